"""The three model families: parameter counts, causality, padding invariance, an encoder layer vs numpy."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.models import build_model, count_params, forward, init_params
from txf.nn import TransformerConfig

BATCH = {"inputs": jnp.ones((2, 6), jnp.int32), "targets": jnp.ones((2, 5), jnp.int32),
         "label": jnp.zeros((2,), jnp.int32)}


def closed_form_count(c: TransformerConfig) -> int:
  """Parameter count from the architecture, written independently of the modules."""
  d, f = c.d_model, c.d_ff
  attention = 4 * d * d                 # W^Q, W^K, W^V, W^O without biases
  ffn = d * f + f + f * d + d           # W1, b1, W2, b2
  norm = 2 * d                          # gamma, beta
  enc_layer = attention + ffn + 2 * norm
  dec_layer = 2 * attention + ffn + 3 * norm
  pe = c.max_len * d if c.positional == "learned" else 0
  final_norm = norm if c.pre_ln else 0
  v, vt = c.vocab_size, c.target_vocab_size or c.vocab_size
  if c.family == "encoder_decoder":
    embeds = v * d if c.share_embeddings else (v + vt) * d
    out = 0 if c.tie_output else d * vt
    return (embeds + c.num_encoder_layers * enc_layer + c.num_decoder_layers * dec_layer
            + 2 * pe + 2 * final_norm + out)
  if c.family == "decoder_lm":
    out = 0 if c.tie_output else d * v
    return v * d + c.num_decoder_layers * (dec_layer - attention - norm) + pe + final_norm + out
  return v * d + c.num_encoder_layers * enc_layer + pe + final_norm + d * c.num_classes + c.num_classes


CONFIGS = [
    dict(family="encoder_decoder"),
    dict(family="encoder_decoder", share_embeddings=False, target_vocab_size=23, tie_output=False),
    dict(family="encoder_decoder", positional="learned", pre_ln=True, num_encoder_layers=1),
    dict(family="decoder_lm", num_decoder_layers=3),
    dict(family="decoder_lm", tie_output=False, positional="learned"),
    dict(family="encoder_classifier", num_classes=5, pre_ln=True),
]


@pytest.mark.parametrize("overrides", CONFIGS)
def test_parameter_count_closed_form(overrides):
  cfg = TransformerConfig(vocab_size=31, d_model=16, num_heads=4, d_ff=24, max_len=12, **overrides)
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0), BATCH))  # shapes, no compile
  assert count_params(params) == closed_form_count(cfg)


def test_paper_base_parameter_count():
  # The paper's base model with a 37000-token shared vocabulary: about 63M parameters (table 3: 65M).
  cfg = TransformerConfig(vocab_size=37000, d_model=512, num_heads=8, d_ff=2048, num_encoder_layers=6,
                          num_decoder_layers=6)
  shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0), BATCH))
  n = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))
  assert n == closed_form_count(cfg)
  assert 60e6 < n < 66e6


def _tiny(family, **kw):
  return TransformerConfig(family=family, vocab_size=19, d_model=16, num_heads=2, d_ff=32, max_len=16,
                           dropout_rate=0.0, **kw)


@pytest.mark.parametrize("family", ["decoder_lm", "encoder_decoder"])
def test_causal_output_at_t_ignores_later_tokens(family):
  cfg = _tiny(family)
  rng = np.random.default_rng(1)
  batch = {"inputs": jnp.asarray(rng.integers(4, 19, (2, 6)), jnp.int32),
           "targets": jnp.asarray(rng.integers(4, 19, (2, 8)), jnp.int32)}
  params = init_params(cfg, jax.random.key(0), batch)
  model = build_model(cfg, deterministic=True)
  logits = jax.jit(lambda b: forward(model, params, b)[0])  # one program for the eight batches
  base = logits(batch)
  for t in range(7):
    changed = dict(batch, targets=batch["targets"].at[:, t + 1:].set(5))
    out = logits(changed)
    # logits at position p depend on targets[:p] (shifted right): positions <= t+1 are unchanged
    np.testing.assert_allclose(out[:, : t + 2], base[:, : t + 2], atol=1e-5)
    if t + 2 < 8:
      assert not np.allclose(out[:, t + 2:], base[:, t + 2:], atol=1e-5)


@pytest.mark.parametrize("family", ["encoder_decoder", "encoder_classifier"])
def test_encoder_ignores_padded_positions(family):
  cfg = _tiny(family)
  rng = np.random.default_rng(2)
  inputs = rng.integers(4, 19, (2, 7))
  seg = np.array([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0]])
  batch = {"inputs": jnp.asarray(inputs * seg, jnp.int32), "inputs_segmentation": jnp.asarray(seg),
           "targets": jnp.asarray(rng.integers(4, 19, (2, 5)), jnp.int32), "label": jnp.zeros(2, jnp.int32)}
  params = init_params(cfg, jax.random.key(0), batch)
  model = build_model(cfg, deterministic=True)
  base = forward(model, params, batch)[0]
  junk = dict(batch, inputs=jnp.asarray(np.where(seg == 1, inputs, rng.integers(4, 19, (2, 7))), jnp.int32))
  np.testing.assert_allclose(forward(model, params, junk)[0], base, atol=1e-5)
  # and 0-padding without segment ids gives the same as explicit segment ids
  plain = {k: v for k, v in batch.items() if k != "inputs_segmentation"}
  np.testing.assert_allclose(forward(model, params, plain)[0], base, atol=1e-5)


def np_layer_norm(x, g, b, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  return g * (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) + b


@pytest.mark.parametrize("pre_ln,pooling", [(False, "mean"), (True, "mean"), (False, "max")])
def test_encoder_classifier_forward_matches_numpy(pre_ln, pooling):
  """One encoder layer, mean or max pooling and the classifier, recomputed in float64 numpy."""
  cfg = TransformerConfig(family="encoder_classifier", vocab_size=13, d_model=8, num_heads=2, d_ff=16,
                          num_encoder_layers=1, num_classes=3, dropout_rate=0.0, pre_ln=pre_ln,
                          pooling=pooling)
  ids = np.array([[5, 6, 7, 8, 0], [4, 9, 0, 0, 0]])
  batch = {"inputs": jnp.asarray(ids, jnp.int32), "label": jnp.zeros(2, jnp.int32)}
  params = init_params(cfg, jax.random.key(3), batch)
  logits = np.asarray(forward(build_model(cfg, deterministic=True), params, batch)[0])
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  lay = p["encoder"]["layer_0"]
  d, h = 8, 2
  pos = np.arange(5)[:, None]
  pe = np.zeros((5, d))
  for j in range(d):
    angle = pos[:, 0] / 10000 ** (2 * (j // 2) / d)
    pe[:, j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
  out = []
  for b in range(2):
    valid = ids[b] != 0
    x = p["embed"]["embedding"][ids[b]] * math.sqrt(d) + pe
    def attn(x):
      a = lay["self_attention"]
      q = np.einsum("ld,dhk->hlk", x, a["query"]); k = np.einsum("ld,dhk->hlk", x, a["key"])
      v = np.einsum("ld,dhk->hlk", x, a["value"])
      s = q @ k.transpose(0, 2, 1) / math.sqrt(d // h)
      s = np.where(valid[None, None, :], s, -np.inf)
      w = np.exp(s - s.max(-1, keepdims=True)); w /= w.sum(-1, keepdims=True)
      return np.einsum("hlk,hkd->ld", w @ v, a["out"])
    def ffn(x):
      f = lay["ffn"]
      return np.maximum(0, x @ f["wi"] + f["bi"]) @ f["wo"] + f["bo"]
    n1 = lambda z: np_layer_norm(z, lay["norm_1"]["scale"], lay["norm_1"]["bias"])
    n2 = lambda z: np_layer_norm(z, lay["norm_2"]["scale"], lay["norm_2"]["bias"])
    if pre_ln:
      x = x + attn(n1(x)); x = x + ffn(n2(x))
      fn = p["encoder"]["final_norm"]
      x = np_layer_norm(x, fn["scale"], fn["bias"])
    else:
      x = n1(x + attn(x)); x = n2(x + ffn(x))
    pooled = x[valid].mean(0) if pooling == "mean" else x[valid].max(0)  # padding never pooled
    out.append(pooled @ p["classifier"]["kernel"] + p["classifier"]["bias"])
  np.testing.assert_allclose(logits, np.stack(out), atol=1e-4)


@pytest.mark.slow  # dropout's own tests (tests/test_dropout.py) stay in the quick tier
def test_dropout_active_in_training_only():
  cfg = dataclasses.replace(_tiny("encoder_decoder"), dropout_rate=0.3)
  batch = {"inputs": jnp.full((2, 6), 5, jnp.int32), "targets": jnp.full((2, 5), 6, jnp.int32)}
  params = init_params(cfg, jax.random.key(0), batch)
  train, evalm = build_model(cfg), build_model(cfg, deterministic=True)
  a = forward(train, params, batch, jax.random.key(1))[0]
  b = forward(train, params, batch, jax.random.key(2))[0]
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(forward(evalm, params, batch)[0], forward(evalm, params, batch)[0])


def test_packed_rows_match_separate_examples():
  cfg = _tiny("encoder_decoder")
  a_in, a_tg, b_in, b_tg = [5, 6, 2], [7, 8, 9, 2], [10, 11, 12, 2], [13, 2]
  sep = {"inputs": jnp.array([a_in + [0] * 4, b_in + [0] * 3]), "targets": jnp.array([a_tg + [0] * 2, b_tg + [0] * 4])}
  packed = {"inputs": jnp.array([a_in + b_in]), "targets": jnp.array([a_tg + b_tg]),
            "inputs_segmentation": jnp.array([[1] * 3 + [2] * 4]), "targets_segmentation": jnp.array([[1] * 4 + [2] * 2]),
            "inputs_position": jnp.array([[0, 1, 2, 0, 1, 2, 3]]), "targets_position": jnp.array([[0, 1, 2, 3, 0, 1]])}
  params = init_params(cfg, jax.random.key(0), sep)
  model = build_model(cfg, deterministic=True)
  s = np.asarray(forward(model, params, sep)[0])
  p = np.asarray(forward(model, params, packed)[0])
  np.testing.assert_allclose(p[0, :4], s[0, :4], atol=1e-5)
  np.testing.assert_allclose(p[0, 4:], s[1, :2], atol=1e-5)
