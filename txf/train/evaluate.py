"""Evaluation: loss/accuracy/perplexity over a split, and decoding held-out examples.

Decoding joins a model (txf.models.inference) with a model-agnostic algorithm (txf.decode) under one
jit per (model config, batch size, lengths, beam), so repeated evaluations never recompile.
"""

import functools
import math
from typing import Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from txf import decode
from txf.data.base import EOS_ID, Example, pad_batch
from txf.models.inference import init_cache, make_logits_fn
from txf.nn import TransformerConfig


def summarize(sums: Dict[str, float], family: str) -> Dict[str, float]:
  """Metric sums over batches -> loss, accuracy, and perplexity (exp of the unsmoothed NLL)."""
  count = max(float(sums["count"]), 1.0)
  out = {"loss": float(sums["loss_sum"]) / count, "accuracy": float(sums["correct"]) / count}
  nll = float(sums["nll_sum"]) / count
  out["nll"] = nll
  if family != "encoder_classifier":
    out["perplexity"] = math.exp(min(nll, 50.0))
  return out


@functools.lru_cache(maxsize=16)
def _compiled_decoder(model_cfg: TransformerConfig, batch_size: int, max_len: int, beam_size: int,
                      alpha: float):
  """jit'd (params, inputs [B, S]) -> ids [B, max_len] (best beam when beam_size > 1)."""

  def run(params, inputs):
    cache = init_cache(model_cfg, params, batch_size, max_len, inputs)
    logits_fn = make_logits_fn(model_cfg, params)
    if beam_size == 1:
      return decode.greedy_decode(logits_fn, cache, batch_size, max_len)
    ids, _ = decode.beam_search(logits_fn, cache, batch_size, beam_size, max_len, alpha=alpha)
    return ids[:, 0]

  return jax.jit(run)


def translate_ids(model_cfg: TransformerConfig, params, sources: Sequence[np.ndarray], input_len: int,
                  max_len: int, batch_size: int = 64, beam_size: int = 1, alpha: float = 0.6,
                  max_extra: Optional[int] = None) -> List[np.ndarray]:
  """Decode source id rows (each ending with EOS) -> generated id rows (EOS kept, padding dropped).

  Sources are padded to [batch_size, input_len]; output length is at most ``max_len`` (the decode
  buffer, fixed for every batch: one compile), and with ``max_extra`` at most each row's own source
  length (EOS counted) + max_extra.
  """
  fn = _compiled_decoder(model_cfg, batch_size, max_len, beam_size, float(alpha))
  out = []
  for s in range(0, len(sources), batch_size):
    chunk = list(sources[s:s + batch_size])
    ids = np.asarray(fn(params, jnp.asarray(pad_batch(chunk, input_len, batch_size))))
    for row, source in zip(ids[:len(chunk)], chunk):
      if max_extra is not None:
        row = row[:len(source) + max_extra]
      end = np.nonzero(row == EOS_ID)[0]
      out.append(row[: end[0] + 1] if len(end) else row)
  return out


def decode_examples(model_cfg, params, task, examples: Sequence[Example], max_extra: int = 50,
                    batch_size: int = 64, beam_size: int = 1, alpha: float = 0.6) -> List[str]:
  """Detokenized hypotheses for held-out translation examples (each at most source length + max_extra)."""
  max_len = min(model_cfg.max_len, task.max_input_len + max_extra)
  ids = translate_ids(model_cfg, params, [e.source_ids for e in examples], task.max_input_len,
                      max_len, batch_size, beam_size, alpha, max_extra=max_extra)
  return [task.decode_target(i) for i in ids]


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """Fraction of hypotheses equal to their reference (after whitespace normalisation)."""
  if not references:
    return 0.0
  same = sum(" ".join(h.split()) == " ".join(r.split()) for h, r in zip(hypotheses, references))
  return same / len(references)
