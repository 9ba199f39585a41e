"""A run's working directory: config.json, task.json, tokenizer/, metrics.jsonl, params, checkpoints.

A workdir that already holds a different run that has trained (a checkpoint, a metrics row or
final parameters) is never silently overwritten: it is refused with the differing fields named, or,
with ``fresh=True``, moved aside to ``<workdir>.old-<time>``. A start that failed before training
leaves nothing to protect: the next command replaces its config. A disk that is full, read-only or
not ours while txf writes gives a ``DiskError`` naming the path (``disk_errors``). A workdir may be a
bucket (``gs://bucket/run``): every file here goes through ``txf.runtime.storage`` (etils.epath).
"""

import contextlib
import errno
import json
import os
import shutil
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import ml_collections
import numpy as np
from flax import serialization

from txf.core import families
from txf.core.config import _flatten, base_config, complete
from txf.core.errors import TxfError, disk_errno_of
from txf.runtime.storage import (absolute, check_filesystem, is_local, join, read_bytes, read_text, staged_dir,
                         size_of, write_bytes, wpath)

# Fields that may change between a run and its resumption (length of the run, logging, decoding).
RESUMABLE_FIELDS = {"num_train_steps", "time_limit_minutes", "log_every", "eval_every",
                    "checkpoint_every", "keep_checkpoints", "num_samples", "decode_examples", "eval_batches",
                    "beam_size", "alpha", "decode_max_extra", "name", "best_metric", "best_mode",
                    "nan_policy", "divergence_factor", "data.path", "data.data_dir", "data.prefetch",
                    "data.id_store_tokens",
                    # the layout may change on resume: checkpoints restore onto any device count
                    "parallelism", "mesh_shape", "dcn_mesh_shape",
                    # what is profiled, and what the backward pass recomputes, change no state
                    "profile_steps", "model.remat", "compile_cache",
                    # the compute dtype: parameters and optimizer state are float32 either way
                    "model.dtype",
                    # where the metrics are also logged
                    "tracker"}
RESUMABLE_PREFIXES = ("sharding_rules.",)

# The names of a run's files and folders under its workdir: defined here and nowhere else.
CONFIG_FILE = "config.json"          # the run's full config (config_to_dict)
TASK_FILE = "task.json"              # the task's sizes (Task.describe): vocabulary, classes, lengths
TOKENIZER_DIR = "tokenizer"          # the run's codecs (Task.save), read back by the data layer
PARAMS_FILE = "params.msgpack"       # final parameters (flax msgpack)
SHARDED_PARAMS = "params"            # final parameters of a multi-process mesh run: orbax, each process its shards
METRICS_FILE = "metrics.jsonl"       # one JSON row per logged point
TENSORBOARD_DIR = "tensorboard"      # TensorBoard event files
CHECKPOINTS_DIR = "checkpoints"      # orbax checkpoints, one numbered folder per step
UNREADABLE_CHECKPOINTS_DIR = "checkpoints-unreadable"   # unreadable checkpoints moved aside
LOSS_PLOT = "loss_curves.png"        # train/eval loss against step
LR_PLOT = "learning_rate.png"        # the learning rate against step
WANDB_RUN_FILE = "wandb.json"        # tracker="wandb": the Weights & Biases run id that a resumed run logs to again


def path_of(workdir: str, name: str) -> str:
  """``workdir/name`` for one of the names above (e.g. ``path_of(w, METRICS_FILE)``)."""
  return join(workdir, name)


def eval_report_name(split: str) -> str:
  """The file name of ``txf eval``'s default report on ``split``: eval_<split>.json."""
  return f"eval_{split}.json"


def exported_params_name(which: Any) -> str:
  """The file name ``txf average-checkpoints`` writes: params_avg<N>.msgpack for an average of the
  last N (an int), params_<step>.msgpack for one exported checkpoint (a step, 'best' or 'latest')."""
  return f"params_avg{which}.msgpack" if isinstance(which, int) else f"params_{which}.msgpack"


def save_task(workdir: str, task) -> None:
  """Write a run's task once: its codecs into tokenizer/ (``task.save``) and its sizes into
  task.json (``task.describe()``). The data layer reads both back; nothing else writes them."""
  with staged_dir(path_of(workdir, TOKENIZER_DIR)) as local:
    task.save(local)
  write_json(path_of(workdir, TASK_FILE), task.describe())


