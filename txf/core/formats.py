"""The local data formats: one table that maps ``data.format`` to the data kind it yields and the
reader of its files, and every other module asks it.

A ``text:DIR`` source is read by its format's reader, prepared once as tfds array_record by the
builder of its data kind (``txf.data.builders``), and then reaches every model family whose
``data_kind`` is that kind. txf's three formats are declared below; a new one is a reader plus one
:func:`register` line, from any Python file the run names in ``config.plugins``::

    from txf.core import formats
    formats.register("jsonl", formats.DataFormat(kind="parallel", reader=read_jsonl,
                                                 files="{split}.jsonl"))

A reader is ``reader(files, spec) -> (records, skipped)``: ``files`` the split's paths (one per
``{lang}`` when ``files`` names the language, else one), ``spec`` the reader settings (a dict with
``max_line_chars``, ``src_lang``, ``tgt_lang``, ...); ``records`` a list of the kind's records
(``KIND_FIELDS``), ``skipped`` a dict of counts for the preparation's metadata. A malformed line is
a ``txf.core.errors.TxfError`` naming the file, the line and the fix.

This module is plain data and imports no jax and no tfds (the config layer checks
``data.format`` with it); a reader is named by the function itself or by the string
``"package.module:function"``, imported when a split is first read.
"""

import dataclasses
from typing import Any, Dict, Tuple

from txf.core import families
from txf.core.errors import ConfigError

# What a record of each data kind holds (txf.core.families.DATA_KINDS).
KIND_FIELDS = {"parallel": ("source", "target"), "tsv": ("text", "label"), "plain": ("text",)}


@dataclasses.dataclass(frozen=True)
class DataFormat:
  """One local data format.

  kind:   the records it yields, a data kind of ``txf.core.families.DATA_KINDS`` (parallel:
          {"source", "target"}, tsv: {"text", "label"}, plain: {"text"}).
  reader: ``reader(files, spec) -> (records, skipped)`` (module doc), or ``"package.module:name"``.
  files:  the file names of a split in the data folder with ``{split}`` and, for one file per
          language, ``{lang}`` (``data.file_pattern`` overrides it).
  whole:  when a split's files are absent, the folder's one file with the pattern's extension is
          cut into the train and eval splits by ``data.lm_split_fraction`` (plain text).
  """
  kind: str
  reader: Any
  files: str
  whole: bool = False

  def check(self, name: str) -> None:
    """ConfigError naming the first field that cannot work."""
    if self.kind not in families.DATA_KINDS:
      raise ConfigError(f"data format {name!r}: kind={self.kind!r} is not one of "
                        f"{families.DATA_KINDS}")
    if "{split}" not in self.files:
      raise ConfigError(f"data format {name!r}: files={self.files!r} must name the split with "
                        f"{{split}}, e.g. '{{split}}.jsonl'")

  @property
  def per_language(self) -> bool:
    """Whether a split is one file per language (``{lang}`` in ``files``)."""
    return "{lang}" in self.files


_REGISTRY: Dict[str, DataFormat] = {}


def register(name: str, data_format: DataFormat, replace: bool = False) -> DataFormat:
  """Make ``name`` a value of ``data.format`` read as ``data_format``; returns it. A name already
  taken raises ConfigError unless ``replace`` (or it is the same record again: a plugin imported
  twice)."""
  data_format.check(name)
  old = _REGISTRY.get(name)
  if old is not None and old != data_format and not replace:
    raise ConfigError(f"data.format {name!r} is already registered: choose another name or pass "
                      f"replace=True")
  _REGISTRY[name] = data_format
  return data_format


def unregister(name: str) -> None:
  """Remove a format (tests register toy formats and take them out again)."""
  _REGISTRY.pop(name, None)


def names() -> Tuple[str, ...]:
  """Every registered format, in registration order: ``data.format``'s allowed values."""
  return tuple(_REGISTRY)


def get(name: str) -> DataFormat:
  """The record of ``name``; ConfigError naming the registered formats otherwise."""
  if name not in _REGISTRY:
    raise ConfigError(f"data.format={name!r} is not one of {names()}: register it "
                      f"(txf.core.formats.register) in a file that config.plugins names")
  return _REGISTRY[name]


def reader(name: str) -> Any:
  """The reader function of format ``name``, imported now if the record names it by a string."""
  return families.resolve(get(name).reader)


# ----------------------------------------------------------------------------- txf's formats

register("parallel", DataFormat("parallel", "txf.data.builders:read_parallel_split",
                                "{split}.{lang}"))   # line-aligned {split}.{src} / {split}.{tgt}
register("tsv", DataFormat("tsv", "txf.data.builders:read_tsv_split",
                           "{split}.tsv"))           # sentence<TAB>label rows
register("plain", DataFormat("plain", "txf.data.builders:read_plain_split",
                             "{split}.txt", whole=True))  # text, cut into chunks at line ends
