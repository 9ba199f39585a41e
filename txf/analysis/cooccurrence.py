"""Seed 003: word embeddings from co-occurrence counts by PCA, with power iteration and deflation.

The pipeline, one pure function per step:

  sequences --cooccurrence_counts--> C [V, V] --standardise--> Z [V, V] --covariance--> S [V, V]
    --top_k_eigenpairs (power iteration + deflation A' = A - lambda v v^T)--> (lambda [k], W [V, k])
    --project--> E = Z W [V, k]

Row i of C is word i's context profile (a sample); column j is "how often context word j is near"
(a feature). PCA runs over the features, so each word gets a k-dimensional embedding.
"""

import functools
from typing import Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

Sequences = Union[Sequence[Sequence[int]], np.ndarray, jnp.ndarray]


def pad_sequences(sequences: Sequences, pad_id: int = -1) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """Ragged token-id sequences -> a padded rectangle and its validity mask (host-side, not traced).

  Args:
    sequences: a list of int sequences of any lengths, or an int array [B, L] (all valid).
    pad_id: the filler written into the padded positions (it is masked out, never counted).
  Returns:
    (ids int32 [B, L_max], valid bool [B, L_max]).
  """
  if isinstance(sequences, (np.ndarray, jnp.ndarray)):
    ids = np.asarray(sequences, dtype=np.int32)
    if ids.ndim == 1:
      ids = ids[None]
    if ids.ndim != 2:
      raise ValueError(f"expected an id array [B, L], got shape {ids.shape}")
    return jnp.asarray(ids), jnp.ones(ids.shape, bool)
  seqs = [np.asarray(s, dtype=np.int32).reshape(-1) for s in sequences]
  length = max([len(s) for s in seqs], default=0)
  ids = np.full((len(seqs), length), pad_id, np.int32)
  valid = np.zeros((len(seqs), length), bool)
  for row, s in enumerate(seqs):
    ids[row, :len(s)] = s
    valid[row, :len(s)] = True
  return jnp.asarray(ids), jnp.asarray(valid)


@functools.partial(jax.jit, static_argnames=("vocab_size", "window"))
def _windowed_counts(ids: jnp.ndarray, valid: jnp.ndarray, vocab_size: int, window: int) -> jnp.ndarray:
  """The traced core of :func:`cooccurrence_counts`: one scatter-add per offset d = 1..window."""
  counts = jnp.zeros((vocab_size, vocab_size), jnp.int32)
  length = ids.shape[1]
  for d in range(1, min(window, length - 1) + 1):
    left, right = ids[:, :-d], ids[:, d:]
    pair_ok = valid[:, :-d] & valid[:, d:]
    left = jnp.where(pair_ok, left, 0).reshape(-1)
    right = jnp.where(pair_ok, right, 0).reshape(-1)
    add = pair_ok.astype(jnp.int32).reshape(-1)
    # token `left` sees `right` d places after it, and `right` sees `left` d places before it.
    counts = counts.at[left, right].add(add).at[right, left].add(add)
  return counts


def cooccurrence_counts(sequences: Sequences, vocab_size: int, window: int) -> jnp.ndarray:
  """Symmetric windowed co-occurrence counts.

  C[i, j] = sum over sequences s, positions t != u with s[t] = i, s[u] = j and |t - u| <= window of 1,

  i.e. the number of times j occurs within ``window`` positions of an occurrence of i, within one
  sequence (windows never cross sequence boundaries; a position never co-occurs with itself, but a
  repeated word does: "a a" gives C[a, a] = 2). C is symmetric and every row sums to the number of
  (occurrence, neighbour) pairs of that word.

  Args:
    sequences: list of int sequences (ragged) or int array [B, L]; ids in [0, vocab_size).
    vocab_size: V.
    window: how many positions to each side count as context (>= 1).
  Returns:
    int32 [V, V].
  """
  if window < 1:
    raise ValueError(f"window must be >= 1, got {window}")
  ids, valid = pad_sequences(sequences)
  if ids.size == 0:
    return jnp.zeros((vocab_size, vocab_size), jnp.int32)
  return _windowed_counts(ids, valid, vocab_size=vocab_size, window=window)


