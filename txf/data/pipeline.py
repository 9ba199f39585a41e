"""grain pipelines for real data: shuffle, length limits, batching, bucketing, packing, prefetch.

Training pipeline of one process (every stage is a grain dataset, so the whole chain is
checkpointable through grain's ``DatasetIterator.get_state`` / ``set_state``)::

  MapDataset.source(records)       random-access array_record source (tfds.data_source)
    [process_index::process_count] per-process shard (disjoint)
    .shuffle(seed).repeat()        global shuffle, a different permutation every epoch
    .map(encode)                   text -> int32 ids (in grain's read threads)
  .to_iter_dataset(ReadOptions)
    .filter / .map                 drop (or truncate) over-long examples, counted and logged
    one of:
      batch + pad                  rows x fixed lengths                       (plain)
      BucketBatchIterDataset       one fixed shape per length bucket          (bucketing)
      FirstFitPackIterDataset      several examples per row, + segmentation/position (packing)
    ThreadPrefetchIterDataset      batches prepared ahead in a thread

Batches are dicts of int32 numpy arrays with fixed shapes (txf.data.base): ``[rows, S]`` /
``[rows, T]`` (bucketing: one shape per bucket), ``label`` [rows] for classification.
"""

import dataclasses
import hashlib
import json
import weakref
from typing import Any, Callable, Dict, List, Sequence

from absl import logging
import grain
import numpy as np

from txf.data.base import EOS_ID, Batch, CheckpointableIterator, DataError, pad_batch

LABEL = "label"


@dataclasses.dataclass(frozen=True)
class BatchSpec:
  """How one process forms training batches (sizes are this process's share)."""
  lengths: Dict[str, int]        # sequence feature -> max length, e.g. {"inputs": S, "targets": T}
  rows: int                      # rows per batch (plain and packed; bucketing without tokens)
  tokens_per_batch: int = 0      # > 0: rows of a bucket = tokens_per_batch // bucket length
  packing: bool = False
  bucketing: bool = False
  num_buckets: int = 4
  bucket_window: int = 64        # bucketing groups this many batches' worth of examples at a time
  rows_multiple: int = 8         # token-derived row counts are rounded down to a multiple of this
  packing_bins: int = 0          # rows packed at once (0 = rows per batch)
  truncate: bool = False         # truncate over-long examples (keeping EOS last) instead of dropping
  eos_last: bool = True          # truncation keeps EOS as the last token
  prefetch: int = 2              # batches prepared ahead (0 = none)
  read_threads: int = 2          # grain threads reading + encoding examples

  @classmethod
  def of(cls, data, lengths: Dict[str, int], rows: int) -> "BatchSpec":
    """The batching of a DataSpec (``data``): every field but ``lengths``, ``rows`` and
    ``eos_last`` is the DataSpec field of the same name."""
    given = {"lengths": lengths, "rows": rows}
    return cls(**given, **{f.name: getattr(data, f.name) for f in dataclasses.fields(cls)
                           if f.name not in given and hasattr(data, f.name)})

  def describe(self) -> str:
    """A short fingerprint of the batching, stored in iterator states."""
    blob = json.dumps(dataclasses.asdict(self), sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


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

  Logged at the first over-long example and then whenever the count doubles.
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
      logging.warning("%s: %s %d of %d examples so far longer than %s tokens (%s)", self.what,
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


def encoded_source(records: Sequence[Any], encode: Callable[[Any], Dict[str, np.ndarray]],
                   seed: int, process_index: int, process_count: int) -> grain.MapDataset:
  """Endless shuffled encoded examples of this process's shard (a new permutation every epoch)."""
  ds = grain.MapDataset.source(records)
  if process_count > 1:
    ds = ds[process_index::process_count]
  if len(ds) == 0:
    raise DataError(f"process {process_index} of {process_count} has no training examples")
  return ds.shuffle(seed=seed).repeat(None).map(encode)


def batched(ds: grain.MapDataset, spec: BatchSpec, seed: int, what: str = "train"
            ) -> grain.IterDataset:
  """Length limits, then plain / bucketed / packed batching, then prefetch (see module doc)."""
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=spec.read_threads,
                                            prefetch_buffer_size=max(64, 4 * spec.rows)))
  limiter = LengthLimiter(spec.lengths, spec.truncate, spec.eos_last, what)
  it = it.map(limiter.cut) if spec.truncate else it.filter(limiter.keep)
  if spec.packing and spec.bucketing:
    raise DataError("data.packing and data.bucketing both set: packing already removes padding; "
                    "set one of them")
  if spec.packing:
    rows = rows_for_length(spec, max(spec.lengths.values()))
    it = grain.experimental.FirstFitPackIterDataset(
        it, length_struct=dict(spec.lengths), num_packing_bins=spec.packing_bins or rows,
        seed=seed, shuffle_bins=True)
    it = it.map(_rename_packed).batch(rows, drop_remainder=True)
  elif spec.bucketing:
    it = BucketBatchIterDataset(it, spec, seed)
  else:
    rows = rows_for_length(spec, max(spec.lengths.values()))
    lengths = dict(spec.lengths)
    it = it.batch(rows, drop_remainder=True, batch_fn=lambda xs: pad_rows(xs, lengths, rows))
  if spec.prefetch > 0:
    it = grain.experimental.ThreadPrefetchIterDataset(it, prefetch_buffer_size=spec.prefetch)
  return it


