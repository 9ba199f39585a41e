"""The contract between data and training: a ``Task`` gives batches, vocabularies and text codecs.

Batches are dicts of numpy int32 arrays with fixed shapes per task (no recompilation):
  translation (family encoder_decoder): ``inputs`` [B, S], ``targets`` [B, T]
  classification (encoder_classifier):  ``inputs`` [B, S], ``label`` [B]
  language modelling (decoder_lm):      ``targets`` [B, T]
Token sequences end with EOS and are right-padded with PAD=0; the model adds BOS itself
(``shift_right``). Packed batches add ``{inputs,targets}_segmentation`` (1, 2, ... per packed
example, 0 on padding) and ``{inputs,targets}_position`` (0-based within each segment).
Special ids are fixed for every tokenizer: PAD=0, BOS=1, EOS=2, UNK=3.
"""

import abc
import collections.abc
import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from txf.core import specs
from txf.core.errors import TxfError
from txf.core.specials import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: F401  (re-exported)

# DataSpec: ``config.data`` read once, frozen. Its fields, types and defaults are those of
# ``txf.core.config.base_config().data`` (declared there only, with their comments); tasks hold one.
DataSpec = specs.section_spec(
    "DataSpec", "data", "The data settings of a run (``config.data``), read once: see txf/core/config.py.")

# PretrainSpec: ``config.pretrain`` read once (the pretraining tasks' noise, spans and masking).
PretrainSpec = specs.section_spec(
    "PretrainSpec", "pretrain",
    "The pretraining objective's settings of a run (``config.pretrain``), read once: see "
    "txf/core/config.py.")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """What the data layer reads of a run config, read once (defaults: ``base_config``'s).

  Attributes:
    data: the ``config.data`` section (DataSpec).
    family: the model family the batches are for (``model.family``).
    seed: the run's seed (synthetic tasks draw their examples from it).
    pretrain: the ``config.pretrain`` section (PretrainSpec).
  """
  data: DataSpec = dataclasses.field(default_factory=DataSpec)
  family: str = specs.field("model.family")
  seed: int = specs.field("seed")
  pretrain: PretrainSpec = dataclasses.field(default_factory=PretrainSpec)

  @classmethod
  def from_config(cls, config) -> "TaskSpec":
    """The spec of a run config (``config.data``, ``model.family``, ``seed``, ``config.pretrain``)."""
    return cls(data=DataSpec.from_config(config.data), family=config.model.family, seed=int(config.seed),
               pretrain=PretrainSpec.from_config(config.pretrain))


def task_spec(spec_or_config) -> TaskSpec:
  """A TaskSpec as it is; a run config (a notebook's ``base_config()``) read into one."""
  if isinstance(spec_or_config, TaskSpec):
    return spec_or_config
  return TaskSpec.from_config(spec_or_config)



class DataError(TxfError, ValueError):
  """Bad or missing data. The message names the file (and line) and how to fix it."""

Batch = Dict[str, np.ndarray]


@dataclasses.dataclass
class Example:
  """One held-out example for decoding samples: source text, reference text, and source ids."""
  source: str
  reference: str
  source_ids: np.ndarray          # int32 [S_i], ends with EOS (LM: the prompt ids, no EOS)
  label: Optional[int] = None     # classification


class CheckpointableIterator(abc.ABC):
  """An iterator over training batches whose position can be saved and restored exactly."""

  @abc.abstractmethod
  def __next__(self) -> Batch: ...

  def __iter__(self):
    return self

  @abc.abstractmethod
  def get_state(self) -> Dict[str, Any]:
    """A JSON-serialisable dict that ``set_state`` accepts."""

  @abc.abstractmethod
  def set_state(self, state: Dict[str, Any]) -> None: ...