def read_task_json(workdir: str) -> Optional[Dict[str, Any]]:
  """The sizes training recorded in ``workdir/task.json`` (None if the run has none)."""
  path = path_of(workdir, TASK_FILE)
  if not wpath(path).is_file():
    return None
  return json.loads(read_text(path))


class RunConflictError(TxfError, RuntimeError):
  """The workdir holds another run."""


class DiskError(TxfError):
  """A write failed because the disk is full, read-only or not writable for us."""


# errno -> (what happened, what to do)
_DISK_ERRNOS = {
    errno.ENOSPC: ("no space left on the device", "free some space (or point --workdir at "
                                                   "another disk) and run the same command again"),
    errno.EDQUOT: ("the disk quota is exceeded", "free some space and run the same command again"),
    errno.EROFS: ("the file system is read-only", "choose a writable --workdir"),
    errno.EACCES: ("permission denied", "choose a --workdir you can write to"),
    errno.EPERM: ("operation not permitted", "choose a --workdir you can write to"),
}


def disk_error_of(exc: BaseException) -> Optional[OSError]:
  """The OSError with a disk errno (full, read-only, no permission) behind ``exc`` (itself, or its
  cause/context chain, as libraries such as orbax re-raise it), or None. A full disk that a library
  reports as another type (TensorStore's ValueError from orbax's background save) counts too."""
  seen, first = set(), exc
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS and not isinstance(exc, DiskError):
      return exc
    exc = exc.__cause__ or exc.__context__
  number = 0 if isinstance(first, DiskError) else disk_errno_of(first)
  return OSError(number, os.strerror(number)) if number else None


def _mount_of(path: str) -> Tuple[str, str]:
  """(device, mount point) of the file system holding ``path`` (/proc/mounts; ("", "") elsewhere)."""
  path = os.path.realpath(path)
  best = ("", "")
  try:
    with open("/proc/mounts", encoding="utf-8") as f:
      for line in f:
        device, mount = line.split()[:2]
        if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[1]):
          best = (device, mount)
  except OSError:
    pass
  return best


def _size_of(path: str) -> int:
  """Bytes of the files under ``path`` (a file's own size; 0 if absent)."""
  if os.path.isfile(path):
    return os.path.getsize(path)
  total = 0
  for root, _, files in os.walk(path):
    for name in files:
      try:
        total += os.path.getsize(os.path.join(root, name))
      except OSError:
        pass
  return total


def full_disk_message(path: str, need_bytes: int = 0, elsewhere: str = "--workdir") -> str:
  """'no space left on DEVICE (mounted on M, F GiB free): free N GiB there or choose another
  --workdir, ...': N is ``need_bytes`` (what the write needs), at least 0.01."""
  device, mount = _mount_of(path)
  try:
    free = shutil.disk_usage(mount or ".").free
  except OSError:
    free = 0
  where = f"{device} (mounted on {mount}, {free / 2**30:.2f} GiB free)" if mount else "the device"
  return (f"no space left on {where}: free {max(need_bytes / 2**30, 0.01):.2f} GiB there or choose "
          f"another {elsewhere}, then run the same command again")


@contextlib.contextmanager
def disk_errors(path: str, what: str = "writing", need_bytes: Optional[int] = None,
                elsewhere: str = "--workdir"):
  """Turn a disk failure (ENOSPC, EDQUOT, EROFS, EACCES, EPERM) raised inside the block into a
  DiskError naming ``path`` and the fix; every other exception passes unchanged. A full disk names
  the device, its free space and what to free: ``need_bytes``, by default the size of ``path``, or
  of its newest numbered subfolder (a checkpoint) when ``path`` is a checkpoints folder."""
  try:
    yield
  except DiskError:
    raise
  except Exception as e:  # noqa: BLE001 - re-raised unless it is a disk failure
    found = disk_error_of(e)
    if found is None:
      raise
    problem, fix = _DISK_ERRNOS[found.errno]
    if found.errno in (errno.ENOSPC, errno.EDQUOT):
      if need_bytes is None and not is_local(path):
        need_bytes = 0
      if need_bytes is None:
        steps = sorted((int(n) for n in os.listdir(path) if n.isdigit()), reverse=True) \
            if os.path.isdir(path) else []
        need_bytes = _size_of(os.path.join(path, str(steps[0]))) if steps else _size_of(path)
      full = DiskError(f"{what} {path}: {full_disk_message(path, need_bytes, elsewhere)}")
      full.resumable = True  # the checkpoints written are intact: once space is back, it goes on
      raise full from e
    raise DiskError(f"{what} {path}: {problem}; {fix}") from e


