"""The text steps of a Hugging Face ``tokenizers`` file before its model: normalizers (text ->
text) and pre-tokenizers (pieces -> smaller pieces); the steps after it are
txf.data.tokjson_decoders.

A piece in pre-tokenization is ``(text, first)``: ``first`` says that it starts at the beginning
of the input (Metaspace's ``prepend_scheme="first"`` prepends only there). Splitting a text by
matches follows ``tokenizers``' behaviours: ``Removed`` drops the matches, ``Isolated`` keeps each
match alone, ``MergedWithPrevious`` / ``MergedWithNext`` glue it to its neighbour, ``Contiguous``
joins runs of matches; ``invert`` swaps matches and the rest. Regexes are Oniguruma's syntax,
run with the ``regex`` module (``\\p{L}`` and friends). Each ``*_from_spec`` raises one DataError
naming a component kind txf lacks.
"""

import unicodedata
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import regex

from txf.data.base import DataError
from txf.data.tokjson_models import CharsMap

# Unicode's White_Space characters (Rust's char::is_whitespace, which tokenizers uses)
WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                       "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
_WORD = regex.compile(r"[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+|"
                      r"[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+")
Piece = Tuple[str, bool]
# one character of a class (the loops over characters run in the regex engine)
_WS_CLASS = "".join(f"\\u{ord(c):04x}" for c in sorted(WHITESPACE))
_PUNCT_CLASS = r"!-/:-@\[-`{-~\p{P}"
WS_CHAR = regex.compile(f"[{_WS_CLASS}]")
PUNCT_CHAR = regex.compile(f"[{_PUNCT_CLASS}]")
NUMERIC_CHAR = regex.compile(r"\p{N}")
CONTROL_CHAR = regex.compile(r"[\x00\ufffd]|[^\P{C}\t\n\r]")
CJK_CHAR = regex.compile("[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f"
                         "\U0002b740-\U0002b81f\U0002b920-\U0002ceaf\uf900-\ufaff"
                         "\U0002f800-\U0002fa1f]")
NONSPACING_MARK = regex.compile(r"\p{Mn}")
MARK = regex.compile(r"\p{M}")
# BERT's pre-tokenization: whitespace removed, each punctuation character alone
BERT_PIECE = regex.compile(f"[{_PUNCT_CLASS}]|[^{_PUNCT_CLASS}{_WS_CLASS}]+")


