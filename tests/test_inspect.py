"""txf.inspect: named intermediates, capture / patch / ablate and the logit lens, on small random
models of every family and of each Hugging Face architecture's txf configuration.

Each result is checked against an independent computation: the plain ``model.apply`` (identity
patch, bit for bit), a second input's own forward (patching a layer), the closed form of an
ablated attention (its output-projection bias), and the attention formula in numpy float64 from
the captured queries and keys.
"""

import dataclasses

import jax
import numpy as np
import pytest

from txf.hf import bert as hf_bert, gpt2 as hf_gpt2, marian as hf_marian, t5 as hf_t5
from txf import inspect as ti
from txf.models import build_model, init_params, model_inputs
from txf.nn import TransformerConfig

SMALL = dict(d_model=16, num_heads=2, d_ff=24, vocab_size=23, max_len=32, dtype="float32",
             dropout_rate=0.0)


@dataclasses.dataclass
class Subject:
  """What txf.inspect needs of a run: the model config and the parameters."""
  model_cfg: TransformerConfig
  params: dict


def hf_fields(arch):
  """The txf model config fields of a small configuration of each Hugging Face architecture."""
  if arch == "gpt2":
    return hf_gpt2.model_fields({"model_type": "gpt2", "n_embd": 16, "n_head": 2, "n_layer": 2,
                                 "vocab_size": 23, "n_positions": 32, "bos_token_id": 22,
                                 "eos_token_id": 22})
  if arch == "bert":
    return hf_bert.model_fields({"model_type": "bert", "hidden_size": 16, "num_attention_heads": 2,
                                 "num_hidden_layers": 2, "intermediate_size": 24,
                                 "vocab_size": 23, "max_position_embeddings": 32},
                                "encoder_mlm")
  if arch == "marian":
    return hf_marian.model_fields({"model_type": "marian", "d_model": 16, "encoder_attention_heads": 2,
                                   "decoder_attention_heads": 2, "encoder_layers": 2,
                                   "decoder_layers": 2, "encoder_ffn_dim": 24,
                                   "decoder_ffn_dim": 24, "vocab_size": 23,
                                   "max_position_embeddings": 32, "decoder_start_token_id": 22,
                                   "pad_token_id": 22})
  return hf_t5.model_fields({"model_type": "t5", "d_model": 16, "num_heads": 2, "d_kv": 8,
                             "num_layers": 2, "num_decoder_layers": 2, "d_ff": 24,
                             "vocab_size": 23}, tied=True)


FAMILIES = {
    "encoder_decoder": dict(family="encoder_decoder", num_encoder_layers=2, num_decoder_layers=2,
                            attention_bias=True),
    "decoder_lm": dict(family="decoder_lm", num_encoder_layers=0, num_decoder_layers=2),
    "encoder_classifier": dict(family="encoder_classifier", num_encoder_layers=2,
                               num_decoder_layers=0, num_classes=3),
    "encoder_mlm": dict(family="encoder_mlm", num_encoder_layers=2, num_decoder_layers=0,
                        activation="gelu", pre_ln=True),
}


def make_batch(family, seed=0, rows=2, length=7):
  rng = np.random.RandomState(seed)
  ids = rng.randint(4, 23, (rows, length)).astype(np.int32)
  ids[1, -2:] = 0  # a padded row
  batch = {"inputs": ids, "targets": np.roll(ids, 1, axis=1)}
  if family == "decoder_lm":
    batch = {"targets": ids}
  elif family in ("encoder_classifier", "encoder_mlm"):
    batch = {"inputs": ids}
  return batch


_SUBJECTS = {}


def subject(name):
  """A small random model of a family (or a Hugging Face architecture's configuration)."""
  if name not in _SUBJECTS:
    if name.startswith("hf_"):
      fields = {k: v for k, v in hf_fields(name[3:]).items()
                if k in {f.name for f in dataclasses.fields(TransformerConfig)}}
      fields.update(vocab_size=23, dtype="float32", dropout_rate=0.0, attention_dropout_rate=0.0,
                    max_len=32)
      cfg = TransformerConfig(**fields)
    else:
      cfg = TransformerConfig(**{**SMALL, **FAMILIES[name]})
    params = init_params(cfg, jax.random.key(1), make_batch(cfg.family))
    # nonzero biases, so that closed forms are not trivially zero
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.1 if "bias" in jax.tree_util.keystr(p) else x, params)
    _SUBJECTS[name] = Subject(cfg, params)
  return _SUBJECTS[name]


def plain_logits(s, batch):
  model = build_model(s.model_cfg, deterministic=True)
  return jax.jit(lambda p, b: model.apply({"params": p}, **model_inputs(s.model_cfg.family, b)))(
      s.params, batch)


# each Hugging Face architecture's configuration: the end-to-end tier (a compile each)
HF = [pytest.param(f"hf_{a}", marks=pytest.mark.slow) for a in ("gpt2", "bert", "marian", "t5")]
ALL = list(FAMILIES) + HF