def _rename_packed(ex: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """grain's ``*_segment_ids`` / ``*_positions`` -> txf's ``*_segmentation`` / ``*_position``."""
  out = {}
  for k, v in ex.items():
    k = k.replace("_segment_ids", "_segmentation").replace("_positions", "_position")
    out[k] = np.asarray(v, np.int32)
  return out


class BucketBatchIterDataset(grain.IterDataset):
  """Batches of similar-length examples, one fixed shape per bucket (a small fixed set of shapes).

  Reads a window of ``bucket_window`` batches' worth of examples, puts each into the smallest
  bucket that holds all its features, cuts each bucket into batches (rows from ``rows`` or from
  ``tokens_per_batch``; a bucket's last, partial batch is completed with all-PAD filler rows) and
  emits the window's batches in a seeded random order. State = the parent's state at the start of
  the window + the number of batches already emitted from it, so a restore is exact.
  """

  def __init__(self, parent: grain.IterDataset, spec: BatchSpec, seed: int):
    super().__init__(parent)
    self._spec, self._seed = spec, seed

  def __iter__(self) -> grain.DatasetIterator:
    return _BucketBatchIterator(self._parent.__iter__(), self._spec, self._seed)

  def __str__(self) -> str:
    return f"BucketBatchIterDataset(buckets={len(bucket_lengths(self._spec))})"


class _BucketBatchIterator(grain.DatasetIterator):
  """The iterator of ``BucketBatchIterDataset`` (state: window start, window number, emitted)."""

  def __init__(self, parent: grain.DatasetIterator, spec: BatchSpec, seed: int):
    super().__init__(parent)
    self._spec, self._seed = spec, seed
    self._buckets = bucket_lengths(spec)
    self._rows = [rows_for_length(spec, max(b.values())) for b in self._buckets]
    self._window_size = spec.bucket_window * max(self._rows)
    self._start_state = parent.get_state()
    self._window, self._emitted, self._batches = 0, 0, None

  def _bucket_of(self, ex: Dict[str, np.ndarray]) -> int:
    for k, lengths in enumerate(self._buckets):
      if all(len(ex[f]) <= m for f, m in lengths.items()):
        return k
    raise DataError(f"example longer than the largest bucket {self._buckets[-1]}")

  def _fill(self) -> List[Batch]:
    groups: List[List[Dict[str, np.ndarray]]] = [[] for _ in self._buckets]
    for _ in range(self._window_size):
      try:
        ex = next(self._parent)
      except StopIteration:
        break
      groups[self._bucket_of(ex)].append(ex)
    batches = []
    for k, group in enumerate(groups):
      rows = self._rows[k]
      for start in range(0, len(group), rows):
        batches.append(pad_rows(group[start:start + rows], self._buckets[k], rows))
    order = np.random.default_rng([self._seed, self._window]).permutation(len(batches))
    return [batches[i] for i in order]

  def __next__(self) -> Batch:
    while self._batches is None or self._emitted >= len(self._batches):
      if self._batches is not None:            # the previous window is used up
        self._window += 1
        self._emitted = 0
        self._start_state = self._parent.get_state()
      self._batches = self._fill()
      if not self._batches:
        raise StopIteration
    batch = self._batches[self._emitted]
    self._emitted += 1
    return batch

  def get_state(self) -> Dict[str, Any]:
    return {"parent": self._start_state, "window": self._window, "emitted": self._emitted}

  def set_state(self, state: Dict[str, Any]) -> None:
    self._parent.set_state(state["parent"])
    self._start_state = state["parent"]
    self._window, self._emitted = int(state["window"]), int(state["emitted"])
    self._batches = None        # refilled from the window start; ``emitted`` batches are skipped


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


class GrainIterator(CheckpointableIterator):
  """The contract's CheckpointableIterator over a grain ``IterDataset`` of this process's rows.

  With ``processes`` > 1 each batch [r, ...] is placed as rows [i r, (i + 1) r) of a global batch
  [P r, ...] (the other rows PAD), ``i`` = ``process_index``. ``get_state()`` = {"grain": grain's
  JSON state, "pipeline": fingerprint, "processes": P}; a state from a different pipeline (other
  batch size, seed, data) or process count is refused with a DataError.
  """

  def __init__(self, dataset: grain.IterDataset, fingerprint: str, processes: int = 1,
               process_index: int = 0):
    self._dataset, self._fingerprint = dataset, fingerprint
    self._processes, self._index = processes, process_index
    self._holder = [iter(dataset)]   # the only reference to grain's iterator, see _release
    weakref.finalize(self, _release, self._holder)

  @property
  def _it(self) -> grain.DatasetIterator:
    return self._holder[0]

  def __next__(self) -> Batch:
    batch = next(self._it)
    if self._processes == 1:
      return batch
    out = {}
    for k, v in batch.items():
      v = np.asarray(v)
      full = np.zeros((v.shape[0] * self._processes,) + v.shape[1:], v.dtype)
      full[self._index * v.shape[0]:(self._index + 1) * v.shape[0]] = v
      out[k] = full
    return out

  def get_state(self) -> Dict[str, Any]:
    state = {"grain": self._it.get_state(), "pipeline": self._fingerprint,
             "processes": self._processes}
    return json.loads(json.dumps(state, default=_jsonable))

  def set_state(self, state: Dict[str, Any]) -> None:
    saved = int(state.get("processes", 1))
    if saved != self._processes:
      raise DataError(f"the checkpoint's data position was saved by {saved} process(es), and "
                      f"packed data (data.packing=True) resumes only on that count, not on "
                      f"{self._processes}: run it on {saved} process(es) (bucketed or plain "
                      f"batches resume on any count)")
    if state.get("pipeline") != self._fingerprint:
      raise DataError(f"iterator state is from another data pipeline ({state.get('pipeline')} != "
                      f"{self._fingerprint}): batch size, seed, process count, data or batching "
                      f"settings changed since the checkpoint; restore with the original config")
    self._it.set_state(state["grain"])


def _release(holder: List[Any]) -> None:
  """Close grain's iterator and drop it while Python is still whole (at exit grain's ``__del__``
  would otherwise run after module teardown and print ignored exceptions)."""
  while holder:
    holder.pop().close()


def _jsonable(x: Any) -> Any:
  if isinstance(x, np.generic):
    return x.item()
  raise TypeError(f"iterator state value {x!r} is not JSON-serialisable")


def pipeline_fingerprint(*parts: Any) -> str:
  """A short hash of everything that decides the batch sequence."""
  return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
