"""Data: synthetic tasks and real text through tfds + grain, all behind the ``Task`` contract."""

from txf.data.base import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataError, DataSpec, Example,
                           PretrainSpec, Task, TaskSpec, task_spec)


def make_task(spec, workdir: str = "") -> Task:
  """The Task for ``spec.data.source``: ``synthetic:KIND`` here, anything else through
  txf.data.real. ``spec``: a TaskSpec (a run config is read into one: ``task_spec``)."""
  spec = task_spec(spec)
  d = spec.data
  if d.source.startswith("synthetic:"):
    from txf.data.synthetic import SyntheticTask
    task = SyntheticTask(d.source.split(":", 1)[1], family=spec.family,
                         min_len=d.synthetic_min_len, max_len=d.synthetic_max_len,
                         num_symbols=d.synthetic_vocab, max_input_len=d.max_input_len,
                         max_target_len=d.max_target_len)
    task.seed = spec.seed
    return task
  from txf.data.real import make_real_task  # noqa: the real-data pipeline (tfds + grain)
  return make_real_task(spec, workdir)
