"""txf.ops.span_corruption against references written here in numpy: the span layout (counts, every
span non-empty, interleaving, mean length), the sentinel order, and the exact round trip
(filling each sentinel of the inputs with its span from the targets gives back the row)."""

import jax
import numpy as np
import pytest

from txf.ops import span_corruption as sc

EOS = 2


def spans_of(mask):
  """[(start, end, is_noise)] of the maximal runs of a 0/1 mask (numpy reference)."""
  mask = np.asarray(mask, np.int64)
  edges = np.flatnonzero(np.diff(mask)) + 1
  bounds = np.concatenate([[0], edges, [len(mask)]])
  return [(int(a), int(b), bool(mask[a])) for a, b in zip(bounds[:-1], bounds[1:])]


def reference_counts(length, density, mean_span):
  """T5's counts in float64: round half to even, as tf.round."""
  n = min(max(np.round(np.float64(length) * density), 1), length - 1)
  return int(n), max(1, int(np.round(n / np.float64(mean_span))))


def fill(inputs, targets, first_sentinel, num_sentinels=40):
  """The row back from (inputs, targets): each sentinel of the inputs replaced by the tokens that
  follow the same sentinel in the targets (numpy reference of the inverse)."""
  is_sentinel = lambda t: first_sentinel - num_sentinels < t <= first_sentinel
  spans, current = {}, None
  for t in targets:
    if t == EOS:
      break
    if is_sentinel(t):
      current = t
      spans[current] = []
    else:
      spans[current].append(int(t))
  out = []
  for t in inputs:
    if t == EOS:
      break
    out.extend(spans[t] if is_sentinel(t) else [int(t)])
  return out


def masks_of(length, density, mean_span, num, seed):
  """``num`` noise masks of one layout, bool [num, length] (one compiled program)."""
  draw = jax.jit(jax.vmap(lambda r: sc.noise_mask(length, r, density, mean_span)))
  return np.asarray(draw(jax.random.split(jax.random.key(seed), num)))


@pytest.mark.parametrize("length,density,mean_span", [
    (64, 0.15, 3.0), (31, 0.3, 1.0), (8, 0.99, 7.0)])
def test_noise_mask_layout(length, density, mean_span):
  num_noise, num_spans = reference_counts(length, density, mean_span)
  assert sc.span_counts(length, density, mean_span) == (num_noise, num_spans)
  for mask in masks_of(length, density, mean_span, 10, length):
    assert mask.shape == (length,) and mask.sum() == num_noise
    runs = spans_of(mask)
    assert not runs[0][2] and runs[-1][2], runs      # starts with non-noise, ends with noise
    assert sum(r[2] for r in runs) == num_spans       # each noise span a maximal non-empty run
    assert sum(not r[2] for r in runs) == num_spans
    assert all(b > a for a, b, _ in runs)


def test_too_many_spans_for_the_row_is_an_error():
  with pytest.raises(ValueError, match="non-noise"):   # 7 noise tokens in 2 spans, 1 other token
    sc.noise_mask(8, jax.random.key(0), 0.99, 3.0)


def test_corrupted_lengths_formula():
  for length, density, mean_span in [(20, 0.15, 3.0), (512, 0.15, 3.0), (64, 0.5, 2.0)]:
    n, k = reference_counts(length, density, mean_span)
    assert sc.corrupted_lengths(length, density, mean_span) == (length - n + k + 1, n + k + 1)
  assert sc.corrupted_lengths(512, 0.15, 3.0) == (512 - 77 + 26 + 1, 77 + 26 + 1)  # T5's


def test_mean_span_length_over_many_draws():
  length, density, mean_span = 200, 0.3, 3.0
  masks = masks_of(length, density, mean_span, 300, 1)
  lengths = [b - a for m in masks for a, b, noisy in spans_of(m) if noisy]
  assert abs(np.mean(lengths) - 60 / 20) < 1e-9      # 60 noise tokens in 20 spans, every draw
  # the segmentation is random: span lengths vary and the first span starts at varied places
  assert np.std(lengths) > 1.0
  assert len({int(np.argmax(m)) for m in masks}) > 20


def test_sentinel_order_and_hand_worked_row():
  # mask of the module docstring: noise on c d and g of a..h
  tokens = np.array([10, 11, 12, 13, 14, 15, 16, 17])
  mask = np.array([0, 0, 1, 1, 0, 0, 1, 0], bool)
  inputs, targets = sc.corrupt_row(tokens, mask, 99, 8, 6)
  np.testing.assert_array_equal(inputs, [10, 11, 99, 14, 15, 98, 17, EOS])
  np.testing.assert_array_equal(targets, [99, 12, 13, 98, 16, EOS])


def test_round_trip_many_rows():
  rng = np.random.default_rng(0)
  for length, density, mean_span in [(40, 0.5, 2.0), (16, 0.2, 1.0)]:
    tokens = rng.integers(4, 50, size=(32, length))
    for seed in range(3):
      inputs, targets = sc.span_corrupt(tokens, jax.random.key(seed), density, mean_span, 99)
      input_len, target_len = sc.corrupted_lengths(length, density, mean_span)
      assert inputs.shape == (32, input_len) and targets.shape == (32, target_len)
      _, k = reference_counts(length, density, mean_span)
      for row, i, t in zip(tokens, np.asarray(inputs), np.asarray(targets)):
        assert fill(i, t, 99) == row.tolist()
        sentinels = [int(x) for x in t if x > 50]
        assert sentinels == list(range(99, 99 - k, -1))        # <extra_id_0>, <extra_id_1>, ...
        assert [int(x) for x in i if x > 50] == sentinels
        assert i[-1] == EOS and t[-1] == EOS                   # full rows fill both exactly


def test_short_rows_drop_padding():
  rng = np.random.default_rng(1)
  tokens = rng.integers(4, 50, size=(40, 30))
  cut = rng.integers(1, 31, size=40)
  tokens[np.arange(30)[None, :] >= cut[:, None]] = 0
  inputs, targets = map(np.asarray, sc.span_corrupt(tokens, jax.random.key(3), 0.3, 2.0, 99))
  for row, n, i, t in zip(tokens, cut, inputs, targets):
    assert fill(i, t, 99) == row[:n].tolist()
    for side in (i, t):               # EOS, then PAD only
      end = int(np.flatnonzero(side == EOS)[0])
      assert not side[end + 1:].any() and (side[:end] != 0).all()
    sentinels = [int(x) for x in t if x > 50]
    assert sentinels == list(range(99, 99 - len(sentinels), -1))


def test_pure_function_of_tokens_and_rng():
  tokens = np.arange(4, 4 + 3 * 20).reshape(3, 20)
  a = sc.span_corrupt(tokens, jax.random.key(7), 0.3, 2.0, 99)
  b = sc.span_corrupt(tokens, jax.random.key(7), 0.3, 2.0, 99)
  c = sc.span_corrupt(tokens, jax.random.key(8), 0.3, 2.0, 99)
  np.testing.assert_array_equal(a[0], b[0])
  assert not np.array_equal(np.asarray(a[0]), np.asarray(c[0]))
