"""Real data as txf Tasks: ``make_real_task(config, workdir)``, the entry point for every source that
is not ``synthetic:*``.

  data.source = text:DIR_OR_NAME   local text (data.format parallel | tsv | plain), prepared once by
                                   txf.data.builders as tfds array_record under data.data_dir
  data.source = tfds:NAME          a tfds catalog dataset (txf.data.catalog), same pipeline

Task classes (all in this module), chosen in one place (``new_task``):
  TranslationTask     encoder_decoder     inputs [B, S], targets [B, T]
  ClassificationTask  encoder_classifier  inputs [B, S], label [B]
  SentenceLMTask      decoder_lm          targets [B, T]; one sentence per record (tfds:lm1b)
  StreamLMTask        decoder_lm          targets [B, T]; windows of one token stream (plain text)
  StreamMLMTask       encoder_mlm         inputs [B, S] (unmasked; the loss masks them), the same
                                          windows (plain text, or a labelled TSV's text column)

Every task holds the run's ``DataSpec`` (``config.data`` read once). The records and the tokenizer
come from txf.data.sources (the run's own tokenizer when ``workdir/tokenizer`` has one, so
evaluation and translation reuse it exactly); ``task.save(directory)`` writes the tokenizer.
"""

import json
import math
from typing import Any, Callable, Dict, List, Optional, Sequence

from absl import logging
import numpy as np

from txf import families
from txf.data import builders, global_batches, pipeline, tokenizer, vocab
from txf.data.base import (EOS_ID, Batch, CheckpointableIterator, DataError, DataSpec, Example,
                           RowLayout, Task, data_spec, truncate_keep_eos)
from txf.data.sentinels import first_sentinel
from txf.data.sources import build_codec, open_source, read_records
from txf.ops.span_corruption import corrupted_lengths

__all__ = ["DataError", "make_real_task", "new_task", "TranslationTask", "ClassificationTask",
           "SentenceLMTask", "StreamLMTask", "StreamMLMTask"]

class _RealTask(Task):
  """What every real task shares: splits, codec, text codecs, save."""

  def __init__(self, data: DataSpec, sources: Dict[str, Sequence[Any]], adapt: Callable,
               codec: tokenizer.Codec, fingerprint: str, family: Optional[str] = None):
    self.data, self.sources, self.adapt, self.codec = data, sources, adapt, codec
    self.family = family or self.family  # a registered family on this data kind, or the class's
    self.fingerprint = fingerprint
    self.vocab_size = codec.source.vocab_size
    self.target_vocab_size = 0 if codec.joint else codec.target.vocab_size
    self._cache: Dict[Any, Any] = {}

  def split_name(self, split: str) -> str:
    """A split's real name: itself, or the alias train / eval / validation / test of the config's."""
    d = self.data
    aliases = {"train": d.train_split, "eval": d.eval_split, "validation": d.eval_split,
               "valid": d.eval_split, "val": d.eval_split, "test": d.test_split}
    name = split if split in self.sources else aliases.get(split, split)
    if name not in self.sources:
      raise DataError(f"split {split!r} is not in this data (it has {sorted(self.sources)}; "
                      f"data.train_split/eval_split/test_split name them)")
    return name

  def records(self, split: str, n: Optional[int] = None) -> List[Dict[str, Any]]:
    """The first ``n`` (default all) records of a split, adapted to str / int values."""
    source = self.sources[self.split_name(split)]
    count = len(source) if n is None else min(n, len(source))
    return read_records(source, range(count), self.adapt)

  def decode_target(self, ids: Sequence[int]) -> str:
    return self.codec.decode_target(ids)

  def save(self, directory: str) -> None:
    self.codec.save(directory)


