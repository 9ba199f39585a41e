"""A BERT checkpoint's WordPiece tokenizer, in and out: read from tokenizer.json, or built from
vocab.txt and tokenizer_config.json as BertTokenizer builds it; written back as tokenizer.json,
vocab.txt and tokenizer_config.json (numpy-free; the pipeline runs in txf.hf.tokenizer_json).

The special tokens are named by tokenizer_config.json (``cls_token`` ...), BERT's ``[PAD]`` ``[CLS]``
``[SEP]`` ``[UNK]`` ``[MASK]`` by default; txf.hf.bert permutes the vocabulary so that the first four
are txf's PAD BOS EOS UNK.
"""

import json
import os
from typing import Any, Dict, List, Tuple

from txf.core.errors import TxfError
from txf.data import tokenizer as tok
from txf.hf import common
from txf.hf import tokenizer_json

SPECIAL_TOKENS = {"pad": "[PAD]", "cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]", "mask": "[MASK]"}
# tokenizer_config.json's names of the special tokens
CONFIG_TOKEN_KEYS = {"pad": "pad_token", "cls": "cls_token", "sep": "sep_token",
                      "unk": "unk_token", "mask": "mask_token"}


def _token_name(value: Any, default: str) -> str:
  """A special token of tokenizer_config.json: a string or an AddedToken dict ({"content": ...})."""
  if isinstance(value, dict):
    return str(value.get("content", default))
  return default if value is None else str(value)


def pipeline_from_vocab(vocab_path: str, tconf: Dict[str, Any], names: Dict[str, str]) -> str:
  """The tokenizers JSON of BertTokenizer's pipeline over vocab.txt (one piece a line, id = line):
  BERT's normalizer (clean text, Chinese characters split, lowercase and accents as
  tokenizer_config.json says), BERT's pre-tokenizer, WordPiece (## continuations, words over 100
  characters -> [UNK]), the [CLS] A [SEP] (B [SEP]) template and the WordPiece decoder."""
  with open(vocab_path, encoding="utf-8") as f:
    pieces = [line.rstrip("\n") for line in f]
  vocab = {p: i for i, p in reversed(list(enumerate(pieces)))}
  missing = [t for t in names.values() if t not in vocab]
  if missing:
    raise TxfError(f"{vocab_path} lacks the special tokens {', '.join(missing)}: give a BERT "
                   f"vocabulary (or its tokenizer.json)")
  lower = bool(tconf.get("do_lower_case", True))
  cls, sep = names["cls"], names["sep"]
  added, next_id = [], len(pieces)
  for t in names.values():  # a special token missing from vocab.txt gets the next id
    if t not in vocab and all(a["content"] != t for a in added):
      vocab_id, next_id = next_id, next_id + 1
    else:
      vocab_id = vocab.get(t, next((a["id"] for a in added if a["content"] == t), None))
    if all(a["content"] != t for a in added):
      added.append({"id": vocab_id, "content": t, "single_word": False, "lstrip": False,
                    "rstrip": False, "normalized": False, "special": True})

  def part(kind, name, type_id):
    return {kind: {"id": name, "type_id": type_id}}
  spec = {
      "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
      "normalizer": {"type": "BertNormalizer", "clean_text": True,
                     "handle_chinese_chars": bool(tconf.get("tokenize_chinese_chars", True)),
                     "strip_accents": tconf.get("strip_accents"), "lowercase": lower},
      "pre_tokenizer": {"type": "BertPreTokenizer"},
      "post_processor": {
          "type": "TemplateProcessing",
          "single": [part("SpecialToken", cls, 0), part("Sequence", "A", 0),
                     part("SpecialToken", sep, 0)],
          "pair": [part("SpecialToken", cls, 0), part("Sequence", "A", 0),
                   part("SpecialToken", sep, 0), part("Sequence", "B", 1),
                   part("SpecialToken", sep, 1)],
          "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]} for t in (cls, sep)}},
      "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
      "model": {"type": "WordPiece", "unk_token": names["unk"], "continuing_subword_prefix": "##",
                "max_input_chars_per_word": 100,
                "vocab": dict(sorted(vocab.items(), key=lambda kv: kv[1]))}}
  return json.dumps(spec, ensure_ascii=False)


def wordpiece_codec(src: str, vocab_size: int) -> Tuple[tok.Codec, Dict[str, Any]]:
  """(the Codec of a BERT tokenizer directory, its tokenizer_config.json as a dict or {})."""
  tconf_path = os.path.join(src, "tokenizer_config.json")
  tconf = common.read_json(tconf_path) if os.path.isfile(tconf_path) else {}
  names = {k: _token_name(tconf.get(CONFIG_TOKEN_KEYS[k]), v) for k, v in SPECIAL_TOKENS.items()}
  json_path, vocab_path = os.path.join(src, "tokenizer.json"), os.path.join(src, "vocab.txt")
  if os.path.isfile(json_path):
    with open(json_path, encoding="utf-8") as f:
      pipeline = f.read()
    used = "tokenizer.json"
  elif os.path.isfile(vocab_path):
    pipeline = pipeline_from_vocab(vocab_path, tconf, names)
    used = "vocab.txt"
  else:
    raise TxfError(f"{src} has no tokenizer.json or vocab.txt: txf imports BERT models with their "
                   f"WordPiece tokenizer (save the tokenizer with save_pretrained beside the model)")
  probe = tokenizer_json.TokenizerJson(pipeline, where=os.path.join(src, used))
  ids = {k: probe.token_to_id.get(t) for k, t in names.items()}
  missing = [names[k] for k, i in ids.items() if i is None and k != "mask"]
  if missing:
    raise TxfError(f"{src}: the tokenizer has no {', '.join(missing)} token")
  if probe.vocab_size > vocab_size:
    raise TxfError(f"{src}: the tokenizer has {probe.vocab_size} "
                   f"tokens, more than the model's vocab_size={vocab_size}")
  specials = {k: int(i) for k, i in ids.items() if i is not None}
  clean_up = bool(tconf.get("clean_up_tokenization_spaces", False))
  wordpiece = tok.WordPieceTokenizer(pipeline, specials, vocab_size, clean_up=clean_up)
  return tok.Codec(wordpiece, wordpiece, {"tokenizer": "wordpiece", "tokenizer_file": used}), tconf


def vocab_and_tokenizer_config(wordpiece: tok.WordPieceTokenizer,
                               max_len: int) -> Tuple[List[str], Dict[str, Any]]:
  """(vocab.txt's pieces in id order, tokenizer_config.json) of a WordPiece tokenizer: its special
  tokens by their config names, its normalizer's lowercasing, accents and Chinese-character
  settings, and ``model_max_length`` = ``max_len``."""
  pipeline = tokenizer_json.TokenizerJson(wordpiece.pipeline_json)
  pieces = [piece for piece, _ in sorted(pipeline.token_to_id.items(), key=lambda kv: kv[1])]
  names = {k: pipeline.id_to_token[i] for k, i in wordpiece.specials.items()}
  tconf = {"tokenizer_class": "BertTokenizer", "model_max_length": max_len,
           "clean_up_tokenization_spaces": wordpiece.clean_up,
           **{CONFIG_TOKEN_KEYS[k]: t for k, t in names.items()}}
  normalizer = json.loads(wordpiece.pipeline_json).get("normalizer") or {}
  if normalizer.get("type") == "BertNormalizer":
    tconf.update(do_lower_case=bool(normalizer.get("lowercase", True)),
                 strip_accents=normalizer.get("strip_accents"),
                 tokenize_chinese_chars=bool(normalizer.get("handle_chinese_chars", True)))
  return pieces, tconf
