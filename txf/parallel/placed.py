"""Parameters where a runner keeps them, with the way to run a function of them over rows.

Every evaluation that needs parameters (decoding translations, greedy LM samples) takes a
``DeviceParams`` from ``runner.device_params(state)``: the parameters stay where the runner keeps
them (one device; a replica per device under pmap; sharded over a mesh), the rows are split over
the runner's devices and processes, and only the outputs come back to the host. ``local(params)``
wraps plain parameters (a loaded run, a notebook) the same way, on the default device.
"""

import dataclasses
import functools
from typing import Any, Callable

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class DeviceParams:
  """``params`` in a runner's layout; ``rows_fn(fn)`` compiles ``fn(params, rows [b, ...]) ->
  [b, ...]`` for that layout and returns ``call(params, rows [B, ...]) -> numpy [B, ...]`` with B a
  multiple of ``shards`` (``fn`` must take its row count ``b`` from ``rows``: under pmap it sees
  one device's rows)."""
  params: Any
  rows_fn: Callable[[Callable], Callable]
  shards: int = 1

  def run(self, fn: Callable, rows: np.ndarray) -> np.ndarray:
    """``fn`` over ``rows`` [n, ...] (any n >= 1): zero rows are added up to a multiple of
    ``shards`` and their outputs dropped; numpy [n, ...] (the same on every process)."""
    rows = np.asarray(rows)
    n = rows.shape[0]
    padded = -(-n // self.shards) * self.shards
    if padded != n:
      rows = np.concatenate([rows, np.zeros((padded - n,) + rows.shape[1:], rows.dtype)])
    return np.asarray(self.rows_fn(fn)(self.params, rows))[:n]


@functools.lru_cache(maxsize=32)
def _jitted(fn: Callable) -> Callable:
  return jax.jit(fn)


def jit_rows(fn: Callable) -> Callable:
  """``rows_fn`` on the default device: ``fn`` jitted (one compile per fn and shapes)."""
  jitted = _jitted(fn)
  return lambda params, rows: np.asarray(jitted(params, rows))


def local(params) -> DeviceParams:
  """Plain parameters (host or one device) as ``DeviceParams`` run on the default device."""
  return params if isinstance(params, DeviceParams) else DeviceParams(params, jit_rows, 1)