def bytes_to_unicode() -> Dict[int, str]:
  """GPT-2's byte -> printable character table: printable Latin-1 bytes map to themselves, the
  other 68 to U+0100 + their rank."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
  table, extra = {}, 0
  for b in range(256):
    if b in keep:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table


BYTE_CHARS = bytes_to_unicode()
CHAR_BYTES = {c: b for b, c in BYTE_CHARS.items()}
_BYTE_TABLE = {b: c for b, c in BYTE_CHARS.items()}  # str.translate over the Latin-1 view of bytes


def byte_chars(text: str) -> str:
  """``text``'s UTF-8 bytes as GPT-2's printable characters (``BYTE_CHARS``)."""
  return text.encode("utf-8").decode("latin-1").translate(_BYTE_TABLE)


def pattern_of(spec: Any) -> "regex.Pattern":
  """A tokenizers pattern ({"String": s} or {"Regex": r}, or a bare string) compiled."""
  if isinstance(spec, dict) and "Regex" in spec:
    return regex.compile(spec["Regex"])
  text = spec["String"] if isinstance(spec, dict) else spec
  return regex.compile(regex.escape(text))


# ---------------------------------------------------------------------------------- normalizers

def _lower(text: str) -> str:
  """Each character lowercased on its own (no final-sigma rule, as tokenizers does)."""
  if "\u03a3" not in text:  # Python's str.lower differs from per-character only around Σ
    return text.lower()
  return "".join(c.lower() for c in text)


def _bert_normalizer(spec: Dict[str, Any]) -> Callable[[str], str]:
  clean, chinese = spec.get("clean_text", True), spec.get("handle_chinese_chars", True)
  lower = spec.get("lowercase", True)
  strip = spec.get("strip_accents")
  strip = lower if strip is None else strip

  def run(text: str) -> str:
    if clean:
      text = WS_CHAR.sub(" ", CONTROL_CHAR.sub("", text))
    if chinese:
      text = CJK_CHAR.sub(r" \g<0> ", text)
    if strip:
      text = NONSPACING_MARK.sub("", unicodedata.normalize("NFD", text))
    return _lower(text) if lower else text
  return run


def _precompiled(spec: Dict[str, Any]) -> Callable[[str], str]:
  charsmap = CharsMap(spec["precompiled_charsmap"]) if spec.get("precompiled_charsmap") else None

  def run(text: str) -> str:
    if charsmap is None:
      return text
    out = []
    for grapheme in regex.findall(r"\X", text):  # a grapheme at once, else char by char
      if len(grapheme.encode("utf-8")) < 6:
        norm = charsmap.transform(grapheme)
        if norm is not None:
          out.append(norm)
          continue
      for c in grapheme:
        norm = charsmap.transform(c)
        out.append(c if norm is None else norm)
    return "".join(out)
  return run


def _strip_text(spec: Dict[str, Any]) -> Callable[[str], str]:
  left, right = spec.get("strip_left", True), spec.get("strip_right", True)
  chars = "".join(WHITESPACE)

  def run(text: str) -> str:
    if left:
      text = text.lstrip(chars)
    return text.rstrip(chars) if right else text
  return run


def _replace(spec: Dict[str, Any]) -> Callable[[str], str]:
  pattern, content = pattern_of(spec["pattern"]), spec["content"]
  return lambda text: pattern.sub(lambda m: content, text)


def normalizer_from_spec(spec: Optional[Dict[str, Any]]) -> Callable[[str], str]:
  """text -> normalized text, for tokenizer.json's "normalizer" (None: unchanged)."""
  if spec is None:
    return lambda text: text
  kind = spec.get("type")
  if kind in ("NFC", "NFD", "NFKC", "NFKD"):
    return lambda text: unicodedata.normalize(kind, text)
  if kind == "Lowercase":
    return _lower
  if kind == "StripAccents":
    return lambda text: MARK.sub("", text)
  if kind == "BertNormalizer":
    return _bert_normalizer(spec)
  if kind == "Replace":
    return _replace(spec)
  if kind == "Prepend":
    return lambda text, p=spec["prepend"]: p + text if text else text
  if kind == "Strip":
    return _strip_text(spec)
  if kind == "Precompiled":
    return _precompiled(spec)
  if kind == "ByteLevel":
    return byte_chars
  if kind == "Nmt":
    return _nmt
  if kind == "Sequence":
    return chain([normalizer_from_spec(s) for s in spec["normalizers"]])
  raise DataError(f"tokenizer.json: normalizer {kind!r} is not supported by txf")


def _nmt(text: str) -> str:
  """SentencePiece's NMT clean-up: some control characters dropped, some spaces made ' '."""
  drop = set(range(0x01, 0x09)) | {0x0B, 0x0E, 0x0F, 0x7F, 0x8F, 0x9F} | set(range(0x10, 0x20))
  space = {0x09, 0x0A, 0x0C, 0x0D, 0x1680, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029,
           0x2581, 0xFEFF, 0xFFFD}
  return "".join(" " if ord(c) in space else c for c in text if ord(c) not in drop)


def chain(steps: Sequence[Callable[[Any], Any]]) -> Callable[[Any], Any]:
  """A tokenizer.json ``Sequence`` (of normalizers, pre-tokenizers or decoders): x -> each step in
  turn, step_n(... step_1(x))."""
  def run(x):
    for step in steps:
      x = step(x)
    return x
  return run


# ------------------------------------------------------------------------------ pre-tokenizers

def split_spans(text: str, spans: Sequence[Tuple[int, int]], behavior: str,
                invert: bool = False) -> List[str]:
  """``text`` split around the match ``spans`` (sorted, disjoint) by ``behavior``."""
  segs: List[Tuple[str, bool]] = []
  at = 0
  for s, e in spans:
    if s > at:
      segs.append((text[at:s], invert))
    if e > s:
      segs.append((text[s:e], not invert))
    at = e
  if at < len(text):
    segs.append((text[at:], invert))
  out: List[str] = []
  behavior = behavior.lower().replace("_", "")
  if behavior == "removed":
    return [t for t, m in segs if not m]
  if behavior == "isolated":
    return [t for t, _ in segs]
  if behavior == "mergedwithprevious":
    prev_match = False
    for t, m in segs:
      if m and out and not prev_match:
        out[-1] += t
      else:
        out.append(t)
      prev_match = m
    return out
  if behavior == "mergedwithnext":
    pending = ""
    for t, m in segs:
      if m:
        if pending:
          out.append(pending)
        pending = t
      else:
        out.append(pending + t)
        pending = ""
    if pending:
      out.append(pending)
    return out
  if behavior == "contiguous":
    last_match = False
    for t, m in segs:
      if m and last_match:
        out[-1] += t
      else:
        out.append(t)
      last_match = m
    return out
  raise DataError(f"tokenizer.json: split behavior {behavior!r} is not supported by txf")


