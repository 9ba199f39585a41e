"""Where a real task's records and tokenizer come from: ``open_source(spec, data_dir)`` opens
``data.source`` (``text:`` prepared by txf.data.builders, ``tfds:`` through txf.data.catalog) as
per-split record sources, and ``build_codec`` gives the run's tokenizer (the run's own, a cached
one, or one trained on the training split, cached under ``data_dir/txf_tokenizers/<hash>``).
Neither writes into a run: the training loop saves the task once (``txf.runtime.workdir.save_task``).
"""

import hashlib
import json
import os
from typing import Any, Callable, Dict, List, Sequence

from absl import logging
import numpy as np

from txf.core import formats
from txf.runtime import workdir as workdir_lib
from txf.data import builders, catalog, tokenizer, vocab
from txf.data import sentinels as sentinel_lib
from txf.data.base import DataError, DataSpec
from txf.data.text import resolve_text_dir

def _str(value: Any) -> str:
  if isinstance(value, np.ndarray):
    value = value.item()
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _adapt_local(record: Dict[str, Any]) -> Dict[str, Any]:
  """A prepared local record (bytes, numpy scalars) -> str / int values."""
  return {k: int(np.asarray(v)) if k == "label" else _str(v) for k, v in record.items()}


def read_records(source: Sequence[Any], indices: Sequence[int], adapt: Callable) -> List[Dict]:
  """Adapted records at ``indices`` (read in chunks through ``__getitems__`` when the source has it)."""
  out, indices = [], [int(i) for i in indices]
  many = getattr(source, "__getitems__", None)
  for start in range(0, len(indices), 4096):
    chunk = indices[start:start + 4096]
    try:
      raw = many(chunk) if many else [source[i] for i in chunk]
    except TypeError:            # tfds.testing.mock_data's sources break __getitems__
      raw = [source[i] for i in chunk]
    out.extend(adapt(r) for r in raw)
  return out


# The settings keys a pretraining objective adds to a tokenizer's (its extra pieces on top).
PRETRAINING_KEYS = ("sentinels", "mask_token")


def _tokenizer_settings(d, sentinels: int = 0, mask_token: bool = False) -> Dict[str, Any]:
  """How the tokenizer is built; ``sentinels`` (span corruption) adds the key "sentinels",
  ``mask_token`` (masked-LM runs) the key "mask_token", so every other run's settings (and cache
  key) are as without them."""
  out = {"tokenizer": d.tokenizer, "vocab_size": int(d.vocab_size),
         "model_type": d.spm_model_type, "joint": bool(d.joint_vocab),
         "input_sentences": int(d.spm_input_sentences), "threads": int(d.spm_num_threads)}
  if sentinels:
    out["sentinels"] = int(sentinels)
  if mask_token:
    out["mask_token"] = vocab.MASK_PIECE
  return out


def _train_codec(d, kind: str, train: Sequence[Any], adapt: Callable, sentinels: int = 0,
                 mask_token: bool = False) -> tokenizer.Codec:
  """Train the tokenizer(s) on (an even sample of) the training split; ``sentinels`` > 0:
  ``_train_with_sentinels``; ``mask_token``: a sentencepiece with the user piece
  ``vocab.MASK_PIECE`` (masked-LM runs)."""
  if sentinels:
    return _train_with_sentinels(d, kind, train, adapt, sentinels)
  cap = 0 if kind == "plain" and d.tokenizer == "char" else d.spm_input_sentences
  records = read_records(train, tokenizer.sample_evenly(len(train), cap), adapt)
  if kind == "parallel":
    src, tgt = [r["source"] for r in records], [r["target"] for r in records]
  else:
    src = tgt = [r["text"] for r in records]
  settings = _tokenizer_settings(d, mask_token=mask_token)
  if d.tokenizer == "char":
    source = target = tokenizer.CharTokenizer("".join(set("".join(src + tgt))))
    return tokenizer.Codec(source, target, settings)

  def train_sp(texts):
    return tokenizer.train_sentencepiece(
        texts, d.vocab_size, d.spm_model_type, d.spm_num_threads,
        user_symbols=(vocab.MASK_PIECE,) if mask_token else ())

  if kind != "parallel" or d.joint_vocab:
    source = target = train_sp(src + tgt if kind == "parallel" else src)
  else:
    source, target = train_sp(src), train_sp(tgt)
  return tokenizer.Codec(source, target, settings)


