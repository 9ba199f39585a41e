"""The encoded examples of a training split, kept in memory once encoded.

A training batch reads its examples by record index. Encoding a record (reading it from its
source, adapting it, tokenizing its text) costs far more than copying its ids, and the pass that
measures the length index (txf/data/global_batches.py) encodes every record of this process's
share once. ``IdStore`` keeps what that pass encodes: per sequence feature one growing int32
array, with each record's start and length, and each scalar field (a label) in an int64 array.
Records not stored yet (another process's share) are stored when first read.

A store holds at most ``max_tokens`` ids (``MAX_TOKENS``: 64M, 256 MiB; a run sets it with
``data.id_store_tokens``); records past that are encoded at every read, as without a store. The ids read back are the ids stored, so the batches
are the same with or without one.
"""

import threading
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

# The most ids a store holds (4 bytes each: 256 MiB).
MAX_TOKENS = 1 << 26


class IdStore:
  """Encoded examples of records 0..count-1: ``put(i, example)``, ``get(i)`` (None if not stored).

  ``features`` name the sequence fields (int ids), ``scalars`` the fields that hold one integer
  (a label); an example missing one of them is not stored."""

  def __init__(self, count: int, features: Sequence[str], scalars: Sequence[str] = (),
               max_tokens: Optional[int] = None):
    self.features, self.scalars = list(features), list(scalars)
    self._starts = np.zeros((count, len(self.features)), np.int32)   # 8 bytes a record and
    self._sizes = np.zeros((count, len(self.features)), np.int32)    # feature
    self._ids = [np.zeros(1024, np.int32) for _ in self.features]
    self._used = [0] * len(self.features)
    self._values = {s: np.zeros(count, np.int64) for s in self.scalars}
    self._have = np.zeros(count, bool)
    self._room = min(MAX_TOKENS if max_tokens is None else int(max_tokens), 2 ** 31 - 1)
    self._lock = threading.Lock()

  def __len__(self) -> int:
    """How many records are stored."""
    return int(self._have.sum())

  def put(self, index: int, example: Dict[str, np.ndarray]) -> None:
    """Store record ``index``'s example (its ``features`` and ``scalars``), unless it is stored
    already, lacks a field, or its ids would pass the store's ``max_tokens``."""
    if self._have[index] or not all(f in example for f in self.features + self.scalars):
      return
    sizes = [len(example[f]) for f in self.features]
    with self._lock:
      if self._have[index] or sum(sizes) > self._room:   # (another thread may have stored it)
        return
      self._room -= sum(sizes)
      for j, f in enumerate(self.features):
        start, end = self._used[j], self._used[j] + sizes[j]
        if end > len(self._ids[j]):       # grow by doubling: the old array stays valid for readers
          grown = np.zeros(max(2 * len(self._ids[j]), end), np.int32)
          grown[:start] = self._ids[j][:start]
          self._ids[j] = grown
        self._ids[j][start:end] = example[f]
        self._starts[index, j], self._sizes[index, j] = start, sizes[j]
        self._used[j] = end
      for s in self.scalars:
        self._values[s][index] = int(example[s])
      self._have[index] = True   # set last: a reader that sees it sees the ids

  def get(self, index: int) -> Optional[Dict[str, np.ndarray]]:
    """Record ``index``'s example (the ids as read-only views), or None if not stored."""
    if not self._have[index]:
      return None
    out = {}
    for j, f in enumerate(self.features):
      start = self._starts[index, j]
      view = self._ids[j][start:start + self._sizes[index, j]]
      view.flags.writeable = False
      out[f] = view
    for s in self.scalars:
      out[s] = self._values[s][index]
    return out

  def read(self, indices: Sequence[int], encode: Callable[[List[int]], List[Dict[str, np.ndarray]]]
           ) -> List[Dict[str, np.ndarray]]:
    """The examples of records ``indices``, in order: stored ones from the store, the others
    through ``encode(missing_indices) -> examples`` (and then stored while there is room)."""
    found = [self.get(int(i)) for i in indices]
    missing = [int(i) for i, ex in zip(indices, found) if ex is None]
    if missing:
      fresh = iter(encode(missing))
      for k, ex in enumerate(found):
        if ex is None:
          ex = found[k] = next(fresh)
          self.put(int(indices[k]), ex)
    return found
