"""The models of a Hugging Face ``tokenizers`` file (tokenizer.json's "model"): one pre-tokenized
word -> token ids. BPE (byte-level as GPT-2's, or SentencePiece-style with byte fallback
``<0xNN>`` as Llama 2's), Unigram (Viterbi over the pieces' log-probabilities, as T5's),
WordPiece (greedy longest match, BERT's) and WordLevel (one lookup); and the SentencePiece
``Precompiled`` normalizer's character map (a double-array trie over UTF-8 bytes).

Each model has ``tokenize(word) -> [ids]``, ``vocab`` (token -> id) and ``tokens`` (id ->
token). Written from the file format alone; ``tests/test_hf_tokenizer_json.py`` compares every
model with the ``tokenizers`` library on varied text.
"""

import base64
import struct
from typing import Any, Dict, List, Optional

from txf.data.base import DataError


def _inverse(vocab: Dict[str, int]) -> Dict[int, str]:
  return {i: t for t, i in vocab.items()}


def _byte_tokens(text: str, vocab: Dict[str, int]) -> Optional[List[int]]:
  """The ids of ``<0xNN>`` for each UTF-8 byte of ``text``; None when one is not in ``vocab``."""
  ids = [vocab.get(f"<0x{b:02X}>") for b in text.encode("utf-8")]
  return None if any(i is None for i in ids) else ids


class BPE:
  """Byte-pair encoding: a word starts as its characters (each a vocabulary token, else its
  ``<0xNN>`` bytes with ``byte_fallback``, else ``unk_token``, consecutive unknowns fused with
  ``fuse_unk``); then, repeatedly, the adjacent pair of lowest merge rank (leftmost among equal
  ranks) becomes one token, until no adjacent pair is a merge. ``ignore_merges``: a word that is
  itself a token is that token."""

  def __init__(self, spec: Dict[str, Any]):
    if spec.get("dropout"):
      raise DataError(f"tokenizer.json: BPE dropout={spec['dropout']} is not supported by txf "
                      f"(it samples; give a file without dropout)")
    self.vocab: Dict[str, int] = dict(spec["vocab"])
    self.tokens = _inverse(self.vocab)
    self.unk = spec.get("unk_token")
    self.prefix = spec.get("continuing_subword_prefix") or ""
    self.suffix = spec.get("end_of_word_suffix") or ""
    self.fuse_unk = bool(spec.get("fuse_unk", False))
    self.byte_fallback = bool(spec.get("byte_fallback", False))
    self.ignore_merges = bool(spec.get("ignore_merges", False))
    self.ranks: Dict[tuple, tuple] = {}
    for rank, merge in enumerate(spec.get("merges") or []):
      a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
      joined = a + (b[len(self.prefix):] if self.prefix and b.startswith(self.prefix) else b)
      if joined not in self.vocab:
        raise DataError(f"tokenizer.json: the BPE merge {a!r} + {b!r} gives {joined!r}, which is "
                        f"not in the vocabulary")
      self.ranks[(a, b)] = (rank, joined)
    self._cache: Dict[str, List[int]] = {}

  def _symbols(self, word: str) -> List[str]:
    """The word's starting symbols (token strings; None-free): characters, bytes or unknowns."""
    out: List[Optional[str]] = []
    unk_last = False
    n = len(word)
    for i, ch in enumerate(word):
      piece = (self.prefix if i > 0 else "") + ch + (self.suffix if i == n - 1 else "")
      if piece in self.vocab:
        out.append(piece)
        unk_last = False
        continue
      if self.byte_fallback:
        ids = _byte_tokens(ch, self.vocab)
        if ids is not None:
          out += [self.tokens[j] for j in ids]
          unk_last = False
          continue
      if self.unk is None:
        continue  # no unknown token: the character is dropped
      if not (self.fuse_unk and unk_last):
        out.append(self.unk)
      unk_last = True
    return out

  def tokenize(self, word: str) -> List[int]:
    """word -> ids."""
    hit = self._cache.get(word)
    if hit is not None:
      return hit
    if self.ignore_merges and word in self.vocab:
      ids = [self.vocab[word]]
    else:
      sym = self._symbols(word)
      ranks = self.ranks
      while len(sym) > 1:
        best, at = None, -1
        for i in range(len(sym) - 1):
          r = ranks.get((sym[i], sym[i + 1]))
          if r is not None and (best is None or r[0] < best[0]):
            best, at = r, i
        if best is None:
          break
        sym[at:at + 2] = [best[1]]
      if self.unk is not None and self.unk not in self.vocab and self.unk in sym:
        raise DataError(f"tokenizer.json: BPE unk_token {self.unk!r} is not in the vocabulary")
      ids = [self.vocab[s] for s in sym]
    if len(self._cache) < 100_000:
      self._cache[word] = ids
    return ids


