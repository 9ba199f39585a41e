"""The parameters of saved checkpoints as params files (``txf average-checkpoints``).

``average_checkpoints(workdir, n)`` writes the mean parameters of the last n checkpoints to
``<workdir>/params_avg<n>.msgpack`` (``Checkpointer.average_params``: one array at a time, means
in float64), or one chosen checkpoint's (``step``: 'best', 'latest' or a number) to
``params_<step>.msgpack``; ``sharded`` writes a directory of shards from every process instead.
Exported parameters drop the vocabulary's padding rows (``exported_params``).
"""

from typing import List, Optional, Tuple

from txf.models import model_config_for, unpad_vocab
from txf.runtime import workdir as workdir_lib
from txf.train.checkpoint import CheckpointError, Checkpointer, CheckpointSpec


def _pick_step(checkpointer: "Checkpointer", which: str) -> int:
  """'best', 'latest', or a step number -> a saved step.

  'best': the checkpoint orbax keeps as the best by the run's ``best_metric`` / ``best_mode``
  (config.json), from the eval metrics saved with each checkpoint.
  """
  steps = checkpointer.all_steps()
  if not steps:
    raise CheckpointError(f"{checkpointer.directory} holds no checkpoint")
  if which == "latest":
    return steps[-1]
  if which == "best":
    spec = CheckpointSpec.from_config(workdir_lib.load_config(checkpointer.workdir))
    name = spec.best_metric
    if not name:
      raise CheckpointError(f"{checkpointer.workdir} was trained without best_metric, so no best "
                            f"checkpoint was kept: pass --step=latest or one of {steps}")
    ranked = Checkpointer(checkpointer.workdir, spec, read_only=True)
    try:
      best = ranked.best_step()
    finally:
      ranked.close()
    if best is None or name not in checkpointer.eval_metrics(best):
      raise CheckpointError(f"no saved checkpoint {steps} was evaluated on '{name}': pass "
                            f"--step=latest or a step")
    return best
  if not str(which).isdigit() or int(which) not in steps:
    raise CheckpointError(f"--step={which!r}: use 'best', 'latest' or one of the saved steps {steps}")
  return int(which)


def exported_params(workdir: str, params):
  """A checkpoint's parameters as params files hold them: without the vocabulary padding rows
  (``txf.models.unpad_vocab``, sizes from the run's config.json and task.json)."""
  sizes = workdir_lib.read_task_json(workdir)
  if sizes is None:  # a run older than task.json: older than vocabulary padding too
    return params
  cfg = model_config_for(workdir_lib.load_config(workdir), sizes["vocab_size"],
                         sizes.get("target_vocab_size", 0), sizes.get("num_classes", 0),
                         vocab_multiple=1)
  return unpad_vocab(params, cfg)


def average_checkpoints(workdir: str, last: int, output: Optional[str] = None,
                        step: Optional[str] = None, sharded: bool = False) -> Tuple[str, List[int]]:
  """Average the params of the ``last`` newest checkpoints; returns (path written, steps used).

  Means are taken in float64 and cast back to each leaf's dtype. ``step`` ('best', 'latest' or a
  step number) exports that one checkpoint's params instead (default name params_<step>.msgpack).
  ``sharded``: shard by shard over every device of every process (``average_params_sharded``,
  sums in float32), written as an orbax directory of shards (default name params_avg<N>/ or
  params_<step>/) that ``workdir.load_params`` reads: what a pod's processes run together.
  """
  if last < 1:
    raise CheckpointError(f"--last={last} must be at least 1")
  checkpointer = Checkpointer(workdir)  # read-only
  try:
    if step:
      chosen = _pick_step(checkpointer, str(step))
      name = output or workdir_lib.exported_params_name(str(step))
      if sharded:  # the mean of one checkpoint: its parameters exactly (x / 1)
        params = exported_params(workdir, checkpointer.average_params_sharded([chosen]))
        return workdir_lib.save_params_sharded(workdir, params, _directory_name(name)), [chosen]
      params = exported_params(workdir, checkpointer.restore_params(chosen))
      path = workdir_lib.save_params(workdir, params, name)
      return path, [chosen]
    steps = checkpointer.all_steps()
    if len(steps) < last:
      raise CheckpointError(f"{checkpointer.directory} holds {len(steps)} checkpoint(s) {steps}, fewer "
                       f"than --last={last}: use --last={len(steps)}, or train with "
                       f"--config.keep_checkpoints={last} (or more) to keep enough")
    steps = steps[-last:]
    if sharded:
      mean = exported_params(workdir, checkpointer.average_params_sharded(steps))
      name = _directory_name(output or workdir_lib.exported_params_name(last))
      return workdir_lib.save_params_sharded(workdir, mean, name), steps
    mean = checkpointer.average_params(steps)
  finally:
    checkpointer.close()
  mean = exported_params(workdir, mean)
  path = workdir_lib.save_params(workdir, mean, output or workdir_lib.exported_params_name(last))
  return path, steps


def _directory_name(name: str) -> str:
  """An exported-parameters file name as the directory of shards: without ``.msgpack``."""
  return name[:-len(".msgpack")] if name.endswith(".msgpack") else name
