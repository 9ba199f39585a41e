"""Batching for real data: the batch spec, row counts, bucket lengths, length limits, padding and
the shuffled windows of a token stream, which every kind of training batch shares.

The batches themselves (plain, bucketed, packed, and windows of a plain-text LM stream) are decided
from the length index on every process alike: txf/data/global_batches.py, the one engine.


Batches are dicts of int32 numpy arrays with fixed shapes (txf.data.base): ``[rows, S]`` /
``[rows, T]`` (bucketing: one shape per bucket), ``label`` [rows] for classification.
"""

import dataclasses
import hashlib
import json
from typing import Any, Dict, List, Sequence

from absl import logging
import grain
import numpy as np

from txf.data.base import EOS_ID, Batch, DataError, DataSpec, pad_batch

LABEL = "label"


# The fields of ``config.data`` that decide batching; BatchSpec takes their types and defaults from
# DataSpec (declared once, in txf/core/config.py's base_config).
BATCHING_FIELDS = ("tokens_per_batch", "packing", "bucketing", "num_buckets", "bucket_window",
                   "rows_multiple", "packing_bins", "truncate", "prefetch", "read_threads")


def _of(cls, data, lengths: Dict[str, int], rows: int) -> "BatchSpec":
  """The batching of a DataSpec (``data``): its ``BATCHING_FIELDS`` with ``lengths`` and ``rows``."""
  return cls(lengths=lengths, rows=rows, **{n: getattr(data, n) for n in BATCHING_FIELDS})


def _describe(self) -> str:
  """A short fingerprint of the batching, stored in iterator states."""
  blob = json.dumps(dataclasses.asdict(self), sort_keys=True)
  return hashlib.sha1(blob.encode()).hexdigest()[:12]


BatchSpec = dataclasses.make_dataclass(
    "BatchSpec",
    [("lengths", Dict[str, int]), ("rows", int)]   # feature -> max length ({"inputs": S, ...}); rows per batch
    + [(f.name, f.type, dataclasses.field(default=f.default))
       for f in dataclasses.fields(DataSpec) if f.name in BATCHING_FIELDS]
    + [("eos_last", bool, dataclasses.field(default=True))],  # truncation keeps EOS last
    namespace={"of": classmethod(_of), "describe": _describe}, frozen=True)
BatchSpec.__doc__ = ("How one process forms training batches (sizes are this process's share): "
                     "the sequence lengths, the rows per batch, and config.data's BATCHING_FIELDS.")


