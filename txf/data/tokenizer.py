"""Tokenizers for real text: SentencePiece trained on the training split, or characters.

Special ids are the same for every tokenizer (txf.data.base):
  PAD=0 "<pad>", BOS=1 "<s>", EOS=2 "</s>", UNK=3 "<unk>".
``encode`` returns ids WITHOUT EOS (the task appends it; an imported BERT WordPiece tokenizer's
starts with its [CLS] = BOS); ``decode`` drops PAD/BOS/EOS.

SentencePiece is trained with byte fallback (no UNK for unseen characters: they become byte pieces),
``hard_vocab_limit=False`` (a small corpus may give fewer pieces than asked; ``vocab_size`` reports
the real size), and a fixed thread count (the trained model depends on it: same input + same
threads = the same model, byte for byte). The character tokenizer maps each character of the
training text to ``4 + its rank``; unseen characters become UNK.

A ``Codec`` is one tokenizer (joint vocabulary) or two (separate source/target vocabularies); it is
saved to a directory (``tokenizer.json`` + ``*.model``) and loaded back byte-identically, so
training, evaluation and translation use exactly the same tokenizer.
"""

import abc
import dataclasses
import io
import json
import os
import re
import shutil
import tempfile
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np
import sentencepiece as spm

from txf.runtime import storage
from txf.data.base import BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataError, truncate_keep_eos
from txf.data.bpe import GPT2Tokenizer, clean_up_spaces
from txf.data.hf_ids import HFIdsTokenizer
from txf.data.tokjson import TokenizerJson
from txf.data.tokjson_codec import JsonTokenizer

NUM_SPECIALS = 4
_SPECIAL_SET = (PAD_ID, BOS_ID, EOS_ID)
CODEC_FILE = "tokenizer.json"


class Tokenizer(abc.ABC):
  """Text <-> ids with the fixed special ids."""
  kind: str

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of ids, specials included."""

  @abc.abstractmethod
  def encode(self, text: str) -> List[int]:
    """text -> ids [L] (no BOS/EOS)."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int]) -> str:
    """ids [L] -> text; PAD, BOS and EOS are dropped (callers cut at EOS first)."""

  @abc.abstractmethod
  def to_json(self, directory: str, prefix: str) -> Dict[str, Any]:
    """Write whatever files are needed under ``directory``; return the JSON description."""

  def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
    """Several texts -> a list of id lists."""
    return [self.encode(t) for t in texts]


# an imported GPT-2's byte-level BPE (txf.data.bpe, which cannot import this module) is a Tokenizer
Tokenizer.register(GPT2Tokenizer)
# a Hugging Face tokenizer.json read by txf itself (txf.data.tokjson_codec), likewise
Tokenizer.register(JsonTokenizer)
# an import without a tokenizer file txf reads: ids only (txf.data.hf_ids)
Tokenizer.register(HFIdsTokenizer)


class SentencePieceTokenizer(Tokenizer):
  """A trained SentencePiece model (serialized proto bytes)."""
  kind = "sentencepiece"

  def __init__(self, model_proto: bytes):
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    got = (self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id(), self._sp.unk_id())
    if got != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
      raise DataError(f"sentencepiece model has special ids (pad, bos, eos, unk)={got}, txf needs "
                      f"{(PAD_ID, BOS_ID, EOS_ID, UNK_ID)}: retrain it with txf.data.tokenizer")

  @property
  def vocab_size(self) -> int:
    return int(self._sp.get_piece_size())

  def encode(self, text: str) -> List[int]:
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
    return self._sp.encode(list(texts), out_type=int)

  def decode(self, ids: Sequence[int]) -> str:
    return self._sp.decode([int(i) for i in ids if int(i) not in _SPECIAL_SET])

  def to_json(self, directory: str, prefix: str) -> Dict[str, Any]:
    name = f"{prefix}.model"
    with open(os.path.join(directory, name), "wb") as f:
      f.write(self.model_proto)
    return {"kind": self.kind, "model_file": name, "vocab_size": self.vocab_size}


