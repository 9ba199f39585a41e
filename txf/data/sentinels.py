"""T5's sentinel tokens ``<extra_id_N>`` for span corruption (txf.ops.span_corruption).

Sentinels are the top ids of the vocabulary, ``<extra_id_0>`` the highest and ``<extra_id_N>`` =
``<extra_id_0>`` - N: T5's convention, which txf's imported T5Tokenizer keeps
(txf.hf.t5), and the one ``add_sentinels`` gives a SentencePiece model txf trains.
"""

import re
from typing import List, Sequence, Tuple

from sentencepiece import sentencepiece_model_pb2

from txf.data.base import DataError
from txf.data.tokenizer import SentencePieceTokenizer, Tokenizer

SENTINEL = re.compile(r"<extra_id_(\d+)>")


def sentinel_piece(n: int) -> str:
  """The text of sentinel n: ``<extra_id_n>``."""
  return f"<extra_id_{n}>"


def add_sentinels(tok: SentencePieceTokenizer, count: int) -> SentencePieceTokenizer:
  """``tok`` with ``count`` user-defined pieces ``<extra_id_{count-1}>`` ... ``<extra_id_0>``
  appended to its model, so ``<extra_id_N>`` = V + count - 1 - N (V = ``tok.vocab_size``): each
  written in a text encodes as its one id, and the other pieces keep their ids."""
  model = sentencepiece_model_pb2.ModelProto()
  model.ParseFromString(tok.model_proto)
  taken = {p.piece for p in model.pieces}
  for n in reversed(range(count)):
    if sentinel_piece(n) in taken:
      raise DataError(f"the sentencepiece model already has a piece {sentinel_piece(n)!r}")
    piece = model.pieces.add()
    piece.piece, piece.score = sentinel_piece(n), 0.0
    piece.type = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
  return SentencePieceTokenizer(model.SerializeToString())


def first_sentinel(tok: Tokenizer, count: int) -> int:
  """The id of ``<extra_id_0>`` in ``tok``, checked: ``<extra_id_N>`` encodes as the single id
  ``<extra_id_0> - N`` for every N < ``count``. DataError naming the fix otherwise (a tokenizer
  without sentinels, too few, or numbered another way)."""
  ids = [_sentinel_id(tok, n) for n in range(count)]
  if ids[0] is None or any(i != ids[0] - n for n, i in enumerate(ids)):
    missing = next((n for n, i in enumerate(ids) if i is None or i != ids[0] - n), 0)
    raise DataError(
        f"model.family='span_corruption' needs a tokenizer with {count} sentinel tokens "
        f"<extra_id_0>..<extra_id_{count - 1}> at the top of its vocabulary (<extra_id_N> = "
        f"<extra_id_0> - N), but {sentinel_piece(missing)} is missing or numbered otherwise: "
        f"train the run's sentencepiece tokenizer with model.family='span_corruption' (it adds "
        f"pretrain.num_sentinels of them), import a T5 tokenizer, or lower pretrain.num_sentinels")
  return int(ids[0])


def _sentinel_id(tok: Tokenizer, n: int):
  """The id sentinel n encodes to (the last id: SentencePiece may put a word-start piece before a
  user-defined one), or None when it is not one piece of the vocabulary."""
  ids = tok.encode(sentinel_piece(n))
  if not ids or ids[-1] < 4 or len(ids) > 2:
    return None
  return int(ids[-1])


def split_sentinels(ids: Sequence[int], first: int, count: int) -> Tuple[List[int], List[List[int]]]:
  """Decoded targets ``<S_i> span_i ...`` -> (the sentinel numbers in order, each one's span ids);
  ids before the first sentinel are dropped, and the list ends at EOS (2)."""
  numbers, spans = [], []
  for i in ids:
    i = int(i)
    if i == 2:
      break
    if first - count < i <= first:
      numbers.append(first - i)
      spans.append([])
    elif spans:
      spans[-1].append(i)
  return numbers, spans
