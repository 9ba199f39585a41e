"""Global batches decided alike on every process; each process reads and fills only its own rows.

The training batch at every step is a pure function of the data, the seed and the step, not of the
process count: every process walks the same shuffled index stream (grain's ``shuffle``, a new
permutation every epoch) and decides the same batches from the examples' lengths alone (the length
index: each process encodes its 1/P of the training split once, and one all-gather shares the
lengths). Then each process reads and encodes only the examples of its rows (``RowLayout``), and
leaves the other rows PAD. So:

- every process compiles and runs the same shapes (bucketed, token-budgeted, partial batches);
- a checkpointed position (``pos``, ``window``, ``emitted``) resumes on any process count;
- with one process the batches are exactly those of the grain pipeline this replaces.

``IndexBatchIterator``: plain batches (``spec.rows`` or a token budget over the full lengths),
bucketed ones (a window of ``bucket_window`` batches' worth of examples is grouped into length
buckets, cut into batches, and emitted in a seeded random order) and packed ones (examples placed
first-fit into a window of ``packing_bins`` rows, every feature within its length; the rows, in a
seeded random order, cut into batches; each row carries ``*_segmentation`` 1, 2, ... per example,
0 on padding, and ``*_position`` from 0 within each example).
``WindowBatchIterator``: fixed-length windows of one token stream (plain-text language models).
"""

import dataclasses
import math
import queue
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

import grain
import jax
import numpy as np

from txf.runtime import agree
from txf.data.base import Batch, CheckpointableIterator, DataError, RowLayout
from txf.data.pipeline import LABEL, BatchSpec, LengthLimiter, bucket_lengths, rows_for_length
from txf.core.errors import TxfError


def layout_spec(spec: BatchSpec, layout: RowLayout) -> BatchSpec:
  """``spec`` whose token-derived row counts are multiples of ``layout.multiple`` too (the batch's
  shards): rows_multiple becomes lcm(rows_multiple, multiple). Checks a fixed row count."""
  if layout.multiple <= 1:
    return spec
  if spec.tokens_per_batch <= 0 and spec.rows % layout.multiple:
    raise DataError(f"batch_size={spec.rows} does not split over the {layout.multiple} batch shards "
                    f"(devices on the batch axes x grad_accum_steps): make it a multiple of "
                    f"{layout.multiple}")
  multiple = math.lcm(max(spec.rows_multiple, 1), layout.multiple)
  return dataclasses.replace(spec, rows_multiple=multiple)


