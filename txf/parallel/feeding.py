"""Which rows of each global batch this process feeds, read from the runner's layout.

Every process builds the same global batch shapes; each fills only the rows its own devices hold
and leaves the others PAD (``Task.train_iterator(..., layout=...)``). The rows come from where
the batch lives, not from ``process_index``:

  single       every row
  pmap         process i: the contiguous rows [i R / P, (i + 1) R / P) (pmap's split)
  mesh         the rows the process's devices hold under the batch sharding (data x fsdp): with
               a tensor (or any other) axis spanning processes, several processes hold, and fill,
               the same rows; with multi-slice meshes the slices' rows are wherever the mesh puts them

``Feed.multiple``: every global row count is a multiple of the batch's shards times
``grad_accum_steps`` (each micro-batch splits evenly over the shards).
"""

from typing import Dict

import jax
import numpy as np


class Feed:
  """``rows(R)`` -> the sorted global row indices int64 [n] this process fills; ``multiple``."""

  def __init__(self, runner, accum: int = 1):
    self.multiple = max(int(getattr(runner, "batch_shards", 1)), 1) * max(int(accum), 1)
    self._sharding = getattr(runner, "batch_sharding", None)
    self._pmap = getattr(runner, "axis_name", None) is not None and self._sharding is None
    self._cache: Dict[int, np.ndarray] = {}

  def rows(self, total: int) -> np.ndarray:
    if total not in self._cache:
      self._cache[total] = self._rows(total)
    return self._cache[total]

  def _rows(self, total: int) -> np.ndarray:
    count, index = jax.process_count(), jax.process_index()
    if self._sharding is not None:
      spans = set()
      for idx in self._sharding.addressable_devices_indices_map((total, 1)).values():
        s = idx[0] if idx else slice(None)
        spans.add((s.start or 0, total if s.stop is None else s.stop))
      return np.unique(np.concatenate([np.arange(a, b) for a, b in sorted(spans)] or
                                      [np.zeros(0, np.int64)])).astype(np.int64)
    if self._pmap and count > 1:
      return np.arange(index * total // count, (index + 1) * total // count)
    return np.arange(total)
