"""Data parallelism with ``jax.pmap``: one replica of the state per device, the batch split across.

The pure step is built with ``axis_name='batch'``, so loss sums, token counts and gradients are
psummed over every device of every process before normalising: each replica takes the update the
single-device step would take on the whole global batch.
"""

from typing import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from txf.core.config import ConfigError
from txf.parallel.placed import DeviceParams


class PmapRunner:
  """jax.pmap over this process's devices; host batches [B, ...] become [devices, B/devices, ...].

  Train batches are this process's share of the global batch (the data loader's
  ``process_index``/``process_count`` split); eval batches are whole global batches, the same on
  every process, of which each process takes its own contiguous slice. host_params/host_state
  return one unreplicated host copy.
  """
  axis_name = "batch"

  def __init__(self, train_step: Callable, eval_step: Callable):
    self.devices = jax.local_devices()
    self.num_local = len(self.devices)
    self._replicated = NamedSharding(Mesh(np.array(self.devices), (self.axis_name,)),
                                     PartitionSpec(self.axis_name))  # as pmap outputs: no recompile
    self._train = jax.pmap(train_step, axis_name=self.axis_name, in_axes=(0, 0, None),
                           donate_argnums=(0,))
    self._eval = jax.pmap(lambda state, batch: eval_step(state.params, batch), axis_name=self.axis_name)
    self._rows_fns = {}

  # -- placement ------------------------------------------------------------------------------
  def prefetch(self, state, batch, rng) -> None:
    """Nothing: only the single-device runner keeps its step in the program cache."""

  def place_state(self, state):
    """An unreplicated state (host or one device) -> a [devices, ...] copy on every local device."""
    def put(x):
      x = np.asarray(jax.device_get(x))
      return jax.device_put(np.broadcast_to(x, (self.num_local,) + x.shape), self._replicated)
    return jax.tree_util.tree_map(put, state)

  def split(self, batch, what: str = "batch"):
    """[B_local, ...] numpy arrays -> [devices, B_local / devices, ...]; a clear error if uneven."""
    def one(x):
      x = np.asarray(x)
      if x.shape[0] % self.num_local:
        raise ConfigError(
            f"parallelism='pmap': the {what} has {x.shape[0]} rows on this process, not divisible by "
            f"its {self.num_local} devices; make batch_size a multiple of "
            f"{self.num_local * jax.process_count()} (devices x processes)")
      return x.reshape(self.num_local, x.shape[0] // self.num_local, *x.shape[1:])
    return jax.tree_util.tree_map(one, batch)

  def _process_slice(self, batch):
    """This process's contiguous rows of a global (identical on every process) batch."""
    count, index = jax.process_count(), jax.process_index()
    def one(x):
      x = np.asarray(x)
      if x.shape[0] % count:
        raise ConfigError(f"parallelism='pmap': an eval batch of {x.shape[0]} rows cannot be split "
                         f"over {count} processes; make batch_size a multiple of {count}")
      rows = x.shape[0] // count
      return x[index * rows:(index + 1) * rows]
    return jax.tree_util.tree_map(one, batch)

  # -- steps ----------------------------------------------------------------------------------
  def train_step(self, state, batch, rng):
    """batch: the global batch [B, ...] of which this process fills its contiguous B / processes
    rows (txf.parallel.feeding); metrics come back as scalars (replica 0)."""
    state, metrics = self._train(state, self.split(self._process_slice(batch)), rng)
    return state, jax.tree_util.tree_map(lambda m: m[0], metrics)

  def eval_step(self, state, batch):
    """batch: one whole global batch [B, ...]; returns the metric sums over it, on the host."""
    sums = self._eval(state, self.split(self._process_slice(batch), "eval batch"))
    return jax.tree_util.tree_map(lambda m: np.asarray(m.addressable_shards[0].data)[0], sums)

  def rows_fn(self, fn: Callable):
    """``fn(params, rows [B, ...]) -> out [B, ...]`` (e.g. a decoder) on every device of every
    process: each process takes its contiguous B / processes rows and splits them over its
    devices; only the outputs are gathered. Returns ``call(params, rows) -> numpy out``, the same
    on every process (``params``: the state's replicated parameters; ``rows``: the same numpy
    array on every process, B a multiple of ``batch_shards``)."""
    mapped = self._rows_fns.get(fn)
    if mapped is None:
      mapped = self._rows_fns[fn] = jax.pmap(fn)

    def call(params, rows):
      out = np.asarray(mapped(params, self.split(self._process_slice(rows), "decode batch")))
      out = out.reshape((-1,) + out.shape[2:])
      if jax.process_count() > 1:
        out = np.asarray(multihost_utils.process_allgather(out, tiled=True))
      return out

    return call

  @property
  def batch_shards(self) -> int:
    """How many ways a global batch is split: every device of every process."""
    return self.num_local * jax.process_count()

  def device_params(self, state) -> DeviceParams:
    """The replicated parameters ([devices, ...], one replica per device) with ``rows_fn``: a
    decoder runs pmapped, each device on its own rows with its own replica."""
    return DeviceParams(state.params, self.rows_fn, self.batch_shards)

  # -- host copies ----------------------------------------------------------------------------
  def host_params(self, state):
    return unreplicate(state.params)

  def host_state(self, state):
    return unreplicate(state)


def unreplicate(tree):
  """[devices, ...] replicated arrays -> one host numpy copy (the first local replica)."""
  return jax.tree_util.tree_map(lambda x: np.asarray(x.addressable_shards[0].data)[0], tree)
