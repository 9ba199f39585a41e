"""Grouped-query / multi-query attention (model.num_kv_heads) and QK-norm (model.qk_norm) against
numpy float64: the K/V heads repeated per query head in numpy, the softmax attention per head."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.core import config as config_lib
from txf import kernels, ops
from txf.kernels import bf16
from txf.models import init_params
from txf.models.flops import model_train_flops
from txf.nn import MultiHeadAttention, TransformerConfig
from txf.nn.qk_norm import QK_NORMS

RNG = np.random.default_rng(7)


def np_attention(q, k, v, mask=None):
  """softmax(q k^T / sqrt(d_k) + M) v in float64 on [..., L, d]; masked keys get weight 0."""
  s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
  if mask is not None:
    s = np.where(mask, s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  w = w / w.sum(-1, keepdims=True)
  return w @ v, w


def np_grouped(q, k, v, mask=None):
  """Grouped-query attention the plain way: key/value head j repeated for its G = h / h_kv query
  heads (head i reads K/V head i // G), then per-head attention."""
  g = q.shape[1] // k.shape[1]
  return np_attention(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), mask)


def padding(lengths, length):
  return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


@pytest.mark.parametrize("h,hk", [(4, 2), (6, 3), (4, 1)])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal_per_head"])
def test_grouped_query_attention_matches_repeated_kv_numpy(h, hk, mask_kind):
  b, lq, lk, d = 2, 5, 5, 8
  q = RNG.normal(size=(b, h, lq, d))
  k, v = RNG.normal(size=(b, hk, lk, d)), RNG.normal(size=(b, hk, lk, d))
  mask = None
  if mask_kind == "padding":  # [B, 1, L_q, L_k]: row 1 has 2 real keys
    mask = padding([5, 2], lk)[:, None, None, :] & np.ones((1, 1, lq, 1), bool)
  elif mask_kind == "causal_per_head":  # [B, h, L_q, L_k], a different mask per head
    mask = np.tril(np.ones((lq, lk), bool))[None, None] & (RNG.random((b, h, lq, lk)) < 0.7)
    mask[..., 0] = True  # every row keeps a key
  out, w = ops.grouped_query_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)),
                                       None if mask is None else jnp.asarray(mask))
  ref, ref_w = np_grouped(q, k, v, mask)
  assert out.shape == (b, h, lq, d) and w.shape == (b, h, lq, lk)
  np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(w, ref_w, atol=1e-6)


def test_equal_head_counts_are_the_plain_formula_exactly():
  q, k, v = (jnp.asarray(RNG.normal(size=(2, 3, 4, 8)), jnp.float32) for _ in range(3))
  mask = jnp.asarray(padding([4, 2], 4))[:, None, None, :]
  for got, want in zip(ops.grouped_query_attention(q, k, v, mask),
                       ops.scaled_dot_product_attention(q, k, v, mask)):
    np.testing.assert_array_equal(got, want)


def test_group_heads_folds_each_groups_query_heads_into_its_rows():
  x = jnp.arange(2 * 4 * 3).reshape(2, 4, 3, 1)  # [B, h=4, L=3, 1]
  folded = np.asarray(ops.group_heads(x, 2))  # [B, 2, 2*3, 1]: group j rows = heads 2j, 2j+1
  np.testing.assert_array_equal(folded[:, 1, 3:], np.asarray(x)[:, 3])
  np.testing.assert_array_equal(ops.ungroup_heads(folded, 4), x)