class CharTokenizer(Tokenizer):
  """One id per character: id = 4 + rank of the character in ``chars`` (sorted)."""
  kind = "char"

  def __init__(self, chars: str):
    self.chars = "".join(sorted(set(chars)))
    self._ids = {c: NUM_SPECIALS + i for i, c in enumerate(self.chars)}

  @property
  def vocab_size(self) -> int:
    return NUM_SPECIALS + len(self.chars)

  def encode(self, text: str) -> List[int]:
    ids = self._ids
    return [ids.get(c, UNK_ID) for c in text]

  def decode(self, ids: Sequence[int]) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i >= NUM_SPECIALS and i - NUM_SPECIALS < len(self.chars):
        out.append(self.chars[i - NUM_SPECIALS])
      elif i == UNK_ID:
        out.append("\ufffd")
    return "".join(out)

  def to_json(self, directory: str, prefix: str) -> Dict[str, Any]:
    return {"kind": self.kind, "chars": self.chars, "vocab_size": self.vocab_size}


def marian_order(vocab_size: int, pad: int, eos: int, unk: int) -> np.ndarray:
  """The Marian id of every txf id: int [V], ``order[txf_id] = marian_id``.

  txf keeps its own special ids inside (PAD 0, EOS 2, UNK 3: batches, masks and losses assume
  them): Marian's pad (its decoder start) becomes 0, its EOS 2, its UNK 3, and the other Marian ids
  fill txf ids 1, 4, 5, ... in increasing order. A fixed permutation: import applies it to the
  embedding rows and logits bias, export undoes it.
  """
  specials = {0: pad, EOS_ID: eos, UNK_ID: unk}
  if len(set(specials.values())) != 3 or not all(0 <= m < vocab_size for m in specials.values()):
    raise DataError(f"Marian special ids pad={pad}, eos={eos}, unk={unk} must be distinct ids "
                    f"below the vocabulary size {vocab_size}")
  rest = iter(m for m in range(vocab_size) if m not in specials.values())
  return np.asarray([specials[t] if t in specials else next(rest) for t in range(vocab_size)],
                    np.int64)




class MarianTokenizer(Tokenizer):
  """A Marian (OPUS-MT) tokenizer side: a SentencePiece model that splits text into pieces and
  ``vocab.json`` (piece -> Marian id), as Hugging Face's MarianTokenizer; ids are txf's
  (``marian_order``). A leading language code ``>>xx<<`` is one token. ``decode`` drops PAD, EOS
  and UNK (``skip_special_tokens``), joins the pieces with ``decode_proto``'s model (default: its
  own; MarianTokenizer decodes targets with the source model when the vocabulary is shared),
  turns the remaining "\u2581" into spaces, strips both ends, and applies ``CLEAN_UP`` when
  ``clean_up`` (tokenizer_config.json's clean_up_tokenization_spaces). No Moses punctuation normalisation
  (MarianTokenizer applies it only when sacremoses is installed)."""
  kind = "marian"

  def __init__(self, model_proto: bytes, vocab: Dict[str, int], specials: Dict[str, int],
               vocab_size: int, decode_proto: Optional[bytes] = None, clean_up: bool = False):
    self.model_proto, self.vocab, self.specials = model_proto, dict(vocab), dict(specials)
    self.decode_proto, self.clean_up = decode_proto, bool(clean_up)
    self._size = int(vocab_size)
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self._decoder = (self._sp if decode_proto is None
                     else spm.SentencePieceProcessor(model_proto=decode_proto))
    self.order = marian_order(self._size, specials["pad"], specials["eos"], specials["unk"])
    self._txf_of = np.empty(self._size, np.int64)
    self._txf_of[self.order] = np.arange(self._size)
    self._piece_of = {}
    for piece, m in self.vocab.items():
      if 0 <= m < self._size:
        self._piece_of[int(self._txf_of[m])] = piece
    self._unk = int(self._txf_of[specials["unk"]])

  @property
  def vocab_size(self) -> int:
    return self._size

  def encode(self, text: str) -> List[int]:
    """text -> txf ids: the SentencePiece pieces looked up in vocab.json (missing: UNK)."""
    txf_of, vocab = self._txf_of, self.vocab
    code = []
    if text.startswith(">>") and text.find("<<") != -1:  # a language code: one token
      end = text.find("<<") + 2
      code, text = [text[:end]], text[end:]
    return [int(txf_of[vocab[p]]) if p in vocab else self._unk
            for p in code + self._sp.encode(text, out_type=str)]

  def decode(self, ids: Sequence[int]) -> str:
    pieces = [self._piece_of[int(i)] for i in ids
              if int(i) not in (PAD_ID, EOS_ID, UNK_ID) and int(i) in self._piece_of]
    text = self._decoder.decode_pieces(pieces).replace("\u2581", " ").strip()
    return clean_up_spaces(text) if self.clean_up else text

  def to_json(self, directory: str, prefix: str) -> Dict[str, Any]:
    name = f"{prefix}.spm"
    with open(os.path.join(directory, name), "wb") as f:
      f.write(self.model_proto)
    extra = {}
    if self.decode_proto is not None:
      extra["decode_model_file"] = f"{prefix}.decode.spm"
      with open(os.path.join(directory, extra["decode_model_file"]), "wb") as f:
        f.write(self.decode_proto)
    with open(os.path.join(directory, "vocab.json"), "w") as f:
      json.dump(self.vocab, f, ensure_ascii=False, indent=1)
    return {"kind": self.kind, "model_file": name, "vocab_file": "vocab.json",
            "specials": self.specials, "vocab_size": self.vocab_size,
            "clean_up_tokenization_spaces": self.clean_up, **extra}