def example_lengths(count: int, lengths_of: Callable[[Sequence[int]], np.ndarray],
                    features: int, what: str) -> np.ndarray:
  """The length index int32 [count, features] of a split: each process measures the records
  i = p, p + P, ... (``lengths_of(indices) -> [len(indices), features]``), then one all-gather
  gives every process all of them (``agree.gather_arrays``). A ``TxfError`` (a bad record) on any
  process is raised on every process with that process's message (the first failed process's,
  whole: ``agree.gather_json``), so none waits for the others."""
  p, n = jax.process_index(), jax.process_count()
  mine = np.arange(p, count, n)
  failure = ""
  try:
    local = np.asarray(lengths_of(mine), np.int32).reshape(len(mine), features)
  except TxfError as e:
    local, failure = np.zeros((len(mine), features), np.int32), f"{e} (process {p}, {what})"
  if n == 1:
    if failure:
      raise DataError(failure)
    return local
  failures = [f for f in agree.gather_json(failure) if f]
  if failures:
    raise DataError(failures[0])
  per = -(-count // n)
  padded = np.zeros((per, features), np.int32)
  padded[:len(local)] = local
  every = agree.gather_arrays(padded)
  full = np.zeros((count, features), np.int32)
  for q in range(n):
    rows = np.arange(q, count, n)
    full[rows] = every[q][:len(rows)]
  return full


def _fill(lengths: Dict[str, int], total: int, slots: Sequence[int], layout: RowLayout,
          read: Callable[[List[int]], List[Dict[str, np.ndarray]]], label: bool) -> Batch:
  """A global batch [total, L_f] of which this process fills its rows: row r holds example
  ``slots[r]`` (rows past ``len(slots)`` are filler), read through ``read(indices)``."""
  mine = [int(r) for r in layout.rows(total) if r < len(slots)]
  examples = read([int(slots[r]) for r in mine])
  batch = {}
  for f, length in lengths.items():
    out = np.zeros((total, length), np.int32)
    for r, ex in zip(mine, examples):
      out[r, :len(ex[f])] = ex[f]
    batch[f] = out
  if label:
    batch[LABEL] = np.zeros((total,), np.int32)
    for r, ex in zip(mine, examples):
      batch[LABEL][r] = ex[LABEL]
  return batch


def _fill_packed(lengths: Dict[str, int], total: int, packed: Sequence[Sequence[int]],
                 layout: RowLayout, read: Callable[[List[int]], List[Dict[str, np.ndarray]]]
                 ) -> Batch:
  """A packed global batch of which this process fills its rows: row r holds the examples
  ``packed[r]`` one after another; per feature f: ``f`` [total, L_f] the ids, ``f_segmentation``
  1, 2, ... for the row's first, second, ... example (0 on padding) and ``f_position`` 0, 1, ...
  within each example (0 on padding)."""
  mine = [int(r) for r in layout.rows(total) if r < len(packed)]
  flat = [int(i) for r in mine for i in packed[r]]
  examples = read(flat)
  batch = {}
  for f, length in lengths.items():
    for suffix in ("", "_segmentation", "_position"):
      batch[f + suffix] = np.zeros((total, length), np.int32)
  if not flat:
    return batch
  # example e of the flat list: its row, its segment number there (1, 2, ...), and per feature
  # its first column (the lengths of the row's earlier examples); then every token at once
  counts = np.asarray([len(packed[r]) for r in mine], np.int64)
  first = np.cumsum(counts) - counts                      # flat index of each row's first example
  rows = np.repeat(np.asarray(mine, np.int64), counts)
  segments = np.arange(len(flat)) - np.repeat(first, counts) + 1
  for f in lengths:
    ids = [ex[f] for ex in examples]
    sizes = np.fromiter((len(x) for x in ids), np.int64, len(ids))
    before = np.cumsum(sizes) - sizes                     # tokens of all earlier examples
    row_start = before[np.minimum(first, len(flat) - 1)]  # (a row with no examples repeats none)
    starts = before - np.repeat(row_start, counts)         # ... of the row's earlier examples
    position = np.arange(int(sizes.sum())) - np.repeat(before, sizes)
    at = (np.repeat(rows, sizes), np.repeat(starts, sizes) + position)
    batch[f][at] = np.concatenate(ids)
    batch[f + "_segmentation"][at] = np.repeat(segments, sizes)
    batch[f + "_position"][at] = position
  return batch


class IndexBatchIterator(CheckpointableIterator):
  """Plain or bucketed global batches over a shuffled record stream (see the module doc).

  ``lengths`` int32 [N, F] in the order of ``spec.lengths``; ``read(indices)`` gives the encoded
  (and, with ``spec.truncate``, truncated) examples of those records. State: ``pos`` = the stream
  position where the current window (plain: the next batch) starts, ``window``, ``emitted``.
  """

  def __init__(self, lengths: np.ndarray, spec: BatchSpec, seed: int, layout: RowLayout,
               read: Callable[[List[int]], List[Dict[str, np.ndarray]]], label: bool,
               fingerprint: str, what: str = "train"):
    self._spec, self._seed, self._layout = spec, seed, layout
    self._read, self._label, self._fingerprint = read, label, fingerprint
    self._features = list(spec.lengths)
    self._limits = np.asarray([spec.lengths[f] for f in self._features], np.int32)
    lengths = np.asarray(lengths, np.int32).reshape(len(lengths), len(self._features))
    self._over = np.any(lengths > self._limits, axis=1)      # [N] longer than the limits
    self._need = np.minimum(lengths, self._limits)           # [N, F] the tokens it takes
    self._limiter = LengthLimiter(spec.lengths, spec.truncate, spec.eos_last, what)
    if not spec.truncate and len(lengths) and self._over.all():
      limits = ", ".join(f"{f} <= {m}" for f, m in spec.lengths.items())
      raise DataError(f"{what}: every one of the {len(lengths)} examples is longer than the "
                      f"model takes ({limits} tokens): raise data.max_input_len / "
                      f"data.max_target_len, or set data.truncate=True to cut them")
    self._order = grain.MapDataset.range(len(lengths)).shuffle(seed=seed).repeat(None)
    if spec.packing and spec.bucketing:
      raise DataError("data.packing and data.bucketing both set: packing already removes padding; "
                      "set one of them")
    if spec.bucketing:
      self._buckets = bucket_lengths(spec)
      self._rows = [rows_for_length(spec, max(b.values())) for b in self._buckets]
      self._window_size = spec.bucket_window * max(self._rows)
    else:
      self._buckets = [dict(spec.lengths)]
      self._rows = [rows_for_length(spec, max(spec.lengths.values()))]
      self._window_size = self._rows[0]
    self._pos, self._next_pos, self._window, self._emitted, self._batches = 0, 0, 0, 0, None

  def _take(self, count: int) -> List[int]:
    """The next ``count`` kept records from ``_next_pos`` on (over-long ones dropped unless
    truncated, counted by the limiter)."""
    out, pos = [], self._next_pos
    while len(out) < count:
      index = int(self._order[pos])
      pos += 1
      over = self._over[index]
      if over:
        self._limiter.count_over()
      else:
        self._limiter.seen += 1
      if over and not self._spec.truncate:
        continue
      out.append(index)
    self._next_pos = pos
    return out

  def _bucket_of(self, index: int) -> int:
    lens = self._need[index]
    for k, bucket in enumerate(self._buckets):
      if all(lens[j] <= bucket[f] for j, f in enumerate(self._features)):
        return k
    raise DataError(f"example longer than the largest bucket {self._buckets[-1]}")

  def _pack(self) -> List[tuple]:
    """The current window's packed batches, in emission order: (0, rows), each row a list of
    record indices. First-fit from ``_pos``: each kept example goes into the first of the window's
    rows (``packing_bins``, rounded up to whole batches) where every feature still fits; the
    window ends before the first example that fits in no row (it opens the next window)."""
    rows = self._rows[0]
    bins = -(-max(self._spec.packing_bins, rows) // rows) * rows
    room = [np.full(bins, m, np.int32) for m in self._limits]   # tokens left per feature and row
    fits = np.empty(bins, bool)
    packed: List[List[int]] = [[] for _ in range(bins)]
    pos = self._pos
    while True:
      index, after, dropped = self._peek(pos)
      need = self._need[index].tolist()
      if not any(need):        # nothing to place (an empty example): pass over it
        pos = after
        continue
      np.greater_equal(room[0], need[0], out=fits)
      for left, n in zip(room[1:], need[1:]):
        fits &= left >= n
      row = int(fits.argmax())
      if not fits[row]:
        break
      for _ in range(dropped):
        self._limiter.count_over()
      if self._over[index]:
        self._limiter.count_over()                        # kept truncated
      else:
        self._limiter.seen += 1
      packed[row].append(index)
      for left, n in zip(room, need):
        left[row] -= n
      pos = after
    self._next_pos = pos
    order = np.random.default_rng([self._seed, self._window]).permutation(bins)
    packed = [packed[i] for i in order]
    return [(0, packed[start:start + rows]) for start in range(0, bins, rows)]

  def _peek(self, pos: int) -> tuple:
    """(the next kept record at or after stream position ``pos``, the position after it, how many
    over-long records were skipped to reach it); nothing is counted."""
    dropped = 0
    while True:
      index = int(self._order[pos])
      pos += 1
      if self._spec.truncate or not self._over[index]:
        return index, pos, dropped
      dropped += 1

  def _plan(self) -> List[tuple]:
    """The current window's batches, in emission order: (bucket, record indices)."""
    if self._spec.packing:
      return self._pack()
    self._next_pos = self._pos
    taken = self._take(self._window_size)
    if not self._spec.bucketing:
      return [(0, taken)]
    groups: List[List[int]] = [[] for _ in self._buckets]
    for index in taken:
      groups[self._bucket_of(index)].append(index)
    batches = []
    for k, group in enumerate(groups):
      for start in range(0, len(group), self._rows[k]):
        batches.append((k, group[start:start + self._rows[k]]))
    order = np.random.default_rng([self._seed, self._window]).permutation(len(batches))
    return [batches[i] for i in order]

  def __next__(self) -> Batch:
    while self._batches is None or self._emitted >= len(self._batches):
      if self._batches is not None:       # the previous window is used up
        self._pos, self._window, self._emitted = self._next_pos, self._window + 1, 0
      self._batches = self._plan()
    k, slots = self._batches[self._emitted]
    self._emitted += 1
    if self._spec.packing:
      return _fill_packed(self._buckets[k], self._rows[k], slots, self._layout, self._read)
    return _fill(self._buckets[k], self._rows[k], slots, self._layout, self._read, self._label)

  def get_state(self) -> Dict[str, Any]:
    return {"pos": int(self._pos), "window": int(self._window), "emitted": int(self._emitted),
            "pipeline": self._fingerprint}

  def set_state(self, state: Dict[str, Any]) -> None:
    _check_fingerprint(state, self._fingerprint)
    self._pos, self._window = int(state["pos"]), int(state["window"])
    self._emitted, self._batches = int(state["emitted"]), None
    if self._emitted:       # replan the window (the same on every process) and skip what was emitted
      self._batches = self._plan()


class WindowBatchIterator(CheckpointableIterator):
  """Global batches of ``rows`` windows: row r of batch b is ``windows[b * rows + r]`` (a grain
  MapDataset of ``{"targets": [T]}``); state: the next batch number."""

  def __init__(self, windows: grain.MapDataset, rows: int, length: int, layout: RowLayout,
               fingerprint: str):
    self._windows, self._rows, self._length, self._layout = windows, rows, length, layout
    self._fingerprint, self._batch = fingerprint, 0

  def __next__(self) -> Batch:
    start = self._batch * self._rows
    self._batch += 1
    mine = self._layout.rows(self._rows)
    out = np.zeros((self._rows, self._length), np.int32)
    for r in mine:
      out[r] = self._windows[start + int(r)]["targets"]
    return {"targets": out}

  def get_state(self) -> Dict[str, Any]:
    return {"batch": int(self._batch), "pipeline": self._fingerprint}

  def set_state(self, state: Dict[str, Any]) -> None:
    _check_fingerprint(state, self._fingerprint)
    self._batch = int(state["batch"])


def _check_fingerprint(state: Dict[str, Any], fingerprint: str) -> None:
  if "grain" in state:
    raise DataError("the checkpoint's data position was saved by an earlier txf's per-process "
                    "grain packer (data.packing=True); packed batches are now decided from the "
                    "length index on every process: resume this run with the txf that started it, "
                    "or start it again")
  if state.get("pipeline") != fingerprint:
    raise DataError(f"iterator state is from another data pipeline ({state.get('pipeline')} != "
                    f"{fingerprint}): batch size, seed, data or batching settings changed since the "
                    f"checkpoint; restore with the original config")


class Prefetched(CheckpointableIterator):
  """``iterator``'s batches made ``depth`` ahead in a background thread (``data.prefetch``).

  One thread drives the wrapped iterator, so the batches are the same as without it. Each batch is
  queued with the wrapped iterator's state right after it, and ``get_state`` returns the state of
  the last batch handed out, so a checkpoint resumes after exactly the batches the step has
  consumed. ``set_state`` stops the thread, drops what it had prepared and restarts from there.
  An error in the thread is raised by the next ``next()``.
  """

  def __init__(self, iterator: CheckpointableIterator, depth: int):
    self._inner, self._depth = iterator, max(int(depth), 1)
    self._state = iterator.get_state()
    self._queue: Optional[queue.Queue] = None
    self._stop: Optional[threading.Event] = None
    self._thread: Optional[threading.Thread] = None

  def _start(self) -> None:
    self._queue, self._stop = queue.Queue(self._depth), threading.Event()
    stop, out, inner = self._stop, self._queue, self._inner

    def work():
      while not stop.is_set():
        try:
          item = (next(inner), inner.get_state(), None)
        except BaseException as e:  # pylint: disable=broad-except  # handed to the consumer
          item = (None, None, e)
        while not stop.is_set():
          try:
            out.put(item, timeout=0.1)
            break
          except queue.Full:
            continue
        if item[2] is not None:
          return

    self._thread = threading.Thread(target=work, name="txf-prefetch", daemon=True)
    self._thread.start()
    # stopped when this iterator goes away or, at the latest, at exit: a thread still inside the
    # data source's native code when the interpreter ends would abort the process
    self._finalizer = weakref.finalize(self, _stop_thread, self._stop, self._thread)

  def _halt(self) -> None:
    if self._thread is not None:
      self._finalizer()
      self._thread = self._queue = self._stop = None

  def __next__(self) -> Batch:
    if self._thread is None:
      self._start()
    batch, state, error = self._queue.get()
    if error is not None:
      self._halt()
      raise error
    self._state = state
    return batch

  def get_state(self) -> Dict[str, Any]:
    return self._state

  def set_state(self, state: Dict[str, Any]) -> None:
    self._halt()
    self._inner.set_state(state)
    self._state = self._inner.get_state()


def _stop_thread(stop: threading.Event, thread: threading.Thread) -> None:
  """Ask a prefetch thread to stop and wait until it has (it finishes the batch it is making)."""
  stop.set()
  thread.join()
