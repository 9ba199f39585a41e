"""Decoding algorithms against hand-built logits functions whose best sequences are known.

T5X style: each ``logits_fn`` below is a small table of next-token log-probs (conditioned on the
last token, the step counter or per-row state kept in the cache), so the expected outputs are
written down by hand or enumerated exhaustively in numpy, never produced by the code under test.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.decode import (beam_search, expand_to_beams, filter_logits, gather_beams, greedy_decode,
                        sample)
from txf.decode.beam import top_log_probs
from txf.kernels import blocked_top_k

PAD, BOS, EOS = 0, 1, 2


def log_probs(rows):
  """{token: prob} per row -> float32 [R, V] log-probs, the leftover mass spread over other ids."""
  vocab = 8
  out = np.zeros((len(rows), vocab))
  for r, probs in enumerate(rows):
    rest = [v for v in range(vocab) if v not in probs]
    left = 1.0 - sum(probs.values())
    for v in range(vocab):
      out[r, v] = probs.get(v, left / len(rest))
  return np.log(out).astype(np.float32)


def table_logits_fn(table):
  """Next-token log-probs depend only on the last fed token: table [V, V]; cache {"step": 0-d}."""
  table = jnp.asarray(table, jnp.float32)

  def logits_fn(ids, cache):
    return table[ids[:, -1]], {"step": cache["step"] + ids.shape[1]}

  return logits_fn


def row_step_logits_fn(tokens, vocab=8):
  """Row b at step t prefers tokens[b][t] (logit 0 vs -5); cache {"row": int [N], "step": 0-d}."""
  tokens = jnp.asarray(tokens, jnp.int32)

  def logits_fn(ids, cache):
    step = jnp.minimum(cache["step"], tokens.shape[1] - 1)
    want = tokens[cache["row"], step]
    logits = jnp.where(jnp.arange(vocab)[None, :] == want[:, None], 0.0, -5.0)
    return logits, {"row": cache["row"], "step": cache["step"] + 1}

  return logits_fn


def history_logits_fn(table):
  """log-probs table[row, prev, last, :] where ``prev`` (the token fed one step earlier) lives
  only in the cache: a beam search that reorders beams without gathering the cache gets it wrong.

  table float [B, V, V, V]; cache {"row": int [N], "prev": int [N], "step": 0-d}.
  """
  table = jnp.asarray(table, jnp.float32)

  def logits_fn(ids, cache):
    last = ids[:, -1]
    logits = table[cache["row"], cache["prev"], last]
    return logits, {"row": cache["row"], "prev": last, "step": cache["step"] + 1}

  return logits_fn


def counter_cache(batch):
  return {"row": jnp.arange(batch), "prev": jnp.full((batch,), BOS), "step": jnp.array(0)}


# ---------------------------------------------------------------- greedy


def test_greedy_follows_table_and_stops_at_eos():
  # BOS -> 5 -> 6 -> EOS
  t = np.full((8, 8), -3.0)
  t[1, 5] = t[5, 6] = t[6, 2] = t[2, 2] = 0.0
  ids = greedy_decode(table_logits_fn(t), {"step": jnp.array(0)}, batch_size=2, max_len=6)
  np.testing.assert_array_equal(ids, [[5, 6, 2, 0, 0, 0]] * 2)


def test_greedy_eos_at_different_lengths():
  tokens = [[4, 2, 7, 7], [4, 5, 6, 2], [7, 7, 7, 7]]
  cache = {"row": jnp.arange(3), "step": jnp.array(0)}
  fn = jax.jit(lambda c: greedy_decode(row_step_logits_fn(tokens), c, 3, 4))
  np.testing.assert_array_equal(fn(cache), [[4, 2, 0, 0], [4, 5, 6, 2], [7, 7, 7, 7]])


def test_greedy_exits_once_every_row_has_eos():
  tokens = [[4, 2, 7, 7, 7], [4, 5, 6, 2, 7]]
  calls = []
  inner = row_step_logits_fn(tokens)

  def counting(ids, cache):
    jax.debug.callback(lambda: calls.append(1))
    return inner(ids, cache)
  out = jax.jit(lambda c: greedy_decode(counting, c, 2, 10))(
      {"row": jnp.arange(2), "step": jnp.array(0)})
  jax.effects_barrier()
  np.testing.assert_array_equal(out, [[4, 2] + [0] * 8, [4, 5, 6, 2] + [0] * 6])
  assert len(calls) == 4  # stopped after the last row's EOS, not at max_len=10


def test_greedy_bad_arguments():
  fn = table_logits_fn(np.zeros((4, 4)))
  with pytest.raises(ValueError, match="max_len"):
    greedy_decode(fn, {"step": jnp.array(0)}, 1, 0)
  with pytest.raises(ValueError, match="batch_size"):
    greedy_decode(fn, {"step": jnp.array(0)}, 0, 3)


# ---------------------------------------------------------------- beam helpers


def test_expand_and_gather_beams_touch_only_per_row_leaves():
  tree = {"k": jnp.arange(6).reshape(2, 3), "index": jnp.array(7)}
  expanded = expand_to_beams(tree, 2)
  np.testing.assert_array_equal(expanded["k"], [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]])
  assert expanded["index"].shape == () and int(expanded["index"]) == 7
  beams = {"k": jnp.array([[10], [11], [20], [21]]), "index": jnp.array(7)}
  gathered = gather_beams(beams, jnp.array([[1, 1], [1, 0]]), batch_size=2, beam=2)
  np.testing.assert_array_equal(gathered["k"], [[11], [11], [21], [20]])
  assert int(gathered["index"]) == 7


def test_top_log_probs_are_the_top_of_log_softmax():
  # against numpy float64: log p = x - logsumexp(x), ranked; and against jax.nn.log_softmax + top_k
  # (the reference path it replaces): the same ids and the same values
  logits = np.random.default_rng(4).normal(0, 3, (2, 3, 1000)).astype(np.float32)
  values, ids = jax.jit(lambda x: top_log_probs(x, 6))(logits)  # 1000: 25 blocks of 40
  x = logits.astype(np.float64)
  logp = x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)
  expected_ids = np.argsort(-logp, axis=-1, kind="stable")[..., :6]
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_allclose(values, np.take_along_axis(logp, expected_ids, -1), rtol=1e-6, atol=1e-6)
  ref_values, ref_ids = jax.jit(lambda x: jax.lax.top_k(jax.nn.log_softmax(x), 6))(logits)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_allclose(values, ref_values, rtol=1e-6, atol=1e-6)


def test_blocked_top_k_equals_top_k_with_ties():
  # small integers: many equal values inside and across blocks; top_k ranks equal values by index
  rng = np.random.default_rng(6)
  for vocab, block, n in ((40, 5, 3), (64, 8, 8), (300, 100, 2)):
    x = rng.integers(-3, 4, (5, vocab)).astype(np.float32)
    x[0] = 1.0  # one row all equal
    x[1, -block:] = 9.0  # the best values in the last block only
    got = jax.jit(lambda a: blocked_top_k(a, n, block))(x)
    want = jax.lax.top_k(x, n)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
  # and against numpy on distinct values
  x = rng.normal(size=(2, 3, 800)).astype(np.float32)
  values, ids = blocked_top_k(x, 8, 100)
  np.testing.assert_array_equal(ids, np.argsort(-x, axis=-1)[..., :8])
  np.testing.assert_array_equal(values, -np.sort(-x, axis=-1)[..., :8])


# ---------------------------------------------------------------- beam search


def greedy_trap():
  """BOS -> A (0.6) or B (0.4); A -> EOS 0.35 (best); B -> EOS 0.9.

  Greedy: [A, EOS], p = 0.21. Best sequence: [B, EOS], p = 0.36.
  """
  a, b = 4, 5
  rows = [{}] * 8
  rows = [dict(r) for r in rows]
  rows[BOS] = {a: 0.6, b: 0.4 - 6e-6}
  rows[a] = {EOS: 0.35, 6: 0.33, 7: 0.32 - 5e-6}
  rows[b] = {EOS: 0.9}
  rows[6] = rows[7] = {EOS: 0.99}
  return log_probs(rows)


def test_beam_fixes_greedy_mistake():
  fn = table_logits_fn(greedy_trap())
  cache = {"step": jnp.array(0)}
  np.testing.assert_array_equal(greedy_decode(fn, cache, 1, 4), [[4, EOS, 0, 0]])
  ids, scores = jax.jit(lambda c: beam_search(fn, c, 1, 2, 4, length_penalty="none"))(cache)
  np.testing.assert_array_equal(ids[0, 0], [5, EOS, 0, 0])
  np.testing.assert_allclose(scores[0, 0], np.log(0.4 - 6e-6) + np.log(0.9), rtol=1e-5)
  np.testing.assert_array_equal(ids[0, 1], [4, EOS, 0, 0])
  np.testing.assert_allclose(scores[0, 1], np.log(0.6) + np.log(0.35), rtol=1e-5)


def test_beam_size_one_equals_greedy():
  # random per-row tables depending on the cached previous token: rows end at different steps
  # (or not at all); with no length penalty beam 1 must pick exactly greedy's tokens
  table = np.random.default_rng(0).normal(0, 2, (6, 8, 8, 8)).astype(np.float32)
  fn = history_logits_fn(table)
  greedy = greedy_decode(fn, counter_cache(6), 6, 7)
  assert len({int((np.asarray(g) != PAD).sum()) for g in greedy}) >= 3  # several lengths
  ids, _ = beam_search(fn, counter_cache(6), 6, 1, 7, length_penalty="none")
  np.testing.assert_array_equal(ids[:, 0], greedy)


def brute_force(table_row, max_len, alpha, kind):
  """Every hypothesis of a history table row, scored logp / lp(L): finished ones (EOS last) and
  the max_len-long ones without EOS. Returns ({seq: score} finished, {seq: score} truncated)."""
  vocab = table_row.shape[-1]
  logp = table_row - np.log(np.exp(table_row).sum(-1, keepdims=True))
  lp = {"gnmt": lambda n: ((5 + n) / 6) ** alpha, "average": float, "none": lambda n: 1.0}[kind]
  finished, truncated = {}, {}
  for n in range(1, max_len + 1):
    for seq in itertools.product([v for v in range(vocab) if v != EOS], repeat=n - 1):
      for end in range(vocab):
        y = seq + (end,)
        prev, last, total = BOS, BOS, 0.0
        for tok in y:
          total += logp[prev, last, tok]
          prev, last = last, tok
        if end == EOS:
          finished[y] = total / lp(n)
        elif n == max_len:
          truncated[y] = total / lp(n)
  return finished, truncated


@pytest.mark.parametrize("kind,alpha", [("gnmt", 0.6), ("average", 0.0)])
def test_exhaustive_beam_matches_enumeration(kind, alpha):
  # V=4 (3 non-EOS tokens), max_len=3: at most 9 alive prefixes and 36 candidates per step, so
  # beam 36 keeps everything and must return exactly the 36 best of the 13 EOS-ended and the 27
  # max_len-long hypotheses
  vocab, max_len, k = 4, 3, 36
  table = np.random.default_rng(5).normal(0, 1.5, (2, vocab, vocab, vocab)).astype(np.float32)
  ids, scores = beam_search(history_logits_fn(table), counter_cache(2), 2, k, max_len,
                            alpha=alpha, length_penalty=kind)
  for b in range(2):
    finished, truncated = brute_force(table[b], max_len, alpha, kind)
    best = sorted({**finished, **truncated}.items(), key=lambda kv: -kv[1])[:k]
    for rank, (seq, score) in enumerate(best):
      np.testing.assert_array_equal(ids[b, rank], list(seq) + [PAD] * (max_len - len(seq)))
      np.testing.assert_allclose(scores[b, rank], score, rtol=1e-5, atol=1e-6)


def reference_beam(table_row, k, max_len, alpha):
  """Plain-Python beam search on one history-table row (GNMT penalty, no early stop): each step
  ranks every extension of the alive beams; EOS-ending ones among the best k are finished
  (kept aside, never extended), the best k others stay alive; max_len-long ones compete at the end.
  Returns [(seq, score)] best first."""
  logp = table_row - np.log(np.exp(table_row).sum(-1, keepdims=True))
  lp = lambda n: ((5 + n) / 6) ** alpha
  alive, finished = [((), 0.0, BOS, BOS)], []
  for step in range(max_len):
    cands = sorted(((seq + (v,), total + logp[prev, last, v], last, v)
                    for seq, total, prev, last in alive for v in range(table_row.shape[-1])),
                   key=lambda c: -c[1])[:2 * k]
    finished += [(c[0], c[1] / lp(step + 1)) for c in cands[:k] if c[3] == EOS]
    alive = [c for c in cands if c[3] != EOS][:k]
  finished += [(c[0], c[1] / lp(max_len)) for c in alive]
  return sorted(finished, key=lambda f: -f[1])[:k]


@pytest.mark.parametrize("k", [2, 3])
def test_beam_matches_reference_beam(k):
  # a small beam over a longer horizon: finished hypotheses kept aside, the cache gathered per
  # beam (the table reads the cached previous token), early stop not changing the result
  vocab, max_len, alpha = 6, 6, 0.6
  table = np.random.default_rng(11).normal(0, 1.5, (3, vocab, vocab, vocab)).astype(np.float32)
  table[:, :, :, EOS] += np.array([1.0, 0.0, -1.0])[:, None, None]  # rows end at different lengths
  ids, scores = jax.jit(lambda c: beam_search(history_logits_fn(table), c, 3, k, max_len,
                                              alpha=alpha))(counter_cache(3))
  for b in range(3):
    for rank, (seq, score) in enumerate(reference_beam(table[b], k, max_len, alpha)):
      np.testing.assert_array_equal(ids[b, rank], list(seq) + [PAD] * (max_len - len(seq)))
      np.testing.assert_allclose(scores[b, rank], score, rtol=1e-5, atol=1e-6)


def test_beam_eos_at_different_lengths_across_batch():
  tokens = [[4, EOS, 7, 7, 7], [4, 5, 6, EOS, 7], [6, 6, 6, 6, 6]]
  ids, scores = beam_search(row_step_logits_fn(tokens), {"row": jnp.arange(3), "step": jnp.array(0)},
                            3, 2, 5, length_penalty="none")
  np.testing.assert_array_equal(ids[:, 0], [[4, EOS, 0, 0, 0], [4, 5, 6, EOS, 0], [6, 6, 6, 6, 6]])
  one = np.log(1 / (1 + 7 * np.exp(-5.0)))  # log-prob of the preferred token
  np.testing.assert_allclose(scores[:, 0], [2 * one, 4 * one, 5 * one], rtol=1e-5)


def length_table():
  """[EOS] has log-prob -1.0; [A, B, EOS] has log-prob log(.6) + log(.8) + log(.6) = -1.245."""
  a, b = 4, 5
  rows = [dict() for _ in range(8)]
  rows[BOS] = {EOS: np.exp(-1.0), a: 0.6}
  rows[a] = {b: 0.8, EOS: 1e-4}
  rows[b] = {EOS: 0.6}
  return log_probs(rows)


@pytest.mark.parametrize("kind,alpha,winner", [
    ("none", 0.0, [EOS, 0, 0, 0]),       # -1.0 > -1.245
    ("gnmt", 0.6, [EOS, 0, 0, 0]),       # -1.0 > -1.245 / (8/6)^0.6 = -1.048
    ("gnmt", 1.0, [4, 5, EOS, 0]),       # -1.245 / (8/6) = -0.934 > -1.0
    ("average", 0.0, [4, 5, EOS, 0]),    # -1.245 / 3 = -0.415 > -1.0
])
def test_length_penalty_changes_the_winner(kind, alpha, winner):
  ids, scores = beam_search(table_logits_fn(length_table()), {"step": jnp.array(0)}, 1, 3, 4,
                            alpha=alpha, length_penalty=kind)
  np.testing.assert_array_equal(ids[0, 0], winner)
  long_logp = np.log(0.6) + np.log(0.8) + np.log(0.6)
  lp3 = {"none": 1.0, "gnmt": (8 / 6) ** alpha, "average": 3.0}[kind]
  expected = max(-1.0, long_logp / lp3)
  np.testing.assert_allclose(scores[0, 0], expected, rtol=1e-4)
  assert scores[0, 0] >= scores[0, 1] >= scores[0, 2]


def test_beam_without_eos_returns_max_len_hypotheses():
  # EOS is never likely: rows end truncated at max_len, ranked by logp / lp(max_len)
  tokens = [[5, 6, 7, 5]]
  ids, scores = beam_search(row_step_logits_fn(tokens), {"row": jnp.arange(1), "step": jnp.array(0)},
                            1, 2, 4, eos_id=-1)
  np.testing.assert_array_equal(ids[0, 0], [5, 6, 7, 5])
  one = np.log(1 / (1 + 7 * np.exp(-5.0)))
  np.testing.assert_allclose(scores[0, 0], 4 * one / (9 / 6) ** 0.6, rtol=1e-5)


def test_beam_stops_early_when_no_alive_beam_can_win():
  calls = []
  table = table_logits_fn(greedy_trap())

  def counting(ids, cache):
    jax.debug.callback(lambda: calls.append(1))
    return table(ids, cache)
  jax.jit(lambda c: beam_search(counting, c, 1, 2, 30, length_penalty="none"))({"step": jnp.array(0)})
  jax.effects_barrier()
  assert len(calls) < 30


def test_beam_bad_arguments():
  fn, cache = table_logits_fn(np.zeros((4, 4))), {"step": jnp.array(0)}
  with pytest.raises(ValueError, match="beam_size"):
    beam_search(fn, cache, 1, 0, 3)
  with pytest.raises(ValueError, match="max_len"):
    beam_search(fn, cache, 1, 2, 0)
  with pytest.raises(ValueError, match="length_penalty"):
    beam_search(fn, cache, 1, 2, 3, length_penalty="gnmt2")


# ---------------------------------------------------------------- sampling


def test_top_k_one_and_temperature_zero_equal_greedy():
  table = np.random.default_rng(3).normal(0, 2, (3, 8, 8, 8)).astype(np.float32)
  fn = history_logits_fn(table)
  greedy = greedy_decode(fn, counter_cache(3), 3, 6)
  no_prompt = jnp.zeros((3, 0), jnp.int32)
  top1 = jax.jit(lambda key: sample(fn, counter_cache(3), no_prompt, key, 6, temperature=1.5,
                                    top_k=1))
  for seed in range(3):
    np.testing.assert_array_equal(top1(jax.random.key(seed)), greedy)
  got = sample(fn, counter_cache(3), no_prompt, jax.random.key(0), 6, temperature=0.0)
  np.testing.assert_array_equal(got, greedy)


def test_sample_feeds_bos_and_prompt_in_one_call():
  # the next token is (sum of every id fed so far) % 8, tracked per row in the cache
  def fn(ids, cache):
    total = cache["sum"] + ids.sum(axis=1)
    logits = jnp.where(jnp.arange(8)[None, :] == (total % 8)[:, None], 0.0, -9.0)
    return logits, {"sum": total, "calls": cache["calls"] + 1}
  prompt = jnp.array([[3, 4], [5, 5]])
  out = jax.jit(lambda c, p: sample(fn, c, p, jax.random.key(0), 4, temperature=0.0))(
      {"sum": jnp.zeros(2, jnp.int32), "calls": jnp.array(0)}, prompt)
  # row 0: 1+3+4 = 8 -> 0 (PAD id, not EOS) -> 8 -> 0 -> 0 ...; row 1: 11 -> 3, 14 -> 6, 20 -> 4, 24 -> 0
  np.testing.assert_array_equal(out, [[0, 0, 0, 0], [3, 6, 4, 0]])


def test_sample_pads_after_eos():
  tokens = [[4, EOS, 7, 7], [5, 6, 7, 5]]
  out = sample(row_step_logits_fn(tokens), {"row": jnp.arange(2), "step": jnp.array(0)},
               jnp.zeros((2, 0), jnp.int32), jax.random.key(0), 4, temperature=0.0)
  np.testing.assert_array_equal(out, [[4, EOS, 0, 0], [5, 6, 7, 5]])


def test_top_p_keeps_exactly_the_nucleus():
  # probabilities 0.05, 0.5, 0.15, 0.3 (shuffled order): nucleus 0.75 = {1, 3}; 0.85 = {1, 3, 2}
  logits = jnp.log(jnp.array([[0.05, 0.5, 0.15, 0.3]]))
  kept = lambda p: set(np.flatnonzero(np.asarray(filter_logits(logits, top_p=p))[0] > -1e29))
  assert kept(0.75) == {1, 3}
  assert kept(0.85) == {1, 2, 3}
  assert kept(0.4) == {1}
  assert kept(1.0) == {0, 1, 2, 3}
  # top-k then top-p on the renormalised remainder: top-2 {1, 3} -> p = .625, .375; top_p .6 -> {1}
  assert set(np.flatnonzero(np.asarray(filter_logits(logits, top_k=2, top_p=0.6))[0] > -1e29)) == {1}


def test_top_p_sampling_draws_only_nucleus_in_proportion():
  probs = np.array([0.05, 0.5, 0.15, 0.3, 0.0, 0.0, 0.0, 0.0]) + 1e-12
  table = jnp.log(jnp.tile(jnp.asarray(probs / probs.sum(), jnp.float32), (8, 1)))
  fn = table_logits_fn(table)
  n = 4000
  out = sample(fn, {"step": jnp.array(0)}, jnp.zeros((n, 0), jnp.int32), jax.random.key(1), 1,
               top_p=0.75)
  counts = np.bincount(np.asarray(out[:, 0]), minlength=8)
  assert set(np.flatnonzero(counts)) == {1, 3}
  assert abs(counts[1] / n - 0.5 / 0.8) < 0.03  # renormalised 0.625


def test_sample_bad_arguments():
  fn, cache, prompt, key = table_logits_fn(np.zeros((4, 4))), {"step": jnp.array(0)}, \
      jnp.zeros((1, 0), jnp.int32), jax.random.key(0)
  with pytest.raises(ValueError, match="max_new_tokens"):
    sample(fn, cache, prompt, key, 0)
  with pytest.raises(ValueError, match="temperature"):
    sample(fn, cache, prompt, key, 3, temperature=-1.0)
  with pytest.raises(ValueError, match="top_p"):
    sample(fn, cache, prompt, key, 3, top_p=0.0)
  with pytest.raises(ValueError, match="top_k"):
    sample(fn, cache, prompt, key, 3, top_k=-1)
  with pytest.raises(ValueError, match="prompt"):
    sample(fn, cache, jnp.zeros((3,), jnp.int32), key, 3)
