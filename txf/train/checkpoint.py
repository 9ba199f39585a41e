"""Checkpoints of a run in ``<workdir>/checkpoints``: orbax ``CheckpointManager``, async, keep-N + best.

One checkpoint per saved step ``<workdir>/checkpoints/<step>/`` holds two orbax items:
  state  the train state ``TrainState(step, params, opt_state)`` as ``runner.host_state`` gives
         it (a host copy; a mesh runner's sharded global arrays, written by every process)
  meta   JSON: {"step", "seed", "data_iterator": [state of process 0, 1, ...], "eval": metrics
         at this step ({} if none), "loop": the loop's own state (e.g. a partial log window)}
and, when ``spec.best_metric`` is set, orbax's ``metrics`` item (the loop then also saves at
every evaluation, so the best evaluated parameters exist as a checkpoint).

The dropout RNG of step n is ``fold_in(split(key(seed))[1], n)`` (see txf/train/loop.py): the
step and the seed (in config.json) determine it, so no key is stored.

Saving is asynchronous: ``save`` returns once the arrays are on the host and orbax writes them in
a background thread; the next ``save`` and ``close`` wait for it. Orbax writes into
``<step>.orbax-checkpoint-tmp*`` and renames it to ``<step>`` only when every item is complete,
so a process killed mid-save leaves no directory that looks like a checkpoint (the temporary
one is ignored, and removed by the next run).

Kept: the last ``spec.keep_checkpoints`` (<= 0: all) plus the best one by the eval metric
``spec.best_metric`` (``spec.best_mode`` max/min; "" = off): a ``CheckpointSpec``, the run
config's checkpoint fields read once.

Restoring is independent of the device count: ``restore_latest(target)`` restores onto the
structure, dtypes and shardings of ``target`` -- jax arrays or ``jax.ShapeDtypeStruct`` leaves
with a sharding are restored straight onto those devices (the loop passes a mesh runner's
``state_shardings``), numpy leaves and ShapeDtypeStructs without a sharding are restored as host
numpy (the loop then calls ``runner.place_state``). A checkpoint that cannot be read is
moved aside to ``<workdir>/checkpoints-unreadable/`` (nothing is deleted) with a warning, and
the previous one is tried; one that reads but does not fit the target is an error.

``Checkpointer.average_params`` averages checkpoints one array at a time (no whole checkpoint is
ever read onto the host); txf.train.averaging writes the mean as a params file
(``txf average-checkpoints``).
"""

import dataclasses
import os
import time
import warnings
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import jax
import numpy as np
import orbax.checkpoint as ocp

from txf.runtime import agree, storage
from txf.runtime import workdir as workdir_lib
from txf.core import specs
from txf.core.errors import TxfError
from txf.train.failed_saves import FailedSaves

FORMAT_VERSION = 1
STATE, META = "state", "meta"


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
  """What a run keeps and how it is named (defaults: ``base_config``'s).

  Attributes:
    seed: the run's seed, saved with each checkpoint.
    keep_checkpoints: the last n checkpoints kept (<= 0: all).
    best_metric: the eval metric whose best checkpoint is also kept ("" = off).
    best_mode: "max" or "min" for ``best_metric``.
  """
  seed: int = specs.field("seed")
  keep_checkpoints: int = specs.field("keep_checkpoints")
  best_metric: str = specs.field("best_metric")
  best_mode: str = specs.field("best_mode")

  @classmethod
  def from_config(cls, config) -> "CheckpointSpec":
    """The spec of a run config (a ConfigDict or dict with those fields)."""
    return specs.read(cls, config)


class CheckpointFallbackWarning(UserWarning):
  """The latest checkpoint was unreadable; an earlier one is used."""


class Restored(NamedTuple):
  """What ``restore`` returns: the train state, this process's data-iterator state, the step,
  the loop's own saved state and the eval metrics saved with the checkpoint."""
  state: Any
  data_state: Optional[Dict[str, Any]]
  step: int
  loop_state: Dict[str, Any]
  eval_metrics: Dict[str, float]


class CheckpointError(TxfError, ValueError):
  """A checkpoint that does not fit this run, or a checkpoint asked for that is not there."""


def _abstract(leaf):
  """A restore target leaf: jax arrays become ShapeDtypeStructs (keeping their sharding);
  ShapeDtypeStructs without a sharding mean host numpy (a placeholder, never filled)."""
  if isinstance(leaf, jax.Array):
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
  if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None:
    return np.empty(leaf.shape, leaf.dtype)
  return leaf


