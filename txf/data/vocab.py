"""What masked-LM training needs from a tokenizer: its mask token and which pieces begin a word."""

import numpy as np

from txf.data.base import UNK_ID, DataError
from txf.data.tokenizer import SentencePieceTokenizer, Tokenizer, WordPieceTokenizer

MASK_PIECE = "<mask>"   # the masked-LM token of a txf-trained sentencepiece (encoder_mlm runs only)


def mask_token_id(tok: Tokenizer) -> int:
  """The txf id of ``tok``'s mask token: ``MASK_PIECE`` of a txf-trained sentencepiece (trained
  for model.family=encoder_mlm), or an imported BERT WordPiece's [MASK]. DataError if it has none."""
  if isinstance(tok, SentencePieceTokenizer):
    i = int(tok._sp.piece_to_id(MASK_PIECE))
    if i != UNK_ID and tok._sp.id_to_piece(i) == MASK_PIECE:
      return i
  elif isinstance(tok, WordPieceTokenizer) and "mask" in tok.specials:
    return int(tok._txf_of[tok.specials["mask"]])
  raise DataError(f"the {tok.kind} tokenizer has no mask token, which masked-LM training needs: "
                  f"use data.tokenizer='sentencepiece' in a new run (txf trains it with "
                  f"{MASK_PIECE!r} for model.family='encoder_mlm'), or an imported BERT's "
                  f"WordPiece with [MASK]")


def word_start_table(tok: Tokenizer) -> np.ndarray:
  """bool [V]: whether each id begins a word (whole-word masking): a sentencepiece piece starting
  with "\u2581" (specials and user pieces too; byte pieces continue a word), a WordPiece piece not
  starting with "##" (specials too).
  DataError for a tokenizer without word pieces."""
  if isinstance(tok, SentencePieceTokenizer):
    return np.asarray([tok._sp.id_to_piece(i).startswith("\u2581") or tok._sp.is_control(i)
                       or tok._sp.is_unknown(i) or tok._sp.id_to_piece(i) == MASK_PIECE
                       for i in range(tok.vocab_size)], bool)
  if isinstance(tok, WordPieceTokenizer):
    starts = np.ones(tok.vocab_size, bool)
    for piece, i in tok._tok.token_to_id.items():
      if 0 <= i < tok.vocab_size and piece.startswith("##"):
        starts[int(tok._txf_of[i])] = False
    return starts
  raise DataError(f"pretrain.whole_word=True needs word pieces: the {tok.kind} tokenizer has none "
                  f"(use data.tokenizer='sentencepiece', or set pretrain.whole_word=False)")
