"""BERT's MLM corruption (txf.ops.mlm_mask) against counts, rates and word boundaries computed
here in numpy: the exact per-row count, the 80/10/10 split within binomial tolerance, specials and
padding never chosen, whole words chosen whole, determinism in the rng."""

import jax
import numpy as np

from txf.ops import mlm_mask

V, MASK = 50, 4
SPECIALS = (1, 2, 3, MASK)          # BOS, EOS, UNK, <mask>
SETTINGS = dict(vocab_size=V, mask_id=MASK, mask_rate=0.15, mask_token_fraction=0.8,
                random_token_fraction=0.1, special_ids=SPECIALS)


def _tokens(rows=2000, length=32, seed=0):
  """Rows of real ids (5..V-1) with a BOS first, an EOS, a few UNKs, and PAD tails of random length."""
  rng = np.random.default_rng(seed)
  t = rng.integers(5, V, (rows, length))
  t[:, 0] = 1
  t[rng.random((rows, length)) < 0.03] = 3
  lengths = rng.integers(2, length + 1, rows)
  for b, n in enumerate(lengths):
    t[b, n - 1] = 2
    t[b, n:] = 0
  return t.astype(np.int32)


@jax.jit
def _masked(tokens, key, rates, word_starts):
  """mlm_mask compiled once per word_starts presence (the rates are traced: one program)."""
  return mlm_mask(tokens, key, vocab_size=V, mask_id=MASK, mask_rate=rates[0],
                  mask_token_fraction=rates[1], random_token_fraction=rates[2],
                  special_ids=SPECIALS, word_starts=word_starts)


def _run(tokens, seed=1, word_starts=None, **over):
  s = {**SETTINGS, **over}
  rates = np.asarray([s["mask_rate"], s["mask_token_fraction"], s["random_token_fraction"]],
                     np.float32)
  out = _masked(tokens, jax.random.key(seed), rates, word_starts)
  return tuple(np.asarray(x) for x in out)


def _eligible(tokens):
  return (tokens != 0) & ~np.isin(tokens, SPECIALS)


def _within(count, total, p, what):
  """count ~ Binomial(total, p): within 5 standard deviations."""
  sd = np.sqrt(total * p * (1 - p))
  assert abs(count - total * p) <= 5 * sd, f"{what}: {count} of {total}, expected {p:.4f}"


def test_exact_count_per_row_and_never_pad_or_special():
  tokens = _tokens()
  inputs, targets, weights = _run(tokens)
  chosen = weights == 1
  assert set(np.unique(weights)) <= {0.0, 1.0}
  n = _eligible(tokens).sum(1)
  expected = np.where(n > 0, np.maximum(1, np.floor(0.15 * n + 0.5)), 0)
  np.testing.assert_array_equal(chosen.sum(1), expected)
  assert not (chosen & ~_eligible(tokens)).any()       # no PAD, BOS, EOS, UNK, mask
  np.testing.assert_array_equal(targets, np.where(chosen, tokens, 0))
  np.testing.assert_array_equal(inputs[~chosen], tokens[~chosen])  # the rest untouched


def test_the_80_10_10_split_and_random_ids_are_not_special():
  tokens = _tokens()
  inputs, _, weights = _run(tokens)
  chosen = weights == 1
  total = int(chosen.sum())
  masked = chosen & (inputs == MASK)
  changed = chosen & (inputs != MASK) & (inputs != tokens)
  allowed = V - 1 - len(SPECIALS)          # random draws exclude PAD and the specials
  _within(int(masked.sum()), total, 0.8, "mask token")
  # a random draw equal to the original token looks unchanged
  _within(int(changed.sum()), total, 0.1 * (1 - 1 / allowed), "random token")
  drawn = inputs[chosen & (inputs != MASK)]
  assert not np.isin(drawn, (0,) + SPECIALS).any()
  assert len(np.unique(inputs[changed])) > allowed // 2  # spread over the vocabulary


def test_positions_are_chosen_uniformly():
  tokens = np.random.default_rng(3).integers(5, V, (2000, 32)).astype(np.int32)  # all eligible
  _, _, weights = _run(tokens, seed=2, mask_rate=0.25)
  per_position = weights.sum(0)              # each position: Binomial(2000, 8 / 32)
  for count in per_position:
    _within(int(count), 2000, 0.25, "per-position choice")


def test_rates_and_fractions_follow_the_settings():
  tokens = _tokens(seed=4)
  inputs, _, weights = _run(tokens, mask_rate=0.4, mask_token_fraction=0.5,
                            random_token_fraction=0.5)
  chosen = weights == 1
  n = _eligible(tokens).sum(1)
  np.testing.assert_array_equal(chosen.sum(1), np.where(n > 0, np.maximum(1, np.floor(0.4 * n + 0.5)), 0))
  unchanged = chosen & (inputs == tokens)      # only a random draw equal to the original
  _within(int(unchanged.sum()), int(chosen.sum()), 0.5 / (V - 1 - len(SPECIALS)), "unchanged")


def _words(tokens, starts):
  """Each row's words as lists of positions: a word begins at an eligible token that starts one
  (or follows a non-eligible token) and runs over the eligible tokens after it."""
  eligible = _eligible(tokens)
  out = []
  for b in range(tokens.shape[0]):
    words, current = [], None
    for t in range(tokens.shape[1]):
      if not eligible[b, t]:
        current = None
        continue
      if current is None or starts[b, t]:
        current = []
        words.append(current)
      current.append(t)
    out.append(words)
  return out


def test_whole_words_are_chosen_whole():
  tokens = _tokens(seed=5)
  starts = np.random.default_rng(6).random(tokens.shape) < 0.4
  inputs, targets, weights = _run(tokens, word_starts=starts, mask_rate=0.2)
  chosen = weights == 1
  picked = 0
  for b, words in enumerate(_words(tokens, starts)):
    whole = [w for w in words if chosen[b, w].all()]
    assert all(chosen[b, w].all() or not chosen[b, w].any() for w in words), b  # all or none
    assert len(whole) == (max(1, int(np.floor(0.2 * len(words) + 0.5))) if words else 0)
    assert chosen[b].sum() == sum(len(w) for w in whole)
    picked += len(whole)
  assert not (chosen & ~_eligible(tokens)).any()
  np.testing.assert_array_equal(targets, np.where(chosen, tokens, 0))
  assert picked > 0


def test_deterministic_in_the_rng():
  tokens = _tokens()
  first, again, other = _run(tokens, seed=7), _run(tokens, seed=7), _run(tokens, seed=8)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first[2], other[2])
