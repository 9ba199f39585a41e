"""``jax.jit`` over a (data, fsdp, tensor) ``Mesh`` with ``NamedSharding``s: FSDP, tensor and data parallel.

The pure step is the single-device one (``axis_name=None``); XLA's SPMD partitioner inserts the
collectives from the in/out shardings: parameters and optimizer state sharded by the logical axes
the model declares and ``config.sharding_rules`` (txf/parallel/sharding.py), batches over
data x fsdp, metrics replicated; the step is traced under the mesh and the rules, so the model's
activation constraints apply. Works the same on one process and on many (each process feeds its own rows).
"""

from typing import Callable, Mapping, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from txf.core.config import ConfigError
from txf.parallel import sharding as sharding_lib
from txf.parallel.placed import DeviceParams


class MeshRunner:
  """jit with in/out shardings on ``mesh``; state buffers donated.

  Train batches are global batches of which each process fills the rows its devices hold
  (txf.parallel.feeding); eval batches are whole global batches, identical on every process; both
  become global arrays with ``jax.make_array_from_callback`` (each device reads only its rows). ``host_state`` returns the
  sharded global arrays themselves (orbax writes each process's shards); ``host_params`` gathers
  one full host copy on every process.
  """
  axis_name = None

  def __init__(self, train_step: Callable, eval_step: Callable, mesh: Mesh,
               rules: Optional[Mapping[str, str]] = None, param_axes=None):
    if param_axes is None:
      raise TypeError("MeshRunner needs param_axes, the model's logical axes (txf.models.param_axes)")
    self.mesh, self.rules, self.param_axes = mesh, rules, param_axes
    self.axis_sizes = dict(mesh.shape)
    self.batch_sharding = NamedSharding(mesh, sharding_lib.batch_spec(rules, self.axis_sizes))
    self.replicated = NamedSharding(mesh, PartitionSpec())
    self._train_step, self._eval_step = train_step, eval_step
    self._key_impl = None
    self._placed_key = None
    self._shardings = None
    self._train = self._eval = None
    self._checked_rows = set()
    self._rows_fns = {}

  def state_shardings(self, state):
    """NamedShardings for every leaf of ``state`` (a TrainState, or shapes of one)."""
    return sharding_lib.named_shardings(state, self.mesh, self.rules, self.param_axes)

  # -- placement ------------------------------------------------------------------------------
  def init_state(self, init_fn: Callable[[], object]):
    """``init_fn()`` (a TrainState) created directly in its shardings (``sharding.init_sharded``):
    each device computes only its own shards, no device or host ever holds the whole state."""
    state = sharding_lib.init_sharded(init_fn, self.mesh, self.rules, self.param_axes)
    if self._shardings is None:
      self._compile(jax.tree_util.tree_map(lambda x: x.sharding, state))
    return state

  def abstract_state(self, abstract):
    """``abstract`` (ShapeDtypeStructs of a TrainState) carrying their target shardings
    (``sharding.abstract_sharded``): what a checkpoint is restored into, each process reading
    only its own shards."""
    return sharding_lib.abstract_sharded(abstract, self.mesh, self.rules, self.param_axes)

  def prefetch(self, state, batch, rng) -> None:
    """Nothing: only the single-device runner keeps its step in the program cache."""

  def place_state(self, state):
    """Shard ``state`` over the mesh (host arrays: the same values must be given on every process)."""
    shardings = self.state_shardings(state)
    if self._shardings is None:
      self._compile(shardings)
    multi = jax.process_count() > 1

    def put(x, s):
      if isinstance(x, jax.Array) and (not multi or not x.is_fully_addressable):
        return jax.device_put(x, s)
      return jax.device_put(np.asarray(jax.device_get(x)), s)

    return jax.tree_util.tree_map(put, state, shardings)

  def _compile(self, shardings):
    self._shardings = shardings

    def train(state, batch, key_data):
      with sharding_lib.step_context(self.mesh, self.rules):
        return self._train_step(state, batch, jax.random.wrap_key_data(key_data, impl=self._key_impl))

    def evaluate(params, batch):
      with sharding_lib.step_context(self.mesh, self.rules):
        return self._eval_step(params, batch)

    self._train = jax.jit(train, in_shardings=(shardings, self.batch_sharding, self.replicated),
                          out_shardings=(shardings, self.replicated), donate_argnums=(0,))
    self._eval = jax.jit(evaluate, in_shardings=(shardings.params, self.batch_sharding),
                         out_shardings=self.replicated)

  def lower_train(self, abstract_state, global_batch):
    """The train step lowered (not run) for ``txf plan``: ``abstract_state`` ShapeDtypeStructs with
    their shardings, ``global_batch`` ShapeDtypeStructs of the whole global batch; returns
    ``jax.stages.Lowered`` (``.compile()`` gives XLA's memory and cost analysis)."""
    shardings = jax.tree_util.tree_map(lambda x: x.sharding, abstract_state)
    self._compile(shardings)
    batch = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.batch_sharding), global_batch)
    key = jax.ShapeDtypeStruct(jax.random.key_data(jax.random.key(0)).shape, np.uint32,
                               sharding=self.replicated)
    return self._train.lower(abstract_state, batch, key)

  def local_batch(self, batch):
    """This process's rows [B_local, ...] -> global arrays [B_local * processes, ...] on the mesh."""
    count = jax.process_count()

    def one(x):
      x = np.asarray(x)
      global_shape = (x.shape[0] * count,) + x.shape[1:]
      self._check_rows(global_shape, x.shape[0])
      return jax.make_array_from_process_local_data(self.batch_sharding, x, global_shape)

    return jax.tree_util.tree_map(one, batch)

  def global_batch(self, batch):
    """A whole global batch, the same numpy values on every process -> sharded global arrays."""
    def one(x):
      x = np.asarray(x)
      self._check_rows(x.shape, None)
      return jax.make_array_from_callback(x.shape, self.batch_sharding, lambda index: x[index])
    return jax.tree_util.tree_map(one, batch)

  def _check_rows(self, global_shape, local_rows):
    key = (global_shape[0], local_rows)
    if key in self._checked_rows:
      return
    spec = self.batch_sharding.spec
    entry = spec[0] if len(spec) else None
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    ways = int(np.prod([self.axis_sizes[a] for a in axes]))
    if global_shape[0] % ways:
      raise ConfigError(f"parallelism='mesh': a batch of {global_shape[0]} rows cannot be split over "
                       f"{ways} batch shards (mesh {self.axis_sizes}, batch over "
                       f"{self.batch_sharding.spec}); make batch_size a multiple of {ways}")
    if local_rows is not None:
      index_map = self.batch_sharding.addressable_devices_indices_map(tuple(global_shape))
      rows = {(idx[0].start or 0, idx[0].stop or global_shape[0]) if idx else (0, global_shape[0])
              for idx in index_map.values()}
      needed = sum(stop - start for start, stop in rows)
      if needed != local_rows:
        raise ConfigError(
            f"parallelism='mesh': this process's devices hold {needed} rows of the global batch but the "
            f"data gives it {local_rows} (batch_size / process_count); the batch axes (data x fsdp = "
            f"{ways}) must be a multiple of the process count {jax.process_count()} and the tensor "
            f"axis must not span processes: change mesh_shape")
    self._checked_rows.add(key)

  def _key_data(self, rng):
    """``rng``'s raw key data replicated on the mesh; the same key object given again (the loop
    passes the run's dropout key every step) is placed once, never fetched again."""
    if self._placed_key is not None and self._placed_key[0] is rng:
      return self._placed_key[1]
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
      self._key_impl = jax.random.key_impl(rng)
      data = jax.random.key_data(rng)
    else:  # a raw uint32 key
      self._key_impl, data = None, rng
    placed = jax.device_put(np.asarray(jax.device_get(data)), self.replicated)
    self._placed_key = (rng, placed)
    return placed

  # -- steps ----------------------------------------------------------------------------------
  def train_step(self, state, batch, rng):
    """batch: the global batch [B, ...] of which this process fills the rows its devices hold
    (txf.parallel.feeding; the others are never read); metrics come back replicated (scalars)."""
    if self._train is None:
      raise RuntimeError("MeshRunner.train_step before place_state: place the state first")
    return self._train(state, self.global_batch(batch), self._key_data(rng))

  def eval_step(self, state, batch):
    """batch: one whole global batch [B, ...]; returns the metric sums over it, on the host."""
    if self._eval is None:
      raise RuntimeError("MeshRunner.eval_step before place_state: place the state first")
    return jax.device_get(self._eval(state.params, self.global_batch(batch)))

  def rows_fn(self, fn: Callable):
    """``fn(params, rows [B, ...]) -> out [B, ...]`` (e.g. a decoder) run on the whole mesh:
    parameters stay in their shardings, the rows are split over the batch axes (each process
    computes only its own rows), and only the outputs are gathered. Returns
    ``call(params, rows) -> numpy out`` (the same on every process); ``rows`` must be the same
    numpy array on every process, with B a multiple of ``batch_shards``."""
    jitted = self._rows_fns.get(fn)
    if jitted is None:
      def traced(params, rows):
        with sharding_lib.step_context(self.mesh, self.rules):
          return fn(params, rows)
      jitted = jax.jit(traced, in_shardings=(self._shardings.params, self.batch_sharding),
                       out_shardings=self.batch_sharding)
      self._rows_fns[fn] = jitted
    return lambda params, rows: gather(jitted(params, self.global_batch(rows)))

  @property
  def batch_shards(self) -> int:
    """How many ways the batch (leading) dimension is split over the mesh."""
    spec = self.batch_sharding.spec
    entry = spec[0] if len(spec) else None
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    return int(np.prod([self.axis_sizes[a] for a in axes]))

  def device_params(self, state) -> DeviceParams:
    """The sharded parameters with ``rows_fn``: decoding runs on the whole mesh, no host
    gathers a parameter."""
    return DeviceParams(state.params, self.rows_fn, self.batch_shards)

  # -- host copies ----------------------------------------------------------------------------
  def host_params(self, state):
    """One full host (numpy) copy of the parameters, on every process."""
    return gather(state.params)

  def host_state(self, state):
    """The state for checkpoints: the sharded global arrays themselves (orbax saves every shard)."""
    return state


def gather(tree):
  """Sharded (possibly multi-process) arrays -> full numpy arrays on every process."""
  if jax.process_count() > 1:
    return multihost_utils.process_allgather(tree, tiled=True)
  return jax.device_get(tree)