@pytest.mark.parametrize("name", ALL)
def test_identity_patch_is_bit_identical_and_points_are_named(name):
  s = subject(name)
  batch = make_batch(s.model_cfg.family)
  points = ti.list_points(s, batch)
  stack = "decoder" if s.model_cfg.num_decoder_layers else "encoder"
  for point in ("embeddings", "layer_0/resid_in", "layer_1/resid_out",
                "layer_0/self_attention/weights", "layer_0/self_attention/heads"):
    assert f"{stack}/{point}" in points
  if s.model_cfg.d_ff:
    assert points[f"{stack}/layer_1/ffn/hidden"][0][-1] == s.model_cfg.ffn_hidden
  assert "logits" in points
  identity = {n: (lambda x: x) for n in points if not n.endswith("/weights")}
  got = ti.patch(s, batch, identity)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(plain_logits(s, batch)))
  captured = ti.capture(s, batch, ["logits"])
  np.testing.assert_array_equal(np.asarray(captured["logits"]), np.asarray(got))


@pytest.mark.parametrize("name", ["decoder_lm", "encoder_classifier", "hf_gpt2"])
def test_patching_a_layer_from_another_input_gives_its_logits(name):
  s = subject(name)
  a, b = make_batch(s.model_cfg.family, 0), make_batch(s.model_cfg.family, 5)
  stack = "decoder" if s.model_cfg.num_decoder_layers else "encoder"
  of_b = ti.capture(s, b)
  layer = {n: v for n, v in of_b.items()
           if n.startswith(f"{stack}/layer_1/") and not n.endswith("/weights")}
  patched = ti.patch(s, a, layer)
  np.testing.assert_array_equal(np.asarray(patched), np.asarray(of_b["logits"]))
  assert not np.array_equal(np.asarray(ti.capture(s, a, ["logits"])["logits"]),
                            np.asarray(of_b["logits"]))


def test_patching_the_decoder_from_another_target_in_translation():
  s = subject("encoder_decoder")
  a = make_batch("encoder_decoder", 0)
  b = dict(a, targets=make_batch("encoder_decoder", 3)["targets"])  # same source, other target
  of_b = ti.capture(s, b)
  layer = {n: v for n, v in of_b.items() if n.startswith("decoder/layer_0/")
           and not n.endswith("/weights")}
  np.testing.assert_array_equal(np.asarray(ti.patch(s, a, layer)), np.asarray(of_b["logits"]))


@pytest.mark.parametrize("name, module", [
    ("encoder_decoder", "decoder/layer_1/cross_attention"),   # with an output bias
    ("encoder_decoder", "encoder/layer_0/self_attention"),
    ("decoder_lm", "decoder/layer_0/self_attention"),         # without
])
def test_ablating_every_head_leaves_the_output_bias(name, module):
  s = subject(name)
  batch = make_batch(s.model_cfg.family)
  heads = [(module, h) for h in range(s.model_cfg.num_heads)]
  masks = ti.ablation_masks(s, batch, heads)
  captured = _captured_with_masks(s, batch, masks, (f"{module}/out",))
  out = np.asarray(captured[f"{module}/out"])
  params = s.params
  for part in module.split("/"):
    params = params[part]
  expected = np.asarray(params["out_bias"]) if "out_bias" in params else np.zeros(out.shape[-1])
  np.testing.assert_array_equal(out, np.broadcast_to(expected, out.shape))
  # the logits change, and equal ablate()'s
  logits = ti.ablate(s, batch, heads=heads)
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(captured["logits"]))
  assert not np.allclose(np.asarray(logits), np.asarray(plain_logits(s, batch)))


def _captured_with_masks(s, batch, masks, names):
  def run(p, b):
    hooks = ti.Hooks(masks=masks, capture=tuple(names) + ("logits",))
    ti.forward(s.model_cfg, p, b, hooks)
    return hooks.captured
  return jax.jit(run)(s.params, batch)


