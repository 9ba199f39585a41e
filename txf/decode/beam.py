"""Batched beam search with length normalisation over a ``logits_fn(ids, cache)`` callback.

Two sets per batch row, as in T5X / tensor2tensor: ``alive`` hypotheses (no EOS yet, extended
every step) and ``finished`` ones (ended in EOS, kept aside, never extended). Each step scores
all K*V one-token extensions of the alive beams and takes the best 2K (so at least K of them do
not end in EOS). Those among the best K that end in EOS enter the finished set (as in Hugging
Face's beam scorer, so that beam size 1 is exactly greedy); the best K that do not end in EOS
stay alive.

Scores: a finished hypothesis y of length |y| (EOS counted) scores log p(y) / lp(|y|) with
  gnmt:    lp(L) = ((5 + L) / 6)^alpha     (Wu et al. 2016)
  power:   lp(L) = L^alpha                  (Hugging Face's length_penalty=alpha)
  average: lp(L) = L                        (plain length normalisation)
  none:    lp(L) = 1

Stopping: by default a row stops when K hypotheses are finished and no alive beam can beat the
worst of them; ``early_stopping=True`` stops a row as soon as K are finished (Hugging Face's
``early_stopping=True``), and that row's finished set no longer changes.
"""

from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp

from txf.decode.greedy import BOS_ID, EOS_ID, PAD_ID, LogitsFn, check_length, forbid
from txf.core.config import LENGTH_PENALTIES
from txf.kernels.topk import top_k

NEG_INF = -1.0e7  # finite "impossible" score: no inf - inf NaNs
PENALTIES = LENGTH_PENALTIES  # txf.core.config's list, the one list of the names


def length_penalty(length: jnp.ndarray, alpha: float, kind: str = "gnmt") -> jnp.ndarray:
  r"""lp(L): ``gnmt`` ((5 + L) / 6)^alpha, ``power`` L^alpha, ``average`` L, ``none`` 1.

  $$lp_\text{gnmt}(L) = \Big(\frac{5 + L}{6}\Big)^{\alpha}, \qquad lp_\text{power}(L) = L^{\alpha}$$

  length: int or float [...] -> float32 [...].
  """
  length = jnp.asarray(length, jnp.float32)
  if kind == "gnmt":
    return ((5.0 + length) / 6.0) ** alpha
  if kind == "average" or (kind == "power" and alpha == 1.0):
    return length
  if kind == "power":
    return length ** alpha
  if kind == "none":
    return jnp.ones_like(length)
  raise ValueError(f"length_penalty must be one of {PENALTIES}, got {kind!r}")


_penalty = length_penalty  # beam_search's argument of the same name shadows the function


def _is_row_leaf(x: Any, rows: int = None) -> bool:
  """A per-row cache leaf: an array with ndim >= 1 (and leading dim ``rows`` when given)."""
  return hasattr(x, "ndim") and x.ndim >= 1 and (rows is None or x.shape[0] == rows)


def expand_to_beams(tree: Any, beam: int, batch_size: int = None) -> Any:
  """Repeat every per-row leaf [N, ...] -> [N * beam, ...]; row n -> rows n*beam .. (n+1)*beam-1.

  out[n * beam + k] = x[n] for k < beam. 0-d leaves (shared counters such as ``cache_index``)
  are left as they are. With ``batch_size`` given, only leaves whose leading dim equals it are
  expanded (others are treated as shared); otherwise every leaf with ndim >= 1 is.
  """
  return jax.tree_util.tree_map(
      lambda x: jnp.repeat(x, beam, axis=0) if _is_row_leaf(x, batch_size) else x, tree)


def gather_rows(tree: Any, rows: jnp.ndarray) -> Any:
  """Reorder every per-row leaf [N, ...] of a cache: out[i] = x[rows[i]], rows int [N].

  Leaves whose leading dim is not N (0-d counters) are returned unchanged. The default cache
  reorder of :func:`beam_search`; a model that knows some of its entries are equal for every beam
  of a source passes its own (txf.decode.adapter.reorder_cache skips them).
  """
  n = rows.shape[0]
  return jax.tree_util.tree_map(
      lambda x: jnp.take(x, rows, axis=0) if _is_row_leaf(x, n) else x, tree)


def beam_rows(beam_indices: jnp.ndarray, beam: int) -> jnp.ndarray:
  """Flat row indices of reordered beams: rows[b * K' + k] = b * K + beam_indices[b, k].

  beam_indices int [B, K'] (each in [0, K)) -> int [B * K'].
  """
  batch = beam_indices.shape[0]
  return (jnp.arange(batch)[:, None] * beam + beam_indices).reshape(-1)


