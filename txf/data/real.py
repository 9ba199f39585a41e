"""Real data as txf Tasks: ``make_real_task(config, workdir)``, the entry point for every source that
is not ``synthetic:*``.

  data.source = text:DIR_OR_NAME   local text (data.format parallel | tsv | plain), prepared once by
                                   txf.data.builders as tfds array_record under data.data_dir
  data.source = tfds:NAME          a tfds catalog dataset (txf.data.catalog), same pipeline

Task classes (txf.data.tasks, txf.data.pretraining), chosen in one place (``new_task``):
  TranslationTask     encoder_decoder     inputs [B, S], targets [B, T]
  ClassificationTask  encoder_classifier  inputs [B, S], label [B]
  SentenceLMTask      decoder_lm          targets [B, T]; one sentence per record (tfds:lm1b)
  StreamLMTask        decoder_lm          targets [B, T]; windows of one token stream (plain text)
  SpanCorruptionTask  span_corruption     inputs [B, L] raw windows, targets [B, T_c] (placeholder)
  StreamMLMTask       encoder_mlm         inputs [B, S] (unmasked; the loss masks them), the same
                                          windows (plain text, or a labelled TSV's text column)

Every task holds the run's ``DataSpec`` (``config.data`` read once). The records and the tokenizer
come from txf.data.sources (the run's own tokenizer when ``workdir/tokenizer`` has one, so
evaluation and translation reuse it exactly); ``task.save(directory)`` writes the tokenizer.
"""

import json
from typing import Any, Callable, Dict, Sequence

from absl import logging

from txf.core import families
from txf.data import builders, tokenizer
from txf.data.base import DataError, DataSpec, Task, task_spec
from txf.data.pretraining import SpanCorruptionTask, StreamMLMTask  # noqa: F401  (re-exported)
from txf.data.sources import build_codec, open_source
from txf.data.tasks import (ClassificationTask, ExampleTask, SentenceLMTask,  # noqa: F401
                            StreamLMTask, TranslationTask)


# ----------------------------------------------------------------------------- entry point


def new_task(family: str, data: DataSpec, sources: Dict[str, Sequence[Any]], adapt: Callable,
             codec: tokenizer.Codec, fingerprint: str, sentences: bool, num_classes: int = 0,
             pretrain=None, whole_word: bool = False) -> Task:
  """The real Task of ``family`` (its ``txf.core.families`` record), chosen here and nowhere else:
  the record's ``task`` (``Class.for_run(..., family=, pretrain=, whole_word=)``: span corruption,
  masked LM), else by its data kind: parallel -> TranslationTask, tsv -> ClassificationTask
  (``num_classes``), plain -> SentenceLMTask when a record is one sentence (``sentences``,
  catalog data), else StreamLMTask. The task's lengths are ``data.max_input_len`` /
  ``data.max_target_len``."""
  args = (data, sources, adapt, codec, fingerprint)
  record = families.get(family)
  if record.task is not None:
    return families.resolve(record.task).for_run(*args, family=family, pretrain=pretrain,
                                                  whole_word=whole_word)
  kind = record.data_kind
  if kind == "parallel":
    return TranslationTask(*args, family=family)
  if kind == "tsv":
    return ClassificationTask(*args, num_classes=num_classes, family=family)
  if kind == "plain":
    return (SentenceLMTask if sentences else StreamLMTask)(*args, family=family)
  able = [f for f in families.names() if families.get(f).data_kind]
  raise DataError(f"model.family={family!r} has no real-data task (it trains on synthetic data "
                  f"only): use one of {able}")


def data_kind_for(family: str, kind: str, source: str) -> str:
  """The data kind ``family`` reads ``kind`` records as: its own, or one of its record's
  ``reads`` (a labelled TSV read by a plain-text family is plain text); DataError naming a family
  that uses ``kind`` otherwise."""
  record = families.get(family)
  if kind == record.data_kind:
    return kind
  if kind in record.reads:
    return "plain" if (kind == "tsv" and record.data_kind == "plain") else kind
  users = [f for f in families.names() if families.get(f).data_kind == kind]
  raise DataError(f"data.source={source!r} gives {kind} data, which model.family={family!r} "
                  f"cannot use: set model.family={users[0]!r} (or another data.format / source)")


def make_real_task(spec, workdir: str = "") -> Task:
  """The Task of ``spec.data.source`` (text:... or tfds:...) for ``spec.family``; ``spec`` a
  TaskSpec (a run config is read into one).

  The tokenizer is read from ``workdir/tokenizer`` if the run has one, else trained (or taken
  from the cache); the training loop saves it into the run once (``txf.runtime.workdir.save_task``), so
  every later use of the run sees the same ids. Nothing is written to ``workdir`` here.
  """
  spec = task_spec(spec)
  d, family = spec.data, spec.family
  if d.tokenizer not in ("sentencepiece", "char"):
    raise DataError(f"data.tokenizer={d.tokenizer!r} is for synthetic tasks; real text needs "
                    f"'sentencepiece' or 'char'")
  data_dir = builders.resolve_data_dir(d.data_dir)
  kind, sources, adapt, num_classes, fingerprint = open_source(d, data_dir)
  from_catalog = kind.startswith("tfds-")
  kind = data_kind_for(family, kind.replace("tfds-", ""), d.source)
  record = families.get(family)
  if d.packing and record.predicts == "label":
    raise DataError(f"data.packing=True with model.family={family!r}: the classifier "
                    f"pools a whole row into one label; set data.packing=False")
  fingerprint = f"{fingerprint}|{d.tokenizer}|{d.max_input_len}|{d.max_target_len}"
  spans = record.pieces == "sentinels"
  codec = build_codec(d, workdir, kind, sources[d.train_split], adapt, fingerprint, data_dir,
                      sentinels=spec.pretrain.num_sentinels if spans else 0,
                      mask_token=record.pieces == "mask")
  task = new_task(family, d, sources, adapt, codec,
                  fingerprint + "|" + json.dumps(codec.settings, sort_keys=True),
                  sentences=from_catalog, num_classes=num_classes,
                  pretrain=spec.pretrain, whole_word=bool(spec.pretrain.whole_word))
  logging.info("real task %s: %s", type(task).__name__, task.describe())
  return task