def test_ffn_units_and_mean_ablation_against_numpy():
  s = subject("decoder_lm")
  batch, ref = make_batch("decoder_lm", 0), make_batch("decoder_lm", 7)
  ffn = "decoder/layer_0/ffn"
  # every unit zeroed: the FFN's output is its bias b2
  units = [(ffn, u) for u in range(s.model_cfg.ffn_hidden)]
  got = _captured_with_masks(s, batch, ti.ablation_masks(s, batch, units=units), (f"{ffn}/out",))
  b2 = np.asarray(s.params["decoder"]["layer_0"]["ffn"]["bo"])
  np.testing.assert_array_equal(np.asarray(got[f"{ffn}/out"]), np.broadcast_to(b2, got[f"{ffn}/out"].shape))
  # mean ablation of head 1: its output replaced by its mean over the reference's real positions
  attn = "decoder/layer_1/self_attention"
  heads_ref = np.asarray(ti.capture(s, ref, [f"{attn}/heads"])[f"{attn}/heads"], np.float64)
  valid = ref["targets"] != 0
  mean = heads_ref[:, 1][valid].mean(0)  # [d_v]
  by_hand = np.asarray(ti.capture(s, batch, [f"{attn}/heads"])[f"{attn}/heads"]).copy()
  by_hand[:, 1] = mean
  expected = ti.patch(s, batch, {f"{attn}/heads": by_hand.astype(np.float32)})
  got = ti.ablate(s, batch, heads=[(attn, 1)], mode="mean", reference=ref)
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name, modules", [
    ("encoder_decoder", ("encoder/layer_0/self_attention", "decoder/layer_1/self_attention",
                         "decoder/layer_0/cross_attention")),
    pytest.param("hf_t5", ("decoder/layer_1/cross_attention",), marks=pytest.mark.slow),
])
def test_captured_weights_equal_the_formula_in_float64(name, modules):
  s = subject(name)
  batch = make_batch(s.model_cfg.family)
  names = [f"{m}/{p}" for m in modules for p in ("q", "k", "weights")]
  got = {k: np.asarray(v, np.float64) for k, v in ti.capture(s, batch, names).items()}
  src_valid = batch["inputs"] != 0
  for m in modules:
    q, k, w = got[f"{m}/q"], got[f"{m}/k"], got[f"{m}/weights"]
    scale = 1.0 if s.model_cfg.attention == "dot_product" else np.sqrt(q.shape[-1])  # T5: unscaled
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) / scale
    lq, lk = scores.shape[-2:]
    if m.startswith("encoder"):
      allowed = src_valid[:, None, :, None] & src_valid[:, None, None, :]
    elif m.endswith("cross_attention"):
      allowed = np.broadcast_to(src_valid[:, None, None, :], scores.shape)
    else:
      allowed = np.broadcast_to(np.tril(np.ones((lq, lk), bool)), scores.shape)
    allowed = np.broadcast_to(allowed, scores.shape)
    scores = np.where(allowed, scores, -1e30)
    e = np.where(allowed, np.exp(scores - scores.max(-1, keepdims=True)), 0.0)
    expected = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    rows = allowed.any(-1)  # fully masked rows (padding queries) are not compared
    np.testing.assert_allclose(w[rows], expected[rows], atol=2e-6)


@pytest.mark.parametrize("name", ALL)
def test_logit_lens_rows(name):
  s = subject(name)
  batch = make_batch(s.model_cfg.family)
  lens = np.asarray(ti.logit_lens(s, batch))
  stack = ti.lens_stack(s, batch)
  n = ti.num_layers(s.model_cfg, stack)
  assert lens.shape[0] == n + 1
  # the last row is the model's logits (one program holds every row: float32 rounding may differ)
  np.testing.assert_allclose(lens[-1], np.asarray(plain_logits(s, batch)), rtol=1e-5, atol=1e-5)
  assert not np.allclose(lens[0], lens[-1])


def test_logit_lens_of_a_post_ln_lm_is_the_tied_head_in_numpy():
  s = subject("decoder_lm")
  batch = make_batch("decoder_lm")
  lens = np.asarray(ti.logit_lens(s, batch), np.float64)
  got = ti.capture(s, batch, ["decoder/embeddings", "decoder/layer_0/resid_out"])
  table = np.asarray(s.params["embed"]["embedding"], np.float64)
  for row, name in ((0, "decoder/embeddings"), (1, "decoder/layer_0/resid_out")):
    expected = np.asarray(got[name], np.float64) @ table.T
    np.testing.assert_allclose(lens[row], expected, rtol=1e-5, atol=1e-5)


def test_unknown_and_read_only_points_are_refused():
  s = subject("decoder_lm")
  batch = make_batch("decoder_lm")
  with pytest.raises(KeyError, match="no point 'decoder/layer_9/resid_out'"):
    ti.capture(s, batch, ["decoder/layer_9/resid_out"])
  with pytest.raises(ValueError, match="read-only"):
    ti.patch(s, batch, {"decoder/layer_0/self_attention/weights": 0.0})


def test_attention_only_layers_have_no_ffn():
  """model.d_ff=0: each layer is its attention sublayers alone (no FFN, no norm for it); the logit
  lens of the only layer of a post-LN LM is h E^T of its residual stream."""
  cfg = TransformerConfig(**{**SMALL, **FAMILIES["decoder_lm"], "d_ff": 0, "num_decoder_layers": 1})
  batch = make_batch("decoder_lm")
  params = init_params(cfg, jax.random.key(2), batch)
  assert set(params["decoder"]["layer_0"]) == {"self_attention", "norm_1"}
  s = Subject(cfg, params)
  got = ti.capture(s, batch, ["decoder/layer_0/norm_1/out", "decoder/layer_0/resid_out", "logits"])
  np.testing.assert_array_equal(np.asarray(got["decoder/layer_0/norm_1/out"]),
                                np.asarray(got["decoder/layer_0/resid_out"]))
  expected = np.asarray(got["decoder/layer_0/resid_out"], np.float64) @ np.asarray(
      params["embed"]["embedding"], np.float64).T
  np.testing.assert_allclose(np.asarray(got["logits"]), expected, rtol=1e-5, atol=1e-5)
