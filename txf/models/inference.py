"""Glue between a trained model and txf.decode: build the KV cache, expose a ``logits_fn``.

txf.decode knows only ``logits_fn(ids [B, 1], cache) -> (logits [B, V], cache)``; this module makes
that callback for the encoder-decoder (encoder run once, cross K/V cached) and the LM.
"""

from typing import Callable, Tuple

import jax
import jax.numpy as jnp

from txf.models import build_model
from txf.nn import TransformerConfig


def init_cache(cfg: TransformerConfig, params, batch_size: int, max_len: int, inputs=None):
  """An empty decode cache for ``max_len`` target positions.

  For the encoder-decoder, ``inputs`` int [B, S] are encoded once here and the cross-attention
  keys/values of every layer are stored in the cache.
  Returns the cache pytree (self-attention buffers [B, max_len, h, d_k] zeroed, index 0).
  The cache holds ``max_len`` positions (BOS and any prompt included): callers must not feed more
  (txf.decode's loops stop at ``max_len``).
  """
  if max_len < 1:
    raise ValueError(f"the decode cache needs max_len >= 1, got {max_len}")
  if cfg.positional == "learned" and max_len > cfg.max_len:
    raise ValueError(f"decoding {max_len} positions needs a learned position table of at least that "
                     f"size, but model.max_len={cfg.max_len}: decode fewer tokens or train with a "
                     f"larger model.max_len")
  model = build_model(cfg, decode=True)
  dummy = jnp.zeros((batch_size, max_len), jnp.int32)
  if cfg.family == "encoder_decoder":
    if inputs is None:
      raise ValueError("the encoder-decoder cache needs the source ids")
    encoded, valid = model.apply({"params": params}, inputs, method=model.encode)
    _, variables = model.apply({"params": params}, encoded, valid, dummy, method=model.decode,
                               mutable=["cache"])
  elif cfg.family == "decoder_lm":
    _, variables = model.apply({"params": params}, dummy, method=model.decode_step, mutable=["cache"])
  else:
    raise ValueError(f"model family {cfg.family!r} does not decode")
  return variables["cache"]


def make_logits_fn(cfg: TransformerConfig, params) -> Callable:
  """logits_fn(ids int [B, L], cache) -> (logits float32 [B, V] at the last position, new cache)."""
  model = build_model(cfg, decode=True)

  def logits_fn(ids: jnp.ndarray, cache) -> Tuple[jnp.ndarray, dict]:
    logits, variables = model.apply({"params": params, "cache": cache}, ids,
                                    method=model.decode_step, mutable=["cache"])
    return logits[:, -1], variables["cache"]

  return logits_fn


def make_uncached_logits_fn(cfg: TransformerConfig, params, inputs=None) -> Callable:
  """Reference callback without a cache: recomputes the whole prefix every call.

  ``ids`` here is the full prefix [B, t] (BOS first); returns logits [B, V] for position t-1.
  Used to check the cache and as the baseline in the decode benchmark.
  """
  model = build_model(cfg, deterministic=True)

  def logits_fn(prefix: jnp.ndarray, _cache=None):
    if cfg.family == "encoder_decoder":
      encoded, valid = model.apply({"params": params}, inputs, method=model.encode)
      logits = model.apply({"params": params}, encoded, valid, prefix, method=model.decode)
    else:
      logits = model.apply({"params": params}, prefix, method=lambda m, x: m.decoder(x))
    return logits[:, -1], _cache

  return logits_fn
