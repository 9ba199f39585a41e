"""Start a run from another run's parameters: ``config.init_from = W`` (a txf run, or a workdir of
``txf import-hf``), e.g. fine-tuning OPUS-MT on Multi30k.

The source run decides what its parameters need: the model's architecture (every ``model.*``
field but the dropout rates, attention implementation and compute dtype, which stay the
experiment's), and the tokenizer (the task reads its ``tokenizer/``, which the new run then saves as its own, so its
vocabulary decides the data pipeline's ids). Optimizer, schedule, data, sharding, checkpointing and
evaluation are the experiment's. A run that resumes from its own checkpoint ignores init_from.

Across objectives (the source's ``model.family`` differs from the experiment's: a masked-LM
encoder into the classifier, a span-corruption encoder-decoder into translation), the run keeps
its own family and head options (``HEAD_FIELDS``) and starts from the parameters both models
have: each of the run's parameters is the source's when the source has it (same path, same
shape), else the run's own initialisation; the source's other parameters are dropped. The run says
how many were loaded, new and dropped, and writes the three lists to ``init_from.json`` in the
run. A parameter both have with different shapes is one error naming it.
"""

import json
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from flax import traverse_util

from txf.runtime import storage
from txf.runtime import workdir as workdir_lib
from txf.core.errors import TxfError
from txf.inference.run import check_params

# model fields the new run keeps from its own experiment (training-time choices)
KEPT_MODEL_FIELDS = ("dropout_rate", "attention_dropout_rate", "attention_impl", "dtype")
# data fields that describe the tokenizer, taken from the source run with its tokenizer
# model fields of the run's own head, kept when the source run has another family
HEAD_FIELDS = ("family", "pooling", "pooler")
REPORT_FILE = "init_from.json"  # the loaded / new / dropped parameter paths of a cross-objective start
TOKENIZER_FIELDS = ("tokenizer", "vocab_size", "spm_model_type", "joint_vocab",
                    "spm_input_sentences", "spm_num_threads")


def apply_init_from(config) -> None:
  """Set (in place) the model and tokenizer fields of ``config`` to those of its init_from run."""
  source = config.init_from
  if not source:
    return
  storage.check_filesystem(source, "init_from")
  if not storage.wpath(storage.join(source, workdir_lib.CONFIG_FILE)).is_file():
    raise TxfError(f"init_from={source!r} holds no txf run (no config.json): give a trained run's "
                   f"workdir, or one written by `txf import-hf`")
  if not storage.wpath(workdir_lib.params_location(source)).exists():
    raise TxfError(f"init_from={source!r} has no trained parameters (params.msgpack): train it to "
                   f"the end first, or give a workdir written by `txf import-hf`")
  theirs = workdir_lib.load_config(source)
  kept = KEPT_MODEL_FIELDS + (HEAD_FIELDS if theirs.model.family != config.model.family else ())
  for key, value in theirs.model.items():
    if key not in kept:
      config.model[key] = value
  if storage.wpath(storage.join(source, workdir_lib.TOKENIZER_DIR, "tokenizer.json")).is_file():
    for key in TOKENIZER_FIELDS:
      config.data[key] = theirs.data[key]


def tokenizer_home(config, workdir: str) -> str:
  """The run directory whose ``tokenizer/`` the task reads: ``workdir`` once it has one, else the
  init_from run's (then ``workdir.save_task`` writes it into ``workdir``, once), else ``workdir``."""
  source = config.init_from
  if (source and not storage.wpath(storage.join(workdir, workdir_lib.TOKENIZER_DIR)).exists()
      and storage.wpath(storage.join(source, workdir_lib.TOKENIZER_DIR)).is_dir()):
    return source
  return workdir


def initial_params(config, model_cfg, task, fresh: Callable[[], Any]
                   ) -> Tuple[Optional[Any], Optional[Dict[str, List[str]]]]:
  """The init_from run's parameters (numpy tree) for this run's model, or (None, None) without
  init_from. Same family: the source's tree, checked against the model (report None). Another
  family: ``merge`` of the source's parameters into ``fresh()`` (the run's own initialisation),
  with its report."""
  source = config.init_from
  if not source:
    return None, None
  params = workdir_lib.load_params(source)  # the run's own params.msgpack (or params/ shards)
  family = workdir_lib.load_config(source).model.family
  if family == model_cfg.family:
    check_params(model_cfg, task, params, workdir_lib.params_location(source))
    return params, None
  return merge(params, fresh(), f"init_from={source!r} ({family})", model_cfg.family)


def merge(source, target, what: str, family: str) -> Tuple[Any, Dict[str, List[str]]]:
  """``target`` with every parameter that ``source`` holds at the same path replaced by the
  source's; returns (tree, {"loaded", "new", "dropped"}: sorted "a/b/c" paths). A shared path
  whose shapes differ, or no shared path at all, raises TxfError."""
  theirs = {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(source).items()}
  ours = {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(target).items()}
  shared = sorted(set(theirs) & set(ours))
  for key in shared:
    if theirs[key].shape != ours[key].shape:
      raise TxfError(f"{what}: parameter {key} has shape {theirs[key].shape} there but "
                     f"{ours[key].shape} in this model.family={family} run: give the run the "
                     f"source's shapes (its model.* fields) or start from scratch")
  if not shared:
    raise TxfError(f"{what} has no parameter of this model.family={family} run (no shared "
                   f"path): start it from a run whose model shares its stacks")
  merged = dict(ours, **{k: theirs[k].astype(ours[k].dtype) for k in shared})
  tree = traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in merged.items()})
  return tree, {"loaded": shared, "new": sorted(set(ours) - set(theirs)),
                "dropped": sorted(set(theirs) - set(ours))}


def write_report(workdir: str, report: Dict[str, List[str]]) -> str:
  """Write ``report`` (merge's) to the run's init_from.json; return the one-line summary."""
  storage.write_bytes(storage.join(workdir, REPORT_FILE), json.dumps(report, indent=1).encode())
  return (f"txf: init_from: {len(report['loaded'])} parameters loaded, {len(report['new'])} new "
          f"({', '.join(_tops(report['new'])) or '-'}), {len(report['dropped'])} dropped "
          f"({', '.join(_tops(report['dropped'])) or '-'}): {REPORT_FILE}")


def _tops(paths: List[str]) -> List[str]:
  """The distinct top-level modules of ``paths``, in order (what a summary line names)."""
  return list(dict.fromkeys(p.split("/")[0] for p in paths))