def special_order(vocab_size: int, specials: Dict[int, int]) -> np.ndarray:
  """The model id of every txf id: int [V], ``order[txf_id] = model_id``, where ``specials`` maps
  txf ids to the model's ids ({0: pad, 1: cls, 2: sep, 3: unk} for BERT) and the other model ids
  fill the remaining txf ids in increasing order."""
  ids = list(specials.values())
  if len(set(ids)) != len(ids) or not all(0 <= m < vocab_size for m in ids):
    raise DataError(f"special ids {specials} must be distinct ids below the vocabulary size "
                    f"{vocab_size}")
  rest = iter(m for m in range(vocab_size) if m not in ids)
  return np.asarray([specials[t] if t in specials else next(rest) for t in range(vocab_size)],
                    np.int64)


class WordPieceTokenizer(Tokenizer):
  """BERT's WordPiece tokenizer: a Hugging Face pipeline (tokenizer.json: normalizer,
  pre-tokenizer, WordPiece model, run by txf.data.tokjson) whose ids are permuted to txf's by
  ``order`` ([PAD] 0, [CLS] = BOS 1, [SEP] = EOS 2, [UNK] 3, the rest in BERT's order).
  ``encode`` starts every text with [CLS] (BOS) and the task appends EOS ([SEP]): the input is
  BERT's [CLS] text [SEP].
  ``decode`` drops the specials and joins the pieces with the pipeline's decoder (and Hugging
  Face's clean-up of spaces when ``clean_up``)."""
  kind = "wordpiece"

  def __init__(self, pipeline_json: str, specials: Dict[str, int], vocab_size: int,
               clean_up: bool = False):
    self.pipeline_json, self.specials, self.clean_up = pipeline_json, dict(specials), bool(clean_up)
    self._tok = TokenizerJson(pipeline_json)
    self._size = int(vocab_size)
    self.order = special_order(self._size, {PAD_ID: specials["pad"], BOS_ID: specials["cls"],
                                            EOS_ID: specials["sep"], UNK_ID: specials["unk"]})
    self._txf_of = np.empty(self._size, np.int64)
    self._txf_of[self.order] = np.arange(self._size)
    self._special_txf = {int(self._txf_of[m]) for m in self.specials.values()}

  @property
  def vocab_size(self) -> int:
    return self._size

  def encode(self, text: str) -> List[int]:
    ids = self._tok.encode(text)
    return [BOS_ID] + [int(self._txf_of[i]) for i in ids]

  def decode(self, ids: Sequence[int]) -> str:
    keep = [int(self.order[int(i)]) for i in ids
            if 0 <= int(i) < self._size and int(i) not in self._special_txf]
    text = self._tok.decode(keep, skip_special_tokens=True)
    return clean_up_spaces(text) if self.clean_up else text

  def to_json(self, directory: str, prefix: str) -> Dict[str, Any]:
    name = f"{prefix}.wordpiece.json"
    with open(os.path.join(directory, name), "w") as f:
      f.write(self.pipeline_json)
    return {"kind": self.kind, "model_file": name, "specials": self.specials,
            "vocab_size": self.vocab_size, "clean_up_tokenization_spaces": self.clean_up}