@functools.partial(jax.jit, static_argnames=("ddof",))
def standardise(c: jnp.ndarray, ddof: int = 0) -> jnp.ndarray:
  """Z-score every column: Z[:, j] = (C[:, j] - mean_j) / std_j, with Z[:, j] = 0 where std_j = 0.

  mean_j = (1/n) sum_i C[i, j];  std_j = sqrt(sum_i (C[i, j] - mean_j)^2 / (n - ddof)).

  Args:
    c: [n, p] (integer counts are cast to the default float: float32, or float64 under x64).
    ddof: 0 for the population standard deviation (the default), 1 for the sample one.
  Returns:
    [n, p] floating, every non-constant column with mean 0 and std 1.
  """
  x = c if jnp.issubdtype(c.dtype, jnp.floating) else c.astype(jax.dtypes.canonicalize_dtype(jnp.float64))
  centred = x - x.mean(axis=0, keepdims=True)
  std = jnp.sqrt(jnp.square(centred).sum(axis=0, keepdims=True) / (x.shape[0] - ddof))
  safe = jnp.where(std > 0, std, 1.0)
  return jnp.where(std > 0, centred / safe, 0.0)


@jax.jit
def covariance(z: jnp.ndarray) -> jnp.ndarray:
  """Sample covariance of column-centred data: S = Z^T Z / (n - 1).

  Args:
    z: [n, p] with zero-mean columns (e.g. from :func:`standardise`).
  Returns:
    [p, p], symmetric positive semi-definite.
  """
  return z.T @ z / (z.shape[0] - 1)


def _default_start(n: int, dtype) -> jnp.ndarray:
  """A fixed, generic start vector (drawn once from key 0): almost surely not orthogonal to v_1."""
  return jax.random.normal(jax.random.key(0), (n,), dtype)


def _canonical_sign(v: jnp.ndarray) -> jnp.ndarray:
  """Flip v so that its largest-magnitude entry is positive (eigenvectors are defined up to sign)."""
  return v * jnp.where(v[jnp.argmax(jnp.abs(v))] < 0, -1.0, 1.0).astype(v.dtype)


@functools.partial(jax.jit, static_argnames=("max_iters",))
def power_iteration(a: jnp.ndarray, max_iters: int = 1000, tol: Optional[float] = None,
                    v0: Optional[jnp.ndarray] = None) -> Tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  r"""The dominant eigenpair of a symmetric matrix by power iteration.

  $$v_{t+1} = \frac{A v_t}{\lVert A v_t \rVert}, \qquad \lambda = v^\top A v$$

  v_{t+1} = A v_t / ||A v_t||, stopped when ||v_{t+1} - s v_t|| < tol (s = sign(v_{t+1} . v_t), so a
  negative eigenvalue's sign flips do not count as change) or after ``max_iters`` steps;
  lambda = v^T A v (the Rayleigh quotient, v unit-norm). Converges at rate |lambda_2 / lambda_1| to
  the eigenvalue of largest magnitude (the largest one for a PSD matrix such as a covariance).

  Args:
    a: symmetric [n, n].
    max_iters: iteration cap (static).
    tol: stopping tolerance; None means 100 * machine epsilon of a's dtype.
    v0: start vector [n]; None means a fixed random vector (key 0).
  Returns:
    (lambda scalar, v [n] unit-norm with its largest-magnitude entry positive, iterations int32).
  """
  n = a.shape[0]
  tol = 100 * jnp.finfo(a.dtype).eps if tol is None else tol
  v = _default_start(n, a.dtype) if v0 is None else v0.astype(a.dtype)
  v = v / jnp.linalg.norm(v)

  def step(v):
    w = a @ v
    norm = jnp.linalg.norm(w)
    return jnp.where(norm > 0, w / jnp.where(norm > 0, norm, 1.0), v)  # A v = 0: v is an eigenvector

  def cond(carry):
    _, delta, it = carry
    return (delta >= tol) & (it < max_iters)

  def body(carry):
    v, _, it = carry
    w = step(v)
    s = jnp.where(w @ v < 0, -1.0, 1.0).astype(v.dtype)
    return w, jnp.linalg.norm(w - s * v), it + 1

  v, _, iters = jax.lax.while_loop(cond, body, (v, jnp.asarray(jnp.inf, a.dtype), jnp.int32(0)))
  v = _canonical_sign(v)
  return v @ a @ v, v, iters