def has_trained(workdir: str) -> bool:
  """Whether the run in ``workdir`` has trained: a checkpoint, a metrics row or params.msgpack."""
  metrics = wpath(path_of(workdir, METRICS_FILE))
  checkpoints = wpath(path_of(workdir, CHECKPOINTS_DIR))
  return ((metrics.is_file() and size_of(metrics) > 0)
          or (checkpoints.is_dir() and any(True for _ in checkpoints.iterdir()))
          or wpath(path_of(workdir, PARAMS_FILE)).exists())


def config_to_dict(config: ml_collections.ConfigDict) -> Dict[str, Any]:
  return json.loads(config.to_json())


def differing_fields(old: Dict[str, Any], new: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
  """(field, old value, new value) for every field that differs and is not in RESUMABLE_FIELDS."""
  defaults = _flatten(base_config())
  # a field missing on one side (added to txf after that run was written) counts as its default
  a = {**defaults, **_flatten(ml_collections.ConfigDict(old))}
  b = {**defaults, **_flatten(ml_collections.ConfigDict(new))}
  return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
          if a.get(k) != b.get(k) and k not in RESUMABLE_FIELDS
          and not k.startswith(RESUMABLE_PREFIXES)]


def prepare(workdir: str, config: ml_collections.ConfigDict, fresh: bool = False,
            say: Callable[[str], None] = lambda line: None) -> bool:
  """Create or check the workdir; returns True when it already held this same run (resume).
  ``say`` hears the line naming where ``fresh`` moved a previous run.

  Raises RunConflictError when it holds a different run that has trained (or unrelated files) and
  ``fresh`` is False; DiskError when the workdir cannot be written. A resumed run's config.json is
  left as it is: ``record_config`` rewrites it once the run trains on (resumable fields such as
  num_train_steps may differ). A run that never trained is replaced by the new config.
  """
  check_filesystem(workdir)
  path = path_of(workdir, CONFIG_FILE)
  new = config_to_dict(config)
  where = wpath(workdir)
  if where.exists() and not where.is_dir():
    raise TxfError(f"--workdir {workdir} is a file, not a directory: choose another --workdir")
  if where.is_dir() and any(True for _ in where.iterdir()):
    if fresh:
      aside = f"{os.fspath(workdir).rstrip('/')}.old-{time.strftime('%Y%m%d-%H%M%S')}"
      if is_local(workdir):
        shutil.move(workdir, aside)
      else:  # a bucket has no folders to rename: its objects are copied under the new prefix
        where.rename(aside)
      say(f"--fresh: moved the previous run to {aside}")
    elif not wpath(path).exists():
      raise RunConflictError(f"workdir {workdir} is not empty and holds no txf run (no config.json): "
                             f"choose another --workdir, or pass --fresh to move it aside")
    else:
      if has_trained(workdir):
        old = json.loads(read_text(path))
        diffs = differing_fields(old, new)
        if diffs:
          lines = "\n".join(f"  {k}: {a!r} (in workdir) != {b!r} (now)" for k, a, b in diffs)
          raise RunConflictError(f"workdir {workdir} holds a different run:\n{lines}\n"
                                 f"use another --workdir, or --fresh to move the old run aside")
        _check_writable(workdir)
        return True
  with disk_errors(workdir, "creating"):
    where.mkdir(parents=True, exist_ok=True)
  _check_writable(workdir)
  write_json(path, new)
  return False


