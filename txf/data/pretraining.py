"""The self-supervised objectives' Tasks: unlabelled text as the windows of
``txf.data.tasks.StreamLMTask``, under the batch keys each objective's loss reads.

  SpanCorruptionTask  span_corruption     inputs [B, L] raw windows (the loss corrupts them),
                                          targets [B, T_c] zeros (the decoder's width)
  StreamMLMTask       encoder_mlm         inputs [B, S] (unmasked; the loss masks them), the same
                                          windows (plain text, or a labelled TSV's text column)
"""

from typing import Any, Callable, Dict, List, Optional

import numpy as np

from txf.data import vocab
from txf.data.base import Batch, CheckpointableIterator, Example, RowLayout
from txf.data.sentinels import first_sentinel
from txf.data.tasks import StreamLMTask
from txf.core.objectives import corrupted_lengths


class _Mapped(CheckpointableIterator):
  """``iterator``'s batches through ``fn``; the position is ``iterator``'s."""

  def __init__(self, iterator: CheckpointableIterator, fn: Callable[[Batch], Batch]):
    self.iterator, self.fn = iterator, fn

  def __next__(self) -> Batch:
    return self.fn(next(self.iterator))

  def get_state(self) -> Dict[str, Any]:
    return self.iterator.get_state()

  def set_state(self, state: Dict[str, Any]) -> None:
    self.iterator.set_state(state)


class SpanCorruptionTask(StreamLMTask):
  """Text as one token stream (a parallel record: its source then its target sentence) ->
  ``inputs`` [B, L] raw windows of L = ``data.max_input_len`` tokens, and ``targets`` [B, T_c]
  zeros that only give the model's initialisation the decoder's width: the span_corruption loss
  (txf.models.span_loss) corrupts ``inputs`` into the encoder's inputs and the decoder's targets.
  ``max_target_len`` = T_c, ``first_sentinel`` = the tokenizer's ``<extra_id_0>``."""
  family = "span_corruption"

  def __init__(self, *args, num_sentinels: int, noise_density: float, mean_span_length: float,
               **kwargs):
    super().__init__(*args, **kwargs)
    self.max_input_len = self.data.max_input_len
    self.max_target_len = corrupted_lengths(self.max_input_len, noise_density, mean_span_length)[1]
    self.first_sentinel = first_sentinel(self.codec.source, num_sentinels)

  @classmethod
  def for_run(cls, *args, family: str, pretrain, whole_word: bool = False) -> "SpanCorruptionTask":
    """The task of a run (``txf.core.families.Family.task``): ``pretrain`` is config.pretrain."""
    del whole_word
    return cls(*args, family=family, num_sentinels=int(pretrain.num_sentinels),
               noise_density=float(pretrain.noise_density),
               mean_span_length=float(pretrain.mean_span_length))

  def stream(self, split: str) -> np.ndarray:
    """The split's text as one int32 token stream [N] (a parallel record: source, then target)."""
    name = self.split_name(split)
    if ("stream", name) not in self._cache:
      texts = [t for r in self.records(name)
               for t in ([r["text"]] if "text" in r else [r["source"], r["target"]])]
      ids = [i for piece in self.codec.source.encode_batch(texts) for i in piece]
      self._cache[("stream", name)] = np.asarray(ids, np.int32)
    return self._cache[("stream", name)]

  def _windows(self, fn, *args, **kwargs):
    """``fn`` run with StreamLMTask's window length (``max_target_len``) set to L."""
    corrupted, self.max_target_len = self.max_target_len, self.max_input_len
    try:
      return fn(*args, **kwargs)
    finally:
      self.max_target_len = corrupted

  def _as_inputs(self, batch: Batch) -> Batch:
    rows = batch["targets"]
    return {"inputs": rows, "targets": np.zeros((rows.shape[0], self.max_target_len), np.int32)}

  def train_iterator(self, batch_size: int, seed: int, process_index: int = 0,
                     process_count: int = 1, layout: Optional[RowLayout] = None
                     ) -> CheckpointableIterator:
    """StreamLMTask's window batches (same order, same exact resume) under ``inputs``."""
    it = self._windows(super().train_iterator, batch_size, seed, process_index, process_count,
                       layout)
    return _Mapped(it, self._as_inputs)

  def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None
                   ) -> List[Batch]:
    """StreamLMTask's consecutive windows from the split's start, under ``inputs``."""
    return [self._as_inputs(b) for b in
            self._windows(super().eval_batches, split, batch_size, max_examples)]

  def examples(self, split: str, n: int) -> List[Example]:
    return []  # not decoded in the loop

  def encode_source(self, text: str) -> np.ndarray:
    """An input whose sentinels are written ``<extra_id_N>``: ids + EOS (``txf generate``)."""
    return self.codec.encode_source(text, 0)


def _mlm_batch(windows: np.ndarray, starts: Optional[np.ndarray]) -> Batch:
  """{"inputs": windows} plus ``word_starts`` from ``starts`` (a bool [V] table), when given."""
  batch = {"inputs": windows}
  if starts is not None:  # PAD counts as a start: masking never chooses it
    batch["word_starts"] = starts[windows].astype(np.int32)
  return batch


class StreamMLMTask(StreamLMTask):
  """Plain text (or a labelled TSV's text column, labels ignored) as one token stream ->
  ``inputs`` [B, S]: StreamLMTask's windows of S = ``data.max_input_len`` tokens, unmasked (the
  family's loss masks them, txf.models.encoder_mlm.mlm_loss), plus ``word_starts`` int32 [B, S]
  when ``whole_word``. ``mask_id``: the tokenizer's mask token (DataError without one)."""
  family = "encoder_mlm"

  def __init__(self, *args, whole_word: bool = False, **kwargs):
    super().__init__(*args, **kwargs)
    self.mask_id = vocab.mask_token_id(self.codec.source)
    self.max_input_len, self.max_target_len = self.data.max_input_len, self.data.max_input_len
    self._starts = vocab.word_start_table(self.codec.source) if whole_word else None

  @classmethod
  def for_run(cls, *args, family: str, pretrain=None, whole_word: bool = False
              ) -> "StreamMLMTask":
    """The task of a run (``txf.core.families.Family.task``): ``whole_word`` from config.pretrain."""
    del pretrain
    return cls(*args, family=family, whole_word=whole_word)

  def train_iterator(self, batch_size: int, seed: int, process_index: int = 0,
                     process_count: int = 1, layout: Optional[RowLayout] = None
                     ) -> CheckpointableIterator:
    """StreamLMTask's windows (the same rows and resume state), as MLM batches."""
    inner = super().train_iterator(batch_size, seed, process_index, process_count, layout)
    return _Mapped(inner, lambda b: _mlm_batch(b["targets"], self._starts))

  def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None
                   ) -> List[Batch]:
    """StreamLMTask's consecutive windows of the split, as MLM batches."""
    return [_mlm_batch(b["targets"], self._starts)
            for b in super().eval_batches(split, batch_size, max_examples)]

  def examples(self, split: str, n: int) -> List[Example]:
    return []  # nothing to decode in-loop

  def encode_source(self, text: str) -> np.ndarray:
    """A text to fill: its ids (no EOS; a mask token where the text says ``<mask>`` / [MASK]),
    the first ``max_input_len``."""
    return np.asarray(self.codec.source.encode(text)[:self.max_input_len], np.int32)
