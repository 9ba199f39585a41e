"""GPT-2's byte-level BPE tokenizer (Hugging Face ``GPT2TokenizerFast``) with txf's special ids.

The tokenization is txf's reader of Hugging Face tokenizer files (txf.data.tokjson), over the
checkpoint's tokenizer.json, or vocab.json + merges.txt under a byte-level pre-tokenizer and
decoder (the tokenizer.json ``GPT2TokenizerFast`` builds from them), so ids are Hugging Face's
exactly. GPT-2 has one special token,
``<|endoftext|>`` (its BOS = EOS = UNK), and no padding; txf keeps PAD 0 / BOS 1 / EOS 2 / UNK 3
inside, so the txf vocabulary is the Hugging Face one plus three rows (``gpt2_order``):
  txf 0 (PAD), 1 (BOS), 3 (UNK): rows of their own, no Hugging Face token (the model masks their
    logits, ``model.mask_special_logits``; an export drops them);
  txf 2 (EOS): ``<|endoftext|>``;
  txf 4, 5, ...: the other Hugging Face ids in increasing order.
``GPT2Tokenizer`` has the interface of ``txf.data.tokenizer.Tokenizer`` (kind, vocab_size, encode,
encode_batch, decode, to_json), is registered there as one, and is loaded there by its kind.
"""

import json
import os
from typing import Any, Dict, List, Sequence

import numpy as np

from txf.data import tokjson
from txf.data.base import BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataError

# rows txf adds to a GPT-2 vocabulary: ids with no Hugging Face token (txf.nn.layers.MASKED_IDS,
# whose logits an imported model masks)
EXTRA_IDS = (PAD_ID, BOS_ID, UNK_ID)
TOKENIZER_FILE = "tokenizer.json"
# Hugging Face's clean_up_tokenization_spaces, in its order (a tokenizer_config.json option; the
# Marian tokenizer of txf.data.tokenizer applies it too)
CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_spaces(text: str) -> str:
  """``text`` with Hugging Face's ``clean_up_tokenization_spaces`` applied (``CLEAN_UP``, in order)."""
  for a, b in CLEAN_UP:
    text = text.replace(a, b)
  return text


def gpt2_order(hf_size: int, eos: int) -> np.ndarray:
  """The Hugging Face id of every txf id: int [hf_size + 3], ``order[txf_id] = hf_id``; the txf-only
  rows PAD 0, BOS 1, UNK 3 get hf_size, hf_size + 1, hf_size + 2 (no Hugging Face token).
  txf 2 (EOS) = ``eos`` (<|endoftext|>); the other Hugging Face ids fill txf 4, 5, ... in order."""
  if not 0 <= eos < hf_size:
    raise DataError(f"GPT-2 eos id {eos} is not below the vocabulary size {hf_size}")
  rest = [i for i in range(hf_size) if i != eos]
  return np.asarray([hf_size, hf_size + 1, eos, hf_size + 2] + rest, np.int64)


def byte_level_bpe_json(vocab: Dict[str, int], merges: List[str], eos_token: str,
                       add_prefix_space: bool = False) -> str:
  """The tokenizer.json text of a byte-level BPE over ``vocab`` (token -> id) and ``merges``
  ("a b" lines, in rank order), ``eos_token`` a special token (the next id when the vocabulary
  lacks it): GPT2TokenizerFast's pipeline (byte-level pre-tokenizer with GPT-2's regex, byte-level
  decoder, no normalizer)."""
  eos_id = vocab.get(eos_token, max(vocab.values(), default=-1) + 1)
  byte_level = {"type": "ByteLevel", "add_prefix_space": bool(add_prefix_space),
                "trim_offsets": True, "use_regex": True}
  spec = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": int(eos_id), "content": eos_token, "single_word": False,
                            "lstrip": False, "rstrip": False, "normalized": False,
                            "special": True}],
          "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
          "decoder": {**byte_level, "add_prefix_space": True},
          "model": {"type": "BPE", "dropout": None, "unk_token": None,
                    "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                    "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                    "merges": [m.split(" ", 1) for m in merges]}}
  return json.dumps(spec, ensure_ascii=False)


