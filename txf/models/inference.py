"""Glue between a trained model and txf.decode: build the KV cache, expose a ``logits_fn``.

txf.decode knows only ``logits_fn(ids [B, 1], cache) -> (logits [B, V], cache)``; this module makes
that callback for the encoder-decoder (encoder run once, cross K/V cached) and the LM.
"""

import dataclasses
from typing import Callable, Dict, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.models import build_model
from txf.nn import Embed, TransformerConfig
from txf.nn.attention import PER_SOURCE_CACHE


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


def cast_for_decoding(cfg: TransformerConfig, params, dtype: str = "bfloat16"):
  """(cfg with compute dtype ``dtype``, params cast to ``dtype`` once): decoding with low-precision
  weights. Pass both to :func:`init_cache` and :func:`make_logits_fn`.

  The model's maths is unchanged (LayerNorm statistics and softmax stay in float32, matmuls
  accumulate in float32); only the weights and activations are rounded to ``dtype``. Casting once,
  outside the decode loop, keeps every step from re-reading the float32 weights; with bfloat16
  weights XLA:CPU can use the bf16 dot instructions where the CPU has them (AVX512-BF16).
  """
  cast = lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
  return dataclasses.replace(cfg, dtype=dtype), jax.tree_util.tree_map(cast, params)


def reorder_cache(cache, rows: jnp.ndarray):
  """Beam search's cache reorder for txf's models: out[i] = cache[rows[i]] for every per-row leaf
  [N, ...] except the per-source entries (:data:`txf.nn.attention.PER_SOURCE_CACHE`: the encoder
  memory's cross-attention keys/values and mask, equal for every beam of a source, so the gather
  would copy them for nothing). 0-d leaves (counters) are unchanged. rows: int [N].

  Pass as ``beam_search(..., reorder_cache=reorder_cache)``.
  """
  n = rows.shape[0]

  def gather(path, x):
    names = {str(getattr(p, "key", "")) for p in path}
    if x.ndim == 0 or x.shape[0] != n or names & set(PER_SOURCE_CACHE):
      return x
    return jnp.take(x, rows, axis=0)

  return jax.tree_util.tree_map_with_path(gather, cache)


def init_uncached_cache(cfg: TransformerConfig, params, batch_size: int, max_len: int,
                        inputs=None) -> Dict[str, jnp.ndarray]:
  """State of the uncached callback: {"prefix": int32 [B, max_len] zeros, "step": 0-d int32}, plus
  for the encoder-decoder {"encoded": [B, S, d_model], "valid": bool [B, S]} (encoder run once)."""
  if max_len < 1:
    raise ValueError(f"the uncached decoder needs max_len >= 1, got {max_len}")
  cache = {"prefix": jnp.zeros((batch_size, max_len), jnp.int32), "step": jnp.array(0, jnp.int32)}
  if cfg.family == "encoder_decoder":
    if inputs is None:
      raise ValueError("the encoder-decoder needs the source ids")
    model = build_model(cfg, deterministic=True)
    cache["encoded"], cache["valid"] = model.apply({"params": params}, inputs, method=model.encode)
  return cache


def _project_only(position):
  """Flax interceptor: the tied output projection h E^T applied to h[:, position] only."""
  def interceptor(next_fun, args, kwargs, context):
    if isinstance(context.module, Embed) and context.method_name == "attend":
      return next_fun(jax.lax.dynamic_slice_in_dim(args[0], position, 1, axis=1), **kwargs)
    return next_fun(*args, **kwargs)
  return interceptor


def make_uncached_logits_fn(cfg: TransformerConfig, params) -> Callable:
  """Reference callback without a KV cache: recomputes the whole prefix at every call.

  ``logits_fn(ids int [N, L], cache) -> (logits float32 [N, V], cache)`` with the cache of
  :func:`init_uncached_cache`: writes ids into cache["prefix"] at cache["step"], re-runs the full
  decoder (teacher-forced, no cache) over the whole [N, max_len] buffer and returns the logits at
  position step + L - 1 (causal attention makes them equal to those of the prefix alone). Runs in
  txf.decode's loops like the cached callback (one compiled step for all steps): the oracle that
  tests check the KV cache against, and the benchmark's uncached baseline.
  """
  model = build_model(cfg, deterministic=True)

  def logits_fn(ids, cache):
    step, length = cache["step"], ids.shape[1]
    prefix = jax.lax.dynamic_update_slice(cache["prefix"], ids.astype(jnp.int32), (0, step))
    position = step + length - 1
    if cfg.family == "encoder_decoder":
      call = lambda: model.apply({"params": params}, cache["encoded"], cache["valid"], prefix,
                                 method=model.decode)
    else:
      call = lambda: model.apply({"params": params}, prefix, method=lambda m, x: m.decoder(x))
    if cfg.tie_output:
      with nn.intercept_methods(_project_only(position)):
        logits = call()[:, 0]
    else:
      logits = jax.lax.dynamic_index_in_dim(call(), position, axis=1, keepdims=False)
    return logits, dict(cache, prefix=prefix, step=step + length)

  return logits_fn