class Unigram:
  """Unigram language model: the split of a word into vocabulary pieces of the highest total
  score (log-probability), found by Viterbi over character positions: best[j] = max over pieces
  w = word[i:j] of best[i] + score(w), ties kept by the first candidate (shorter pieces first,
  earlier starts first). A character no piece starts with is the unknown piece with score
  min(scores) - 10; consecutive unknowns are one token; with ``byte_fallback`` an unknown
  becomes its ``<0xNN>`` bytes."""

  UNK_PENALTY = 10.0

  def __init__(self, spec: Dict[str, Any]):
    pieces = spec["vocab"]
    self.vocab = {}
    self.scores: Dict[str, float] = {}
    for i, (piece, score) in enumerate(pieces):
      self.vocab.setdefault(piece, i)
      self.scores.setdefault(piece, float(score))
    self.tokens = {i: p for i, (p, _) in enumerate(pieces)}
    self.unk_id = spec.get("unk_id")
    self.byte_fallback = bool(spec.get("byte_fallback", False))
    self.max_len = max((len(p) for p in self.vocab), default=1)
    self.unk_score = min(self.scores.values(), default=0.0) - self.UNK_PENALTY
    self._cache: Dict[str, List[int]] = {}

  def tokenize(self, word: str) -> List[int]:
    hit = self._cache.get(word)
    if hit is not None:
      return hit
    n, scores = len(word), self.scores
    best = [None] * (n + 1)  # best[j] = (score, start, piece or None for unknown)
    best[0] = (0.0, -1, None)
    for i in range(n):
      if best[i] is None:
        continue
      base = best[i][0]
      single = False
      for j in range(i + 1, min(n, i + self.max_len) + 1):
        piece = word[i:j]
        s = scores.get(piece)
        if s is None:
          continue
        cand = base + s
        if best[j] is None or cand > best[j][0]:
          best[j] = (cand, i, piece)
        if j == i + 1:
          single = True
      if not single:
        cand = base + self.unk_score
        if best[i + 1] is None or cand > best[i + 1][0]:
          best[i + 1] = (cand, i, None)
    parts: List[Optional[str]] = []
    j = n
    while j > 0:
      _, i, piece = best[j]
      parts.append(piece if piece is not None else (None, word[i:j]))
      j = i
    parts.reverse()
    ids: List[int] = []
    unk_text = None
    for p in parts + ["\0end"]:
      if isinstance(p, tuple):
        unk_text = (unk_text or "") + p[1]
        continue
      if unk_text is not None:
        ids += self._unknown(unk_text)
        unk_text = None
      if p != "\0end":
        ids.append(self.vocab[p])
    if len(self._cache) < 100_000:
      self._cache[word] = ids
    return ids

  def _unknown(self, text: str) -> List[int]:
    if self.byte_fallback:
      ids = _byte_tokens(text, self.vocab)
      if ids is not None:
        return ids
    if self.unk_id is None:
      raise DataError(f"tokenizer.json: Unigram has no unk_id and {text!r} has no piece")
    return [int(self.unk_id)]