def record_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Rewrite config.json with ``config`` (a resumed run that trains on under changed resumable
  fields, e.g. a larger num_train_steps)."""
  write_json(path_of(workdir, CONFIG_FILE), config_to_dict(config))


def _check_writable(workdir: str) -> None:
  """DiskError now, before anything is built, if ``workdir`` cannot be written."""
  probe = wpath(join(workdir, f".txf-write-test-{os.getpid()}"))
  with disk_errors(workdir):
    probe.write_bytes(b"")
    probe.unlink()


def write_json(path: str, obj: Any, elsewhere: str = "--workdir") -> None:
  """Write JSON atomically (temp file + rename): a crash never leaves half a file; a full disk is a
  DiskError whose fix names ``elsewhere`` (the flag that picks another place)."""
  with disk_errors(path, elsewhere=elsewhere):
    write_bytes(path, json.dumps(obj, indent=2, sort_keys=True).encode("utf-8"))


def save_params(workdir: str, params, name: str = PARAMS_FILE) -> str:
  """Write parameters (flax msgpack) atomically; returns the path."""
  path = join(workdir, name)
  data = serialization.msgpack_serialize(jax.device_get(params))
  with disk_errors(path, need_bytes=len(data)):
    write_bytes(path, data)
    stale = wpath(join(workdir, SHARDED_PARAMS))  # an earlier multi-process finish's shards
    if name == PARAMS_FILE and stale.is_dir():
      stale.rmtree()
  return path


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config.json over ``base_config()`` (``txf.core.config.complete``): a field missing
  from an older run's file (added to txf since) has its base_config default, so base_config is the
  one source of defaults."""
  check_filesystem(workdir)
  path = path_of(workdir, CONFIG_FILE)
  if not wpath(path).exists():
    raise TxfError(f"{workdir} holds no txf run (no config.json): train one with "
                            f"`txf train --workdir {workdir}` first")
  config = complete(json.loads(read_text(path)))
  families.import_plugins(config.plugins)  # the files that register its family
  return config


def save_params_sharded(workdir: str, params, name: str = SHARDED_PARAMS) -> str:
  """Write parameters that no host holds whole (a multi-process mesh run's sharded global arrays)
  as an orbax checkpoint directory ``<workdir>/<name>/``: every process calls this and writes
  only its own shards, nothing is gathered. ``load_params`` reads it back. Returns the path."""
  import orbax.checkpoint as ocp  # deferred: orbax takes a while to import
  path = absolute(join(workdir, name))
  with disk_errors(path):
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, params, force=True)
    checkpointer.wait_until_finished()
    checkpointer.close()
    stale = path_of(workdir, PARAMS_FILE)  # an earlier finish's, which load_params prefers
    if name == SHARDED_PARAMS and jax.process_index() == 0 and wpath(stale).exists():
      wpath(stale).unlink()
  return path


def _load_sharded(path: str):
  """An orbax parameter directory (``save_params_sharded``) as nested dicts of numpy arrays."""
  import orbax.checkpoint as ocp
  with ocp.PyTreeCheckpointer() as checkpointer:
    tree = checkpointer.metadata(path).item_metadata.tree
    restore_args = jax.tree_util.tree_map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))


def params_location(workdir: str, name: Optional[str] = None) -> str:
  """The path of a run's parameters: ``name`` (default params.msgpack; relative to the workdir),
  or, when the default file is absent, the sharded ``params/`` directory a multi-process run
  writes (``save_params_sharded``)."""
  path = join(workdir, name or PARAMS_FILE)
  if name is None and not wpath(path).exists():
    sharded = join(workdir, SHARDED_PARAMS)
    if wpath(sharded).is_dir():
      return sharded
  return path


def load_params(workdir: str, name: Optional[str] = None):
  """Final (or named, e.g. averaged) parameters of a run as a pytree of numpy arrays: a flax
  msgpack file (params.msgpack), or an orbax directory of shards (``params/``, written by a
  multi-process run without gathering; read here whole)."""
  absolute_name = name is not None and (os.path.isabs(name) or not is_local(name))
  path = name if absolute_name else params_location(workdir, name)
  if not wpath(path).exists():
    raise TxfError(f"no trained parameters at {path}: the run has not finished (train it "
                            f"to the end, or average its checkpoints with `txf average-checkpoints`)")
  if wpath(path).is_dir():
    return _load_sharded(path)
  return serialization.msgpack_restore(read_bytes(path))


def last_checkpoint(workdir: str) -> str:
  """'step N (DIR)' of the newest checkpoint directory in ``workdir``'s checkpoints/, or 'none
  written' (what a lost-process message names: read from the folder, no orbax)."""
  directory = join(workdir, CHECKPOINTS_DIR)
  try:
    steps = sorted(int(p.name) for p in wpath(directory).iterdir() if p.name.isdigit())
  except OSError:
    steps = []
  return f"step {steps[-1]} ({join(directory, str(steps[-1]))})" if steps else "none written"