def gather_beams(tree: Any, beam_indices: jnp.ndarray, batch_size: int, beam: int) -> Any:
  """Reorder the beams of every per-row leaf [B * beam, ...] (a flattened [B, beam, ...]).

  out[b * K' + k] = x[b * K + beam_indices[b, k]], with beam_indices int [B, K'] and K = beam;
  leaves whose leading dim is not B * K (0-d counters) are returned unchanged.
  """
  new_beam = beam_indices.shape[1]
  rows = beam_rows(beam_indices, beam)

  def gather(x):
    if not _is_row_leaf(x, batch_size * beam):
      return x
    return jnp.take(x, rows, axis=0).reshape((batch_size * new_beam,) + x.shape[1:])

  return jax.tree_util.tree_map(gather, tree)


def _take(x: jnp.ndarray, indices: jnp.ndarray) -> jnp.ndarray:
  """x [B, M, ...] gathered along axis 1 by indices int [B, K] -> [B, K, ...]."""
  idx = indices.reshape(indices.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


def top_log_probs(logits: jnp.ndarray, n: int, never_ids: Tuple[int, ...] = ()
                  ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """The ``n`` largest log-probabilities of each row of logits and their token ids.

  logits float [..., V] -> (log_softmax(logits)[..., top n] float32 [..., n], ids int32 [..., n]),
  best first. log_softmax(x)_v = (x_v - m) - log sum_u exp(x_u - m) with m = max_u x_u is monotone
  in x_v, so the top-n of the logits are the top-n of the log-probabilities: the top-k runs on
  the logits and the normaliser is subtracted from the n kept values only, with the same
  operations as ``jax.nn.log_softmax`` (one pass over [..., V] instead of writing and re-reading
  the [..., V] log-probabilities). ``never_ids`` are left out of the top n but stay in the
  normaliser (Hugging Face's bad-words rule: -inf on the log-probabilities, not renormalised).
  """
  logits = logits.astype(jnp.float32)
  top, ids = top_k(forbid(logits, never_ids), n)
  # m from its own max-reduction: taking it from ``top`` (its first value) makes XLA lower the
  # top-k as a full sort of each row (its TopK rewrite wants the sorted values used only once)
  peak = jnp.max(logits, axis=-1, keepdims=True)
  log_norm = jnp.log(jnp.sum(jnp.exp(logits - peak), axis=-1, keepdims=True))
  return (top - peak) - log_norm, ids


def beam_search(logits_fn: LogitsFn, cache: Any, batch_size: int, beam_size: int, max_len: int,
                alpha: float = 0.6, eos_id: int = EOS_ID, bos_id: int = BOS_ID,
                length_penalty: str = "gnmt", early_stopping: bool = False,
                never_ids: Tuple[int, ...] = (),
                reorder_cache: Callable[[Any, jnp.ndarray], Any] = gather_rows,
                expand_cache: Optional[Callable[[Any, int], Any]] = None
                ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """Beam search for argmax_y log p(y | x) / lp(|y|), batched, jit-compatible.

  The cache is given for ``batch_size`` rows and expanded for B * beam_size beams inside
  (``expand_cache``, default :func:`expand_to_beams`); when beams are reordered, ``reorder_cache(cache, rows)`` follows
  them (default :func:`gather_rows`: every per-row leaf gathered, 0-d leaves untouched). ``logits_fn`` is called on
  ids [B * K, 1] once per step, at most ``max_len`` times (a cache must hold ``max_len``
  positions). The loop stops early once, in every row, K hypotheses are finished and no alive
  beam can still beat the worst of them: with log-probs <= 0 an alive beam's final score is at
  most logp_alive / max_{L' > L} lp(L'). An ``eos_id`` never produced (e.g. -1) forces
  ``max_len`` steps.

  Reaching ``max_len`` counts as an end: alive hypotheses of length max_len without EOS compete
  with the finished ones on score logp / lp(max_len) (as in fairseq; T5X instead prefers any
  EOS-ended hypothesis, which can return a near-empty output for a row that wants a long one).

  Args:
    logits_fn: ``(ids int32 [N, 1], cache) -> (logits float32 [N, V], cache)``; V >= 2.
    cache: cache pytree for ``batch_size`` rows.
    batch_size: B; beam_size: K >= 1; max_len: most tokens per hypothesis (EOS included), >= 1.
    alpha: exponent of the GNMT penalty (ignored by the other kinds).
    eos_id, bos_id: special ids.
    length_penalty: ``"gnmt"``, ``"power"``, ``"average"`` or ``"none"``.
    early_stopping: stop a row once K hypotheses are finished (see the module docstring).
    never_ids: ids never generated (see :func:`top_log_probs`), e.g. Marian's pad.
    reorder_cache: ``(cache, rows int32 [B * K]) -> cache`` with row i of the result taken from
      row rows[i]; a model may skip entries that are equal for every beam of a source
      (txf.decode.adapter.reorder_cache).
    expand_cache: ``(cache, K) -> cache`` for B * K beams, called once before the loop; default
      :func:`expand_to_beams` (every per-row leaf repeated K times). A model may lay its cache out
      for beams its own way (txf.decode.adapter.expand_cache); ``reorder_cache`` must match it.
  Returns:
    (ids int32 [B, K, max_len], scores float32 [B, K]), best first per row; ids exclude BOS,
    include EOS, PAD (0) after it.
  """
  check_length("batch_size", batch_size)
  check_length("beam_size", beam_size)
  check_length("max_len", max_len)
  if length_penalty not in PENALTIES:
    raise ValueError(f"length_penalty must be one of {PENALTIES}, got {length_penalty!r}")
  b, k = batch_size, beam_size
  lp = lambda n: _penalty(n, alpha, length_penalty)
  lp_max_ahead = lambda n: jnp.maximum(lp(n), lp(max_len))  # lp is monotone in L

  def cond(state):
    step, _, alive_logp, _, finished_scores, finished, _ = state
    best_alive = alive_logp[:, 0] / lp_max_ahead(step + 1)
    worst_finished = jnp.min(jnp.where(finished, finished_scores, NEG_INF), axis=1)
    row_done = jnp.all(finished, axis=1)
    if not early_stopping:
      row_done = row_done & (worst_finished >= best_alive)
    return (step < max_len) & ~jnp.all(row_done)

  def body(state):
    step, alive_seqs, alive_logp, finished_seqs, finished_scores, finished, cache = state
    last = jnp.where(step == 0, bos_id,
                     jax.lax.dynamic_index_in_dim(alive_seqs, jnp.maximum(step - 1, 0), 2, False))
    logits, cache = logits_fn(last.reshape(b * k, 1), cache)
    vocab = logits.shape[-1]
    # the 2K best of the K*V extensions lie among each beam's 2K best tokens: top-k in two stages,
    # over [B*K, V] then [B, K*2K], instead of one over [B, K*V] rows
    n = min(2 * k, vocab)
    beam_logp, beam_token = top_log_probs(logits.reshape(b, k, vocab), n, never_ids)  # [B, K, n]
    candidates = (alive_logp[:, :, None] + beam_logp).reshape(b, k * n)
    top_logp, top_index = jax.lax.top_k(candidates, min(2 * k, k * n))  # [B, 2K]
    top_beam = top_index // n
    top_token = jnp.take_along_axis(beam_token.reshape(b, k * n), top_index, axis=1).astype(jnp.int32)
    top_seqs = jax.lax.dynamic_update_slice_in_dim(
        _take(alive_seqs, top_beam), top_token[:, :, None], step, axis=2)  # [B, 2K, T]
    is_eos = top_token == eos_id
    # an EOS candidate finishes only if it ranks among the K best (HF's rule; beam 1 == greedy)
    ends = is_eos & (top_logp > NEG_INF / 2) & (jnp.arange(top_logp.shape[1]) < k)
    if early_stopping:  # a row with K finished is done: its finished set stays as it is
      ends = ends & ~jnp.all(finished, axis=1, keepdims=True)

    # finished: merge the K kept aside with the new EOS-ending candidates, keep the best K
    new_scores = jnp.where(ends, top_logp / lp(step + 1), NEG_INF)
    merged_scores = jnp.concatenate([finished_scores, new_scores], axis=1)
    merged_flags = jnp.concatenate([finished, ends], axis=1)
    finished_scores, pick = jax.lax.top_k(jnp.where(merged_flags, merged_scores, NEG_INF), k)
    finished = _take(merged_flags, pick)
    finished_seqs = _take(jnp.concatenate([finished_seqs, top_seqs], axis=1), pick)

    # alive: the best K candidates that did not end in EOS; reorder the cache to follow them
    alive_logp, pick = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_logp), k)
    alive_seqs = _take(top_seqs, pick)
    cache = reorder_cache(cache, beam_rows(_take(top_beam, pick), k))
    return step + 1, alive_seqs, alive_logp, finished_seqs, finished_scores, finished, cache

  alive_logp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (b, 1))
  state = (jnp.array(0, jnp.int32), jnp.zeros((b, k, max_len), jnp.int32), alive_logp,
           jnp.zeros((b, k, max_len), jnp.int32), jnp.full((b, k), NEG_INF, jnp.float32),
           jnp.zeros((b, k), bool),
           expand_to_beams(cache, k, b) if expand_cache is None else expand_cache(cache, k))
  step, alive_seqs, alive_logp, finished_seqs, finished_scores, _, _ = jax.lax.while_loop(
      cond, body, state)

  # hypotheses that reached max_len without EOS compete on score (an early stop means none can win)
  alive_scores = jnp.where(step == max_len, alive_logp / lp(max_len), NEG_INF)
  scores, order = jax.lax.top_k(jnp.concatenate([finished_scores, alive_scores], axis=1), k)
  return _take(jnp.concatenate([finished_seqs, alive_seqs], axis=1), order), scores
