"""txf's own reader and writer of Hugging Face ``tokenizers`` files: ``tokenizer.json`` (the
pipeline) and ``tokenizer_config.json`` beside it (transformers' settings: the special tokens'
names and ``clean_up_tokenization_spaces``). No ``tokenizers``
or ``transformers`` import: the pipeline is run by txf.data.tokjson_steps,
txf.data.tokjson_models and txf.data.tokjson_decoders.

Encoding a text, as ``tokenizers`` does:
  1. the added tokens (``added_tokens``) whose ``normalized`` is false are found in the raw text,
     longest first at each position (``single_word``: only between non-word characters;
     ``lstrip`` / ``rstrip``: the whitespace beside them is theirs); each is its own id;
  2. the text between them is normalized, and the normalized added tokens are found in it;
  3. each remaining part is pre-tokenized into words, and each word becomes ids by the model;
  4. with ``add_special_tokens`` the post-processor's template adds its special ids. As in
     transformers 5, tokenizer_config.json's add_bos_token / add_eos_token do not change it
     (transformers drops them when a tokenizer.json is there): the file's template decides.
Decoding maps ids to tokens (added tokens first), drops the special ones when asked, runs the
decoder and joins; ``clean_up_tokenization_spaces`` then applies transformers' clean-up.
"""

import json
import os
from typing import Any, Dict, List, Optional, Tuple

import regex

from txf.data.base import DataError
from txf.data import tokjson_decoders, tokjson_models, tokjson_steps

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
# transformers' clean_up_tokenization (tokenizer_config.json's clean_up_tokenization_spaces)
CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def token_name(value: Any) -> Optional[str]:
  """A special token of tokenizer_config.json: a string, or an AddedToken dict ({"content": s})."""
  if isinstance(value, dict):
    value = value.get("content")
  return None if value is None else str(value)


def _is_word_char(c: str) -> bool:
  return c.isalnum() or c == "_"


class AddedTokens:
  """The added tokens of one kind (normalized or not): ``split(text)`` -> [(text, id or None)]."""

  def __init__(self, tokens: List[Dict[str, Any]], contents: List[str]):
    self.tokens = tokens
    self.by_content = {}
    for t, c in zip(tokens, contents):
      self.by_content.setdefault(c, t)
    alts = sorted(self.by_content, key=lambda c: (-len(c), c))
    self.pattern = (regex.compile("|".join(regex.escape(c) for c in alts if c))
                    if any(alts) else None)

  def split(self, text: str) -> List[Tuple[str, Optional[int]]]:
    if self.pattern is None or not text:
      return [(text, None)] if text else []
    out: List[Tuple[str, Optional[int]]] = []
    done = 0
    for m in self.pattern.finditer(text):
      start, stop = m.span()
      if start < done:
        continue
      tok = self.by_content[m.group()]
      if tok.get("single_word"):
        if (start > 0 and _is_word_char(text[start - 1])) or (
            stop < len(text) and _is_word_char(text[stop])):
          continue
      if tok.get("lstrip"):
        while start > done and text[start - 1] in tokjson_steps.WHITESPACE:
          start -= 1
      if tok.get("rstrip"):
        while stop < len(text) and text[stop] in tokjson_steps.WHITESPACE:
          stop += 1
      if start > done:
        out.append((text[done:start], None))
      out.append((text[start:stop], int(tok["id"])))
      done = stop
    if done < len(text):
      out.append((text[done:], None))
    return out