class T5Tokenizer(MarianTokenizer):
  """A T5 tokenizer (txf.hf.t5): one SentencePiece model with ``vocab`` its pieces at
  their ids plus the sentinels ``<extra_id_N>`` above them, ids txf's as for Marian. The sentinels
  are special tokens, as in Hugging Face's T5Tokenizer: written in the text each is one id (the
  text around it encoded on its own, surrounding spaces dropped), and ``decode`` drops them with
  PAD, EOS and UNK (``skip_special_tokens``)."""
  kind = "t5"
  SENTINEL = re.compile(r"(<extra_id_\d+>)")

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._sentinels = {int(self._txf_of[m]) for p, m in self.vocab.items()
                       if self.SENTINEL.fullmatch(p) and 0 <= m < self._size}

  def encode(self, text: str) -> List[int]:
    """text -> txf ids: each ``<extra_id_N>`` one id, the text between encoded by SentencePiece."""
    ids: List[int] = []
    for part in self.SENTINEL.split(text):
      if self.SENTINEL.fullmatch(part) and part in self.vocab:
        ids.append(int(self._txf_of[self.vocab[part]]))
      elif part.strip():
        ids += [int(self._txf_of[self.vocab[p]]) if p in self.vocab else self._unk
                for p in self._sp.encode(part.strip(), out_type=str)]
    return ids

  def decode(self, ids: Sequence[int]) -> str:
    return super().decode([i for i in ids if int(i) not in self._sentinels])


def train_sentencepiece(sentences: Iterable[str], vocab_size: int, model_type: str = "unigram",
                        num_threads: int = 1, character_coverage: float = 0.9999,
                        user_symbols: Sequence[str] = ()) -> SentencePieceTokenizer:
  """Train a SentencePiece model in memory on ``sentences`` (all are used: sample them beforehand).

  Deterministic for the same sentences, settings and ``num_threads``. ``user_symbols``: pieces
  that are always one token wherever they occur in a text (``txf.data.vocab.MASK_PIECE``);
  sentencepiece gives them the ids right after the four specials (none: the model is as without
  the argument).
  """
  extra = {"user_defined_symbols": list(user_symbols)} if user_symbols else {}
  if model_type not in ("unigram", "bpe", "char", "word"):
    raise DataError(f"data.spm_model_type={model_type!r} is not one of unigram, bpe, char, word")
  if vocab_size < 256 + NUM_SPECIALS + 8:
    raise DataError(f"data.vocab_size={vocab_size} is too small for sentencepiece with byte fallback "
                    f"(256 byte pieces + 4 specials): use at least 300, or data.tokenizer='char'")
  proto = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=proto, vocab_size=vocab_size,
        model_type=model_type, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        pad_piece="<pad>", bos_piece="<s>", eos_piece="</s>", unk_piece="<unk>",
        byte_fallback=True, hard_vocab_limit=False, character_coverage=character_coverage,
        num_threads=num_threads, input_sentence_size=0, shuffle_input_sentence=False,
        minloglevel=2, **extra)
  except RuntimeError as e:
    raise DataError(f"sentencepiece training failed: {e}: check data.vocab_size={vocab_size} and "
                    f"data.spm_model_type={model_type!r} against the size of the training split"
                    ) from None
  return SentencePieceTokenizer(proto.getvalue())


