"""Positions inside self-attention (model.positional = rope | alibi | relative) at the model
level: each self-attention's weights against numpy float64 on packed rows, packed rows equal
separate rows, bf16 compute, and which parameters each adds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_model_options import BATCH, small_config
from txf.models import build_model, init_params
from txf.nn import TransformerConfig


PACKED = {  # two rows: row 0 packs two examples per side, row 1 one example then padding
    "inputs": np.array([[4, 5, 6, 7, 8, 9, 5], [6, 4, 9, 5, 7, 0, 0]], np.int32),
    "inputs_segmentation": np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0]], np.int32),
    "inputs_position": np.array([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 0, 0]], np.int32),
    "targets": np.array([[7, 8, 5, 9, 6, 4], [9, 7, 8, 6, 0, 0]], np.int32),
    "targets_segmentation": np.array([[1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 0, 0]], np.int32),
    "targets_position": np.array([[0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 0, 0]], np.int32)}


def _self_attention_weights(cfg, params, batch):
  """{module path: (kind, input x [B, L, d], attention weights [B, h, L, L])} of every
  self-attention of one forward pass (the weights the module sows)."""
  import flax.linen as fnn
  from txf.nn import MultiHeadAttention
  inputs = {}

  def record(next_fun, args, kwargs, context):
    module = context.module
    if (isinstance(module, MultiHeadAttention) and context.method_name == "__call__"
        and module.kind != "cross"):
      inputs[module.path] = (module.kind, np.asarray(args[0], np.float64))
    return next_fun(*args, **kwargs)

  with fnn.intercept_methods(record):
    _, state = build_model(cfg, deterministic=True).apply({"params": params}, **batch,
                                                          mutable=["intermediates"])
  out = {}
  for path, (kind, x) in inputs.items():
    node = state["intermediates"]
    for name in path:
      node = node[name]
    out[path] = (kind, x, np.asarray(node["attention_weights"][0], np.float64))
  return out


# alibi in the quick tier; rope and relative (their formulas: tests/test_positions.py, quick) in the
# end-to-end tier: the model-level compiles cost the quick tier ~10 s
@pytest.mark.parametrize("positional", [pytest.param("rope", marks=pytest.mark.slow), "alibi",
                                        pytest.param("relative", marks=pytest.mark.slow)])
def test_positions_inside_attention_give_numpy_weights_on_packed_rows(positional):
  """Every self-attention's weights equal softmax(q'k'^T / sqrt(d_k) + B + M) in numpy float64,
  with q', k' RoPE's rotations and B ALiBi's / T5's bias at the packed rows' own positions
  (restarting at 0 in each example): the encoder's bidirectional, the decoder's causal. (All three
  depend on p_j - p_i only, which packing keeps within an example: shifted positions give the
  same scores.)"""
  from tests.test_positions import bucket_np, rope_np
  cfg = small_config(d_model=16, num_heads=4, positional=positional, relative_buckets=8,
                     relative_max_distance=16)
  batch = {k: jnp.asarray(v) for k, v in PACKED.items()}
  params = init_params(cfg, jax.random.key(4), batch)
  seen = _self_attention_weights(cfg, params, batch)
  assert sorted(kind for kind, _, _ in seen.values()) == ["causal", "self"]
  slopes = 2.0 ** (-8.0 * np.arange(1, 5) / 4)
  for path, (kind, x, weights) in seen.items():
    p = params
    for name in path:
      p = p[name]
    side = "inputs" if kind == "self" else "targets"
    seg, pos = PACKED[f"{side}_segmentation"], PACKED[f"{side}_position"]
    for b in range(2):
      q = np.einsum("ld,dhk->hlk", x[b], np.asarray(p["query"], np.float64))
      k = np.einsum("ld,dhk->hlk", x[b], np.asarray(p["key"], np.float64))
      if positional == "rope":
        q, k = rope_np(q, pos[b]), rope_np(k, pos[b])
      rel = pos[b][None, :] - pos[b][:, None]  # [i, j] = p_j - p_i
      if positional == "alibi":
        bias = -slopes[:, None, None] * np.abs(rel)[None]
      elif positional == "relative":
        table = np.asarray(p["relative_bias"], np.float64)
        bias = np.stack([[table[bucket_np(int(r), kind == "self", 8, 16)] for r in row]
                         for row in rel]).transpose(2, 0, 1)
      else:
        bias = 0.0
      mask = (seg[b][:, None] == seg[b][None, :]) & (seg[b][:, None] != 0)
      if kind == "causal":
        mask &= np.tri(len(pos[b]), dtype=bool)
      s = np.where(mask, q @ k.transpose(0, 2, 1) / 2.0 + bias, -np.inf)  # sqrt(d_k) = 2
      rows = mask.any(-1)
      w = np.exp(s[:, rows] - s[:, rows].max(-1, keepdims=True))
      np.testing.assert_allclose(weights[b][:, rows], w / w.sum(-1, keepdims=True), atol=1e-5,
                                 err_msg=f"{path} row {b}")


@pytest.mark.slow  # the end-to-end tier: the numpy test above checks the same scores
@pytest.mark.parametrize("positional", ["rope", "alibi", "relative"])
def test_positions_inside_attention_packed_rows_equal_separate_rows(positional):
  """decoder_lm: a row packing two examples (positions restarting at 0) gives each example the
  logits it gets alone; encoder_classifier: a padded row gives the class logits of the unpadded."""
  cfg = small_config(family="decoder_lm", num_heads=4, positional=positional,
                     relative_buckets=8, relative_max_distance=16)
  a, b = [5, 7, 9], [8, 4, 6, 10]
  packed = {"targets": jnp.asarray([a + b]),
            "targets_segmentation": jnp.asarray([[1] * 3 + [2] * 4]),
            "targets_position": jnp.asarray([[0, 1, 2, 0, 1, 2, 3]])}
  params = init_params(cfg, jax.random.key(5), packed)
  model = build_model(cfg, deterministic=True)
  together = model.apply({"params": params}, **packed)[0]
  alone = model.apply({"params": params}, jnp.asarray([a + [0] * 4, b + [0] * 3]))
  np.testing.assert_allclose(together[:3], alone[0, :3], atol=1e-5)
  np.testing.assert_allclose(together[3:], alone[1, :4], atol=1e-5)
  cls = small_config(family="encoder_classifier", num_heads=4, positional=positional,
                     relative_buckets=8, relative_max_distance=16)
  inputs = jnp.asarray([[5, 7, 9, 4, 0, 0]])
  params = init_params(cls, jax.random.key(6), {"inputs": inputs})
  model = build_model(cls, deterministic=True)
  np.testing.assert_allclose(model.apply({"params": params}, inputs),
                             model.apply({"params": params}, inputs[:, :4]), atol=1e-5)


@pytest.mark.slow  # the end-to-end tier: three bf16 models
def test_positions_inside_attention_under_bf16_compute():
  """model.dtype=bfloat16 (CPU: the bf16 restatement, the bias added to its float32 logits) stays
  within bf16 rounding of the float32 model, for each encoding inside attention."""
  rng = np.random.default_rng(8)
  batch = {"inputs": jnp.asarray(rng.integers(3, 11, (2, 6)), jnp.int32),
           "targets": jnp.asarray(rng.integers(3, 11, (2, 5)), jnp.int32)}
  for positional in ("rope", "alibi", "relative"):
    cfg = small_config(d_model=16, num_heads=4, positional=positional, dtype="float32")
    params = init_params(cfg, jax.random.key(9), batch)
    want = build_model(cfg, deterministic=True).apply({"params": params}, **batch)
    bf = TransformerConfig(**{**cfg.__dict__, "dtype": "bfloat16"})
    got = build_model(bf, deterministic=True).apply({"params": params}, **batch)
    err = float(jnp.abs(got - want).max() / jnp.abs(want).max())
    assert 0 < err < 0.05, (positional, err)


def test_only_relative_adds_parameters_one_table_per_self_attention():
  """rope and alibi add no parameters (the tree of positional=none); relative adds exactly a
  [relative_buckets, h] table to each self-attention (encoder and decoder), none to cross."""
  def leaves(**kw):
    cfg = small_config(num_encoder_layers=2, num_decoder_layers=3, **kw)
    shapes = jax.eval_shape(lambda r: init_params(cfg, r, BATCH), jax.random.key(0))
    return {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_flatten_with_path(shapes)[0]}
  none = leaves(positional="none")
  assert leaves(positional="rope") == none and leaves(positional="alibi") == none
  relative = leaves(positional="relative", relative_buckets=12)
  extra = {k: v for k, v in relative.items() if k not in none}
  assert {k: v for k, v in relative.items() if k in none} == none
  want = {f"['{stack}']['layer_{i}']['self_attention']['relative_bias']": (12, 2)
          for stack, n in (("encoder", 2), ("decoder", 3)) for i in range(n)}
  assert extra == want