class RowLayout:
  """Which rows of every global batch this process fills (the others it leaves as PAD).

  Every process forms the same global batches (same shapes, same examples in the same rows);
  ``rows(R)`` gives the sorted global row indices [n] of an R-row batch that this process's devices
  hold, and ``multiple`` is what every global row count must be a multiple of (the batch's shards
  times the micro-batches). ``RowLayout.block(i, n)``: process i of n fills the i-th contiguous
  block of R / n rows (the layout of a batch split by process index, e.g. pmap's). Any object
  with ``rows`` and ``multiple`` will do (``txf.parallel.feeding.Feed`` reads them from a runner).
  """

  def __init__(self, rows: Optional[Any] = None, multiple: int = 1):
    self._rows, self.multiple = rows, max(int(multiple), 1)

  @classmethod
  def block(cls, process_index: int = 0, process_count: int = 1) -> "RowLayout":
    """Process ``process_index`` of ``process_count`` fills rows [i R / n, (i + 1) R / n)."""
    if process_count <= 1:
      return cls()
    return cls(lambda r: np.arange(process_index * r // process_count,
                                   (process_index + 1) * r // process_count), process_count)

  def rows(self, total: int) -> np.ndarray:
    """The global row indices (sorted int64 [n]) of a ``total``-row batch this process fills."""
    if self._rows is None:
      return np.arange(total)
    return np.asarray(self._rows(total), np.int64)


class Task(abc.ABC):
  """A data source bound to a model family, with everything training and decoding need."""
  family: str                     # encoder_decoder | encoder_classifier | decoder_lm
  vocab_size: int                 # source (or only) vocabulary size, specials included
  target_vocab_size: int = 0      # 0: shared with the source
  num_classes: int = 0            # classification only
  max_input_len: int = 0          # S of every batch (0 if the family has no inputs)
  max_target_len: int = 0         # T of every batch (0 if the family has no targets)

  @abc.abstractmethod
  def train_iterator(self, batch_size: int, seed: int, process_index: int = 0,
                     process_count: int = 1, layout: Optional[RowLayout] = None
                     ) -> CheckpointableIterator:
    """Endless, shuffled global training batches of ``batch_size`` rows (or of a token budget):
    the same shapes and examples on every process, whatever the process count; this process fills
    the rows ``layout`` gives it (default ``RowLayout.block(process_index, process_count)``) and
    leaves the others PAD."""

  @abc.abstractmethod
  def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None
                   ) -> List[Batch]:
    """The whole split (or its first ``max_examples``) in fixed-shape batches, filler rows all PAD."""

  @abc.abstractmethod
  def examples(self, split: str, n: int) -> List[Example]:
    """The first ``n`` examples of a split, as text and ids, for decoding and samples."""

  @abc.abstractmethod
  def encode_source(self, text: str) -> np.ndarray:
    """Text -> int32 ids ending with EOS (translation/classification source, LM prompt without EOS)."""

  @abc.abstractmethod
  def decode_target(self, ids: Sequence[int]) -> str:
    """Ids -> detokenized text, stopping at the first EOS and dropping PAD/BOS."""

  def save(self, directory: str) -> None:
    """Store what is needed to rebuild the codecs (e.g. the tokenizer model) in ``directory``."""

  def describe(self) -> Dict[str, Any]:
    """Sizes for config.json and the log."""
    return {"family": self.family, "vocab_size": self.vocab_size,
            "target_vocab_size": self.target_vocab_size, "num_classes": self.num_classes,
            "max_input_len": self.max_input_len, "max_target_len": self.max_target_len}


class LazyBatches(collections.abc.Sequence):
  """A fixed list of ``count`` batches made on first use: ``make(i)`` builds batch i, once. Its
  length is known without building any (a run's set-up does not pay for evaluation data before
  its first evaluation)."""

  def __init__(self, count: int, make: Callable[[int], Dict[str, np.ndarray]]):
    self._made: List[Optional[Dict[str, np.ndarray]]] = [None] * count
    self._make = make

  def __len__(self) -> int:
    return len(self._made)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self[j] for j in range(*i.indices(len(self)))]
    if self._made[i] is None:
      self._made[i] = self._make(range(len(self))[i])
    return self._made[i]


def pad_batch(rows: Sequence[np.ndarray], length: int, batch_size: Optional[int] = None) -> np.ndarray:
  """Right-pad int rows with PAD to ``length`` (and all-PAD filler rows up to ``batch_size``,
  default len(rows)) -> int32 [batch_size, length]. txf's one padding routine: training batches,
  evaluation batches and inference batches all go through it. Raises ValueError for a row longer
  than ``length``."""
  batch_size = len(rows) if batch_size is None else batch_size
  out = np.full((batch_size, length), PAD_ID, np.int32)
  for i, r in enumerate(rows):
    if len(r) > length:
      raise ValueError(f"row {i} has {len(r)} tokens, more than the batch length {length}")
    out[i, :len(r)] = r
  return out


def truncate_keep_eos(ids: Sequence[int], max_len: int) -> np.ndarray:
  """Ids ending with EOS cut to at most ``max_len`` (> 0) tokens, EOS still last:
  ``ids[:max_len - 1] + [EOS]`` when too long, else ``ids`` unchanged (int32)."""
  ids = np.asarray(ids, np.int32)
  if len(ids) <= max_len:
    return ids
  return np.append(ids[:max_len - 1], np.int32(EOS_ID))