def test_multi_head_attention_with_kv_heads_matches_per_head_numpy():
  b, lq, lk, d, h, hk = 2, 4, 6, 12, 6, 2
  dk = d // h
  xq, xkv = RNG.normal(size=(b, lq, d)), RNG.normal(size=(b, lk, d))
  wq, wo = RNG.normal(size=(d, d)) / math.sqrt(d), RNG.normal(size=(d, d)) / math.sqrt(d)
  wk, wv = (RNG.normal(size=(d, hk * dk)) / math.sqrt(d) for _ in range(2))
  seen = []
  hook = lambda k, v, mask: (seen.append(k.shape) or (k, v, mask))
  out, w = ops.multi_head_attention(*(jnp.asarray(a, jnp.float32) for a in (xq, xkv, wq, wk, wv, wo)),
                                    h, num_kv_heads=hk, kv_hook=hook)
  assert seen == [(b, hk, lk, dk)]  # the hook (a KV cache) sees only the K/V heads
  heads = []
  for i in range(h):
    j = i // (h // hk)  # the key/value head of query head i
    o, _ = np_attention(xq @ wq[:, i * dk:(i + 1) * dk], xkv @ wk[:, j * dk:(j + 1) * dk],
                        xkv @ wv[:, j * dk:(j + 1) * dk])
    heads.append(o)
  np.testing.assert_allclose(out, np.concatenate(heads, -1) @ wo, atol=1e-4)
  assert w.shape == (b, h, lq, lk)


def np_norm(x, gain, bias, kind, eps=1e-6):
  """LayerNorm / RMSNorm over the last axis in float64."""
  if kind == "layer_norm":
    mu = x.mean(-1, keepdims=True)
    return gain * (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) + bias
  return gain * x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)


@pytest.mark.parametrize("qk_norm", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("kind", ["causal", "cross"])
def test_the_module_with_qk_norm_and_kv_heads_matches_numpy(qk_norm, kind):
  b, t, s, d, h, hk = 2, 5, 4, 16, 4, 2
  cfg = TransformerConfig(d_model=d, num_heads=h, num_kv_heads=hk, qk_norm=qk_norm,
                          deterministic=True, dropout_rate=0.0)
  x, memory = RNG.normal(size=(b, t, d)), RNG.normal(size=(b, s, d))
  mask = np.tril(np.ones((t, t), bool))[None, None] if kind == "causal" else (
      padding([4, 2], s)[:, None, None, :])
  module = MultiHeadAttention(cfg, kind)
  args = lambda: (jnp.asarray(x, jnp.float32), None if kind == "causal" else jnp.asarray(memory, jnp.float32),
                  jnp.asarray(mask))
  params = nn.unbox(module.init(jax.random.key(0), *args()))
  # random gains (and biases), so that a norm applied to the wrong axis or head would show
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: jnp.asarray(RNG.normal(1.0, 0.3, p.shape), jnp.float32)
      if "norm" in jax.tree_util.keystr(path) else p, params)
  out = module.apply(params, *args())
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params["params"])
  assert p["key"].shape == (d, hk, d // h) and p["query_norm"]["scale"].shape == (d // h,)
  src = x if kind == "causal" else memory
  q = np.einsum("bld,dhk->bhlk", x, p["query"])
  k, v = np.einsum("bld,dhk->bhlk", src, p["key"]), np.einsum("bld,dhk->bhlk", src, p["value"])
  norm = lambda a, name: np_norm(a, p[name]["scale"], p[name].get("bias", 0.0), qk_norm)
  o, _ = np_grouped(norm(q, "query_norm"), norm(k, "key_norm"), v, mask)
  ref = np.einsum("bhlk,hkd->bld", o, p["out"])
  np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)


def test_qk_norm_table_and_its_parameters():
  assert QK_NORMS.names() == ("none", "layer_norm", "rms_norm")
  assert config_lib.allowed_values("model.qk_norm") == QK_NORMS.names()
  x = jnp.ones((1, 3, 16))
  for name, expect in (("none", set()), ("rms_norm", {"scale"}), ("layer_norm", {"scale", "bias"})):
    params = MultiHeadAttention(TransformerConfig(d_model=16, num_heads=4, qk_norm=name), "self").init(
        jax.random.key(0), x)["params"]
    for which in ("query_norm", "key_norm"):
      assert set(params.get(which, {})) == expect


