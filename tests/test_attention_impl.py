"""The two attention implementations agree: reference (einsum) and fused (jax.nn.dot_product_attention).

Same parameters, both implementations: outputs and gradients equal to float32 rounding for
bidirectional self, causal self and cross attention with padding masks (including query rows
whose keys are all masked), through a whole encoder-decoder loss, and on the KV-cache decode path.
``auto`` resolves per backend and is accepted by the config validation.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.core import config as config_lib
from txf import ops
from txf.models import build_model, forward, init_params
from txf.decode.adapter import init_cache, make_logits_fn
from txf.nn import MultiHeadAttention, TransformerConfig
from txf.kernels import attend, resolve_impl

IMPLS = ("reference", "fused")
ATOL, RTOL = 2e-5, 2e-5


def tiny_config(**overrides):
  base = dict(vocab_size=17, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2,
              num_decoder_layers=2, max_len=16, dropout_rate=0.0, deterministic=True)
  base.update(overrides)
  return TransformerConfig(**base)


def lengths_valid(lengths, length):
  """bool [B, length]: the first lengths[b] positions of row b are real."""
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def attention_case(kind):
  """(x [B, T, d], memory [B, S, d] or None, mask, memory_valid) with padding; row 2 has no real
  query positions past 1 and (for cross) a memory of one real position."""
  rng = np.random.default_rng(0)
  b, t, s, d = 3, 6, 5, 16
  x = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
  tgt_valid = lengths_valid([6, 4, 1], t)
  if kind == "cross":
    memory = jnp.asarray(rng.normal(size=(b, s, d)), jnp.float32)
    mem_valid = lengths_valid([5, 3, 1], s)
    return x, memory, ops.padding_mask(tgt_valid, mem_valid), mem_valid
  mask = ops.padding_mask(tgt_valid, tgt_valid)
  if kind == "causal":
    mask = ops.combine_masks(mask, ops.causal_mask(t))
  return x, None, mask, None


# the paper's heads; grouped-query (2 K/V heads for 4 query heads); multi-query with QK-norm
HEADS = [dict(), dict(num_heads=4, num_kv_heads=2), dict(num_heads=4, num_kv_heads=1, qk_norm="layer_norm")]


# the grouped-query cases in the end-to-end tier (they compile as long as the plain one)
@pytest.mark.parametrize("heads", [HEADS[0]] + [pytest.param(h, marks=pytest.mark.slow) for h in HEADS[1:]],
                         ids=["mha", "gqa", "mqa_qk_norm"])
@pytest.mark.parametrize("kind", ["self", "causal", "cross"])
def test_outputs_and_gradients_agree(kind, heads):
  x, memory, mask, mem_valid = attention_case(kind)
  cfg = tiny_config(**heads)
  params = MultiHeadAttention(cfg, kind).init(jax.random.key(0), x, memory, mask, mem_valid)
  cotangent = jax.random.normal(jax.random.key(1), x.shape)

  def run(impl):
    module = MultiHeadAttention(dataclasses.replace(cfg, attention_impl=impl), kind)
    loss = lambda p, x_: (module.apply(p, x_, memory, mask, mem_valid) * cotangent).sum()
    out = module.apply(params, x, memory, mask, mem_valid)
    return out, jax.grad(loss, argnums=(0, 1))(params, x)

  (out_r, grads_r), (out_f, grads_f) = run("reference"), run("fused")
  assert np.isfinite(np.asarray(out_f)).all()
  np.testing.assert_allclose(out_f, out_r, atol=ATOL, rtol=RTOL)
  for g_f, g_r in zip(jax.tree_util.tree_leaves(grads_f), jax.tree_util.tree_leaves(grads_r)):
    np.testing.assert_allclose(g_f, g_r, atol=ATOL, rtol=RTOL)


def test_fully_masked_query_rows_are_zero_in_both():
  x, _, mask, _ = attention_case("self")
  cfg = tiny_config()
  params = MultiHeadAttention(cfg, "self").init(jax.random.key(0), x, None, mask)
  for impl in IMPLS:
    out = MultiHeadAttention(dataclasses.replace(cfg, attention_impl=impl), "self").apply(
        params, x, None, mask)
    np.testing.assert_array_equal(out[2, 1:], 0.0)  # row 2: one real token, 5 padded queries


@pytest.mark.slow  # whole models' gradients both ways (12 s a family); the ops' agreement stays quick
@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_lm"])
def test_model_loss_and_gradients_agree(family):
  rng = np.random.default_rng(3)
  targets = rng.integers(4, 17, (3, 7)).astype(np.int32)
  targets[1, 5:] = 0
  targets[2, 2:] = 0
  batch = {"targets": jnp.asarray(targets)}
  if family == "encoder_decoder":
    inputs = rng.integers(4, 17, (3, 6)).astype(np.int32)
    inputs[0, 4:] = 0
    inputs[2, 1:] = 0
    batch["inputs"] = jnp.asarray(inputs)
  cfg = tiny_config(family=family, dropout_rate=0.1)
  params = init_params(cfg, jax.random.key(0), batch)

  def loss_and_grads(impl):
    model = build_model(dataclasses.replace(cfg, attention_impl=impl))

    def loss(p):
      logits, tgt, w = forward(model, p, batch, jax.random.key(5))  # same dropout masks
      s, n = ops.label_smoothed_cross_entropy(logits, tgt, w, 0.1)
      return s / n
    return jax.value_and_grad(loss)(params)

  (loss_r, grads_r), (loss_f, grads_f) = loss_and_grads("reference"), loss_and_grads("fused")
  np.testing.assert_allclose(loss_f, loss_r, atol=ATOL, rtol=RTOL)
  for g_f, g_r in zip(jax.tree_util.tree_leaves(grads_f), jax.tree_util.tree_leaves(grads_r)):
    np.testing.assert_allclose(g_f, g_r, atol=ATOL, rtol=1e-4)


# the language model in the quick tier; translation's (~10 s of compiles; cached = full forward
# for translation stays quick in tests/test_kv_cache.py) and GQA's in the end-to-end tier
@pytest.mark.parametrize("family,heads", [pytest.param("encoder_decoder", {}, marks=pytest.mark.slow),
                                          ("decoder_lm", {}),
                                          pytest.param("encoder_decoder", dict(num_heads=4, num_kv_heads=2),
                                                       marks=pytest.mark.slow)])
def test_cached_decode_steps_agree(family, heads):
  cfg = tiny_config(family=family, **heads)
  example = {"targets": jnp.ones((1, 4), jnp.int32)}
  inputs = None
  if family == "encoder_decoder":
    example["inputs"] = jnp.ones((1, 4), jnp.int32)
    inputs = jnp.asarray([[5, 6, 7, 8, 0], [9, 10, 0, 0, 0]], jnp.int32)
  params = init_params(cfg, jax.random.key(0), example)
  ids = jnp.asarray([[1, 5, 9, 4, 11], [1, 7, 7, 12, 3]], jnp.int32)

  def step_logits(impl):
    c = dataclasses.replace(cfg, attention_impl=impl)
    logits_fn = make_logits_fn(c, params)

    @jax.jit
    def run(src):
      cache = init_cache(c, params, 2, 8, src)
      out = []
      for t in range(ids.shape[1]):
        logits, cache = logits_fn(ids[:, t:t + 1], cache)
        out.append(logits)
      return jnp.stack(out, 1)
    return run(inputs)

  np.testing.assert_allclose(step_logits("fused"), step_logits("reference"), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_beam_queries_over_grouped_keys_agree_with_numpy(kv_heads):
  # beam search's per-source attention (G beams of a source read its keys once) with fewer K/V
  # heads than query heads: both implementations against numpy (K/V heads repeated per query head)
  rng = np.random.default_rng(4)
  b, beams, h, l, lk, d = 2, 3, 4, 2, 5, 8
  q = rng.normal(size=(b * beams, h, l, d))
  k, v = rng.normal(size=(b, kv_heads, lk, d)), rng.normal(size=(b, kv_heads, lk, d))
  mask = rng.random((b, 1, beams * l, lk)) < 0.7
  mask[..., 0] = True
  g = h // kv_heads
  kr, vr = np.repeat(k, g, 1), np.repeat(v, g, 1)  # [B, h, L_k, d]
  want = np.empty((b * beams, h, l, d))
  for row in range(b * beams):
    src, beam = divmod(row, beams)
    s = np.einsum("hqd,hkd->hqk", q[row], kr[src]) / np.sqrt(d)
    s = np.where(mask[src, 0, beam * l:(beam + 1) * l], s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    want[row] = (w / w.sum(-1, keepdims=True)) @ vr[src]
  for impl in IMPLS:
    qf, kf, vf = (jnp.asarray(t, jnp.float32) for t in (q, k, v))
    out, _ = attend(ops.fold_beams(qf, b), kf, vf, jnp.asarray(mask), impl)  # as the model does
    got = ops.unfold_beams(out, b * beams)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_auto_resolves_per_backend_and_validates():
  expected = "reference" if jax.default_backend() == "cpu" else "fused"
  assert resolve_impl("auto") == expected
  assert resolve_impl("fused") == "fused" and resolve_impl("reference") == "reference"
  assert config_lib.base_config().model.attention_impl == "auto"
  cfg = config_lib.base_config()
  config_lib.validate(cfg)
  cfg.model.attention_impl = "flash"
  with pytest.raises(config_lib.ConfigError, match="attention_impl"):
    config_lib.validate(cfg)
