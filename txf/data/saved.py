"""A trained run's task rebuilt from its workdir alone: ``tokenizer/``, ``task.json`` and the config.

Inference (``txf translate``, ``classify``, ``generate``) needs the codecs and the sizes, not the
dataset: ``task_from_workdir`` gives the same Task class training used, with the run's own tokenizer
and the sizes training recorded, and opens the data only when a split is read (``txf eval``,
``task.examples``). That happens at most once, from ``data.path`` (which ``txf eval --data_path``
overrides) and ``data.data_dir``; tfds' preparation prints nothing (builders.quiet_prepare).
"""

import collections.abc
import dataclasses
import os
from typing import Any, Dict, Optional

from txf.runtime import storage
from txf.runtime import workdir as workdir_lib
from txf.data import builders, real, tokenizer
from txf.data.base import DataError, DataSpec, Task, task_spec
from txf.data.sources import open_source

class LazySources(collections.abc.Mapping):
  """split name -> record source, opened from the config's data on first use (then kept).

  ``opened`` tells whether the data has been opened; until then nothing touches the disk.
  """

  def __init__(self, data: DataSpec):
    self.data = data
    self._sources: Optional[Dict[str, Any]] = None
    self._adapt = None

  @property
  def opened(self) -> bool:
    return self._sources is not None

  def _open(self) -> Dict[str, Any]:
    if self._sources is None:
      data_dir = builders.resolve_data_dir(self.data.data_dir)
      _, sources, adapt, _, _ = open_source(self.data, data_dir)
      self._sources, self._adapt = dict(sources), adapt
    return self._sources

  def adapt(self, record: Any) -> Dict[str, Any]:
    """A raw record of the opened data -> str / int values (the source's own adapter)."""
    self._open()
    return self._adapt(record)

  def __getitem__(self, split: str):
    return self._open()[split]

  def __iter__(self):
    return iter(self._open())

  def __len__(self) -> int:
    return len(self._open())


def task_from_workdir(spec, workdir: str) -> Optional[Task]:
  """The real-data Task of a trained run from its workdir, without reading its data.

  Returns None when the run is not a real-data run with a saved tokenizer and task.json (synthetic
  tasks need no data: ``make_task`` builds them). The family and sizes come from task.json; a
  mismatch with the config (an edited config.json) raises DataError naming both. ``spec``: the
  run's TaskSpec (a run config is read into one).
  """
  spec = task_spec(spec)
  d = spec.data
  scheme = d.source.partition(":")[0]
  if scheme not in ("text", "tfds"):
    return None
  codec = tokenizer.load_codec(workdir_lib.path_of(workdir, workdir_lib.TOKENIZER_DIR))
  sizes = workdir_lib.read_task_json(workdir)
  if codec is None or sizes is None:
    return None
  family = spec.family
  if sizes.get("family", family) != family:
    raise DataError(f"{workdir}: task.json says family {sizes['family']!r} but config.json says "
                    f"model.family={family!r}: restore the run's own config.json")
  # the lengths the model was trained with
  d = dataclasses.replace(d, **{k: int(sizes[k]) for k in ("max_input_len", "max_target_len")
                                if k in sizes})
  sources = LazySources(d)
  return real.new_task(family, d, sources, sources.adapt, codec,
                       f"workdir:{storage.absolute(workdir)}", sentences=scheme == "tfds",
                       num_classes=int(sizes.get("num_classes", 0)),
                       whole_word=bool(spec.pretrain.whole_word), pretrain=spec.pretrain)



def point_at_data(config, data_path: str) -> None:
  """Point ``config`` (in place) at data that has moved: for a ``text:`` source, ``data_path`` is
  the folder that holds the dataset's files, or the root that holds it by name (like data.path);
  for a ``tfds:`` source it is the prepared-data directory (data.data_dir)."""
  d = config.data
  scheme, _, rest = d.source.partition(":")
  path = os.path.abspath(os.path.expanduser(data_path))
  if not os.path.isdir(path):
    raise DataError(f"--data_path {data_path}: no such directory")
  if scheme == "tfds":
    d.data_dir = path
  elif scheme == "text":
    name = os.path.basename(os.path.normpath(rest))
    if os.path.isdir(os.path.join(path, name)):
      d.path, d.source = path, f"text:{name}"
    else:
      d.source = f"text:{path}"