class Checkpointer:
  """Save and restore a run's checkpoints (one instance per run; call ``close()`` at the end).

  ``spec`` (a ``CheckpointSpec``) supplies keep_checkpoints, best_metric, best_mode and seed;
  ``spec=None`` opens the checkpoints read-only (e.g. to average them). ``agreed_steps``: with several processes,
  process 0 lists the checkpoint steps and broadcasts them, so every process resumes from the same
  step whatever its view of a shared file system (a collective: every process must build the
  Checkpointer, as the training loop does; one process alone must not pass it).
  """

  def __init__(self, workdir: str, spec: Optional[CheckpointSpec] = None, async_save: bool = True,
               read_only: bool = False, agreed_steps: bool = False):
    self.workdir = storage.absolute(workdir)  # a local path made absolute, a bucket path as it is
    self.directory = storage.join(self.workdir, workdir_lib.CHECKPOINTS_DIR)
    self.read_only = spec is None or read_only
    self.seed = None if spec is None else int(spec.seed)
    self.best_metric = "" if spec is None else spec.best_metric
    best_mode = "max" if spec is None else spec.best_mode
    self._warned_missing_metric = False
    keep = None if self.read_only or spec.keep_checkpoints <= 0 else int(spec.keep_checkpoints)
    policies = [ocp.checkpoint_managers.LatestN(n=keep)]
    best_fn = None
    if self.best_metric:
      name, worst = self.best_metric, -np.inf if best_mode == "max" else np.inf
      best_fn = lambda m: float(m.get(name, worst))  # checkpoints without eval: never best
      policies.append(ocp.checkpoint_managers.BestN(
          get_metric_fn=best_fn, reverse=best_mode == "min", n=1,
          keep_checkpoints_without_metrics=False))
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    registry.add(STATE, ocp.args.StandardSave)
    registry.add(STATE, ocp.args.StandardRestore)
    registry.add(STATE, ocp.args.PyTreeRestore)
    meta_handler = ocp.handlers.JsonCheckpointHandler()
    registry.add(META, ocp.args.JsonSave, meta_handler)
    registry.add(META, ocp.args.JsonRestore, meta_handler)
    options = ocp.CheckpointManagerOptions(
        preservation_policy=None if self.read_only else
        ocp.checkpoint_managers.AnyPreservationPolicy(policies),
        best_fn=best_fn, best_mode=best_mode, create=not self.read_only,
        cleanup_tmp_directories=not self.read_only, read_only=self.read_only,
        enable_async_checkpointing=async_save, save_interval_steps=0 if self.read_only else 1,
        single_host_load_and_broadcast=agreed_steps)
    if self.read_only and not storage.wpath(self.directory).is_dir():
      raise CheckpointError(f"no checkpoints in {self.directory}: train a run there first")
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          handler_registry=registry)
    # several processes: a failed background save is raised at once (txf.train.failed_saves)
    self._saves = FailedSaves(self._manager, jax.process_count() > 1 and not self.read_only
                              and async_save)

  # -- what is there -------------------------------------------------------------------------

  def all_steps(self) -> List[int]:
    """Steps of the finished checkpoints, ascending."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def best_step(self) -> Optional[int]:
    """The best step by ``best_metric`` (the latest one if best tracking is off)."""
    return self._manager.best_step()

  def step_dir(self, step: int) -> str:
    return storage.join(self.directory, str(step))

  # -- saving ----------------------------------------------------------------------------------

  def save(self, step: int, state, data_state: Optional[Dict[str, Any]],
           eval_metrics: Optional[Dict[str, float]] = None,
           loop_state: Optional[Dict[str, Any]] = None) -> bool:
    """Start saving checkpoint ``step`` in the background; returns False if it already exists.

    state: the runner's host copy of the train state (``runner.host_state``).
    data_state: this process's ``train_iterator.get_state()`` (JSON-serialisable).
    eval_metrics: the eval metrics measured at this very step, or None.
    loop_state: JSON-serialisable extras the loop needs to resume exactly.
    Waits for the previous save first. Every process must call it.
    """
    self._saves.wait()
    if step in self._manager.all_steps():
      return False
    meta = {"format": FORMAT_VERSION, "step": int(step), "seed": self.seed,
            "process_count": jax.process_count(), "data_iterator": agree.gather_json(data_state),
            "eval": {k: float(v) for k, v in (eval_metrics or {}).items()},
            "loop": loop_state or {}}
    metrics = {} if self.best_metric else None  # {}: not evaluated here, never the best
    if self.best_metric and eval_metrics:
      if self.best_metric in eval_metrics and np.isfinite(eval_metrics[self.best_metric]):
        metrics = {self.best_metric: float(eval_metrics[self.best_metric])}
      elif not self._warned_missing_metric:
        self._warned_missing_metric = True
        warnings.warn(f"best_metric={self.best_metric!r} is not among the eval metrics "
                      f"{sorted(eval_metrics)} (or is not finite): no checkpoint is kept as best")
    return self._manager.save(
        int(step), args=ocp.args.Composite(**{STATE: ocp.args.StandardSave(state),
                                              META: ocp.args.JsonSave(meta)}),
        metrics=metrics, force=True)

  def wait(self) -> None:
    """Block until the save in flight (if any) is on disk; raises if it failed."""
    self._saves.wait()
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Wait for the save in flight and release orbax's resources (with several processes, after
    a failed save: neither, as orbax's own close would wait on its stuck finalize thread)."""
    self._saves.wait()
    if not self._saves.failed_before:
      self._manager.close()

  # -- restoring -------------------------------------------------------------------------------

  def restore(self, step: int, target=None) -> Restored:
    """Checkpoint ``step`` onto ``target``'s structure/dtypes/shardings (None: nested dicts)."""
    state_args = ocp.args.StandardRestore(
        None if target is None else jax.tree_util.tree_map(_abstract, target))
    out = self._manager.restore(int(step), args=ocp.args.Composite(
        **{STATE: state_args, META: ocp.args.JsonRestore()}))
    state, meta = out[STATE], out[META]
    saved_step = state["step"] if isinstance(state, dict) else state.step
    if int(np.asarray(saved_step)) != int(step) or int(meta["step"]) != int(step):
      raise ValueError(f"checkpoint {step} holds step {int(np.asarray(saved_step))} "
                       f"(meta: {meta['step']})")
    return Restored(state, self._data_state(meta), int(step), meta.get("loop", {}),
                    meta.get("eval", {}))

  def restore_latest(self, target=None) -> Optional[Restored]:
    """The newest readable checkpoint, or None if there is none.

    An unreadable checkpoint (truncated or missing files) is moved aside to
    ``<workdir>/checkpoints-unreadable/`` with a CheckpointFallbackWarning, and the previous
    one is tried. A readable checkpoint that does not fit ``target`` (other shapes, or
    shardings that do not divide them) raises CheckpointError and is left where it is.
    """
    for step in reversed(self.all_steps()):
      try:
        return self.restore(step, target)
      except Exception as e:  # pylint: disable=broad-except
        reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        if self._readable(step):
          raise CheckpointError(f"the checkpoint at step {step} in {self.directory} is readable but does "
                           f"not fit this run's state ({reason})") from e
        aside = self._move_aside(step)
        warnings.warn(CheckpointFallbackWarning(
            f"the checkpoint at step {step} is unreadable ({reason}); moved it to {aside} and "
            f"falling back to the previous checkpoint"))
    return None

  def eval_metrics(self, step: int) -> Dict[str, float]:
    """The eval metrics saved with checkpoint ``step`` ({} if it was not evaluated)."""
    meta = self._manager.restore(int(step), args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
    return meta[META].get("eval", {})

  def restore_params(self, step: int):
    """Only the parameters of checkpoint ``step``, as numpy arrays (nested dicts)."""
    return self._restore_numpy(step, "params")

  def average_params(self, steps: List[int]):
    """The element-wise mean of the parameters of checkpoints ``steps``, one array at a time:
    each parameter is read from every checkpoint (a partial restore of that array alone), summed
    in float64 and cast back to its dtype before the next is read, so the host holds the result
    plus one array of one checkpoint, never a whole checkpoint's state."""
    tree = self._manager.item_metadata(int(steps[0]))[STATE].tree["params"]
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    means = []
    for path, meta in flat:
      total = None
      for step in steps:
        x = self._restore_leaf(step, ("params",) + tuple(_key_name(k) for k in path), meta)
        total = np.asarray(x, np.float64) if total is None else total + x
      means.append((total / len(steps)).astype(meta.dtype))
    return jax.tree_util.tree_unflatten(treedef, means)

  def average_params_sharded(self, steps: List[int]):
    """``average_params`` shard by shard: each parameter is restored as a global array spread
    over every device of every process (``spread_sharding``), so each process reads only its own
    shards of each checkpoint; the sum is taken on the devices in float32 and divided there.
    Returns the mean as sharded jax Arrays: no host ever holds an array whole."""
    tree = self._manager.item_metadata(int(steps[0]))[STATE].tree["params"]
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("shards",))
    add = jax.jit(lambda total, x: total + x.astype(total.dtype), donate_argnums=0)
    means = []
    for path, meta in flat:
      sharding = spread_sharding(mesh, meta.shape)
      mean = jax.jit(lambda t, n=len(steps), dt=meta.dtype: (t / n).astype(dt),
                     out_shardings=sharding)
      total = None
      for step in steps:
        x = self._restore_leaf(step, ("params",) + tuple(_key_name(k) for k in path), meta, sharding)
        total = x.astype(np.float32) if total is None else add(total, x)
      means.append(mean(total))
    return jax.tree_util.tree_unflatten(treedef, means)

  def _restore_leaf(self, step: int, keys: Tuple[str, ...], meta, sharding=None):
    """One array of checkpoint ``step``'s state, at the nested-dict path ``keys``: numpy, or with
    ``sharding`` a global jax Array of which this process reads only its own shards."""
    item = jax.ShapeDtypeStruct(meta.shape, meta.dtype, sharding=sharding)
    args = (ocp.RestoreArgs(restore_type=np.ndarray) if sharding is None else
            ocp.ArrayRestoreArgs(sharding=sharding, global_shape=tuple(meta.shape), dtype=meta.dtype))
    for k in reversed(keys):
      item, args = {k: item}, {k: args}
    out = self._manager.restore(int(step), args=ocp.args.Composite(**{STATE: ocp.args.PyTreeRestore(
        item=item, restore_args=args, partial_restore=True)}))[STATE]
    for k in keys:
      out = out[k]
    return np.asarray(out) if sharding is None else out

  def _restore_numpy(self, step: int, key: Optional[str] = None):
    """The saved state (or its ``key`` subtree) as nested dicts of numpy arrays, on any devices."""
    tree = self._manager.item_metadata(int(step))[STATE].tree
    if key is not None:
      tree = {key: tree[key]}
    item = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), tree)
    restore_args = jax.tree_util.tree_map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    out = self._manager.restore(int(step), args=ocp.args.Composite(**{STATE: ocp.args.PyTreeRestore(
        item=item, restore_args=restore_args, partial_restore=key is not None)}))[STATE]
    return out if key is None else out[key]

  def _readable(self, step: int) -> bool:
    """Whether every array and the meta item of checkpoint ``step`` can be read."""
    try:
      self._restore_numpy(step)
      self._manager.restore(int(step), args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
      return True
    except Exception:  # pylint: disable=broad-except
      return False

  def _data_state(self, meta) -> Optional[Dict[str, Any]]:
    states = meta.get("data_iterator") or [None]
    if len(states) == jax.process_count():
      return states[jax.process_index()]
    if all(s == states[0] for s in states):
      return states[0]
    raise CheckpointError(f"the checkpoint holds the data positions of {len(states)} processes, and "
                     f"this run has {jax.process_count()}: resume with {len(states)} processes")

  def _move_aside(self, step: int) -> str:
    aside = storage.join(self.workdir, workdir_lib.UNREADABLE_CHECKPOINTS_DIR,
                         f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
    if jax.process_index() == 0:
      storage.wpath(aside).parent.mkdir(parents=True, exist_ok=True)
      if storage.is_local(aside):
        os.replace(self.step_dir(step), aside)
      else:  # a bucket renames by copying the objects
        storage.wpath(self.step_dir(step)).rename(aside)
    agree.barrier(f"txf_checkpoint_move_aside_{step}")
    self._manager.reload()
    return aside


def _key_name(key) -> str:
  """A pytree path entry (a dict key) as the string orbax stores."""
  return str(getattr(key, "key", getattr(key, "name", key)))


def spread_sharding(mesh, shape) -> "jax.sharding.NamedSharding":
  """A sharding of an array of ``shape`` over the 1-D ``mesh`` ("shards"): split on its largest
  axis of those the device count divides (the first of equal ones), else replicated (only small
  arrays: biases, LayerNorm scales)."""
  n = mesh.shape["shards"]
  fits = [i for i, size in enumerate(shape) if size % n == 0 and size >= n]
  spec = [None] * len(shape)
  if fits and n > 1:
    spec[max(fits, key=lambda i: shape[i])] = "shards"
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
