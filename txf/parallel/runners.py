"""Runners: where the state lives and how a step is compiled. One interface for every layout.

Runner API (numpy host batches in, the same pure step function inside every runner):
  place_state(state) -> state on device(s); host values must be the same on every process
  prefetch(state, batch, rng) -> start reading the train step's program back from the program
      cache (``txf.runtime.program_cache``) on a thread, where the runner keeps it there (single device)
  train_step(state, batch, rng) -> (state, metrics)    compiled, state buffers donated;
      ``batch`` is the global batch [B, ...], of which a process fills only the rows its devices
      hold (``txf.parallel.feeding.Feed``; all of them on one process)
  eval_step(state, batch) -> metric sums               ``batch`` is a whole global batch, the same
      on every process
  rows_fn(fn) -> call(params, rows): ``fn(params, rows [B, ...]) -> [B, ...]`` (a decoder) on all
      the runner's devices and processes, the rows split over them (B a multiple of
      ``batch_shards``), parameters where they are; only the outputs are gathered
  device_params(state) -> ``DeviceParams`` (txf/parallel/placed.py): the parameters where the
      runner keeps them with its ``rows_fn`` and ``batch_shards``: what every evaluation that
      decodes (translations, LM samples) is given; nothing is gathered but the outputs
  host_params(state) -> params as one full host copy (for saving)
  host_state(state) -> the state as checkpoints take it (single/pmap: one host copy; mesh: the
      sharded global arrays, which orbax writes from every process)

``make_runner`` picks one by ``layout.parallelism`` (a ``ParallelSpec``, txf/parallel/spec.py):
single (txf.parallel.runners), pmap (txf.parallel.pmap_runner) or mesh (txf.parallel.mesh_runner).
"""

from typing import Callable

import jax
import numpy as np

from txf.runtime import program_cache
from txf.core.config import ConfigError
from txf.parallel import sharding as sharding_lib
from txf.parallel.mesh_runner import MeshRunner
from txf.parallel.placed import DeviceParams
from txf.parallel.pmap_runner import PmapRunner
from txf.parallel.spec import ParallelSpec


class SingleDeviceRunner:
  """jax.jit on the default device; compiles once (fixed batch shapes), donates the state."""
  axis_name = None

  def __init__(self, train_step: Callable, eval_step: Callable):
    self._train = program_cache.CachedJit(train_step, donate_argnums=(0,))
    self._eval = jax.jit(lambda state, batch: eval_step(state.params, batch))
    self._rows_fns = {}

  @property
  def train_jit(self):
    """The jitted, state-donating train step (kept in the program cache, ``txf.runtime.program_cache``):
    ``.lower(...).compile()`` for AOT, ``._cache_size()``."""
    return self._train

  def prefetch(self, state, batch, rng) -> None:
    """Starts reading the train step's program back from the program cache on a thread, when it
    holds one for these arguments (arrays or ``jax.ShapeDtypeStruct``s); the first step waits."""
    self._train.prefetch(state, batch, rng)

  def place_state(self, state):
    return jax.device_put(state)

  def train_step(self, state, batch, rng):
    return self._train(state, batch, rng)

  def eval_step(self, state, batch):
    return self._eval(state, batch)

  def rows_fn(self, fn: Callable):
    """``fn(params, rows) -> out`` jitted on the default device: ``call(params, rows) -> numpy``."""
    jitted = self._rows_fns.get(fn)
    if jitted is None:
      jitted = self._rows_fns[fn] = jax.jit(fn)
    return lambda params, rows: np.asarray(jitted(params, rows))

  batch_shards = 1

  def device_params(self, state) -> DeviceParams:
    """The state's parameters on the default device, decoded there."""
    return DeviceParams(state.params, self.rows_fn, 1)

  def host_params(self, state):
    return jax.device_get(state.params)

  def host_state(self, state):
    return jax.device_get(state)


def make_runner(layout: ParallelSpec, make_train_step: Callable, make_eval_step: Callable,
                param_axes=None):
  """The runner for ``layout.parallelism``; ``make_*_step(axis_name)`` build the pure steps.

  ``param_axes``: the model's logical axes (``txf.models.param_axes``), needed by ``mesh``.
  Checks up front that ``batch_size`` (and its ``grad_accum_steps`` micro-batches) split evenly
  over the processes and devices of the chosen layout.
  """
  kind = layout.parallelism
  processes, accum = jax.process_count(), layout.grad_accum_steps
  if kind == "single":
    if processes > 1:
      raise ConfigError(f"parallelism='single' uses one device, but this is one of {processes} "
                       f"processes: set parallelism='pmap' or 'mesh'")
    return SingleDeviceRunner(make_train_step(None), make_eval_step(None))
  if kind == "pmap":
    shards = processes * jax.local_device_count()
    _check_batch(layout.batch_size, shards, accum, f"{shards} devices ({processes} process(es) x "
                 f"{jax.local_device_count()})")
    return PmapRunner(make_train_step(PmapRunner.axis_name), make_eval_step(PmapRunner.axis_name))
  if kind == "mesh":
    mesh = sharding_lib.make_mesh(layout.mesh_shape, dcn_mesh_shape=layout.dcn_mesh_shape)
    rules = dict(layout.sharding_rules)
    batch_axes = sharding_lib.batch_spec(rules, dict(mesh.shape))
    axes = (() if not len(batch_axes) else (batch_axes[0],) if isinstance(batch_axes[0], str)
            else tuple(batch_axes[0]))
    shards = 1
    for a in axes:
      shards *= mesh.shape[a]
    _check_batch(layout.batch_size, max(shards, processes), accum,
                 f"mesh {dict(mesh.shape)}: batch over {axes or 'nothing'}, {processes} process(es)")
    return MeshRunner(make_train_step(None), make_eval_step(None), mesh, rules, param_axes)
  raise ConfigError(f"parallelism={kind!r} is not one of 'single', 'pmap', 'mesh'")


def _check_batch(batch_size: int, shards: int, accum: int, where: str) -> None:
  if batch_size % shards:
    raise ConfigError(f"batch_size={batch_size} does not split over {where}: make it a multiple of {shards}")
  if accum > 1 and (batch_size // shards) % accum:
    raise ConfigError(f"batch_size={batch_size} gives {batch_size // shards} rows per shard over {where}, "
                     f"not divisible into grad_accum_steps={accum} micro-batches: make batch_size a "
                     f"multiple of {shards * accum}")
