"""The real-data Task classes (chosen by ``txf.data.real.new_task``): parallel text, labelled text,
sentences and token streams for the language model.

  TranslationTask     encoder_decoder     inputs [B, S], targets [B, T]
  ClassificationTask  encoder_classifier  inputs [B, S], label [B]
  SentenceLMTask      decoder_lm          targets [B, T]; one sentence per record (tfds:lm1b)
  StreamLMTask        decoder_lm          targets [B, T]; windows of one token stream (plain text)

Every task holds the run's ``DataSpec`` (``config.data`` read once), its records (txf.data.sources)
and its tokenizer; ``task.save(directory)`` writes the tokenizer.
"""

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from txf.core import families
from txf.data import global_batches, pipeline, tokenizer
from txf.data.base import (EOS_ID, Batch, CheckpointableIterator, DataError, DataSpec, Example,
                           RowLayout, Task, truncate_keep_eos)
from txf.data.id_store import IdStore
from txf.data.sources import read_records


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
    label = families.get(self.family).predicts == "label"
    lengths, store = self._index(source, features, label)

    def encode(indices):
      return [self.encode_record(r) for r in read_records(source, indices, self.adapt)]

    def read(indices):
      examples = store.read(indices, encode)
      if not spec.truncate:
        return examples
      return [{k: truncate_keep_eos(v, limits[k]) if k in limits else v for k, v in ex.items()}
              for ex in examples]

    fp = pipeline.pipeline_fingerprint("global", self.fingerprint, spec.describe(), seed)
    it = global_batches.IndexBatchIterator(lengths, spec, seed, layout, read, label, fp)
    return global_batches.Prefetched(it, d.prefetch) if d.prefetch > 0 else it

  def _index(self, source, features: List[str], label: bool) -> Tuple[np.ndarray, IdStore]:
    """(the training split's length index int32 [N, F], computed once and shared by all
    processes; an ``IdStore`` holding the examples that pass encoded, up to
    ``data.id_store_tokens`` ids)."""
    key = ("lengths", tuple(features))
    if key not in self._cache:
      store = IdStore(len(source), features, ("label",) if label else (),
                      max_tokens=self.data.id_store_tokens)

      def lengths_of(indices):
        out = []
        for i, ex in zip(indices, map(self.encode_record,
                                      read_records(source, indices, self.adapt))):
          out.append([len(ex[f]) for f in features])
          store.put(int(i), ex)
        return out

      lengths = global_batches.example_lengths(len(source), lengths_of, len(features),
                                               "the training split")
      self._cache[key] = (lengths, store)
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
