"""The position encodings that act inside attention (txf.ops.positional): RoPE, ALiBi and T5's
relative bias, each against numpy float64 written from the papers (or hand-worked values), and the
optional score bias of the attention formula's three paths (txf.ops, the bf16 restatement, the
fused kernel)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from txf import kernels, ops
from txf.kernels import bf16

RNG = np.random.default_rng(7)


def rope_np(x, positions, base=10000.0):
  """Su et al.'s rotation in float64: pair (x_2i, x_2i+1) of each row turned by p * base^(-2i/d).
  x [..., L, d]; positions [L]."""
  out = np.empty_like(x, dtype=np.float64)
  d = x.shape[-1]
  for row, p in enumerate(positions):
    for i in range(d // 2):
      angle = p * base ** (-2 * i / d)
      c, s = math.cos(angle), math.sin(angle)
      a, b = x[..., row, 2 * i], x[..., row, 2 * i + 1]
      out[..., row, 2 * i], out[..., row, 2 * i + 1] = c * a - s * b, s * a + c * b
  return out


def bucket_np(relative, bidirectional, num_buckets, max_distance):
  """A port of T5's _relative_position_bucket (Mesh TensorFlow), scalar, float64 logs."""
  ret, n = 0, -relative
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0) * num_buckets
    n = abs(n)
  else:
    n = max(n, 0)
  max_exact = num_buckets // 2
  if n < max_exact:
    return ret + n
  val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                        * (num_buckets - max_exact))
  return ret + min(val, num_buckets - 1)


@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_rope_rotates_pairs_as_numpy(base):
  x = RNG.normal(size=(2, 3, 5, 8))
  positions = np.array([0, 1, 2, 7, 30])
  got = ops.rope(jnp.asarray(x, jnp.float32), jnp.asarray(positions)[None], base)
  np.testing.assert_allclose(np.asarray(got), rope_np(x, positions, base), rtol=1e-5, atol=1e-5)
  # per-row positions (packed rows): row b rotated at its own positions
  rows = np.array([[0, 1, 2, 3, 4], [0, 1, 0, 1, 2]])
  got = ops.rope(jnp.asarray(x, jnp.float32), jnp.asarray(rows), base)
  for b in range(2):
    np.testing.assert_allclose(np.asarray(got[b]), rope_np(x[b], rows[b], base), atol=1e-5)


def test_rope_scores_depend_only_on_the_offset():
  # q_m . k_n for one q and k vector rotated at positions m and n: equal for equal m - n
  q, k = RNG.normal(size=(1, 1, 1, 16)), RNG.normal(size=(1, 1, 1, 16))
  at = lambda x, p: np.asarray(ops.rope(jnp.asarray(x, jnp.float32), jnp.asarray([[p]])),
                               np.float64)[0, 0, 0]
  score = lambda m, n: float(at(q, m) @ at(k, n))
  for offset in (0, 3, -5):
    scores = [score(m, m - offset) for m in (5, 9, 20, 41)]
    np.testing.assert_allclose(scores, scores[0], rtol=1e-4, atol=1e-4)
  assert abs(score(9, 9) - score(9, 6)) > 1e-2  # and the offset does matter
  np.testing.assert_allclose(score(0, 0), float(q[0, 0, 0] @ k[0, 0, 0]), rtol=1e-5)


def test_rope_refuses_an_odd_head_width():
  with pytest.raises(ValueError, match="must be even"):
    ops.rope(jnp.ones((1, 1, 2, 5)), jnp.arange(2)[None])