def tokenizer_from_files(directory: str, eos_token: str,
                         add_prefix_space: bool = False) -> tokjson.TokenizerJson:
  """The tokenizer of a GPT-2 checkpoint directory: its tokenizer.json, else vocab.json +
  merges.txt (``byte_level_bpe_json``). DataError when neither is there or they are malformed."""
  path = os.path.join(directory, TOKENIZER_FILE)
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      return tokjson.TokenizerJson(f.read(), where=path)
  vocab_path, merges_path = (os.path.join(directory, n) for n in ("vocab.json", "merges.txt"))
  if not (os.path.isfile(vocab_path) and os.path.isfile(merges_path)):
    raise DataError(f"{directory} has no tokenizer.json and no vocab.json + merges.txt: txf imports "
                    f"GPT-2 with its byte-level BPE tokenizer files")
  try:
    with open(vocab_path, encoding="utf-8") as f:
      vocab = json.load(f)
  except json.JSONDecodeError as e:
    raise DataError(f"{vocab_path} is not valid JSON ({e})") from None
  with open(merges_path, encoding="utf-8") as f:
    merges = [line.rstrip("\r\n") for line in f]
  merges = [m for m in merges if m and not m.startswith("#version")]
  bad = next((m for m in merges if len(m.split(" ")) != 2), None)
  if bad is not None:
    raise DataError(f"{merges_path}: the line {bad!r} is not two tokens separated by one space")
  return tokjson.TokenizerJson(byte_level_bpe_json(vocab, merges, eos_token, add_prefix_space),
                               where=merges_path)


class GPT2Tokenizer:
  """Text <-> txf ids through a byte-level BPE (``serialized``: its tokenizer.json text, run by
  txf.data.tokjson) of ``hf_size`` ids whose ``<|endoftext|>`` is ``eos``; txf ids are
  ``gpt2_order``'s.
  ``decode`` drops the special ids (``skip_special_tokens``) and applies ``CLEAN_UP`` when
  ``clean_up`` (tokenizer_config.json's clean_up_tokenization_spaces)."""
  kind = "gpt2"

  def __init__(self, serialized: str, hf_size: int, eos: int, clean_up: bool = False):
    self.serialized, self.hf_size, self.eos = serialized, int(hf_size), int(eos)
    self.clean_up = bool(clean_up)
    self._tok = tokjson.TokenizerJson(serialized)
    self.order = gpt2_order(self.hf_size, self.eos)
    self._txf_of = np.empty(self.hf_size + len(EXTRA_IDS), np.int64)
    self._txf_of[self.order] = np.arange(len(self.order))

  @property
  def vocab_size(self) -> int:
    return len(self.order)

  def to_txf(self, hf_ids) -> np.ndarray:
    """Hugging Face ids int [...] -> txf ids int [...]."""
    return self._txf_of[np.asarray(hf_ids, np.int64)]

  def encode(self, text: str) -> List[int]:
    """text -> txf ids (no BOS/EOS added; an ``<|endoftext|>`` in the text is EOS)."""
    return self.to_txf(self._tok.encode(text)).tolist()

  def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
    return [self.encode(t) for t in texts]

  def decode(self, ids: Sequence[int]) -> str:
    """txf ids -> text, PAD/BOS/EOS/UNK dropped."""
    keep = [int(self.order[int(i)]) for i in ids
            if int(i) not in (PAD_ID, BOS_ID, EOS_ID, UNK_ID) and 0 <= int(i) < len(self.order)]
    text = self._tok.decode(keep, skip_special_tokens=True)
    return clean_up_spaces(text) if self.clean_up else text

  def vocab_and_merges(self):
    """(vocab.json dict token -> Hugging Face id, merges.txt lines "a b") of the BPE model."""
    model = json.loads(self.serialized)["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    vocab = dict(model["vocab"])
    for added in json.loads(self.serialized).get("added_tokens", []):
      vocab.setdefault(added["content"], added["id"])
    return vocab, merges

  def to_json(self, directory: str, prefix: str) -> Dict[str, Any]:
    name = f"{prefix}.{TOKENIZER_FILE}"
    with open(os.path.join(directory, name), "w") as f:
      f.write(self.serialized)
    return {"kind": self.kind, "tokenizer_file": name, "hf_vocab_size": self.hf_size,
            "eos": self.eos, "vocab_size": self.vocab_size,
            "clean_up_tokenization_spaces": self.clean_up}

  @classmethod
  def from_json(cls, directory: str, desc: Dict[str, Any]) -> "GPT2Tokenizer":
    with open(os.path.join(directory, desc["tokenizer_file"])) as f:
      return cls(f.read(), desc["hf_vocab_size"], desc["eos"],
                 desc.get("clean_up_tokenization_spaces", False))