class ExampleTask(_RealTask):
  """One record = one example (translation, classification, sentence LM), through the grain pipeline."""
  features: Dict[str, int] = {}           # sequence feature -> max length

  def encode_record(self, record: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """Adapted record -> {"inputs"/"targets": int32 ids ending with EOS, ("label": int)}."""
    raise NotImplementedError

  def _encode_raw(self, raw: Any) -> Dict[str, np.ndarray]:
    return self.encode_record(self.adapt(raw))

  def train_iterator(self, batch_size: int, seed: int, process_index: int = 0,
                     process_count: int = 1, layout: Optional[RowLayout] = None
                     ) -> CheckpointableIterator:
    """Endless global batches (see base.Task): plain, bucketed and packed batches are decided
    alike on every process from the length index (txf/data/global_batches.py), each process
    reading only the examples of its rows."""
    d = self.data
    layout = layout or RowLayout.block(process_index, process_count)
    spec = global_batches.layout_spec(pipeline.BatchSpec.of(d, dict(self.features), batch_size),
                                      layout)
    source = self.sources[self.split_name("train")]
    features = list(self.features)
    limits = dict(self.features)

    def encode(record):
      ex = self.encode_record(record)
      if spec.truncate:
        ex = {k: truncate_keep_eos(v, limits[k]) if k in limits else v for k, v in ex.items()}
      return ex

    def read(indices):
      return [encode(r) for r in read_records(source, indices, self.adapt)]

    fp = pipeline.pipeline_fingerprint("global", self.fingerprint, spec.describe(), seed)
    it = global_batches.IndexBatchIterator(self._lengths(source, features), spec, seed, layout,
                                           read, families.get(self.family).predicts == "label", fp)
    return global_batches.Prefetched(it, d.prefetch) if d.prefetch > 0 else it


  def _lengths(self, source, features: List[str]) -> np.ndarray:
    """The training split's length index int32 [N, F] (computed once, shared by all processes)."""
    key = ("lengths", tuple(features))
    if key not in self._cache:
      def lengths_of(indices):
        return [[len(ex[f]) for f in features]
                for ex in map(self.encode_record, read_records(source, indices, self.adapt))]
      self._cache[key] = global_batches.example_lengths(len(source), lengths_of, len(features),
                                                        "the training split")
    return self._cache[key]

  def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None
                   ) -> List[Batch]:
    """The whole split in [batch_size, L] batches; over-long examples truncated (counted, logged)."""
    key = ("eval", self.split_name(split), batch_size, max_examples)
    if key not in self._cache:
      limiter = pipeline.LengthLimiter(self.features, True, True, f"{self.split_name(split)} split")
      examples = [limiter.cut(self.encode_record(r)) for r in self.records(split, max_examples)]
      self._cache[key] = [pipeline.pad_rows(examples[i:i + batch_size], self.features, batch_size)
                          for i in range(0, len(examples), batch_size)]
    return self._cache[key]


class TranslationTask(ExampleTask):
  """Parallel text -> ``inputs`` [B, S], ``targets`` [B, T] (both end with EOS)."""
  family = "encoder_decoder"

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.max_input_len, self.max_target_len = self.data.max_input_len, self.data.max_target_len
    self.features = {"inputs": self.max_input_len, "targets": self.max_target_len}

  def encode_record(self, record):
    return {"inputs": self.codec.encode_source(record["source"], 0),
            "targets": np.asarray(self.codec.target.encode(record["target"]) + [EOS_ID], np.int32)}

  def encode_source(self, text: str) -> np.ndarray:
    return self.codec.encode_source(text, self.max_input_len)

  def examples(self, split: str, n: int) -> List[Example]:
    return [Example(r["source"], r["target"], self.encode_source(r["source"]))
            for r in self.records(split, n)]


class ClassificationTask(ExampleTask):
  """Labelled text -> ``inputs`` [B, S] (ends with EOS), ``label`` [B]."""
  family = "encoder_classifier"

  def __init__(self, *args, num_classes: int, **kwargs):
    super().__init__(*args, **kwargs)
    self.num_classes, self.max_input_len = num_classes, self.data.max_input_len
    self.features = {"inputs": self.max_input_len}

  def encode_record(self, record):
    return {"inputs": self.codec.encode_source(record["text"], 0), "label": record["label"]}

  def encode_source(self, text: str) -> np.ndarray:
    return self.codec.encode_source(text, self.max_input_len)

  def examples(self, split: str, n: int) -> List[Example]:
    return [Example(r["text"], str(r["label"]), self.encode_source(r["text"]), r["label"])
            for r in self.records(split, n)]


def _lm_example(codec: tokenizer.Codec, ids: np.ndarray, prompt_len: int) -> Example:
  prompt = np.asarray(ids[:prompt_len], np.int32)
  return Example(codec.source.decode(prompt), codec.source.decode(ids[prompt_len:]), prompt)


