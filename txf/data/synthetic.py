"""Synthetic tasks generated on the fly, deterministic by seed, no download.

``copy``, ``reverse`` and ``sort`` map a random symbol string to itself, its reverse, or its sorted
order; ``repeat`` to itself twice (x x: the second half is predictable only by looking back, what
induction heads do). ``translate`` is a small language pair of our own making whose grammar needs reordering and
agreement, so cross-attention has to learn an alignment:

  source (SVO, adjectives before the noun):  the big red dog sees a small cat quickly
  target (S ADV O V, adjectives after the noun, agreement):  lo hundo grando rosso rapide una katta pikola vede

* every target noun has a gender; articles and adjectives agree with it in gender and number
  (``lo``/``la``/``li``, ``un``/``una``/``dei``; adjective endings -o/-a/-i);
* the verb moves to the end and agrees with the *subject's* number (``vede``/``veden``);
* an optional sentence-final adverb moves to just after the subject.

Example n of a split is a pure function of (seed, split, n); about 1 in 10 sentences (by a hash
of the source text) is reserved for held-out evaluation and never appears in training.
"""

import zlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from txf.core import families
from txf.core.config import ConfigError
from txf.data.base import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, Batch, CheckpointableIterator, Example,
                           LazyBatches, RowLayout, Task, pad_batch)

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]

# (source singular, source plural, target stem, gender)
NOUNS = [("dog", "dogs", "hund", "m"), ("cat", "cats", "katt", "f"), ("bird", "birds", "vogel", "m"),
         ("horse", "horses", "kaval", "m"), ("fish", "fishes", "pesk", "m"), ("mouse", "mice", "mus", "f"),
         ("king", "kings", "reg", "m"), ("queen", "queens", "regin", "f"), ("child", "children", "kind", "m"),
         ("farmer", "farmers", "bauer", "m"), ("teacher", "teachers", "lerer", "f"),
         ("doctor", "doctors", "medik", "f")]
ADJECTIVES = [("big", "grand"), ("small", "pikol"), ("red", "ross"), ("old", "alt"), ("young", "jung"),
              ("happy", "felik"), ("tired", "stank"), ("clever", "klug")]
VERBS = [("sees", "see", "vede"), ("likes", "like", "ama"), ("follows", "follow", "segue"),
         ("hears", "hear", "ore"), ("helps", "help", "hilfe"), ("finds", "find", "trova"),
         ("calls", "call", "klama"), ("feeds", "feed", "nutre")]
ADVERBS = [("quickly", "rapide"), ("often", "spesso"), ("today", "oggi"), ("again", "ankora")]
ARTICLES = {("def", "m", "sg"): "lo", ("def", "f", "sg"): "la", ("def", "m", "pl"): "li",
            ("def", "f", "pl"): "li", ("ind", "m", "sg"): "un", ("ind", "f", "sg"): "una",
            ("ind", "m", "pl"): "dei", ("ind", "f", "pl"): "dei"}
ENDINGS = {("m", "sg"): "o", ("f", "sg"): "a", ("m", "pl"): "i", ("f", "pl"): "e"}


def _noun_phrase(rng: np.random.Generator) -> Tuple[List[str], List[str], str]:
  """(source words, target words, number) of one random noun phrase."""
  src_sg, src_pl, stem, gender = NOUNS[rng.integers(len(NOUNS))]
  number = "pl" if rng.random() < 0.35 else "sg"
  definite = "def" if rng.random() < 0.6 else "ind"
  adjs = [ADJECTIVES[i] for i in rng.choice(len(ADJECTIVES), size=rng.integers(0, 3), replace=False)]
  ending = ENDINGS[(gender, number)]
  src_det = "the" if definite == "def" else ("a" if number == "sg" else "some")
  src = [src_det] + [a[0] for a in adjs] + [src_pl if number == "pl" else src_sg]
  tgt = [ARTICLES[(definite, gender, number)], stem + ending] + [a[1] + ending for a in adjs]
  return src, tgt, number