def test_bf16_grouped_attention_matches_float32_to_bf16_rounding():
  b, lq, lk, d, h, hk = 2, 5, 6, 16, 4, 2
  bf = lambda *shape: jnp.asarray(RNG.normal(size=shape), jnp.bfloat16)
  x, m = bf(b, lq, d), bf(b, lk, d)
  wq, wk, wv, wo = bf(d, h, d // h), bf(d, hk, d // h), bf(d, hk, d // h), bf(h, d // h, d)
  mask = jnp.asarray(padding([6, 3], lk))[:, None, None, :]
  f32 = lambda *a: [t.astype(jnp.float32) for t in a]
  got, _ = bf16.multi_head_attention(x, m, wq, wk, wv, wo, h, mask, num_kv_heads=hk)
  want, _ = ops.multi_head_attention(*f32(x, m, wq, wk, wv, wo), h, mask, num_kv_heads=hk)
  ref, _ = np_grouped(*(np.einsum("bld,dhk->bhlk", np.asarray(a, np.float64), np.asarray(w, np.float64))
                        for a, w in ((x, wq), (m, wk), (m, wv))), np.asarray(mask))
  ref = np.einsum("bhlk,hkd->bld", ref, np.asarray(wo, np.float64))
  assert got.dtype == jnp.bfloat16
  scale = np.abs(ref).max()
  np.testing.assert_allclose(np.asarray(want, np.float64), ref, atol=1e-4 * scale)
  np.testing.assert_allclose(np.asarray(got, np.float64), ref, atol=3e-2 * scale)
  assert not np.array_equal(np.asarray(got, np.float32), np.asarray(want))  # bf16 really rounds


def test_the_module_in_bf16_with_kv_heads_and_qk_norm_matches_float32():
  cfg = TransformerConfig(d_model=16, num_heads=4, num_kv_heads=1, qk_norm="rms_norm",
                          deterministic=True)
  x = jnp.asarray(RNG.normal(size=(2, 5, 16)), jnp.float32)
  mask = jnp.asarray(np.tril(np.ones((5, 5), bool)))[None, None]
  params = MultiHeadAttention(cfg, "causal").init(jax.random.key(1), x, None, mask)
  out32 = MultiHeadAttention(cfg, "causal").apply(params, x, None, mask)
  for dots in ("layout", "xla"):  # the bf16 restatement (txf.kernels.bf16) and XLA's bf16 dots
    with kernels.use(bf16_dots=dots):
      out16 = MultiHeadAttention(dataclasses.replace(cfg, dtype="bfloat16"), "causal").apply(
          params, x, None, mask)
    assert out16.dtype == jnp.bfloat16
    scale = float(jnp.abs(out32).max())
    np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=3e-2 * scale)


def test_validate_names_bad_kv_heads():
  import txf.models  # noqa: F401  (declares the variant tables' choices)
  cfg = config_lib.base_config()
  cfg.model.num_kv_heads = 2
  config_lib.validate(cfg)
  for bad, words in ((3, "does not divide model.num_heads=8"), (16, "does not divide"),
                     (-1, "must be an integer >= 0")):
    cfg.model.num_kv_heads = bad
    with pytest.raises(config_lib.ConfigError, match=words):
      config_lib.validate(cfg)
  cfg.model.num_kv_heads, cfg.parallelism, cfg.mesh_shape = 2, "mesh", (1, 1, 4)
  with pytest.raises(config_lib.ConfigError, match="sharding_rules.kv_heads=''"):
    config_lib.validate(cfg)
  cfg.sharding_rules.kv_heads = ""
  config_lib.validate(cfg)
  cfg.model.num_kv_heads, cfg.model.qk_norm = 0, "l2"
  with pytest.raises(config_lib.ConfigError, match="model.qk_norm='l2'"):
    config_lib.validate(cfg)