def _train_with_sentinels(d, kind: str, train: Sequence[Any], adapt: Callable, count: int
                          ) -> tokenizer.Codec:
  """One sentencepiece vocabulary of ``data.vocab_size`` ids, on the text of every record (both
  sides of parallel text), whose top ``count`` ids are the sentinels ``<extra_id_N>``
  (txf.data.sentinels.add_sentinels): span corruption's tokenizer."""
  if d.tokenizer != "sentencepiece" or (kind == "parallel" and not d.joint_vocab):
    raise DataError(f"model.family='span_corruption' needs one sentencepiece vocabulary with "
                    f"sentinels: set data.tokenizer='sentencepiece' (got {d.tokenizer!r}) and "
                    f"data.joint_vocab=True")
  least = 256 + tokenizer.NUM_SPECIALS + 8  # train_sentencepiece's smallest vocabulary
  if d.vocab_size - count < least:
    raise DataError(f"data.vocab_size={d.vocab_size} leaves {d.vocab_size - count} sentencepiece "
                    f"pieces beside pretrain.num_sentinels={count} sentinels: raise data.vocab_size "
                    f"to at least {least + count} or lower pretrain.num_sentinels")
  records = read_records(train, tokenizer.sample_evenly(len(train), d.spm_input_sentences), adapt)
  texts = ([r["source"] for r in records] + [r["target"] for r in records] if kind == "parallel"
           else [r["text"] for r in records])
  base = tokenizer.train_sentencepiece(texts, d.vocab_size - count, d.spm_model_type,
                                       d.spm_num_threads)
  tok = sentinel_lib.add_sentinels(base, count)
  return tokenizer.Codec(tok, tok, _tokenizer_settings(d, count))


def _without_pretraining_pieces(settings: Dict[str, Any]) -> Dict[str, Any]:
  """``settings`` without the pieces a pretraining objective adds on top (``PRETRAINING_KEYS``):
  a run fine-tuned from a pretrained one (init_from) keeps its tokenizer, extra
  pieces included, and that is no mismatch with a config that asks for none."""
  return {k: v for k, v in settings.items() if k not in PRETRAINING_KEYS}


def build_codec(d, workdir: str, kind: str, train: Sequence[Any], adapt: Callable,
                fingerprint: str, data_dir: str, sentinels: int = 0, mask_token: bool = False
                ) -> tokenizer.Codec:
  """The run's tokenizer (``workdir/tokenizer``), else a cached one, else a newly trained one
  (``sentinels`` > 0: with that many ``<extra_id_N>`` on top, for span corruption; ``mask_token``:
  with a mask piece, for model.family=encoder_mlm)."""
  wanted = _tokenizer_settings(d, sentinels, mask_token)
  if workdir:
    directory = workdir_lib.path_of(workdir, workdir_lib.TOKENIZER_DIR)
    codec = tokenizer.load_codec(directory)
    if codec is not None:
      if (codec.settings != wanted and _without_pretraining_pieces(codec.settings) != wanted
          and codec.settings.get("tokenizer") not in ("marian", "wordpiece", "gpt2")):
        logging.warning("using the run's tokenizer in %s (built with %s); the config asks for %s",
                        directory, codec.settings, wanted)
      return codec
  key = hashlib.sha1(json.dumps([wanted, fingerprint], sort_keys=True).encode()).hexdigest()[:16]
  cache = os.path.join(data_dir, "txf_tokenizers", key)
  codec = tokenizer.load_codec(cache)
  if codec is None:
    logging.info("training the %s tokenizer on the training split (%s)", d.tokenizer, wanted)
    codec = _train_codec(d, kind, train, adapt, sentinels, mask_token)
    codec.save(cache)
  _report_vocab_size(d, codec)
  return codec


def _report_vocab_size(d, codec: tokenizer.Codec) -> None:
  """Say when sentencepiece made fewer pieces than data.vocab_size asks for (too little text)."""
  if d.tokenizer != "sentencepiece":
    return
  sizes = {codec.source.vocab_size, codec.target.vocab_size}
  if max(sizes) < d.vocab_size:
    used = " / ".join(f"{n:,}" for n in sorted(sizes))
    logging.warning("data.vocab_size=%s is more than the training data supports: the vocabulary "
                    "has %s pieces, and the model uses that size (lower data.vocab_size to silence "
                    "this)", f"{d.vocab_size:,}", used)


def open_source(d: DataSpec, data_dir: str):
  """(kind, sources, adapt, num_classes, fingerprint) of ``d.source``: kind parallel | tsv | plain
  (a local format's data kind, ``txf.core.formats``), prefixed 'tfds-' for a catalog dataset;
  sources: split name -> random-access records."""
  scheme, _, rest = d.source.partition(":")
  splits = [d.train_split, d.eval_split, d.test_split]
  if scheme == "text":
    directory = resolve_text_dir(rest, d.path)
    spec = builders.local_spec(directory, d.format, splits, d.src_lang, d.tgt_lang,
                               d.max_line_chars, d.lm_split_fraction, d.file_pattern)
    prepared = builders.prepare_local(directory, spec, data_dir)
    return (formats.get(d.format).kind, prepared.sources, _adapt_local, int(prepared.metadata.get("num_classes", 0)),
            prepared.fingerprint)
  if scheme == "tfds":
    try:
      cat = catalog.open_catalog(rest, splits, data_dir, d.src_lang, d.tgt_lang)
    except DataError as e:
      if "has no split" not in str(e) or f"'{d.test_split}'" not in str(e):
        raise
      logging.info("tfds:%s has no test split %r; continuing without it", rest, d.test_split)
      cat = catalog.open_catalog(rest, splits[:2], data_dir, d.src_lang, d.tgt_lang)
    return "tfds-" + cat.kind, cat.sources, cat.adapt, cat.num_classes, cat.fingerprint
  raise DataError(f"data.source={d.source!r}: use text:DIR_OR_NAME, tfds:NAME or synthetic:TASK")