def _char_spans(text: str, one_char) -> List[Tuple[int, int]]:
  """The span of each character of ``text`` that the one-character pattern matches."""
  return [m.span() for m in one_char.finditer(text)]


def _regex_spans(pattern, text: str) -> List[Tuple[int, int]]:
  return [m.span() for m in pattern.finditer(text) if m.end() > m.start()]


def _each(fn: Callable[[Piece], List[Piece]]) -> Callable[[List[Piece]], List[Piece]]:
  return lambda pieces: [q for p in pieces for q in fn(p)]


def _split_with(splitter: Callable[[str], List[str]]) -> Callable[[List[Piece]], List[Piece]]:
  """A pre-tokenizer from a text splitter; only the first part of a first piece stays first."""
  return _each(lambda p: [(t, p[1] and i == 0) for i, t in enumerate(splitter(p[0])) if t])


def _metaspace(spec: Dict[str, Any]):
  rep = spec.get("replacement", "\u2581")
  scheme = spec.get("prepend_scheme")
  if scheme is None:
    scheme = "always" if spec.get("add_prefix_space", True) else "never"
  split = spec.get("split", True)
  rep_char = regex.compile(regex.escape(rep))

  def one(p: Piece) -> List[Piece]:
    text, first = p
    text = text.replace(" ", rep)
    if not text.startswith(rep) and (scheme == "always" or (scheme == "first" and first)):
      text = rep + text
    if not split:
      return [(text, first)]
    parts = split_spans(text, _char_spans(text, rep_char), "mergedwithnext")
    return [(t, first and i == 0) for i, t in enumerate(parts) if t]
  return _each(one)


def _byte_level(spec: Dict[str, Any]):
  prefix, use_regex = spec.get("add_prefix_space", True), spec.get("use_regex", True)
  pattern = regex.compile(GPT2_PATTERN)

  def one(p: Piece) -> List[Piece]:
    text, first = p
    if prefix and not text.startswith(" "):
      text = " " + text
    parts = split_spans(text, _regex_spans(pattern, text), "isolated") if use_regex else [text]
    return [(byte_chars(t), first and i == 0)
            for i, t in enumerate(parts) if t]
  return _each(one)


def _split(spec: Dict[str, Any]):
  pattern, behavior = pattern_of(spec["pattern"]), spec.get("behavior", "Isolated")
  invert = bool(spec.get("invert", False))
  return _split_with(lambda t: split_spans(t, _regex_spans(pattern, t), behavior, invert))


def pre_tokenizer_from_spec(spec: Optional[Dict[str, Any]]) -> Callable[[List[Piece]], List[Piece]]:
  """pieces -> smaller pieces, for tokenizer.json's "pre_tokenizer" (None: unchanged)."""
  if spec is None:
    return lambda pieces: pieces
  kind = spec.get("type")
  if kind == "ByteLevel":
    return _byte_level(spec)
  if kind == "Metaspace":
    return _metaspace(spec)
  if kind == "Whitespace":
    return _split_with(lambda t: _WORD.findall(t))
  if kind == "WhitespaceSplit":
    return _split_with(lambda t: split_spans(t, _char_spans(t, WS_CHAR), "removed"))
  if kind == "BertPreTokenizer":
    return _split_with(BERT_PIECE.findall)
  if kind == "Punctuation":
    behavior = spec.get("behavior", "Isolated")
    return _split_with(lambda t: split_spans(t, _char_spans(t, PUNCT_CHAR), behavior))
  if kind == "Digits":
    behavior = "isolated" if spec.get("individual_digits", False) else "contiguous"
    return _split_with(lambda t: split_spans(t, _char_spans(t, NUMERIC_CHAR), behavior))
  if kind == "Split":
    return _split(spec)
  if kind == "Sequence":
    return chain([pre_tokenizer_from_spec(s) for s in spec["pretokenizers"]])
  raise DataError(f"tokenizer.json: pre-tokenizer {kind!r} is not supported by txf")