class SentenceLMTask(ExampleTask):
  """One sentence per record (tfds:lm1b) -> ``targets`` [B, T] ending with EOS; packing recommended."""
  family = "decoder_lm"

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.max_target_len = self.data.max_target_len
    self.features = {"targets": self.max_target_len}

  def encode_record(self, record):
    return {"targets": self.codec.encode_source(record["text"], 0)}

  def encode_source(self, text: str) -> np.ndarray:
    return self.codec.encode_source(text, self.max_target_len, eos=False)

  def examples(self, split: str, n: int) -> List[Example]:
    out = []
    for r in self.records(split, n):
      ids = self.codec.encode_source(r["text"], self.max_target_len, eos=False)
      out.append(_lm_example(self.codec, ids, max(1, len(ids) // 2)))
    return out


class StreamLMTask(_RealTask):
  """Plain text as one token stream -> ``targets`` [B, T]: windows of T tokens (random per-epoch
  offsets, shuffled); no padding, so packing and bucketing do not apply."""
  family = "decoder_lm"

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.max_target_len = self.data.max_target_len
    if self.data.packing or self.data.bucketing:
      logging.warning("data.packing / data.bucketing have no effect on a plain-text LM stream: "
                      "every row is a full window of %d tokens", self.max_target_len)

  def stream(self, split: str) -> np.ndarray:
    """The split's text as one int32 token stream [N] (records encoded in order, concatenated)."""
    name = self.split_name(split)
    if ("stream", name) not in self._cache:
      texts = [r["text"] for r in self.records(name)]
      ids = [i for piece in self.codec.source.encode_batch(texts) for i in piece]
      self._cache[("stream", name)] = np.asarray(ids, np.int32)
    return self._cache[("stream", name)]

  def train_iterator(self, batch_size: int, seed: int, process_index: int = 0,
                     process_count: int = 1, layout: Optional[RowLayout] = None
                     ) -> CheckpointableIterator:
    """Endless global [rows, T] windows, rows = batch_size (or tokens_per_batch / T); row r of
    batch b is window b * rows + r of the shuffled window stream, whatever the process count."""
    d, length = self.data, self.max_target_len
    layout = layout or RowLayout.block(process_index, process_count)
    rows = pipeline.rows_for_tokens(batch_size, d.tokens_per_batch,
                                    math.lcm(max(d.rows_multiple, 1), layout.multiple), length)
    if d.tokens_per_batch <= 0 and rows % layout.multiple:
      raise DataError(f"batch_size={rows} does not split over the {layout.multiple} batch shards: "
                      f"make it a multiple of {layout.multiple}")
    ds = pipeline.lm_windows(self.stream("train"), length, seed, 0, 1)
    fp = pipeline.pipeline_fingerprint("global", self.fingerprint, rows, length, seed)
    it = global_batches.WindowBatchIterator(ds, rows, length, layout, fp)
    return global_batches.Prefetched(it, d.prefetch) if d.prefetch > 0 else it

  def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None
                   ) -> List[Batch]:
    """Consecutive windows of the split from its start (the last one PAD-padded), [batch_size, T]."""
    stream, length = self.stream(split), self.max_target_len
    windows = [stream[i:i + length] for i in range(0, len(stream), length)][:max_examples]
    rows = [{"targets": w} for w in windows]
    return [pipeline.pad_rows(rows[i:i + batch_size], {"targets": length}, batch_size)
            for i in range(0, len(rows), batch_size)]

  def examples(self, split: str, n: int) -> List[Example]:
    """``n`` windows spread over the split: the first quarter is the prompt, the rest the reference."""
    stream, length = self.stream(split), self.max_target_len
    starts = np.linspace(0, max(len(stream) - length, 0), n).astype(int) if n else []
    return [_lm_example(self.codec, stream[s:s + length], max(1, length // 4)) for s in starts]

  def encode_source(self, text: str) -> np.ndarray:
    """A prompt: ids without EOS (its last ``max_target_len`` tokens)."""
    return np.asarray(self.codec.source.encode(text)[-self.max_target_len:], np.int32)


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


class _Renamed(CheckpointableIterator):
  """A window iterator's ``{"targets": [B, T]}`` batches as ``{"inputs": ...}`` (plus
  ``word_starts`` from ``starts``, a bool [V] table, when given); state is the wrapped one's."""

  def __init__(self, inner: CheckpointableIterator, starts: Optional[np.ndarray]):
    self._inner, self._starts = inner, starts

  def __next__(self) -> Batch:
    return _mlm_batch(next(self._inner)["targets"], self._starts)

  def get_state(self) -> Dict[str, Any]:
    return self._inner.get_state()

  def set_state(self, state: Dict[str, Any]) -> None:
    self._inner.set_state(state)


def _mlm_batch(windows: np.ndarray, starts: Optional[np.ndarray]) -> Batch:
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

  def train_iterator(self, batch_size: int, seed: int, process_index: int = 0,
                     process_count: int = 1, layout: Optional[RowLayout] = None
                     ) -> CheckpointableIterator:
    """StreamLMTask's windows (the same rows and resume state), as MLM batches."""
    inner = super().train_iterator(batch_size, seed, process_index, process_count, layout)
    return _Renamed(inner, self._starts)

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


def whole_word(config) -> bool:
  """``config.pretrain.whole_word`` (False for a config without the section)."""
  return bool(config.get("pretrain", {}).get("whole_word", False))


# ----------------------------------------------------------------------------- entry point


def new_task(family: str, data: DataSpec, sources: Dict[str, Sequence[Any]], adapt: Callable,
             codec: tokenizer.Codec, fingerprint: str, sentences: bool, num_classes: int = 0,
             pretrain=None, whole_word: bool = False) -> Task:
  """The real Task class of ``family``'s data kind (its ``txf.families`` record), chosen here and
  nowhere else: parallel -> TranslationTask, tsv -> ClassificationTask (``num_classes``), plain ->
  SentenceLMTask when a record is one sentence (``sentences``, catalog data), else StreamLMTask;
  span_corruption -> SpanCorruptionTask (``pretrain``: config.pretrain); encoder_mlm ->
  StreamMLMTask (``whole_word``: its batches carry word starts).
  The task's lengths are ``data.max_input_len`` / ``data.max_target_len``."""
  args = (data, sources, adapt, codec, fingerprint)
  if family == "span_corruption":
    return SpanCorruptionTask(*args, family=family, num_sentinels=int(pretrain.num_sentinels),
                              noise_density=float(pretrain.noise_density),
                              mean_span_length=float(pretrain.mean_span_length))
  if family == StreamMLMTask.family:
    return StreamMLMTask(*args, family=family, whole_word=whole_word)
  kind = families.get(family).data_kind
  if kind == "parallel":
    return TranslationTask(*args, family=family)
  if kind == "tsv":
    return ClassificationTask(*args, num_classes=num_classes, family=family)
  if kind == "plain":
    return (SentenceLMTask if sentences else StreamLMTask)(*args, family=family)
  able = [f for f in families.names() if families.get(f).data_kind]
  raise DataError(f"model.family={family!r} has no real-data task (it trains on synthetic data "
                  f"only): use one of {able}")


def make_real_task(config, workdir: str = "") -> Task:
  """The Task of ``config.data.source`` (text:... or tfds:...) for ``config.model.family``.

  The tokenizer is read from ``workdir/tokenizer`` if the run has one, else trained (or taken
  from the cache); the training loop saves it into the run once (``txf.workdir.save_task``), so
  every later use of the run sees the same ids. Nothing is written to ``workdir`` here.
  """
  d, family = data_spec(config), config.model.family
  if d.tokenizer not in ("sentencepiece", "char"):
    raise DataError(f"data.tokenizer={d.tokenizer!r} is for synthetic tasks; real text needs "
                    f"'sentencepiece' or 'char'")
  data_dir = builders.resolve_data_dir(d.data_dir)
  kind, sources, adapt, num_classes, fingerprint = open_source(d, data_dir)
  from_catalog = kind.startswith("tfds-")
  kind = kind.replace("tfds-", "")
  mlm = family == StreamMLMTask.family
  if mlm and kind == "tsv":
    kind = "plain"  # a labelled TSV's text column is unlabelled text for masked-LM pretraining
  if families.get(family).data_kind != kind and not (family == "span_corruption"
                                                     and kind == "parallel"):  # both sides as text
    users = [f for f in families.names() if families.get(f).data_kind == kind]
    raise DataError(f"data.source={d.source!r} gives {kind} data, which model.family={family!r} "
                    f"cannot use: set model.family={users[0]!r} (or another data.format / source)")
  if d.packing and families.get(family).predicts == "label":
    raise DataError("data.packing=True with model.family='encoder_classifier': the classifier "
                    "pools a whole row into one label; set data.packing=False")
  fingerprint = f"{fingerprint}|{d.tokenizer}|{d.max_input_len}|{d.max_target_len}"
  spans = family == "span_corruption"
  codec = build_codec(d, workdir, kind, sources[d.train_split], adapt, fingerprint, data_dir,
                      sentinels=config.pretrain.num_sentinels if spans else 0, mask_token=mlm)
  task = new_task(family, d, sources, adapt, codec,
                  fingerprint + "|" + json.dumps(codec.settings, sort_keys=True),
                  sentences=from_catalog, num_classes=num_classes,
                  pretrain=config.pretrain if spans else None, whole_word=whole_word(config))
  logging.info("real task %s: %s", type(task).__name__, task.describe())
  return task
