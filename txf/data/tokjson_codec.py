"""A Hugging Face tokenizer.json (txf.data.tokjson) as a txf tokenizer: ids permuted so that
txf's PAD 0 / BOS 1 / EOS 2 / UNK 3 are the checkpoint's pad, bos, eos and unk tokens.

``order[txf_id] = hf_id``. The checkpoint's special ids take txf's special ids; the other ids
fill the remaining txf ids in increasing order. A special the checkpoint lacks (T5 has no BOS,
Llama no pad) is, with ``extra_rows`` False, a regular checkpoint id moved there (Marian's and
T5's layout, txf.data.tokenizer.marian_order), or with ``extra_rows`` True a row of its own after
the checkpoint's ids (GPT-2's layout, txf.data.bpe.gpt2_order: ids >= hf_size have no token).
``JsonTokenizer`` has the interface of ``txf.data.tokenizer.Tokenizer`` and is registered there
under its kind, ``tokenizer_json``.
"""

import json
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from txf.data.base import BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataError
from txf.data import tokjson

TXF_SPECIALS = {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}


def special_order(hf_size: int, specials: Dict[str, Optional[int]], extra_rows: bool) -> np.ndarray:
  """int [V]: the checkpoint id of each txf id (see the module docstring); ``specials``: name
  (pad, bos, eos, unk) -> checkpoint id or None."""
  given = {TXF_SPECIALS[k]: int(v) for k, v in specials.items() if v is not None}
  if len(set(given.values())) != len(given) or not all(0 <= m < hf_size for m in given.values()):
    raise DataError(f"special ids {specials} must be distinct ids below the vocabulary size "
                    f"{hf_size}")
  missing = [t for t in sorted(TXF_SPECIALS.values()) if t not in given]
  if extra_rows:
    given.update({t: hf_size + k for k, t in enumerate(missing)})
  size = hf_size + (len(missing) if extra_rows else 0)
  rest = iter(m for m in range(hf_size) if m not in given.values())
  return np.asarray([given[t] if t in given else next(rest) for t in range(size)], np.int64)


class JsonTokenizer:
  """Text <-> txf ids through a ``tokjson.TokenizerJson`` of ``hf_size`` ids (the model's
  vocabulary, >= the tokenizer's), ``specials`` its pad/bos/eos/unk ids (None where absent).
  ``encode`` adds no special token (the task appends EOS); ``decode`` drops the checkpoint's pad,
  bos and eos, the rows with no token and the tokenizer's special tokens
  (``skip_special_tokens``)."""
  kind = "tokenizer_json"

  def __init__(self, tokenizer: tokjson.TokenizerJson, hf_size: int,
               specials: Dict[str, Optional[int]], extra_rows: bool = False):
    self.tokenizer, self.hf_size, self.extra_rows = tokenizer, int(hf_size), bool(extra_rows)
    if tokenizer.vocab_size > self.hf_size:
      raise DataError(f"{tokenizer.where} has {tokenizer.vocab_size} ids, more than the model's "
                      f"vocabulary of {self.hf_size}: give the tokenizer saved with this model")
    self.specials = {k: (None if v is None else int(v)) for k, v in specials.items()}
    self.order = special_order(self.hf_size, self.specials, self.extra_rows)
    self._txf_of = np.empty(len(self.order), np.int64)
    self._txf_of[self.order] = np.arange(len(self.order))
    # txf ids decode drops: the checkpoint's pad, bos, eos (a special the checkpoint lacks is a
    # row of its own, dropped as such, or a regular token, kept)
    self._dropped = {TXF_SPECIALS[k] for k in ("pad", "bos", "eos")
                     if self.specials.get(k) is not None}

  @property
  def vocab_size(self) -> int:
    return len(self.order)

  @property
  def eos(self) -> Optional[int]:
    """The checkpoint's EOS id (None when it has none)."""
    return self.specials.get("eos")

  @property
  def adds_bos(self) -> bool:
    """Whether the tokenizer's own template puts its BOS first (``tokenizer(text)`` starts with
    it, as Llama's does): ``txf generate`` then starts a prompt with the model's start token."""
    bos = self.tokenizer.bos_id
    return bos is not None and self.tokenizer.encode("a", add_special_tokens=True)[:1] == [bos]

  def save_hf(self, folder: str) -> None:
    """Write tokenizer.json and tokenizer_config.json into ``folder`` as they were read."""
    self.tokenizer.save(folder)

  def to_txf(self, hf_ids) -> List[int]:
    """checkpoint ids [L] -> txf ids [L]."""
    return self._txf_of[np.asarray(hf_ids, np.int64)].tolist()

  def encode(self, text: str) -> List[int]:
    """text -> txf ids [L] (no BOS/EOS)."""
    return self.to_txf(self.tokenizer.encode(text, add_special_tokens=False))

  def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
    return [self.encode(t) for t in texts]

  def decode(self, ids: Sequence[int]) -> str:
    """txf ids [L] -> text (pad, bos, eos and special tokens dropped)."""
    keep = [int(self.order[int(i)]) for i in ids
            if int(i) not in self._dropped and 0 <= int(i) < len(self.order)]
    return self.tokenizer.decode([i for i in keep if i < self.hf_size], skip_special_tokens=True)

  def to_json(self, directory: str, prefix: str) -> Dict[str, Any]:
    """Write ``{prefix}.tokenizer.json`` (as read) and ``{prefix}.tokenizer_config.json``."""
    files = {"tokenizer_file": f"{prefix}.{tokjson.TOKENIZER_FILE}",
             "config_file": f"{prefix}.{tokjson.CONFIG_FILE}"}
    with open(os.path.join(directory, files["tokenizer_file"]), "w", encoding="utf-8") as f:
      f.write(self.tokenizer.text)
    with open(os.path.join(directory, files["config_file"]), "w", encoding="utf-8") as f:
      json.dump(self.tokenizer.config, f, ensure_ascii=False, indent=1)
    return {"kind": self.kind, **files, "hf_vocab_size": self.hf_size, "specials": self.specials,
            "extra_rows": self.extra_rows, "vocab_size": self.vocab_size}

  @classmethod
  def from_json(cls, directory: str, desc: Dict[str, Any]) -> "JsonTokenizer":
    path = os.path.join(directory, desc["tokenizer_file"])
    with open(path, encoding="utf-8") as f:
      text = f.read()
    with open(os.path.join(directory, desc["config_file"]), encoding="utf-8") as f:
      config = json.load(f)
    return cls(tokjson.TokenizerJson(text, config, path), desc["hf_vocab_size"], desc["specials"],
               desc.get("extra_rows", False))
