"""Word embeddings from co-occurrence counts by PCA (txf.analysis.cooccurrence): counts, standardisation, power iteration + deflation, projection."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.analysis import cooccurrence as co


def brute_force_counts(sequences, vocab_size, window):
  """C[i, j] by the definition: every ordered pair of distinct positions at distance <= window."""
  c = np.zeros((vocab_size, vocab_size), np.int64)
  for s in sequences:
    for t in range(len(s)):
      for u in range(len(s)):
        if t != u and abs(t - u) <= window:
          c[s[t], s[u]] += 1
  return c


def spd_with_spectrum(eigenvalues, seed=0):
  """Q diag(eigenvalues) Q^T for a random orthogonal Q (numpy float64)."""
  rng = np.random.default_rng(seed)
  q, _ = np.linalg.qr(rng.normal(size=(len(eigenvalues), len(eigenvalues))))
  return q @ np.diag(eigenvalues) @ q.T


def test_counts_hand_worked():
  # "the cat sat the" as ids 0 1 2 0 (the=0, cat=1, sat=2).
  # window 1 pairs: (the,cat) (cat,sat) (sat,the), each counted both ways.
  c1 = np.asarray(co.cooccurrence_counts([[0, 1, 2, 0]], vocab_size=3, window=1))
  np.testing.assert_array_equal(c1, [[0, 1, 1],
                                     [1, 0, 1],
                                     [1, 1, 0]])
  # window 2 adds distance-2 pairs (the@0, sat@2) and (cat@1, the@3).
  c2 = np.asarray(co.cooccurrence_counts([[0, 1, 2, 0]], vocab_size=3, window=2))
  np.testing.assert_array_equal(c2, [[0, 2, 2],
                                     [2, 0, 1],
                                     [2, 1, 0]])
  # window 3 adds (the@0, the@3): a repeated word co-occurs with itself, once each way.
  c3 = np.asarray(co.cooccurrence_counts([[0, 1, 2, 0]], vocab_size=3, window=3))
  assert c3[0, 0] == 2
  # windows never cross sequence boundaries: [0] [1] share no window.
  np.testing.assert_array_equal(co.cooccurrence_counts([[0], [1]], 2, 5), np.zeros((2, 2)))


@pytest.mark.parametrize("window", [1, 3])
def test_counts_match_brute_force_on_ragged_sequences(window):
  rng = np.random.default_rng(window)
  seqs = [list(rng.integers(0, 7, size=n)) for n in (0, 1, 3, 9, 12)]
  got = np.asarray(co.cooccurrence_counts(seqs, vocab_size=7, window=window))
  np.testing.assert_array_equal(got, brute_force_counts(seqs, 7, window))
  np.testing.assert_array_equal(got, got.T)


def test_counts_accept_a_rectangular_array():
  ids = np.array([[3, 1, 4, 1, 5], [2, 6, 5, 3, 5]])
  got = np.asarray(co.cooccurrence_counts(ids, vocab_size=7, window=2))
  np.testing.assert_array_equal(got, brute_force_counts(ids.tolist(), 7, 2))


def test_standardise_and_covariance_against_numpy():
  rng = np.random.default_rng(0)
  c = rng.integers(0, 9, size=(10, 4)).astype(np.float32)
  c[:, 2] = 5.0  # a constant column: std 0 must give zeros, not NaN
  z = np.asarray(co.standardise(jnp.asarray(c)))
  expected = (c - c.mean(0)) / np.where(c.std(0) > 0, c.std(0), 1.0)
  expected[:, 2] = 0.0
  np.testing.assert_allclose(z, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(co.covariance(jnp.asarray(z))), np.cov(z, rowvar=False),
                             rtol=1e-5, atol=1e-6)


def test_power_iteration_and_deflation_match_eigh_float64():
  spectrum = np.array([9.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.1, 0.05])
  a = spd_with_spectrum(spectrum, seed=1)
  expected_vals, expected_vecs = np.linalg.eigh(a)  # ascending
  expected_vals, expected_vecs = expected_vals[::-1], expected_vecs[:, ::-1]
  with jax.enable_x64(True):
    lam, v, iters = co.power_iteration(jnp.asarray(a))
    assert v.dtype == jnp.float64 and int(iters) < 1000
    np.testing.assert_allclose(float(lam), expected_vals[0], rtol=1e-12)
    np.testing.assert_allclose(abs(float(v @ expected_vecs[:, 0])), 1.0, atol=1e-12)
    vals, vecs = co.top_k_eigenpairs(jnp.asarray(a), k=4)
  vals, vecs = np.asarray(vals), np.asarray(vecs)
  np.testing.assert_allclose(vals, expected_vals[:4], rtol=1e-10)
  signs = np.sign(np.sum(vecs * expected_vecs[:, :4], axis=0))
  np.testing.assert_allclose(vecs * signs, expected_vecs[:, :4], atol=1e-9)
  np.testing.assert_allclose(np.linalg.norm(vecs, axis=0), 1.0, atol=1e-12)


def test_power_iteration_stops_at_the_iteration_cap_and_accepts_a_start_vector():
  a = spd_with_spectrum(np.array([1.0, 0.99, 0.5]), seed=2)  # slow: ratio 0.99
  lam, v, iters = co.power_iteration(jnp.asarray(a, jnp.float32), max_iters=7,
                                     v0=jnp.ones(3))
  assert int(iters) == 7
  assert abs(float(jnp.linalg.norm(v)) - 1.0) < 1e-6


def test_projection_and_pca_embeddings_against_numpy():
  rng = np.random.default_rng(0)
  zipf = 1.0 / np.arange(1, 13)
  seqs = [list(rng.choice(12, size=30, p=zipf / zipf.sum())) for _ in range(8)]
  k = 3
  with jax.enable_x64(True):
    got = np.asarray(co.pca_embeddings([np.asarray(s) for s in seqs], vocab_size=12, k=k, window=2,
                                       tol=1e-13))
  # Independent numpy pipeline: counts by brute force, z-score, np.cov, eigh, Z W.
  c = brute_force_counts(seqs, 12, 2).astype(np.float64)
  std = c.std(0)
  z = np.where(std > 0, (c - c.mean(0)) / np.where(std > 0, std, 1.0), 0.0)
  vals, vecs = np.linalg.eigh(np.cov(z, rowvar=False))
  assert vals[-k - 1] < 0.9 * vals[-k]  # the top-k subspace is well defined
  expected = z @ vecs[:, ::-1][:, :k]
  signs = np.sign(np.sum(got * expected, axis=0))
  np.testing.assert_allclose(got * signs, expected, rtol=1e-5, atol=1e-5)
  # project() alone against numpy
  w = rng.normal(size=(12, k))
  np.testing.assert_allclose(np.asarray(co.project(jnp.asarray(z, jnp.float32), jnp.asarray(w, jnp.float32))),
                             z @ w, rtol=1e-4, atol=1e-4)


def test_embeddings_separate_two_topics():
  # Words 0-4 only ever appear with each other, words 5-9 likewise: neighbours stay in their topic.
  rng = np.random.default_rng(4)
  seqs = [list(rng.integers(0, 5, size=20)) for _ in range(20)] + \
         [list(rng.integers(5, 10, size=20)) for _ in range(20)]
  emb = co.pca_embeddings(seqs, vocab_size=10, k=2, window=2)
  idx, sims = co.nearest_neighbours(emb, 0, 4)
  assert set(np.asarray(idx).tolist()) == {1, 2, 3, 4}
  idx, _ = co.nearest_neighbours(emb, 7, 4)
  assert set(np.asarray(idx).tolist()) == {5, 6, 8, 9}


def test_nearest_neighbours_cosine_against_numpy():
  rng = np.random.default_rng(5)
  emb = rng.normal(size=(9, 4)).astype(np.float32)
  idx, sims = co.nearest_neighbours(jnp.asarray(emb), 2, 3)
  unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
  cos = unit @ unit[2]
  cos[2] = -np.inf
  order = np.argsort(-cos)[:3]
  np.testing.assert_array_equal(np.asarray(idx), order)
  np.testing.assert_allclose(np.asarray(sims), cos[order], rtol=1e-5)


def test_analogy_king_man_woman_queen():
  # axes: [royal, male, female]; the answer excludes the three query words.
  words = ["king", "queen", "man", "woman", "apple"]
  emb = jnp.asarray([[1.0, 1.0, 0.0],    # king
                     [1.0, 0.0, 1.0],    # queen
                     [0.0, 1.0, 0.0],    # man
                     [0.0, 0.0, 1.0],    # woman
                     [-1.0, 0.2, 0.2]])  # apple
  idx, sims = co.analogy(emb, words.index("king"), words.index("man"), words.index("woman"), n=2)
  assert words[int(idx[0])] == "queen"
  np.testing.assert_allclose(float(sims[0]), 1.0, rtol=1e-6)
  assert int(idx[1]) == words.index("apple")  # king, man and woman are never answers
