"""Frozen specs: the part of the run config one layer reads, read once where the config enters.

A layer below the training loop takes a spec, not the run config: the optimizer an
``OptimizerSpec`` (txf/train/optimizer.py), the runners a ``ParallelSpec`` (txf/parallel/spec.py),
the checkpointer a ``CheckpointSpec`` (txf/train/checkpoint.py), the data a ``DataSpec``
(txf/data/base.py), the model a ``TransformerConfig`` and decoding a ``DecodingSpec``. Each is a
frozen dataclass whose fields name the config field they come from; their defaults are
``base_config()``'s, so a default is still written once, in txf/core/config.py::

  @dataclasses.dataclass(frozen=True)
  class CheckpointSpec:
    seed: int = specs.field("seed")
    keep_checkpoints: int = specs.field("keep_checkpoints")

  CheckpointSpec.from_config(config)   # the loop's set-up, once
  CheckpointSpec(keep_checkpoints=2)   # a test: the other fields at base_config's defaults

``section_spec`` makes the spec of a whole section (``config.optimizer``, ``config.data``).
Values are stored frozen: lists become tuples, sections become read-only mappings.
"""

import dataclasses
import types
from typing import Any, Mapping

import ml_collections

from txf.core.config import base_config


def frozen(value: Any) -> Any:
  """``value`` with its lists as tuples and its mappings as read-only dicts, recursively."""
  if isinstance(value, (ml_collections.ConfigDict, Mapping)):
    return types.MappingProxyType({k: frozen(v) for k, v in value.items()})
  if isinstance(value, (list, tuple)):
    return tuple(frozen(v) for v in value)
  return value


def _at(config, path: str) -> Any:
  value = config
  for part in path.split("."):
    value = value[part]
  return value


def field(path: str):
  """A spec field read from the config field ``path`` (dotted: "model.vocab_multiple"), with
  ``base_config()``'s default for it."""
  return _field(_at(base_config(), path), path)


def _field(default: Any, path: str):
  value = frozen(default)
  if isinstance(value, types.MappingProxyType):  # unhashable: a factory giving the one read-only copy
    return dataclasses.field(default_factory=lambda: value, metadata={"path": path})
  return dataclasses.field(default=value, metadata={"path": path})


def read(cls, config):
  """An instance of the spec class ``cls`` with each field read from ``config`` (a ConfigDict or
  dict holding the fields' paths; a path it lacks takes the field's default)."""
  values = {}
  for f in dataclasses.fields(cls):
    try:
      values[f.name] = frozen(_at(config, f.metadata.get("path", f.name)))
    except (KeyError, AttributeError):
      continue
  return cls(**values)


def section_spec(name: str, section: str, doc: str) -> type:
  """A frozen spec class with one field per field of ``base_config()[section]`` (its type and
  default), and ``from_config(section_values)`` reading a section (fields it does not know are
  ignored, fields it lacks take their defaults)."""
  cls = dataclasses.make_dataclass(
      name, [(key, type(value), _field(value, key)) for key, value in base_config()[section].items()],
      frozen=True)
  cls.from_config = classmethod(read)
  cls.__doc__ = doc
  return cls