def translation_pair(rng: np.random.Generator) -> Tuple[str, str]:
  """One (source, target) sentence pair of the toy language."""
  subj_src, subj_tgt, subj_number = _noun_phrase(rng)
  obj_src, obj_tgt, _ = _noun_phrase(rng)
  v_sg, v_pl, v_tgt = VERBS[rng.integers(len(VERBS))]
  verb_src = v_sg if subj_number == "sg" else v_pl
  verb_tgt = v_tgt if subj_number == "sg" else v_tgt + "n"
  adverb = ADVERBS[rng.integers(len(ADVERBS))] if rng.random() < 0.3 else None
  src = subj_src + [verb_src] + obj_src + ([adverb[0]] if adverb else [])
  tgt = subj_tgt + ([adverb[1]] if adverb else []) + obj_tgt + [verb_tgt]
  return " ".join(src), " ".join(tgt)


def translation_vocabulary() -> List[str]:
  """All words of both sides of the toy language (joint vocabulary, specials first)."""
  words = {"the", "a", "some"} | set(ARTICLES.values())
  for src_sg, src_pl, stem, _ in NOUNS:
    words |= {src_sg, src_pl} | {stem + e for e in ENDINGS.values()}
  for src, tgt in ADJECTIVES:
    words |= {src} | {tgt + e for e in ENDINGS.values()}
  for sg, pl, tgt in VERBS:
    words |= {sg, pl, tgt, tgt + "n"}
  for src, tgt in ADVERBS:
    words |= {src, tgt}
  return SPECIALS + sorted(words)


class WordCodec:
  """Whitespace word tokenizer over a fixed vocabulary (PAD=0, BOS=1, EOS=2, UNK=3)."""

  def __init__(self, vocab: Sequence[str]):
    self.vocab = list(vocab)
    self.index = {w: i for i, w in enumerate(self.vocab)}

  def encode(self, text: str, eos: bool = True) -> np.ndarray:
    ids = [self.index.get(w, UNK_ID) for w in text.split()]
    return np.asarray(ids + ([EOS_ID] if eos else []), np.int32)

  def decode(self, ids: Sequence[int]) -> str:
    words = []
    for i in np.asarray(ids).tolist():
      if i == EOS_ID:
        break
      if i not in (PAD_ID, BOS_ID):
        words.append(self.vocab[i] if 0 <= i < len(self.vocab) else "<unk>")
    return " ".join(words)


class _StepIterator(CheckpointableIterator):
  """Batch n is a pure function of (seed, n): the state is just the next n."""

  def __init__(self, make_batch, start: int = 0):
    self.make_batch, self.n = make_batch, start

  def __next__(self) -> Batch:
    batch = self.make_batch(self.n)
    self.n += 1
    return batch

  def get_state(self) -> Dict[str, int]:
    return {"next_index": int(self.n)}

  def set_state(self, state) -> None:
    self.n = int(state["next_index"])