@functools.partial(jax.jit, static_argnames=("k", "max_iters"))
def top_k_eigenpairs(a: jnp.ndarray, k: int, max_iters: int = 1000, tol: Optional[float] = None
                     ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """The k dominant eigenpairs of a symmetric matrix by power iteration with deflation.

  For m = 1..k: (lambda_m, v_m) = power_iteration(A_m) with A_1 = A and A_{m+1} = A_m - lambda_m v_m v_m^T
  (Hotelling deflation: v_m's eigenvalue becomes 0, the others stay). Exact eigenpairs need a gap
  between lambda_k and lambda_{k+1}; errors in early pairs carry into later ones.

  Args:
    a: symmetric [n, n] (PSD for "top" to mean "largest").
    k: number of pairs (static), k <= n.
  Returns:
    (eigenvalues [k] in the order found, eigenvectors [n, k] as unit-norm columns).
  """
  if k > a.shape[0]:
    raise ValueError(f"k={k} exceeds the matrix size {a.shape[0]}")

  def one_pair(a_m, _):
    lam, v, _ = power_iteration(a_m, max_iters=max_iters, tol=tol)
    return a_m - lam * jnp.outer(v, v), (lam, v)

  _, (lams, vecs) = jax.lax.scan(one_pair, a, None, length=k)
  return lams, vecs.T


@jax.jit
def project(z: jnp.ndarray, components: jnp.ndarray) -> jnp.ndarray:
  """Coordinates on the principal components: E = Z W.

  Args:
    z: [n, p] standardised data; components: W [p, k] unit-norm eigenvectors as columns.
  Returns:
    [n, k].
  """
  return z @ components


def pca_embeddings(sequences: Sequences, vocab_size: int, k: int, window: int,
                   max_iters: int = 1000, tol: Optional[float] = None) -> jnp.ndarray:
  """k-dimensional word embeddings: E = standardise(C) W_k, W_k the top-k eigenvectors of cov(Z).

  C = cooccurrence_counts(sequences, V, window), Z = standardise(C), S = Z^T Z / (V - 1),
  (lambda, W_k) = top_k_eigenpairs(S, k), E = Z W_k. Row i is word i's embedding; words that
  never occur get the same embedding as any other word with an all-zero context row.

  Args:
    sequences: list of int sequences or int array [B, L]; vocab_size: V; k: embedding size;
    window: co-occurrence half-window.
  Returns:
    [V, k], float32 (float64 under x64).
  """
  z = standardise(cooccurrence_counts(sequences, vocab_size, window))
  _, w = top_k_eigenpairs(covariance(z), k, max_iters=max_iters, tol=tol)
  return project(z, w)


def _cosine_to_all(embeddings: jnp.ndarray, query: jnp.ndarray) -> jnp.ndarray:
  """cos(e_i, q) = e_i . q / (||e_i|| ||q||) for every row i; 0 where a norm is 0."""
  norms = jnp.linalg.norm(embeddings, axis=-1) * jnp.linalg.norm(query)
  return jnp.where(norms > 0, embeddings @ query / jnp.where(norms > 0, norms, 1.0), 0.0)


@functools.partial(jax.jit, static_argnames=("n",))
def nearest_neighbours(embeddings: jnp.ndarray, index: int, n: int) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """The n rows most cosine-similar to row ``index``, excluding itself.

  cos(i, j) = e_i . e_j / (||e_i|| ||e_j||), ranked high to low (ties: lower index first).

  Args:
    embeddings: [V, k]; index: the query row; n: how many neighbours (static, n <= V - 1).
  Returns:
    (indices int32 [n], cosine similarities [n]).
  """
  sims = _cosine_to_all(embeddings, embeddings[index])
  sims = sims.at[index].set(-jnp.inf)
  top, idx = jax.lax.top_k(sims, n)
  return idx.astype(jnp.int32), top


@functools.partial(jax.jit, static_argnames=("n",))
def analogy(embeddings: jnp.ndarray, a: int, b: int, c: int, n: int = 1
            ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """Analogy "b is to a as c is to ?": the rows nearest (cosine) to e_a - e_b + e_c, not a, b or c.

  Ranked by cos(e_j, e_a - e_b + e_c) over j not in {a, b, c}; with a = king, b = man,
  c = woman the answer should be queen.

  Args:
    embeddings: [V, k]; a, b, c: row indices; n: how many answers (static, n <= V - 3).
  Returns:
    (indices int32 [n], cosine similarities [n]).
  """
  sims = _cosine_to_all(embeddings, embeddings[a] - embeddings[b] + embeddings[c])
  sims = sims.at[jnp.stack([a, b, c])].set(-jnp.inf)
  top, idx = jax.lax.top_k(sims, n)
  return idx.astype(jnp.int32), top