class WordPiece:
  """WordPiece: a word is split greedily into the longest vocabulary token at each point, pieces
  after the first carrying ``continuing_subword_prefix`` (``##``); a word with a part no token
  covers, or longer than ``max_input_chars_per_word``, is ``unk_token``."""

  def __init__(self, spec: Dict[str, Any]):
    self.vocab = dict(spec["vocab"])
    self.tokens = _inverse(self.vocab)
    self.unk = spec.get("unk_token", "[UNK]")
    self.prefix = spec.get("continuing_subword_prefix", "##")
    self.max_chars = int(spec.get("max_input_chars_per_word", 100))
    if self.unk not in self.vocab:
      raise DataError(f"tokenizer.json: WordPiece unk_token {self.unk!r} is not in the vocabulary")

  def tokenize(self, word: str) -> List[int]:
    if len(word) > self.max_chars:
      return [self.vocab[self.unk]]
    ids, start, n = [], 0, len(word)
    while start < n:
      end = n
      found = None
      while start < end:
        piece = (self.prefix if start > 0 else "") + word[start:end]
        if piece in self.vocab:
          found = self.vocab[piece]
          break
        end -= 1
      if found is None:
        return [self.vocab[self.unk]]
      ids.append(found)
      start = end
    return ids


class WordLevel:
  """WordLevel: a word is its vocabulary id, else ``unk_token``'s."""

  def __init__(self, spec: Dict[str, Any]):
    self.vocab = dict(spec["vocab"])
    self.tokens = _inverse(self.vocab)
    self.unk = spec.get("unk_token")

  def tokenize(self, word: str) -> List[int]:
    if word in self.vocab:
      return [self.vocab[word]]
    if self.unk not in self.vocab:
      raise DataError(f"tokenizer.json: WordLevel has no token for {word!r} and no unk_token")
    return [self.vocab[self.unk]]


MODELS = {"BPE": BPE, "Unigram": Unigram, "WordPiece": WordPiece, "WordLevel": WordLevel}


def model_from_spec(spec: Dict[str, Any]):
  """The model of tokenizer.json's "model" object; DataError naming a kind txf lacks."""
  kind = spec.get("type")
  if kind is None:  # files of old tokenizers versions leave the type out: guess from the fields
    kind = ("Unigram" if isinstance(spec.get("vocab"), list) else "BPE" if "merges" in spec
            else "WordPiece" if "continuing_subword_prefix" in spec else "WordLevel")
  if kind not in MODELS:
    raise DataError(f"tokenizer.json: model type {kind!r} is not supported by txf (it reads "
                    f"{', '.join(MODELS)})")
  return MODELS[kind](spec)


class CharsMap:
  """SentencePiece's precompiled normalization map (base64 in tokenizer.json): a little-endian
  uint32 trie size in bytes, a darts-clone double-array trie of that size over UTF-8 byte
  strings whose values are offsets into the rest, a pool of NUL-terminated replacements."""

  def __init__(self, blob_b64: str):
    blob = base64.b64decode(blob_b64)
    (size,) = struct.unpack_from("<I", blob, 0)
    if size % 4 or 4 + size > len(blob):
      raise DataError("tokenizer.json: the Precompiled normalizer's charsmap is malformed")
    self.units = struct.unpack_from(f"<{size // 4}I", blob, 4)
    self.pool = blob[4 + size:]

  def first_prefix_value(self, key: bytes) -> Optional[int]:
    """The value of the shortest prefix of ``key`` in the trie, or None."""
    units = self.units
    pos = 0
    unit = units[0]
    pos ^= (unit >> 10) << ((unit & (1 << 9)) >> 6)
    for c in key:
      pos ^= c
      if pos >= len(units):
        return None
      unit = units[pos]
      if (unit & ((1 << 31) | 0xFF)) != c:
        return None
      pos ^= (unit >> 10) << ((unit & (1 << 9)) >> 6)
      if (unit >> 8) & 1:
        return units[pos] & ((1 << 31) - 1)
    return None

  def transform(self, chunk: str) -> Optional[str]:
    """The replacement of ``chunk``'s shortest mapped prefix (the whole chunk is replaced), or
    None when no prefix is mapped."""
    at = self.first_prefix_value(chunk.encode("utf-8"))
    if at is None:
      return None
    end = self.pool.find(b"\0", at)
    return self.pool[at:end if end >= 0 else len(self.pool)].decode("utf-8", "replace")