def round_rows(rows: int, multiple: int) -> int:
  """``rows`` rounded down to a multiple of ``multiple`` (at least one multiple, or 1)."""
  if multiple <= 1:
    return max(rows, 1)
  return max(rows // multiple * multiple, multiple)


def rows_for_tokens(rows: int, tokens_per_batch: int, rows_multiple: int, length: int) -> int:
  """Rows of a batch whose longest feature is ``length`` tokens: ``rows`` (a fixed row count), or
  with ``tokens_per_batch`` > 0 ``tokens_per_batch // length`` rounded down to ``rows_multiple``
  (``round_rows``). Every batch row count of the data, and ``txf plan``'s, comes from here."""
  if tokens_per_batch <= 0:
    return rows
  return round_rows(tokens_per_batch // max(length, 1), rows_multiple)


def rows_for_length(spec: BatchSpec, length: int) -> int:
  """Rows of a batch whose longest feature is ``length``: from tokens_per_batch, or ``spec.rows``."""
  return rows_for_tokens(spec.rows, spec.tokens_per_batch, spec.rows_multiple, length)


def bucket_lengths(spec: BatchSpec) -> List[Dict[str, int]]:
  """Lengths of each bucket: feature f gets ceil(max_f * (k+1) / K) rounded up to a multiple of 8."""
  k_total = max(spec.num_buckets, 1)
  out = []
  for k in range(k_total):
    lengths = {}
    for f, m in spec.lengths.items():
      share = -(-m * (k + 1) // k_total)                  # ceil(m * (k + 1) / K)
      lengths[f] = min(m, -(-share // 8) * 8)             # rounded up to a multiple of 8
    out.append(lengths)
  uniq = []
  for b in out:
    if b not in uniq:
      uniq.append(b)
  return uniq


def pad_rows(examples: Sequence[Dict[str, np.ndarray]], lengths: Dict[str, int], rows: int
             ) -> Batch:
  """Stack examples into fixed-shape int32 arrays: features [rows, L] right-padded with PAD,
  ``label`` [rows]; missing rows are all-PAD filler (label 0)."""
  batch = {f: pad_batch([ex[f] for ex in examples], length, rows) for f, length in lengths.items()}
  if examples and LABEL in examples[0]:
    batch[LABEL] = np.zeros((rows,), np.int32)
    batch[LABEL][:len(examples)] = [ex[LABEL] for ex in examples]
  return batch


class LengthLimiter:
  """Drops or truncates examples longer than the max lengths; counts them and logs the counts.

  Logged (INFO: shown with ``-v``, not by default) at the first over-long example and then
  whenever the count doubles.
  """

  def __init__(self, lengths: Dict[str, int], truncate: bool, eos_last: bool, what: str):
    self.lengths, self.truncate, self.eos_last, self.what = lengths, truncate, eos_last, what
    self.seen = self.over = 0
    self._next_log = 1

  def _count(self, ex: Dict[str, np.ndarray]) -> bool:
    over = any(len(ex[f]) > m for f, m in self.lengths.items())
    if over:
      self.count_over()
    else:
      self.seen += 1
    return over

  def count_over(self) -> None:
    """Count one over-long example (and log at the first one and whenever the count doubles)."""
    self.seen += 1
    self.over += 1
    if self.over >= self._next_log:
      self._next_log *= 2
      limits = ", ".join(f"{f}<={m}" for f, m in self.lengths.items())
      logging.info("%s: %s %d of %d examples so far longer than %s tokens (%s)", self.what,
                      "truncated" if self.truncate else "dropped", self.over, self.seen, limits,
                      "data.truncate=True keeps them truncated" if not self.truncate else
                      "raise data.max_input_len / max_target_len to keep them whole")

  def keep(self, ex: Dict[str, np.ndarray]) -> bool:
    """Filter predicate: False for over-long examples (when not truncating)."""
    return self.truncate or not self._count(ex)

  def cut(self, ex: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Truncate every feature to its max length, keeping EOS last."""
    if not self.truncate or not self._count(ex):
      return ex
    out = dict(ex)
    for f, m in self.lengths.items():
      if len(ex[f]) > m:
        out[f] = ex[f][:m].copy()
        if self.eos_last:
          out[f][-1] = EOS_ID
    return out


def lm_windows(stream: np.ndarray, length: int, seed: int, process_index: int,
               process_count: int) -> grain.MapDataset:
  """Endless shuffled windows ``{"targets": int32 [length]}`` of a token stream [N].

  Window w of epoch e starts at ``offset_e + w * length`` with a per-epoch random offset in
  [0, length), so every epoch cuts the text at new places; windows are shuffled every epoch.
  """
  n = (len(stream) - length) // length
  if n <= 0:
    raise DataError(f"the training text has {len(stream)} tokens, fewer than two windows of "
                    f"data.max_target_len={length}: lower max_target_len or use more text")
  ds = grain.MapDataset.range(n)
  if process_count > 1:
    ds = ds[process_index::process_count]
  per_epoch = len(ds)

  def window(index: int, w: int) -> Dict[str, np.ndarray]:
    offset = int(np.random.default_rng([seed, index // per_epoch]).integers(length))
    start = offset + int(w) * length
    return {"targets": np.asarray(stream[start:start + length], np.int32)}

  return ds.shuffle(seed=seed).repeat(None).map_with_index(window)


def pipeline_fingerprint(*parts: Any) -> str:
  """A short hash of everything that decides the batch sequence."""
  return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
