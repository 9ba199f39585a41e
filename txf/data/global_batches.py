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

``IndexBatchIterator``: plain batches (``spec.rows`` or a token budget over the full lengths) and
bucketed ones (a window of ``bucket_window`` batches' worth of examples is grouped into length
buckets, cut into batches, and emitted in a seeded random order).
``WindowBatchIterator``: fixed-length windows of one token stream (plain-text language models).
"""

import dataclasses
import math
from typing import Any, Callable, Dict, List, Sequence

import grain
import jax
import numpy as np

from txf import agree
from txf.data.base import Batch, CheckpointableIterator, DataError, RowLayout
from txf.data.pipeline import LABEL, BatchSpec, LengthLimiter, bucket_lengths, rows_for_length
from txf.errors import TxfError


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


class IndexBatchIterator(CheckpointableIterator):
  """Plain or bucketed global batches over a shuffled record stream (see the module doc).

  ``lengths`` int32 [N, F] in the order of ``spec.lengths``; ``read(indices)`` gives the encoded
  (and, with ``spec.truncate``, truncated) examples of those records. State: ``pos`` = the stream
  position where the current window (plain: the next batch) starts, ``window``, ``emitted``.
  """

  def __init__(self, lengths: np.ndarray, spec: BatchSpec, seed: int, layout: RowLayout,
               read: Callable[[List[int]], List[Dict[str, np.ndarray]]], label: bool,
               fingerprint: str, what: str = "train"):
    self._lengths, self._spec, self._seed, self._layout = lengths, spec, seed, layout
    self._read, self._label, self._fingerprint = read, label, fingerprint
    self._features = list(spec.lengths)
    self._limits = np.asarray([spec.lengths[f] for f in self._features], np.int32)
    self._limiter = LengthLimiter(spec.lengths, spec.truncate, spec.eos_last, what)
    self._order = grain.MapDataset.range(len(lengths)).shuffle(seed=seed).repeat(None)
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
      lens = self._lengths[index]
      over = bool(np.any(lens > self._limits))
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
    lens = np.minimum(self._lengths[index], self._limits)
    for k, bucket in enumerate(self._buckets):
      if all(lens[j] <= bucket[f] for j, f in enumerate(self._features)):
        return k
    raise DataError(f"example longer than the largest bucket {self._buckets[-1]}")

  def _plan(self) -> List[tuple]:
    """The current window's batches, in emission order: (bucket, record indices)."""
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
  if state.get("pipeline") != fingerprint:
    raise DataError(f"iterator state is from another data pipeline ({state.get('pipeline')} != "
                    f"{fingerprint}): batch size, seed, data or batching settings changed since the "
                    f"checkpoint; restore with the original config")
