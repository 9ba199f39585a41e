"""txf.ops against independent numpy float64 code written from the paper's formulas."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import ops

RNG = np.random.default_rng(0)


def np_softmax(x, axis=-1):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def test_positional_encoding_formula_elementwise():
  length, d = 50, 16
  pe = np.asarray(ops.sinusoidal_positional_encoding(length, d))
  for pos in range(length):
    for j in range(d):
      i = j // 2
      angle = pos / 10000 ** (2 * i / d)
      expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
      assert abs(pe[pos, j] - expected) < 1e-6


def test_positional_encoding_worked_example_position_12():
  # d=4, pos=12: [sin(12), cos(12), sin(12/100), cos(12/100)] -- index 1 shares index 0's frequency
  pe = np.asarray(ops.sinusoidal_positional_encoding(13, 4))[12]
  np.testing.assert_allclose(pe, [math.sin(12), math.cos(12), math.sin(0.12), math.cos(0.12)], atol=1e-6)


def test_positional_encoding_at_matches_table_and_odd_width():
  table = ops.sinusoidal_positional_encoding(20, 7)
  at = ops.positional_encoding_at(jnp.arange(20)[None], 7)[0]
  np.testing.assert_allclose(at, table, atol=1e-5)
  assert table.shape == (20, 7)


def np_attention(q, k, v, mask=None):
  logits = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
  if mask is not None:
    logits = np.where(mask, logits, -np.inf)
  w = np_softmax(logits)
  return w @ v, w


def test_scaled_dot_product_attention_matches_numpy():
  q, k, v = (RNG.normal(size=(2, 3, 5, 8)) for _ in range(3))
  out, w = ops.scaled_dot_product_attention(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
                                            jnp.asarray(v, jnp.float32))
  ref_out, ref_w = np_attention(q, k, v)
  np.testing.assert_allclose(out, ref_out, atol=1e-5)
  np.testing.assert_allclose(w, ref_w, atol=1e-6)
  np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-6)


def test_hand_worked_attention():
  # one query, two keys: logits = [1*1, 1*0]/sqrt(1) -> weights [e/(e+1), 1/(e+1)]
  q = jnp.array([[1.0]]); k = jnp.array([[1.0], [0.0]]); v = jnp.array([[10.0], [20.0]])
  out, w = ops.scaled_dot_product_attention(q, k, v)
  e = math.e
  np.testing.assert_allclose(w, [[e / (e + 1), 1 / (e + 1)]], rtol=1e-6)
  np.testing.assert_allclose(out, [[10 * e / (e + 1) + 20 / (e + 1)]], rtol=1e-6)


def test_masks_and_masked_keys_get_exactly_zero_weight():
  valid = jnp.array([[True, True, True, False, False]])
  mask = ops.combine_masks(ops.padding_mask(valid, valid), ops.causal_mask(5))
  expected = np.array([[i < 3 and j < 3 and j <= i for j in range(5)] for i in range(5)])
  np.testing.assert_array_equal(np.asarray(mask)[0, 0], expected)
  q, k, v = (jnp.asarray(RNG.normal(size=(1, 1, 5, 4)), jnp.float32) for _ in range(3))
  out, w = ops.scaled_dot_product_attention(q, k, v, mask)
  w = np.asarray(w)[0, 0]
  assert np.all(w[~expected] == 0.0)
  np.testing.assert_allclose(w[:3].sum(-1), 1.0, atol=1e-6)
  ref_out, ref_w = np_attention(np.asarray(q)[0, 0, :3], np.asarray(k)[0, 0, :3], np.asarray(v)[0, 0, :3],
                                expected[:3, :3])
  np.testing.assert_allclose(np.asarray(out)[0, 0, :3], ref_out, atol=1e-5)


def test_fully_masked_row_is_finite_zero():
  q, k, v = (jnp.ones((1, 3, 4)) for _ in range(3))
  mask = jnp.array([[True, True, True], [False, False, False], [True, False, False]])
  out, w = ops.scaled_dot_product_attention(q, k, v, mask)
  assert np.all(np.isfinite(out)) and np.all(np.isfinite(w))
  np.testing.assert_array_equal(np.asarray(w)[0, 1], 0.0)
  grads = jax.grad(lambda q: ops.scaled_dot_product_attention(q, k, v, mask)[0].sum())(q)
  assert np.all(np.isfinite(grads))


def test_segment_mask():
  seg = jnp.array([[1, 1, 2, 2, 2, 0]])
  m = np.asarray(ops.segment_mask(seg, seg))[0, 0]
  s = np.asarray(seg)[0]
  expected = (s[:, None] == s[None, :]) & (s[:, None] != 0) & (s[None, :] != 0)
  np.testing.assert_array_equal(m, expected)


def test_multi_head_attention_matches_per_head_numpy():
  b, lq, lk, d, h = 2, 4, 6, 12, 3
  xq, xkv = RNG.normal(size=(b, lq, d)), RNG.normal(size=(b, lk, d))
  wq, wk, wv, wo = (RNG.normal(size=(d, d)) / math.sqrt(d) for _ in range(4))
  out, w = ops.multi_head_attention(*(jnp.asarray(a, jnp.float32) for a in (xq, xkv, wq, wk, wv, wo)), h)
  dk = d // h
  heads = []
  for i in range(h):
    cols = slice(i * dk, (i + 1) * dk)
    o, _ = np_attention(xq @ wq[:, cols], xkv @ wk[:, cols], xkv @ wv[:, cols])
    heads.append(o)
  ref = np.concatenate(heads, -1) @ wo
  np.testing.assert_allclose(out, ref, atol=1e-4)
  assert w.shape == (b, h, lq, lk)


def test_layer_norm_matches_numpy():
  x = RNG.normal(size=(3, 7, 10)) * 3 + 1
  g, b = RNG.normal(size=10), RNG.normal(size=10)
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  ref = g * (x - mu) / np.sqrt(var + 1e-6) + b
  out = ops.layer_norm(*(jnp.asarray(a, jnp.float32) for a in (x, g, b)))
  np.testing.assert_allclose(out, ref, atol=1e-4)


def test_feed_forward_matches_numpy():
  x = RNG.normal(size=(2, 5, 8))
  w1, b1, w2, b2 = RNG.normal(size=(8, 32)), RNG.normal(size=32), RNG.normal(size=(32, 8)), RNG.normal(size=8)
  ref = np.maximum(0, x @ w1 + b1) @ w2 + b2
  out = ops.feed_forward(*(jnp.asarray(a, jnp.float32) for a in (x, w1, b1, w2, b2)))
  np.testing.assert_allclose(out, ref, atol=1e-3)


def test_embedding_scale_and_tied_logits():
  table = RNG.normal(size=(11, 16))
  ids = np.array([[3, 0, 10]])
  np.testing.assert_allclose(ops.embed(jnp.asarray(ids), jnp.asarray(table, jnp.float32)),
                             table[ids] * 4.0, atol=1e-5)
  h = RNG.normal(size=(1, 3, 16))
  np.testing.assert_allclose(ops.tied_logits(jnp.asarray(h, jnp.float32), jnp.asarray(table, jnp.float32)),
                             h @ table.T, atol=1e-4)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_brute_force(eps):
  v = 7
  logits = RNG.normal(size=(2, 5, v))
  targets = RNG.integers(0, v, size=(2, 5))
  weights = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], float)
  total, count = 0.0, 0.0
  for b in range(2):
    for t in range(5):
      if not weights[b, t]:
        continue
      logp = logits[b, t] - np.log(np.exp(logits[b, t]).sum())
      q = np.full(v, eps / (v - 1))
      q[targets[b, t]] = 1 - eps
      assert abs(q.sum() - 1) < 1e-12
      total -= (q * logp).sum()
      count += 1
  loss, n = ops.label_smoothed_cross_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(targets),
                                             jnp.asarray(weights), eps)
  assert float(n) == count
  np.testing.assert_allclose(float(loss), total, rtol=1e-5)


def test_token_accuracy():
  logits = jnp.array([[[0.0, 1.0], [1.0, 0.0], [0.0, 5.0]]])
  correct, n = ops.token_accuracy(logits, jnp.array([[1, 1, 1]]), jnp.array([[1.0, 1.0, 0.0]]))
  assert (float(correct), float(n)) == (1.0, 2.0)


def test_rms_norm_matches_numpy_and_a_hand_worked_row():
  rng = np.random.default_rng(3)
  x, g = rng.normal(size=(2, 3, 8)) * 3 + 1, rng.normal(size=(8,))
  want = g * x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6)   # float64
  out = ops.rms_norm(jnp.asarray(x, jnp.float32), jnp.asarray(g, jnp.float32))
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
  # [3, 4]: mean of squares 12.5, so [3, 4] / sqrt(12.5) = [0.8485, 1.1314] (gamma 1, eps 0)
  row = ops.rms_norm(jnp.array([3.0, 4.0]), jnp.ones(2), eps=0.0)
  np.testing.assert_allclose(np.asarray(row), [3 / 12.5 ** 0.5, 4 / 12.5 ** 0.5], rtol=1e-6)
  # unlike LayerNorm, the mean is kept: a constant row is not sent to zero
  np.testing.assert_allclose(np.asarray(ops.rms_norm(jnp.full((4,), 2.0), jnp.ones(4), eps=0.0)),
                             np.ones(4), rtol=1e-6)
