"""Filling sentinels with a span-corruption run (``txf generate`` of a model.family span_corruption
run): the text's ``<extra_id_N>`` become sentinel ids, the model decodes the targets greedily
(``<S_0> span_0 <S_1> span_1 ... EOS``), and each sentinel of the text is replaced by its span."""

import dataclasses
import re
from typing import List, Sequence

import numpy as np

from txf.data.base import EOS_ID, DataError
from txf.data.sentinels import SENTINEL, split_sentinels
from txf.decode.decoders import translate_ids
from txf.decode.spec import DecodingSpec
from txf.inference.run import Run


def encode_with_sentinels(run: Run, text: str) -> np.ndarray:
  """int32 [n] ids of ``text`` + EOS: each ``<extra_id_N>`` the id first_sentinel - N, the text
  between them encoded on its own (so no word-start piece is left before a sentinel)."""
  tok, first = run.task.codec.source, run.model_cfg.first_sentinel
  count = int(run.config.pretrain.num_sentinels)
  ids: List[int] = []
  for part in re.split(r"(<extra_id_\d+>)", text):
    m = SENTINEL.fullmatch(part)
    if m:
      if int(m.group(1)) >= count:
        raise DataError(f"{part} is not one of this run's {count} sentinels "
                        f"<extra_id_0>..<extra_id_{count - 1}>")
      ids.append(first - int(m.group(1)))
    elif part.strip():
      ids += tok.encode(part.strip())
  return np.asarray(ids + [EOS_ID], np.int32)


def fill_sentinels(run: Run, texts: Sequence[str], max_new_tokens: int = 64) -> List[str]:
  """Each text with every ``<extra_id_N>`` replaced by the span the model predicts for it
  (greedy decoding of at most ``max_new_tokens`` tokens, at most model.max_len); a sentinel the
  model gives no span stays as written."""
  sources = [encode_with_sentinels(run, t) for t in texts]
  limit = run.model_cfg.max_len
  for text, ids in zip(texts, sources):
    if len(ids) > limit:
      raise DataError(f"{text[:40]!r}...: {len(ids)} tokens, more than model.max_len={limit}")
  out_len = max(1, min(limit, max_new_tokens))
  # the model is an encoder_decoder's (same module, same parameters): decode it as one
  model_cfg = dataclasses.replace(run.model_cfg, family="encoder_decoder")
  rows = translate_ids(model_cfg, run.params, sources, max(len(s) for s in sources), out_len,
                       DecodingSpec(beam_size=1), batch_size=len(sources), cut=False)
  first, count = run.model_cfg.first_sentinel, int(run.config.pretrain.num_sentinels)
  decode = run.task.codec.source.decode
  filled = []
  for text, row in zip(texts, rows):
    numbers, spans = split_sentinels(row, first, count)
    found = {n: decode(s) for n, s in zip(numbers, spans)}
    filled.append(SENTINEL.sub(lambda m: found.get(int(m.group(1)), m.group(0)), text))
  return filled
