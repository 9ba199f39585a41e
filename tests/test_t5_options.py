"""The model options a T5 checkpoint needs, each against numpy float64 written from the formulas:
unscaled attention (``model.attention="dot_product"``, its bf16 and fused kernels too), a head
width other than d_model / h (``model.head_dim``), one relative bias table per stack
(``model.relative_shared``) and the scaled tied head (``model.logits_scale``); their validation and
FLOP count; and that the defaults leave the paper's model as it was."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_positions import bucket_np
from txf.core import config as config_lib
from txf import ops
from txf.kernels import attend
from txf.kernels import bf16
from txf.models import build_model, init_params
from txf.models.flops import model_train_flops
from txf.nn import TransformerConfig

RNG = np.random.default_rng(5)


def softmax_np(s, mask):
  s = np.where(mask, s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  return w / w.sum(-1, keepdims=True)


def test_dot_product_attention_is_unscaled_softmax():
  """softmax(Q K^T + B + M) V in float64: no 1/sqrt(d_k); reference, bf16 restatement (float32
  inputs: same products) and the fused kernel (XLA's, scale 1) agree with it."""
  q, k, v = (RNG.normal(size=(2, 3, 5, 4)) for _ in range(3))
  bias = RNG.normal(size=(1, 3, 5, 5))
  mask = np.tril(np.ones((5, 5), bool))[None, None] & (RNG.random((2, 1, 1, 5)) < 0.8)
  mask[..., 0] = True
  want_w = softmax_np(q @ k.swapaxes(-1, -2) + bias, mask)
  want = want_w @ v
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  out, w = ops.dot_product_attention(f32(q), f32(k), f32(v), jnp.asarray(mask), bias=f32(bias))
  np.testing.assert_allclose(w, want_w, atol=1e-5)
  np.testing.assert_allclose(out, want, atol=1e-5)
  out16, _ = bf16.dot_product_attention(f32(q), f32(k), f32(v), jnp.asarray(mask), bias=f32(bias))
  np.testing.assert_allclose(out16, want, atol=1e-5)
  fused, _ = attend(f32(q), f32(k), f32(v), jnp.asarray(mask), "fused", formula="dot_product",
                    bias=f32(bias))
  np.testing.assert_allclose(fused, want, atol=1e-5)
  scaled, _ = attend(f32(q), f32(k), f32(v), jnp.asarray(mask), "reference", bias=f32(bias))
  assert np.abs(np.asarray(scaled) - want).max() > 1e-2  # the paper's default still scales


def rms_np(x, g, eps):
  return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * g


def t5_logits_np(p, src, tgt_in, h, buckets, distance, scale, eps):
  """A T5-layout encoder-decoder in float64 from txf's parameter tree: pre-LN RMSNorm, unscaled
  attention, one relative table per stack (encoder bidirectional, decoder causal), ReLU FFN
  without biases, final norms, tied head of (scale * h) E^T, no embedding scale."""
  a = lambda t: np.asarray(t, np.float64)
  table = a(p["embed"]["embedding"])

  def attention(x, kv, w, mask, bias):
    q = np.einsum("ld,dhk->hlk", x, a(w["query"]))
    k = np.einsum("ld,dhk->hlk", kv, a(w["key"]))
    v = np.einsum("ld,dhk->hlk", kv, a(w["value"]))
    o = softmax_np(q @ k.swapaxes(-1, -2) + bias, mask) @ v
    return np.einsum("hlk,hkd->ld", o, a(w["out"]))

  def rel(length, table_, bidirectional):
    r = np.arange(length)[None, :] - np.arange(length)[:, None]
    return np.stack([[a(table_)[bucket_np(int(x), bidirectional, buckets, distance)] for x in row]
                     for row in r]).transpose(2, 0, 1)

  def ffn(x, w):
    return np.maximum(x @ a(w["wi"]), 0) @ a(w["wo"])

  out = []
  for s, t in zip(src, tgt_in):
    valid = s != 0
    x = table[s]
    enc_bias = rel(len(s), p["encoder"]["relative_bias"], True)
    emask = np.broadcast_to(valid[None, :], (len(s), len(s)))[None]
    for i in range(2):
      lp = p["encoder"][f"layer_{i}"]
      x = x + attention(rms_np(x, a(lp["norm_1"]["scale"]), eps), rms_np(x, a(lp["norm_1"]["scale"]), eps),
                        lp["self_attention"], emask, enc_bias)
      x = x + ffn(rms_np(x, a(lp["norm_2"]["scale"]), eps), lp["ffn"])
    mem = rms_np(x, a(p["encoder"]["final_norm"]["scale"]), eps)
    y = table[t]
    dec_bias = rel(len(t), p["decoder"]["relative_bias"], False)
    causal = np.tri(len(t), dtype=bool)[None]
    cmask = np.broadcast_to(valid[None, :], (len(t), len(s)))[None]
    for i in range(2):
      lp = p["decoder"][f"layer_{i}"]
      n = rms_np(y, a(lp["norm_1"]["scale"]), eps)
      y = y + attention(n, n, lp["self_attention"], causal, dec_bias)
      y = y + attention(rms_np(y, a(lp["norm_2"]["scale"]), eps), mem, lp["cross_attention"],
                        cmask, 0.0)
      y = y + ffn(rms_np(y, a(lp["norm_3"]["scale"]), eps), lp["ffn"])
    y = rms_np(y, a(p["decoder"]["final_norm"]["scale"]), eps)
    out.append((scale * y) @ table.T)
  return np.stack(out)


T5_OPTIONS = dict(family="encoder_decoder", vocab_size=11, d_model=16, num_heads=3, head_dim=8,
                  d_ff=24, num_encoder_layers=2, num_decoder_layers=2, max_len=16,
                  positional="relative", relative_shared=True, relative_buckets=8,
                  relative_max_distance=16, attention="dot_product", pre_ln=True, norm="rms_norm",
                  use_bias=False, embed_scale=False, logits_scale=0.25, decoder_start_id=0)


@pytest.mark.slow  # the end-to-end tier: a whole model applied op by op (~10 s on 2 cores)
def test_t5_layout_logits_equal_numpy():
  """Teacher-forced logits of the T5 options together (3 heads of d_k = 8 on d_model 16, shared
  relative tables, unscaled attention, logits scale 1/4) equal the float64 numpy model."""
  cfg = TransformerConfig(**T5_OPTIONS)
  src = np.array([[4, 5, 6, 7, 2, 0, 0], [8, 9, 10, 4, 5, 6, 2]], np.int32)
  tgt = np.array([[5, 6, 7, 8, 2], [9, 4, 2, 0, 0]], np.int32)
  batch = {"inputs": jnp.asarray(src), "targets": jnp.asarray(tgt)}
  shapes = jax.eval_shape(lambda r: init_params(cfg, r, batch), jax.random.key(0))
  params = jax.tree_util.tree_map(
      lambda s: jnp.asarray(RNG.normal(0, 0.4, s.shape), jnp.float32), shapes)
  got = build_model(cfg, deterministic=True).apply({"params": params}, **batch)
  tgt_in = np.pad(tgt, ((0, 0), (1, 0)))[:, :-1]  # decoder start 0
  want = t5_logits_np(jax.tree_util.tree_map(np.asarray, params), src, tgt_in, 3, 8, 16, 0.25,
                      cfg.layer_norm_eps)
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-4, rtol=1e-4)