@dataclasses.dataclass
class Codec:
  """The tokenizer(s) of a task: ``source`` and ``target`` are the same object for a joint vocabulary."""
  source: Tokenizer
  target: Tokenizer
  settings: Dict[str, Any] = dataclasses.field(default_factory=dict)  # how it was built (for checks)

  @property
  def joint(self) -> bool:
    return self.source is self.target

  def encode_source(self, text: str, max_len: int, eos: bool = True) -> np.ndarray:
    """text -> int32 [<= max_len] ids (+ EOS), truncated so that EOS stays last."""
    ids = self.source.encode(text)
    if eos:
      return truncate_keep_eos(ids + [EOS_ID], max_len) if max_len else np.asarray(ids + [EOS_ID], np.int32)
    if max_len:
      ids = ids[:max_len]
    return np.asarray(ids, np.int32)

  def decode_target(self, ids: Sequence[int]) -> str:
    """ids -> text, cut at the first EOS; PAD and BOS dropped."""
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
      ids = ids[:ids.index(EOS_ID)]
    return self.target.decode(ids)

  def save(self, directory: str) -> None:
    """Write ``tokenizer.json`` (+ model files) to ``directory`` (created if needed).

    Safe when several processes save into one shared directory at once: each writes its files
    into a temporary directory of its own (unique name), then renames them into place one by one,
    the json last; a reader sees either no tokenizer or a complete one, never a partial file.
    A bucket ``directory`` (gs://...) gets the files written in a local folder, then copied up.
    """
    if not storage.is_local(directory):
      with storage.staged_dir(directory) as local:
        self.save(local)
      return
    os.makedirs(directory, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{CODEC_FILE}.tmp-{os.getpid()}-", dir=directory)
    try:
      desc = {"specials": {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID},
              "joint": self.joint, "settings": self.settings,
              "source": self.source.to_json(tmp, "source" if not self.joint else "joint")}
      if not self.joint:
        desc["target"] = self.target.to_json(tmp, "target")
      with open(os.path.join(tmp, CODEC_FILE), "w") as f:
        json.dump(desc, f, indent=1, sort_keys=True)
      for name in sorted(os.listdir(tmp), key=lambda n: n == CODEC_FILE):  # the json last
        os.replace(os.path.join(tmp, name), os.path.join(directory, name))
    finally:
      shutil.rmtree(tmp, ignore_errors=True)


def _tokenizer_from_json(directory: str, desc: Dict[str, Any]) -> Tokenizer:
  if desc["kind"] == HFIdsTokenizer.kind:  # an import without a tokenizer (txf.data.hf_ids)
    return HFIdsTokenizer.from_json(directory, desc)
  if desc["kind"] == GPT2Tokenizer.kind:  # an imported GPT-2's byte-level BPE (txf.data.bpe)
    return GPT2Tokenizer.from_json(directory, desc)
  if desc["kind"] == JsonTokenizer.kind:  # a Hugging Face tokenizer.json (txf.data.tokjson_codec)
    return JsonTokenizer.from_json(directory, desc)
  if desc["kind"] == "char":
    return CharTokenizer(desc["chars"])
  if desc["kind"] in ("marian", "t5"):
    with open(os.path.join(directory, desc["model_file"]), "rb") as f:
      proto = f.read()
    with open(os.path.join(directory, desc["vocab_file"])) as f:
      vocab = json.load(f)
    decode_proto = None
    if desc.get("decode_model_file"):
      with open(os.path.join(directory, desc["decode_model_file"]), "rb") as f:
        decode_proto = f.read()
    kind = T5Tokenizer if desc["kind"] == "t5" else MarianTokenizer
    return kind(proto, vocab, desc["specials"], desc["vocab_size"], decode_proto,
                desc.get("clean_up_tokenization_spaces", False))
  if desc["kind"] == "wordpiece":
    with open(os.path.join(directory, desc["model_file"])) as f:
      return WordPieceTokenizer(f.read(), desc["specials"], desc["vocab_size"],
                                desc.get("clean_up_tokenization_spaces", False))
  with open(os.path.join(directory, desc["model_file"]), "rb") as f:
    return SentencePieceTokenizer(f.read())


def load_codec(directory: str) -> Optional[Codec]:
  """The codec saved in ``directory`` (local, or a bucket's copied down), or None if there is none."""
  if not storage.is_local(directory):
    if not storage.wpath(storage.join(directory, CODEC_FILE)).is_file():
      return None
    with storage.local_copy(directory) as local:  # sentencepiece reads local files
      return load_codec(local)
  path = os.path.join(directory, CODEC_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    desc = json.load(f)
  source = _tokenizer_from_json(directory, desc["source"])
  target = source if desc["joint"] else _tokenizer_from_json(directory, desc["target"])
  return Codec(source, target, desc.get("settings", {}))


def sample_evenly(n: int, cap: int) -> np.ndarray:
  """Deterministic indices of at most ``cap`` items spread evenly over ``range(n)`` (all if n <= cap)."""
  if cap <= 0 or n <= cap:
    return np.arange(n)
  return np.unique(np.linspace(0, n - 1, cap).astype(np.int64))
