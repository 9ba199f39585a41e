"""A run's working directory: config.json, task.json, tokenizer/, metrics.jsonl, params, checkpoints.

A workdir that already holds a different run is never silently overwritten: it is refused with the
differing fields named, or, with ``fresh=True``, moved aside to ``<workdir>.old-<time>``.
"""

import json
import os
import shutil
import time
from typing import Any, Dict, List, Optional, Tuple

import jax
import ml_collections
from flax import serialization

from txf.config import _flatten, base_config
from txf.errors import TxfError

# Fields that may change between a run and its resumption (length of the run, logging, decoding).
RESUMABLE_FIELDS = {"num_train_steps", "time_limit_minutes", "log_every", "eval_every",
                    "checkpoint_every", "keep_checkpoints", "num_samples", "decode_examples", "eval_batches",
                    "beam_size", "alpha", "decode_max_extra", "name", "best_metric", "best_mode",
                    "nan_policy", "data.path", "data.data_dir", "data.prefetch",
                    # the layout may change on resume: checkpoints restore onto any device count
                    "parallelism", "mesh_shape", "dcn_mesh_shape"}
RESUMABLE_PREFIXES = ("sharding_rules.",)


class RunConflictError(TxfError, RuntimeError):
  """The workdir holds another run."""


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


def prepare(workdir: str, config: ml_collections.ConfigDict, fresh: bool = False) -> bool:
  """Create or check the workdir; returns True when it already held this same run (resume).

  Raises RunConflictError when it holds a different run (or unrelated files) and ``fresh`` is False.
  """
  path = os.path.join(workdir, "config.json")
  new = config_to_dict(config)
  if os.path.isdir(workdir) and os.listdir(workdir):
    if fresh:
      aside = f"{workdir.rstrip('/')}.old-{time.strftime('%Y%m%d-%H%M%S')}"
      shutil.move(workdir, aside)
      print(f"--fresh: moved the previous run to {aside}")
    elif not os.path.exists(path):
      raise RunConflictError(f"workdir {workdir} is not empty and holds no txf run (no config.json): "
                             f"choose another --workdir, or pass --fresh to move it aside")
    else:
      with open(path) as f:
        old = json.load(f)
      diffs = differing_fields(old, new)
      if diffs:
        lines = "\n".join(f"  {k}: {a!r} (in workdir) != {b!r} (now)" for k, a, b in diffs)
        raise RunConflictError(f"workdir {workdir} holds a different run:\n{lines}\n"
                               f"use another --workdir, or --fresh to move the old run aside")
      write_json(path, new)  # resumable fields (e.g. num_train_steps) may have changed
      return True
  os.makedirs(workdir, exist_ok=True)
  write_json(path, new)
  return False


def write_json(path: str, obj: Any) -> None:
  """Write JSON atomically (temp file + rename): a crash never leaves half a file."""
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def save_params(workdir: str, params, name: str = "params.msgpack") -> str:
  """Write parameters (flax msgpack) atomically; returns the path."""
  path = os.path.join(workdir, name)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(serialization.msgpack_serialize(jax.device_get(params)))
  os.replace(tmp, path)
  return path


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config.json over ``base_config()``: a field missing from an older run's file (added
  to txf since) has its base_config default, so base_config is the one source of defaults."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise TxfError(f"{workdir} holds no txf run (no config.json): train one with "
                            f"`txf train --workdir {workdir}` first")
  with open(path) as f:
    stored = json.load(f)
  config = base_config()
  config.update(stored)
  return config


def load_params(workdir: str, name: Optional[str] = None):
  """Final (or named, e.g. averaged) parameters of a run as a pytree of numpy arrays."""
  name = name or "params.msgpack"
  path = name if os.path.isabs(name) else os.path.join(workdir, name)
  if not os.path.exists(path):
    raise TxfError(f"no trained parameters at {path}: the run has not finished (train it "
                            f"to the end, or average its checkpoints with `txf average-checkpoints`)")
  with open(path, "rb") as f:
    return serialization.msgpack_restore(f.read())

