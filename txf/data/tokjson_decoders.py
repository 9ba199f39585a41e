"""The steps of a Hugging Face ``tokenizers`` file after its model: decoders (tokens -> text,
joined afterwards) and post-processors (the ids of one text -> with the special ids of a
template, as ``add_special_tokens=True`` adds them). Each ``*_from_spec`` raises one DataError
naming a component kind txf lacks.
"""

from typing import Any, Callable, Dict, List, Optional, Tuple

from txf.data.base import DataError
from txf.data.tokjson_steps import CHAR_BYTES, chain, pattern_of


# ------------------------------------------------------------------------------------ decoders

def _byte_fallback(tokens: List[str]) -> List[str]:
  out: List[str] = []
  pending = bytearray()

  def flush():
    if pending:
      try:
        out.append(bytes(pending).decode("utf-8"))
      except UnicodeDecodeError:
        out.extend(["\ufffd"] * len(pending))
      pending.clear()
  for t in tokens:
    if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
      try:
        pending.append(int(t[3:5], 16))
        continue
      except ValueError:
        pass
    flush()
    out.append(t)
  flush()
  return out


def _strip_tokens(spec: Dict[str, Any]):
  content, start, stop = spec["content"], int(spec.get("start", 0)), int(spec.get("stop", 0))

  def one(t: str) -> str:
    for _ in range(start):
      if t.startswith(content):
        t = t[len(content):]
      else:
        break
    for _ in range(stop):
      if t.endswith(content) and t:
        t = t[:-len(content)]
      else:
        break
    return t
  return lambda tokens: [one(t) for t in tokens]


_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _cleanup(text: str) -> str:
  for a, b in _CLEANUP:
    text = text.replace(a, b)
  return text


def _wordpiece_decoder(spec: Dict[str, Any]):
  prefix, clean = spec.get("prefix", "##"), spec.get("cleanup", True)

  def run(tokens: List[str]) -> List[str]:
    out = []
    for i, t in enumerate(tokens):
      if i:
        t = t[len(prefix):] if t.startswith(prefix) else " " + t
      out.append(_cleanup(t) if clean else t)
    return out
  return run


def _metaspace_decoder(spec: Dict[str, Any]):
  rep = spec.get("replacement", "\u2581")
  scheme = spec.get("prepend_scheme")
  if scheme is None:
    scheme = "always" if spec.get("add_prefix_space", True) else "never"
  return lambda tokens: ["".join(("" if i == 0 and scheme != "never" else " ") if c == rep else c
                                 for c in t) for i, t in enumerate(tokens)]


def _byte_level_decoder(tokens: List[str]) -> List[str]:
  data = bytearray()
  for t in tokens:
    for c in t:
      data.append(CHAR_BYTES[c]) if c in CHAR_BYTES else data.extend(c.encode("utf-8"))
  return [data.decode("utf-8", "replace")]


def decoder_from_spec(spec: Optional[Dict[str, Any]]) -> Callable[[List[str]], List[str]]:
  """tokens -> decoded tokens (joined afterwards), for tokenizer.json's "decoder" (None: the
  tokens separated by spaces)."""
  if spec is None:
    return lambda tokens: [" ".join(tokens)]
  kind = spec.get("type")
  if kind == "ByteLevel":
    return _byte_level_decoder
  if kind == "Metaspace":
    return _metaspace_decoder(spec)
  if kind == "WordPiece":
    return _wordpiece_decoder(spec)
  if kind == "ByteFallback":
    return _byte_fallback
  if kind == "Fuse":
    return lambda tokens: ["".join(tokens)]
  if kind == "Strip":
    return _strip_tokens(spec)
  if kind == "Replace":
    pattern, content = pattern_of(spec["pattern"]), spec["content"]
    return lambda tokens: [pattern.sub(lambda m: content, t) for t in tokens]
  if kind == "BPEDecoder":
    suffix = spec.get("suffix", "</w>")
    return lambda tokens: [t.replace(suffix, "" if i == len(tokens) - 1 else " ")
                           for i, t in enumerate(tokens)]
  if kind == "Sequence":
    return chain([decoder_from_spec(s) for s in spec["decoders"]])
  raise DataError(f"tokenizer.json: decoder {kind!r} is not supported by txf")


# ------------------------------------------------------------------------------ post-processors

def template(single: List[Tuple[str, Any]]) -> Callable[[List[int]], List[int]]:
  """ids -> the template's ids: ``single`` is [("A", None) | ("special", [ids])]."""
  def run(ids: List[int]) -> List[int]:
    out: List[int] = []
    for what, extra in single:
      out += ids if what == "A" else extra
    return out
  return run


def post_processor_from_spec(spec: Optional[Dict[str, Any]]) -> Callable[[List[int]], List[int]]:
  """ids of one text -> with the special tokens add_special_tokens=True adds (None: unchanged)."""
  if spec is None:
    return lambda ids: ids
  kind = spec.get("type")
  if kind == "TemplateProcessing":
    specials = {k: list(v["ids"]) for k, v in (spec.get("special_tokens") or {}).items()}
    parts = []
    for item in spec["single"]:
      if "Sequence" in item:
        parts.append(("A", None))
      else:
        name = item["SpecialToken"]["id"]
        if name not in specials:
          raise DataError(f"tokenizer.json: the template names {name!r}, not in its special_tokens")
        parts.append(("special", specials[name]))
    return template(parts)
  if kind in ("RobertaProcessing", "BertProcessing"):
    cls, sep = int(spec["cls"][1]), int(spec["sep"][1])
    return lambda ids: [cls] + ids + [sep]
  if kind == "ByteLevel":
    return lambda ids: ids
  if kind == "Sequence":
    steps = [post_processor_from_spec(s) for s in spec["processors"]]

    def run(ids: List[int]) -> List[int]:
      for step in steps:
        ids = step(ids)
      return ids
    return run
  raise DataError(f"tokenizer.json: post-processor {kind!r} is not supported by txf")