class SyntheticTask(Task):
  """copy | reverse | sort | repeat | translate, for any family that predicts targets (txf.core.families): with
  source and target for one that reads ``inputs`` (encoder_decoder), the target alone for one that
  does not (decoder_lm)."""
  KINDS = ("copy", "reverse", "sort", "repeat", "translate")
  _SPLIT_KEYS = {"train": 0, "val": 1, "test": 2}

  def __init__(self, kind: str, family: str = "encoder_decoder", min_len: int = 4, max_len: int = 12,
               num_symbols: int = 16, max_input_len: int = 32, max_target_len: int = 32):
    if kind not in self.KINDS:
      raise ConfigError(f"unknown synthetic task {kind!r}; choose one of {self.KINDS}")
    record = families.get(family)
    if record.predicts != "targets":
      token = [f for f in families.names() if families.get(f).predicts == "targets"]
      raise ConfigError(f"synthetic:{kind} feeds families that predict tokens ({', '.join(token)}), "
                        f"not {family!r}")
    if not 1 <= min_len <= max_len:
      raise ConfigError(f"data.synthetic_min_len={min_len} and data.synthetic_max_len={max_len} need 1 <= min <= max")
    self.kind, self.family = kind, family
    self.with_source = "inputs" in record.inputs   # False: the target sentence alone
    self.min_len, self.max_len = min_len, max_len
    if kind == "translate":
      self.codec = WordCodec(translation_vocabulary())
    else:
      self.codec = WordCodec(SPECIALS + [f"s{i}" for i in range(num_symbols)])
    self.vocab_size = len(self.codec.vocab)
    # tokens incl. EOS (translate: 4+1+4+1 words; repeat: twice the string)
    longest = 11 if kind == "translate" else (2 if kind == "repeat" else 1) * max_len + 1
    self.max_input_len = max_input_len if self.with_source else 0
    self.max_target_len = max_target_len
    if longest > max_target_len or (self.with_source and longest > max_input_len):
      raise ConfigError(f"synthetic:{kind} makes sequences of up to {longest} tokens (with EOS) but "
                       f"data.max_input_len={max_input_len}, data.max_target_len={max_target_len}: raise them")

  # -- examples ---------------------------------------------------------------------------------
  def _pair(self, rng: np.random.Generator) -> Tuple[str, str]:
    if self.kind == "translate":
      return translation_pair(rng)
    n = rng.integers(self.min_len, self.max_len + 1)
    syms = rng.integers(0, len(self.codec.vocab) - len(SPECIALS), size=n)
    out = {"copy": syms, "reverse": syms[::-1], "sort": np.sort(syms),
           "repeat": np.concatenate([syms, syms])}[self.kind]
    return " ".join(f"s{i}" for i in syms), " ".join(f"s{i}" for i in out)

  @staticmethod
  def _held_out(source: str) -> bool:
    return zlib.crc32(source.encode()) % 10 == 0

  def pair(self, split: str, n: int) -> Tuple[str, str]:
    """Example n of a split: train never holds a held-out sentence, val/test only held-out ones."""
    key = self._SPLIT_KEYS[split]
    attempt = 0
    while True:
      rng = np.random.default_rng([self.seed, key, n, attempt])
      src, tgt = self._pair(rng)
      if self._held_out(src) == (split != "train"):
        return src, tgt
      attempt += 1

  seed = 0

  def _batch(self, split: str, start: int, count: int, batch_size: Optional[int] = None,
             indices: Optional[Sequence[int]] = None) -> Batch:
    if indices is None:
      indices = range(start, start + count)
    pairs = [self.pair(split, i) for i in indices]
    tgt = [self.codec.encode(t) for _, t in pairs]
    if not self.with_source:
      return {"targets": pad_batch(tgt, self.max_target_len, batch_size)}
    src = [self.codec.encode(s) for s, _ in pairs]
    return {"inputs": pad_batch(src, self.max_input_len, batch_size),
            "targets": pad_batch(tgt, self.max_target_len, batch_size)}

  # -- Task API ---------------------------------------------------------------------------------
  def train_iterator(self, batch_size: int, seed: int, process_index: int = 0,
                     process_count: int = 1, layout: Optional[RowLayout] = None
                     ) -> CheckpointableIterator:
    """Global batch n holds training examples n B .. n B + B - 1; this process makes only the
    rows ``layout`` gives it (the others stay PAD)."""
    layout = layout or RowLayout.block(process_index, process_count)
    if batch_size % layout.multiple:
      raise ConfigError(f"batch_size={batch_size} does not split over the {layout.multiple} batch "
                        f"shards (devices x grad_accum_steps): make it a multiple of "
                        f"{layout.multiple}")
    self.seed = seed
    rows = layout.rows(batch_size)
    if len(rows) == batch_size:   # every row: the batch as one process makes it
      return _StepIterator(lambda n: self._batch("train", n * batch_size, batch_size))

    def make(n):
      part = self._batch("train", 0, 0, None, [n * batch_size + int(r) for r in rows])
      out = {}
      for k, v in part.items():
        out[k] = np.zeros((batch_size,) + v.shape[1:], v.dtype)
        out[k][rows] = v
      return out

    return _StepIterator(make)

  def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None
                   ) -> Sequence[Batch]:
    """The split's first ``max_examples`` (default 1000) examples in batches, each made when it
    is first read."""
    self._SPLIT_KEYS[split]  # an unknown split fails here, not at the first evaluation
    total = max_examples or 1000
    starts = range(0, total, batch_size)
    return LazyBatches(len(starts), lambda i: self._batch(split, starts[i],
                                                          min(batch_size, total - starts[i]), batch_size))

  def examples(self, split: str, n: int) -> List[Example]:
    out = []
    for i in range(n):
      src, tgt = self.pair(split, i)
      if not self.with_source:
        out.append(Example(source="", reference=tgt, source_ids=np.zeros((0,), np.int32)))
      else:
        out.append(Example(source=src, reference=tgt, source_ids=self.codec.encode(src)))
    return out

  def encode_source(self, text: str) -> np.ndarray:
    return self.codec.encode(text, eos=self.with_source)

  def decode_target(self, ids: Sequence[int]) -> str:
    return self.codec.decode(ids)

  def save(self, directory: str) -> None:
    import os
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
      f.write("\n".join(self.codec.vocab) + "\n")
