"""Load a trained run: its config, task (with the run's own tokenizer), model config and parameters.

``load_run(workdir)`` is the one loader: ``txf translate/classify/generate/eval``, tests and
notebooks all use it.
"""

import dataclasses
import logging
import os
from typing import Any, Callable, Optional

import jax
import numpy as np
from flax import traverse_util

from txf.core import families
from txf.runtime import storage
from txf.runtime import workdir as workdir_lib
from txf.data import TaskSpec, make_task, saved
from txf.data.base import Task
from txf.core.errors import TxfError
from txf.models import init_params, model_config_from

DEFAULT_PARAMS = workdir_lib.PARAMS_FILE
Warn = Callable[[str], None]


LOGGER = logging.getLogger("txf.inference")


def log_warning(message: str) -> None:
  """The inference functions' default ``warn``: ``message`` on the ``txf.inference`` logger
  (WARNING). The commands pass their own (``txf: warning:`` lines on stderr)."""
  LOGGER.warning(message)


@dataclasses.dataclass
class Run:
  """A trained run ready for inference: its config, task (with the run's tokenizer), model config
  and parameters (a pytree of arrays), and the parameter file they came from."""
  workdir: str
  config: Any
  task: Task
  model_cfg: Any
  params: Any
  params_path: str

  @property
  def family(self) -> str:
    return self.model_cfg.family


def resolve_params_path(workdir: str, name: Optional[str] = None) -> str:
  """The parameter file ``name`` (default params.msgpack) of a run.

  A bare or relative name is looked up in the workdir first (``params_avg5.msgpack``), then relative
  to the current directory (``runs/x/params_avg5.msgpack``); an absolute path is used as is.
  Raises TxfError naming what was looked for and how to make it.
  """
  if name is None:  # params.msgpack, or the params/ shards of a multi-process run
    path = workdir_lib.params_location(workdir)
    if storage.wpath(path).exists():
      return path
  name = name or DEFAULT_PARAMS
  given = os.path.isabs(name) or not storage.is_local(name)  # an absolute path or a bucket's
  candidates = [name] if given else [storage.join(workdir, name), name]
  for path in candidates:
    if storage.wpath(path).exists():  # a file, or a directory: orbax shards (params/)
      return path
  if name == DEFAULT_PARAMS:
    raise TxfError(
        f"no trained parameters in {workdir} (no {DEFAULT_PARAMS}): the run has not finished; train "
        f"it to the end (`txf train --workdir {workdir}`), or average its checkpoints with "
        f"`txf average-checkpoints --workdir {workdir}` and pass --params params_avg<N>.msgpack")
  where = storage.wpath(workdir)
  present = sorted(f.name for f in where.iterdir() if f.name.endswith(".msgpack")) if where.is_dir() else []
  raise TxfError(f"--params {name}: no such file in {workdir} or the current directory "
                 f"(parameter files in the workdir: {', '.join(present) or 'none'})")


def check_params(model_cfg, task: Task, params, path: str) -> None:
  """Raise TxfError if ``params`` does not have the tree and shapes of the run's model."""
  batch = {"inputs": np.zeros((1, max(task.max_input_len, 1)), np.int32),
           "targets": np.zeros((1, max(task.max_target_len, 1)), np.int32)}
  expected = jax.eval_shape(lambda: init_params(model_cfg, jax.random.key(0), batch))
  want = {"/".join(k): tuple(v.shape) for k, v in traverse_util.flatten_dict(expected).items()}
  if not isinstance(params, dict):
    raise TxfError(f"{path} does not hold a parameter tree")
  got = {"/".join(k): tuple(np.shape(v)) for k, v in traverse_util.flatten_dict(params).items()}
  problems = [f"missing {k}" for k in sorted(set(want) - set(got))]
  problems += [f"unexpected {k}" for k in sorted(set(got) - set(want))]
  problems += [f"{k}: shape {got[k]} != {want[k]}" for k in sorted(set(want) & set(got))
               if got[k] != want[k]]
  if problems:
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    raise TxfError(f"{path} does not match this run's model ({model_cfg.family}, d_model="
                   f"{model_cfg.d_model}): {'; '.join(problems[:3])}{more}; is it from another run?")


def load_task(config, workdir: str) -> Task:
  """A trained run's task: from the workdir alone (tokenizer/, task.json) when the run has them, so
  the training data is not needed until a split is read; else rebuilt from the data (older runs,
  synthetic tasks)."""
  spec = TaskSpec.from_config(config)
  task = saved.task_from_workdir(spec, workdir)
  if task is None:
    task = make_task(spec, workdir)
  return task


def load_run(workdir: str, params_name: Optional[str] = None, data_path: Optional[str] = None
             ) -> Run:
  """Load a run's config, task and parameters (final, or ``params_name``, e.g. an average).

  Only the workdir is read (see ``load_task``); the data is opened when a split is first read,
  from the config's data.path, or from ``data_path`` when it has moved (``saved.point_at_data``).
  The parameter file is located before the task is built, so a run without trained parameters
  fails fast; parameters of another model raise TxfError naming the mismatch.
  """
  config = workdir_lib.load_config(workdir)
  if data_path:
    saved.point_at_data(config, data_path)
  path = resolve_params_path(workdir, params_name)
  task = load_task(config, workdir)
  # params files hold the real vocabulary (exports drop the padding rows of model.vocab_multiple)
  model_cfg = model_config_from(config, task, vocab_multiple=1)
  params = workdir_lib.load_params(workdir, storage.absolute(path))
  check_params(model_cfg, task, params, path)
  return Run(workdir, config, task, model_cfg, jax.device_put(params), path)


def require_family(run: Run, family: str, command: str) -> None:
  """TxfError unless the run's model family is ``family`` or another family served by the same
  command (their ``txf.core.families`` records' ``command``), pointing at the right command."""
  if run.family == family or families.get(run.family).command == families.get(family).command:
    return
  raise TxfError(f"txf {command} needs a model.family={family} run, but {run.workdir} holds a "
                 f"model.family={run.family} run: use `{families.get(run.family).command}` for it")
