"""Filling masks with a masked language model (model.family=encoder_mlm): ``txf generate`` on an
MLM run. No absl flags here, so tests and notebooks call it."""

from typing import List, Sequence, Tuple

import jax
import numpy as np

from txf.runtime import workdir as workdir_lib
from txf.data.base import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from txf.data.tokenizer import SentencePieceTokenizer, Tokenizer, load_codec
from txf.data.vocab import mask_token_id
from txf.core.errors import TxfError
from txf.inference.run import Run, Warn, log_warning
from txf.models import build_model

# (the filled text, per mask in order: its top-k (token text, probability), most likely first)
Filled = Tuple[str, List[List[Tuple[str, float]]]]


def _tokenizer(run: Run) -> Tokenizer:
  codec = getattr(run.task, "codec", None) or load_codec(
      workdir_lib.path_of(run.workdir, workdir_lib.TOKENIZER_DIR))
  if codec is None:
    raise TxfError(f"{run.workdir} has no tokenizer/: txf generate fills masks of real-text MLM "
                   f"runs (trained on text:..., or imported from a BERT with its tokenizer)")
  return codec.source


def _drop_space_before_mask(tok: Tokenizer, ids: List[int], mask_id: int) -> List[int]:
  """SentencePiece encodes "a <mask>" as "\u2581a", "\u2581", "<mask>": the lone "\u2581" is
  dropped, so the mask stands for a whole piece "\u2581word", as in training."""
  if not isinstance(tok, SentencePieceTokenizer):
    return ids
  space = tok.encode(" <mask>")[:1]
  if len(space) != 1 or space[0] == mask_id:
    return ids
  return [x for k, x in enumerate(ids)
          if not (x == space[0] and k + 1 < len(ids) and ids[k + 1] == mask_id)]


def _readable(tok: Tokenizer, order: np.ndarray, n: int) -> List[int]:
  """The first ``n`` ids of ``order`` that decode to text on their own (a byte piece of a
  multi-byte character does not: it would print as U+FFFD)."""
  out = []
  for b in order:
    text = tok.decode([int(b)])
    if text.strip() and "\ufffd" not in text:
      out.append(int(b))
      if len(out) == n:
        break
  return out or [int(order[0])]


def fill_masks(run: Run, texts: Sequence[str], top_k: int = 5, warn: Warn = log_warning
               ) -> List[Filled]:
  """Each text with every mask token (``<mask>`` of a txf-trained sentencepiece, [MASK] of an
  imported BERT) replaced by the model's most likely token, and the ``top_k`` most likely with
  their probabilities p = softmax(logits) at that position. The specials (PAD, BOS, EOS, UNK and
  the mask itself) are never proposed, nor ids that decode to no text alone (a byte piece of a
  multi-byte character). A WordPiece text is BERT's [CLS] text [SEP]; texts longer
  than the model's ``max_len`` are cut there (with a warning). One forward pass per call."""
  tok = _tokenizer(run)
  mask_id = run.model_cfg.mask_id or mask_token_id(tok)
  limit = int(getattr(run.task, "max_input_len", 0) or run.model_cfg.max_len)
  rows = []
  for i, text in enumerate(texts):
    ids = _drop_space_before_mask(tok, tok.encode(text), mask_id)
    ids += [EOS_ID] if tok.kind == "wordpiece" else []
    if len(ids) > limit:
      warn(f"text {i + 1} has {len(ids)} tokens, more than the {limit} the model was trained on: "
           f"cut to its first {limit}")
      ids = ids[:limit]
    rows.append(ids)
  inputs = np.zeros((len(rows), max([len(r) for r in rows] + [1])), np.int32)
  for i, r in enumerate(rows):
    inputs[i, :len(r)] = r
  logits = build_model(run.model_cfg, deterministic=True).apply(
      {"params": run.params}, inputs=jax.numpy.asarray(inputs))
  logits = np.asarray(logits, np.float64)
  logits[..., [PAD_ID, BOS_ID, EOS_ID, UNK_ID, mask_id]] = -np.inf
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = []
  for i, r in enumerate(rows):
    filled, tops = list(r), []
    for t in [t for t, x in enumerate(r) if x == mask_id]:
      best = _readable(tok, np.argsort(-probs[i, t], kind="stable"), max(top_k, 1))
      filled[t] = best[0]
      tops.append([(tok.decode([b]), float(probs[i, t, b])) for b in best[:top_k]])
    out.append((tok.decode(filled), tops))
  return out