class TokenizerJson:
  """A Hugging Face tokenizer read from its files (``read``).

  Attributes: ``token_to_id`` (dict token -> id, added tokens included), ``id_to_token`` (dict
  id -> token), ``vocab_size`` (max id + 1), ``bos_id`` / ``eos_id`` / ``pad_id`` / ``unk_id``
  (tokenizer_config.json's tokens, the model's unk_token; None where absent), ``config`` (the
  tokenizer_config.json dict, {} without one), ``text`` (the tokenizer.json text as read).
  """

  def __init__(self, text: str, config: Optional[Dict[str, Any]] = None,
               where: str = TOKENIZER_FILE):
    self.text, self.config, self.where = text, dict(config or {}), where
    try:
      spec = json.loads(text)
    except json.JSONDecodeError as e:
      raise DataError(f"{where} is not valid JSON ({e}): give the tokenizer.json written by "
                      f"save_pretrained") from None
    if not isinstance(spec, dict) or "model" not in spec:
      raise DataError(f"{where} has no \"model\": it is not a Hugging Face tokenizers file")
    try:
      self._build(spec)
    except DataError as e:
      raise DataError(f"{where}: {str(e).replace('tokenizer.json: ', '')}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      raise DataError(f"{where}: malformed ({type(e).__name__}: {e}): give the tokenizer.json "
                      f"written by save_pretrained") from None

  def _build(self, spec: Dict[str, Any]) -> None:
    self.model = tokjson_models.model_from_spec(spec["model"])
    self.normalize = tokjson_steps.normalizer_from_spec(spec.get("normalizer"))
    self.pre_tokenize = tokjson_steps.pre_tokenizer_from_spec(spec.get("pre_tokenizer"))
    self._decode = tokjson_decoders.decoder_from_spec(spec.get("decoder"))
    self.post_process = tokjson_decoders.post_processor_from_spec(spec.get("post_processor"))
    added = spec.get("added_tokens") or []
    self.id_to_token: Dict[int, str] = dict(self.model.tokens)
    self.token_to_id: Dict[str, int] = dict(self.model.vocab)
    for t in added:
      self.id_to_token[int(t["id"])] = t["content"]
      self.token_to_id[t["content"]] = int(t["id"])
    self.special_ids = {int(t["id"]) for t in added if t.get("special")}
    raw = [t for t in added if not t.get("normalized", not t.get("special"))]
    norm = [t for t in added if t.get("normalized", not t.get("special"))]
    self._raw_added = AddedTokens(raw, [t["content"] for t in raw])
    self._norm_added = AddedTokens(norm, [self.normalize(t["content"]) for t in norm])
    # decode shows a normalized added token as its normalized content, as tokenizers does
    self._decode_as = {int(t["id"]): self.normalize(t["content"]) for t in norm}
    self.vocab_size = max(self.id_to_token, default=-1) + 1
    self.bos_id, self.eos_id, self.pad_id, self.unk_id = (
        self._config_id(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token"))
    if self.unk_id is None:
      unk = getattr(self.model, "unk", None)
      self.unk_id = self.token_to_id.get(unk) if unk else getattr(self.model, "unk_id", None)
    self.clean_up = bool(self.config.get("clean_up_tokenization_spaces", False))

  def _config_id(self, key: str) -> Optional[int]:
    name = token_name(self.config.get(key))
    return None if name is None else self.token_to_id.get(name)

  def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
    """text -> ids [L]; with ``add_special_tokens`` the post-processor's specials (BOS, EOS,
    [CLS] ... [SEP]) around them, as ``transformers``' ``tokenizer(text)["input_ids"]``."""
    ids: List[int] = []
    first = True
    for part, tid in self._raw_added.split(text):
      if tid is not None:
        ids.append(tid)
        first = False
        continue
      for sub, sid in self._norm_added.split(self.normalize(part)):
        if sid is not None:
          ids.append(sid)
        else:
          for word, _ in self.pre_tokenize([(sub, first)]):
            ids += self.model.tokenize(word)
        first = False
      first = False
    return self.post_process(ids) if add_special_tokens else ids

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    """ids [L] -> text: the tokens (special ones dropped with ``skip_special_tokens``, unknown ids
    dropped) through the decoder, joined; transformers' clean-up of spaces when the config asks."""
    tokens = []
    for i in ids:
      i = int(i)
      token = self._decode_as.get(i, self.id_to_token.get(i))
      if token is None or (skip_special_tokens and i in self.special_ids):
        continue
      tokens.append(token)
    text = "".join(self._decode(tokens)) if tokens else ""
    if self.clean_up:
      for a, b in CLEAN_UP:
        text = text.replace(a, b)
    return text

  def save(self, folder: str) -> None:
    """Write tokenizer.json (the text read, unchanged) and tokenizer_config.json (when there
    was one) into ``folder`` (created if needed)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, TOKENIZER_FILE), "w", encoding="utf-8") as f:
      f.write(self.text)
    if self.config:
      with open(os.path.join(folder, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(self.config, f, ensure_ascii=False, indent=2)


def read(path: str) -> TokenizerJson:
  """The tokenizer of ``path``: a folder with tokenizer.json (and tokenizer_config.json, read
  when there), or a tokenizer.json file (tokenizer_config.json beside it read when there).
  DataError (a TxfError) naming a missing or malformed file, or a component txf lacks."""
  folder, file = (path, os.path.join(path, TOKENIZER_FILE)) if os.path.isdir(path) else (
      os.path.dirname(path), path)
  if not os.path.isfile(file):
    raise DataError(f"{file} does not exist: give a folder holding the tokenizer.json written by "
                    f"save_pretrained")
  with open(file, encoding="utf-8") as f:
    text = f.read()
  config: Dict[str, Any] = {}
  config_path = os.path.join(folder, CONFIG_FILE)
  if os.path.isfile(config_path):
    try:
      with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    except json.JSONDecodeError as e:
      raise DataError(f"{config_path} is not valid JSON ({e})") from None
  return TokenizerJson(text, config, file)
