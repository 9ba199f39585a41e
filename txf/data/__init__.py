"""Data: synthetic tasks and real text through tfds + grain, all behind the ``Task`` contract."""

from txf.data.base import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataError, DataSpec, Example, Task,
                           data_spec)


def make_task(config, workdir: str = "") -> Task:
  """The Task for ``config.data.source``: ``synthetic:KIND`` here, anything else through txf.data.real."""
  d = data_spec(config)
  source = d.source
  if source.startswith("synthetic:"):
    from txf.data.synthetic import SyntheticTask
    task = SyntheticTask(source.split(":", 1)[1], family=config.model.family,
                         min_len=d.synthetic_min_len, max_len=d.synthetic_max_len,
                         num_symbols=d.synthetic_vocab, max_input_len=d.max_input_len,
                         max_target_len=d.max_target_len)
    task.seed = config.seed
    return task
  from txf.data.real import make_real_task  # noqa: the real-data pipeline (tfds + grain)
  return make_real_task(config, workdir)