def test_relative_shared_puts_one_table_in_each_stack():
  """relative_shared: exactly one [buckets, h] table per stack (encoder, decoder), none in the
  layers; the projections are [d_model, h, head_dim] and W^O [h, head_dim, d_model]."""
  cfg = TransformerConfig(**T5_OPTIONS)
  example = {"inputs": jnp.ones((1, 4), jnp.int32), "targets": jnp.ones((1, 4), jnp.int32)}
  shapes = jax.eval_shape(lambda r: init_params(cfg, r, example), jax.random.key(0))
  flat = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(shapes)}
  tables = {k: s for k, s in flat.items() if "relative_bias" in k}
  assert tables == {"['decoder']['relative_bias']": (8, 3), "['encoder']['relative_bias']": (8, 3)}
  assert flat["['encoder']['layer_0']['self_attention']['query']"] == (16, 3, 8)
  assert flat["['decoder']['layer_1']['cross_attention']['out']"] == (3, 8, 16)


def test_defaults_keep_the_paper_model():
  """The new fields' defaults: d_k = d_model / h, the scaled formula, per-layer tables, scale 1."""
  m = config_lib.base_config().model
  assert (m.head_dim, m.attention, m.relative_shared, m.logits_scale) == (
      0, "scaled_dot_product", False, 1.0)
  assert TransformerConfig(d_model=512, num_heads=8).d_k == 64
  assert TransformerConfig(d_model=512, num_heads=6, head_dim=64).d_k == 64


@pytest.mark.parametrize("field,value,words", [
    ("head_dim", -1, "model.head_dim"), ("logits_scale", 0.0, "model.logits_scale"),
    ("relative_shared", True, "model.positional=relative")])
def test_validate_names_bad_values(field, value, words):
  import txf.models  # noqa: F401  (declares the variant tables' allowed values)
  c = config_lib.base_config()
  c.model[field] = value
  with pytest.raises(config_lib.ConfigError, match=words):
    config_lib.validate(c)


def test_head_dim_allows_widths_not_dividing_d_model():
  import txf.models  # noqa: F401
  c = config_lib.base_config()
  c.model.d_model, c.model.num_heads, c.model.head_dim = 512, 6, 64
  config_lib.validate(c)
  c.model.head_dim = 0
  with pytest.raises(config_lib.ConfigError, match="not divisible"):
    config_lib.validate(c)


def test_flops_count_the_head_width():
  """With d_q = h d_k != d the attention terms use d_q: forward = S N_e (4 d d_q + 4 d d_kv + F +
  4 S d_q) + T N_d (8 d d_q + 4 d d_kv + F + 4 T d_q + 4 S d_q) + S N_d 4 d d_kv + 2 T d V."""
  cfg = TransformerConfig(d_model=16, num_heads=3, head_dim=8, d_ff=24, num_encoder_layers=2,
                          num_decoder_layers=1, vocab_size=11)
  d, dq, f, s, t, v = 16, 24, 24, 5, 4, 11
  forward = (s * 2 * (8 * d * dq + 4 * d * f + 4 * s * dq)
             + t * 1 * (12 * d * dq + 4 * d * f + 4 * t * dq + 4 * s * dq)
             + s * 1 * 4 * d * dq + 2 * t * d * v)
  assert model_train_flops(cfg, 1, s, t) == 3.0 * forward
  paper = TransformerConfig(d_model=16, num_heads=2, d_ff=24, vocab_size=11)
  assert model_train_flops(paper, 1, s, t) == 3.0 * (
      s * 6 * (8 * 16 * 16 + 4 * 16 * 24 + 4 * s * 16)
      + t * 6 * (12 * 16 * 16 + 4 * 16 * 24 + 4 * t * 16 + 4 * s * 16)
      + s * 6 * 4 * 16 * 16 + 2 * t * 16 * 11)
  assert math.isclose(model_train_flops(paper, 2, s, t), 2 * model_train_flops(paper, 1, s, t))
