"""Start a run from another run's parameters: ``config.init_from = W`` (a txf run, or a workdir of
``txf import-hf``), e.g. fine-tuning OPUS-MT on Multi30k.

The source run decides what its parameters need: the model's architecture (every ``model.*``
field but the dropout rates, attention implementation and compute dtype, which stay the
experiment's), and the tokenizer (the task reads its ``tokenizer/``, which the new run then saves as its own, so its
vocabulary decides the data pipeline's ids). Optimizer, schedule, data, sharding, checkpointing and
evaluation are the experiment's. A run that resumes from its own checkpoint ignores init_from.
"""

from typing import Any, Optional

from txf import storage
from txf import workdir as workdir_lib
from txf.errors import TxfError
from txf.inference.run import check_params

# model fields the new run keeps from its own experiment (training-time choices)
KEPT_MODEL_FIELDS = ("dropout_rate", "attention_dropout_rate", "attention_impl", "dtype")
# data fields that describe the tokenizer, taken from the source run with its tokenizer
TOKENIZER_FIELDS = ("tokenizer", "vocab_size", "spm_model_type", "joint_vocab",
                    "spm_input_sentences", "spm_num_threads")


def apply_init_from(config) -> None:
  """Set (in place) the model and tokenizer fields of ``config`` to those of its init_from run."""
  source = config.get("init_from", "")
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
  for key, value in theirs.model.items():
    if key not in KEPT_MODEL_FIELDS:
      config.model[key] = value
  if storage.wpath(storage.join(source, workdir_lib.TOKENIZER_DIR, "tokenizer.json")).is_file():
    for key in TOKENIZER_FIELDS:
      config.data[key] = theirs.data[key]


def tokenizer_home(config, workdir: str) -> str:
  """The run directory whose ``tokenizer/`` the task reads: ``workdir`` once it has one, else the
  init_from run's (then ``workdir.save_task`` writes it into ``workdir``, once), else ``workdir``."""
  source = config.get("init_from", "")
  if (source and not storage.wpath(storage.join(workdir, workdir_lib.TOKENIZER_DIR)).exists()
      and storage.wpath(storage.join(source, workdir_lib.TOKENIZER_DIR)).is_dir()):
    return source
  return workdir


def initial_params(config, model_cfg, task) -> Optional[Any]:
  """The init_from run's parameters (numpy tree), checked against this run's model, or None."""
  source = config.get("init_from", "")
  if not source:
    return None
  params = workdir_lib.load_params(source)  # the run's own params.msgpack (or params/ shards)
  check_params(model_cfg, task, params, workdir_lib.params_location(source))
  return params
