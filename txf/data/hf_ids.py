"""A stand-in tokenizer for a Hugging Face model imported without a tokenizer txf can read: text is
the model's own token ids written as decimal numbers separated by spaces ("1 15043 3186"), so a
workdir of the weights alone still serves ``txf generate`` and ``txf eval`` on ids.

Its txf ids are those of txf.data.bpe.gpt2_order (``order[txf_id] = hf_id``: the checkpoint's EOS
at txf 2, txf's PAD 0 / BOS 1 / UNK 3 rows past the Hugging Face ids, the rest in order). It also
records the checkpoint's vocabulary size and EOS, which an export needs to undo that order.
"""

from typing import Any, Dict, List, Sequence

import numpy as np

from txf.data.base import BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataError
from txf.data.bpe import gpt2_order


class HFIdsTokenizer:
  """Text of decimal Hugging Face ids <-> txf ids, for a vocabulary of ``hf_size`` ids whose EOS
  is ``eos``. ``encode("5 7")`` = the txf ids of Hugging Face ids 5 and 7; a token that is not an
  id below ``hf_size`` is UNK; ``decode`` writes the Hugging Face ids back, txf's PAD/BOS/EOS/UNK
  dropped."""
  kind = "hf_ids"
  adds_bos = False

  def __init__(self, hf_size: int, eos: int):
    self.hf_size, self.eos = int(hf_size), int(eos)
    self.order = gpt2_order(self.hf_size, self.eos)
    self._txf_of = np.empty(len(self.order), np.int64)
    self._txf_of[self.order] = np.arange(len(self.order))

  @property
  def vocab_size(self) -> int:
    return len(self.order)

  def to_txf(self, hf_ids) -> np.ndarray:
    """Hugging Face ids int [...] -> txf ids int [...]."""
    return self._txf_of[np.asarray(hf_ids, np.int64)]

  def encode(self, text: str) -> List[int]:
    out = []
    for word in text.split():
      out.append(int(self._txf_of[int(word)]) if word.isdigit() and int(word) < self.hf_size
                 else UNK_ID)
    return out

  def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
    return [self.encode(t) for t in texts]

  def decode(self, ids: Sequence[int]) -> str:
    return " ".join(str(int(self.order[int(i)])) for i in ids
                    if int(i) not in (PAD_ID, BOS_ID, EOS_ID, UNK_ID) and 0 <= int(i) < len(self.order))

  def to_json(self, directory: str, prefix: str) -> Dict[str, Any]:
    del directory, prefix
    return {"kind": self.kind, "hf_vocab_size": self.hf_size, "eos": self.eos,
            "vocab_size": self.vocab_size}

  @classmethod
  def from_json(cls, directory: str, desc: Dict[str, Any]) -> "HFIdsTokenizer":
    del directory
    if int(desc["vocab_size"]) != int(desc["hf_vocab_size"]) + 3:
      raise DataError(f"hf_ids tokenizer: vocab_size {desc['vocab_size']} != hf_vocab_size + 3")
    return cls(desc["hf_vocab_size"], desc["eos"])
