"""The encoded examples of a training split, kept in memory once encoded.

A training batch reads its examples by record index. Encoding a record (reading it from its
source, adapting it, tokenizing its text) costs far more than copying its ids, and the length
index (txf/data/global_batches.py) has already encoded every record of this process's share once.
``IdStore`` keeps those ids: one flat int32 array per sequence feature, example i at
``offsets[i]`` with the length the length index gives, and each scalar field (a label) in an
int64 array. Records not yet stored (another process's share) are stored when first read.

A split whose ids would pass ``MAX_TOKENS`` is not stored (``IdStore.for_split`` returns None)
and every read encodes, as before. The ids read back are the ids stored: batches are the same
with or without a store.
"""

import threading
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

# The most ids a store holds (4 bytes each: 256 MiB); a larger split is encoded at every read.
MAX_TOKENS = 1 << 26


class IdStore:
  """Encoded examples by record index: ``put(i, example)``, ``get(i)`` (None if not stored).

  ``lengths`` int32 [N, F]: the length index, the ids of feature ``features[j]`` of record i
  have ``lengths[i, j]`` entries; an example whose lengths differ is not stored. ``scalars``
  names the fields that hold one integer (a label)."""

  def __init__(self, lengths: np.ndarray, features: Sequence[str], scalars: Sequence[str] = ()):
    lengths = np.asarray(lengths, np.int64).reshape(len(lengths), len(features))
    self.features, self.scalars = list(features), list(scalars)
    self._lengths = lengths
    ends = np.cumsum(lengths, axis=0)
    self._starts = ends - lengths                                  # [N, F]
    self._ids = [np.zeros(int(ends[-1, j]) if len(lengths) else 0, np.int32)
                 for j in range(len(self.features))]
    self._values = {s: np.zeros(len(lengths), np.int64) for s in self.scalars}
    self._have = np.zeros(len(lengths), bool)
    self._lock = threading.Lock()

  @classmethod
  def for_split(cls, lengths: np.ndarray, features: Sequence[str], scalars: Sequence[str] = (),
                max_tokens: int = MAX_TOKENS) -> Optional["IdStore"]:
    """A store for a split of this length index, or None when its ids pass ``max_tokens``."""
    if int(np.asarray(lengths, np.int64).sum()) > max_tokens:
      return None
    return cls(lengths, features, scalars)

  def __len__(self) -> int:
    """How many records are stored."""
    return int(self._have.sum())

  def put(self, index: int, example: Dict[str, np.ndarray]) -> None:
    """Store record ``index``'s example (its ``features`` and ``scalars``): skipped when its
    lengths are not the length index's or a field is missing."""
    if not all(f in example for f in self.features + self.scalars):
      return
    if any(len(example[f]) != self._lengths[index, j] for j, f in enumerate(self.features)):
      return
    with self._lock:
      for j, f in enumerate(self.features):
        start = self._starts[index, j]
        self._ids[j][start:start + self._lengths[index, j]] = example[f]
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
      view = self._ids[j][start:start + self._lengths[index, j]]
      view.flags.writeable = False
      out[f] = view
    for s in self.scalars:
      out[s] = self._values[s][index]
    return out

  def read(self, indices: Sequence[int], encode: Callable[[List[int]], List[Dict[str, np.ndarray]]]
           ) -> List[Dict[str, np.ndarray]]:
    """The examples of records ``indices``, in order: stored ones from the store, the others
    through ``encode(missing_indices) -> examples`` (and then stored)."""
    found = [self.get(int(i)) for i in indices]
    missing = [int(i) for i, ex in zip(indices, found) if ex is None]
    if missing:
      fresh = iter(encode(missing))
      for k, ex in enumerate(found):
        if ex is None:
          ex = found[k] = next(fresh)
          self.put(int(indices[k]), ex)
    return found