def test_alibi_slopes_hand_lists():
  np.testing.assert_array_equal(ops.alibi_slopes(8), [1 / 2 ** e for e in range(1, 9)])
  # H=6: the 4 slopes of H'=4 (2^-2, 2^-4, 2^-6, 2^-8), then every other of H=8's: 2^-1, 2^-3
  np.testing.assert_array_equal(ops.alibi_slopes(6),
                                [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
  np.testing.assert_array_equal(ops.alibi_slopes(2), [1 / 16, 1 / 256])
  np.testing.assert_array_equal(ops.alibi_slopes(1), [1 / 256])


def test_alibi_bias_matches_numpy():
  q_pos, k_pos = np.array([[0, 1, 2, 3], [0, 1, 0, 1]]), np.array([[0, 1, 2, 3, 4], [2, 0, 1, 5, 3]])
  slopes = ops.alibi_slopes(4)
  got = np.asarray(ops.alibi_bias(jnp.asarray(q_pos), jnp.asarray(k_pos), slopes))
  assert got.shape == (2, 4, 4, 5)
  for b in range(2):
    for h in range(4):
      for i in range(4):
        for j in range(5):
          assert got[b, h, i, j] == pytest.approx(-slopes[h] * abs(q_pos[b, i] - k_pos[b, j]))
  # causal: for j <= i the bias is the paper's m_h (j - i)
  causal = np.asarray(ops.alibi_bias(jnp.arange(6)[None], jnp.arange(6)[None], slopes))
  i, j = np.tril_indices(6)
  np.testing.assert_allclose(causal[0][:, i, j], slopes[:, None] * (j - i)[None], atol=1e-7)


def test_t5_buckets_hand_worked():
  # bidirectional, 32 buckets, max_distance 128: 16 per sign, 8 exact; r = j - i
  cases = {0: 0, -3: 3, 3: 19, -8: 8, -20: 10, -127: 15, -128: 15, -1000: 15, 200: 31, 1: 17}
  got = ops.relative_position_bucket(jnp.asarray(list(cases)), True, 32, 128)
  assert np.asarray(got).tolist() == list(cases.values())
  # -20: 8 + floor(ln(20/8) / ln(128/8) * 8) = 8 + floor(2.64) = 10
  # unidirectional (causal), 32 buckets, 16 exact: keys after the query share bucket 0
  cases = {5: 0, 0: 0, -5: 5, -15: 15, -16: 16, -32: 21, -100: 30, -128: 31, -500: 31}
  got = ops.relative_position_bucket(jnp.asarray(list(cases)), False, 32, 128)
  assert np.asarray(got).tolist() == list(cases.values())
  # -32: 16 + floor(ln 2 / ln 8 * 16) = 16 + 5;  -100: 16 + floor(ln 6.25 / ln 8 * 16) = 16 + 14


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 16), (16, 40)])
def test_t5_buckets_match_the_papers_code(bidirectional, num_buckets, max_distance):
  relative = np.array([-300, -128, -127, -64, -33, -17, -16, -9, -8, -5, -4, -3, -2, -1, 0, 1, 2,
                       3, 4, 7, 8, 15, 16, 39, 40, 100, 127, 128, 129, 500])
  got = np.asarray(ops.relative_position_bucket(jnp.asarray(relative), bidirectional, num_buckets,
                                                max_distance))
  want = [bucket_np(int(r), bidirectional, num_buckets, max_distance) for r in relative]
  assert got.tolist() == want
  assert got.min() >= 0 and got.max() < num_buckets


def test_relative_bias_gathers_the_bucket_rows():
  table = RNG.normal(size=(8, 3))
  q_pos, k_pos = np.array([[0, 1, 2, 9]]), np.array([[0, 4, 1, 2, 30]])
  for bidirectional in (True, False):
    got = np.asarray(ops.relative_position_bias(jnp.asarray(table, jnp.float32), jnp.asarray(q_pos),
                                                jnp.asarray(k_pos), bidirectional, max_distance=16))
    assert got.shape == (1, 3, 4, 5)
    for i in range(4):
      for j in range(5):
        row = bucket_np(int(k_pos[0, j] - q_pos[0, i]), bidirectional, 8, 16)
        np.testing.assert_allclose(got[0, :, i, j], table[row], rtol=1e-6)


def attention_np(q, k, v, mask, bias):
  s = np.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1]) + bias
  s = np.where(mask, s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  return (w / w.sum(-1, keepdims=True)) @ v


def test_attention_formula_adds_the_bias_on_every_path():
  q, k, v = RNG.normal(size=(2, 2, 3, 4)), RNG.normal(size=(2, 2, 5, 4)), RNG.normal(size=(2, 2, 5, 4))
  bias = RNG.normal(size=(1, 2, 3, 5)) * 3
  mask = RNG.random((2, 1, 3, 5)) < 0.7
  mask[..., 0] = True
  want = attention_np(q, k, v, mask, bias)
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  args = (f32(q), f32(k), f32(v), jnp.asarray(mask))
  out, _ = ops.scaled_dot_product_attention(*args, bias=f32(bias))
  np.testing.assert_allclose(out, want, atol=1e-5)
  for impl in ("reference", "fused"):
    out, _ = kernels.attend(*args, impl, bias=f32(bias))
    np.testing.assert_allclose(out, want, atol=1e-5)
  bf = lambda a: jnp.asarray(a, jnp.bfloat16)
  out, _ = bf16.scaled_dot_product_attention(bf(q), bf(k), bf(v), jnp.asarray(mask), f32(bias))
  np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=0.1)
  # no bias: the paper's formula, exactly as before
  plain, _ = ops.scaled_dot_product_attention(*args)
  np.testing.assert_allclose(plain, attention_np(q, k, v, mask, 0.0), atol=1e-5)
  assert not np.allclose(plain, want, atol=1e-2)