def hand_count(d, f, h, hk, v, ne, nd, qk=0):
  """Parameters of a post-LN encoder-decoder with one shared tied table, counted by hand: each
  attention has W^Q, W^O [d, d] and W^K, W^V [d, h_kv d_k]; QK-norm adds qk per attention."""
  dk = d // h
  attention = 2 * d * d + 2 * d * hk * dk + qk
  ffn, norm = 2 * d * f + f + d, 2 * d
  return v * d + ne * (attention + ffn + 2 * norm) + nd * (2 * attention + ffn + 3 * norm)


@pytest.mark.parametrize("hk,qk_norm,qk", [(0, "none", 0), (2, "none", 0), (1, "layer_norm", 4 * 4)])
def test_parameter_count_and_flops_of_a_grouped_model(hk, qk_norm, qk):
  d, f, h, v = 32, 64, 8, 40
  cfg = TransformerConfig(d_model=d, d_ff=f, num_heads=h, num_kv_heads=hk, qk_norm=qk_norm,
                          vocab_size=v, num_encoder_layers=2, num_decoder_layers=3)
  batch = {"inputs": jnp.ones((1, 4), jnp.int32), "targets": jnp.ones((1, 4), jnp.int32)}
  shapes = jax.eval_shape(lambda r: init_params(cfg, r, batch), jax.random.key(0))
  count = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
  assert count == hand_count(d, f, h, hk or h, v, 2, 3, qk)
  # FLOPs: the weight matmuls are 6 x (weights touched per token) + 12 L^2 d attention terms
  b, s, t = 3, 7, 5
  kv = (hk or h) * (d // h)
  enc = s * 2 * (2 * d * d + 2 * d * kv + 2 * d * f)
  dec = t * 3 * (4 * d * d + 2 * d * kv + 2 * d * f) + s * 3 * 2 * d * kv + t * d * v
  attention = 2 * 2 * s * s * d + 3 * (2 * t * t * d + 2 * t * s * d)
  assert model_train_flops(cfg, b, s, t) == pytest.approx(6.0 * b * (enc + dec + attention), rel=1e-12)


@pytest.mark.parametrize("kind", ["causal", "cross"])
def test_grouped_heads_equal_plain_heads_with_repeated_kv_kernels_dropout_included(kind):
  # a GQA layer is the plain multi-head layer whose W^K, W^V blocks are repeated per group (head i
  # reads K/V head i // G): same outputs, also on the attention-dropout path (same dropout bits,
  # as the dropped weights have the same shape [B, h, L_q, L_k])
  h, hk = 4, 2
  cfg = TransformerConfig(d_model=16, num_heads=h, num_kv_heads=hk, attention_dropout_rate=0.3,
                          deterministic=True)
  x, memory = (jnp.asarray(RNG.normal(size=(2, n, 16)), jnp.float32) for n in (5, 4))
  memory = None if kind == "causal" else memory
  mask = jnp.asarray(np.tril(np.ones((5, 5 if kind == "causal" else 4), bool)))[None, None]
  grouped = nn.unbox(MultiHeadAttention(cfg, kind).init(jax.random.key(0), x, memory, mask))
  plain = jax.tree_util.tree_map(lambda a: a, grouped)
  for name in ("key", "value"):
    plain["params"][name] = jnp.repeat(grouped["params"][name], h // hk, axis=1)
  plain_cfg = dataclasses.replace(cfg, num_kv_heads=0)
  for deterministic in (True, False):
    run = lambda c, p: MultiHeadAttention(dataclasses.replace(c, deterministic=deterministic), kind).apply(
        p, x, memory, mask, rngs={"dropout": jax.random.key(3)})
    got, want = run(cfg, grouped), run(plain_cfg, plain)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  assert not np.allclose(run(cfg, grouped), MultiHeadAttention(cfg, kind).apply(grouped, x, memory, mask))
