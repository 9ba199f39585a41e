"""The arithmetic of the self-supervised objectives that the config checks, the data tasks and the
ops share (plain Python: this module sits below every layer that uses it and imports nothing).

T5's span corruption of a row of L tokens: ``span_counts`` (how many noise tokens and spans) and
``corrupted_lengths`` (the static lengths of the corrupted inputs and targets); the corruption
itself is ``txf.ops.span_corruption``.
"""

from typing import Tuple


def span_counts(length: int, noise_density: float, mean_span_length: float) -> Tuple[int, int]:
  """(num_noise, num_spans) of a row of ``length`` tokens: num_noise = round(L * density) clipped
  to [1, L - 1], num_spans = max(1, round(num_noise / mean_span_length)) (float64, rounding half
  to even, as numpy's np.round and T5's seqio)."""
  num_noise = int(min(max(round(length * noise_density), 1), length - 1))
  num_spans = max(1, int(round(num_noise / mean_span_length)))
  return num_noise, num_spans


def corrupted_lengths(length: int, noise_density: float, mean_span_length: float) -> Tuple[int, int]:
  """(input_len, target_len) of a corrupted row of ``length`` tokens:
  input_len = L - num_noise + num_spans + 1, target_len = num_noise + num_spans + 1 (one sentinel
  per span, one EOS)."""
  num_noise, num_spans = span_counts(length, noise_density, mean_span_length)
  return length - num_noise + num_spans + 1, num_noise + num_spans + 1


def span_corruption_lengths(max_input_len: int, pretrain) -> Tuple[int, int]:
  """The span-corruption family's (encoder_len, target_len) for windows of ``max_input_len``
  tokens: ``corrupted_lengths`` at ``pretrain.noise_density`` and ``pretrain.mean_span_length``
  (``txf.core.families.Family.lengths``)."""
  return corrupted_lengths(max_input_len, pretrain.noise_density, pretrain.mean_span_length)
