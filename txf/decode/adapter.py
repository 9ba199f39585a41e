"""The model adapter: what txf.decode's search algorithms need from txf's models.

The algorithms (greedy, beam, sampling) know only ``logits_fn(ids [B, L], cache) -> (logits
[B, V], cache)`` and, for beam search, how to expand and reorder a cache. This module, the only
one of txf.decode that imports the models, makes them: the KV cache (:func:`init_cache`; the
encoder-decoder's encoder runs once, its cross K/V cached), one step's logits
(:func:`make_logits_fn`), the beam layout (:func:`expand_cache`, :func:`reorder_cache`: the
layout of txf.nn.kv_cache) and an uncached reference callback.
"""

import dataclasses
from typing import Callable, Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.core import families
from txf.models import build_model
from txf.nn import Embed, TransformerConfig, kv_cache
from txf.nn.stack import unstack_layers


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
  cfg, params = _unrolled(cfg, _model_params(params))
  model = build_model(cfg, decode=True)
  dummy = jnp.zeros((batch_size, max_len), jnp.int32)
  decoding = families.get(cfg.family).decoding
  if decoding == "seq2seq":
    if inputs is None:
      raise ValueError("the encoder-decoder cache needs the source ids")
    encoded, valid = model.apply({"params": params}, inputs, method=model.encode)
    _, variables = model.apply({"params": params}, encoded, valid, dummy, method=model.decode,
                               mutable=["cache"])
  elif decoding == "lm":
    _, variables = model.apply({"params": params}, dummy, method=model.decode_step, mutable=["cache"])
  else:
    raise ValueError(f"model family {cfg.family!r} does not decode")
  return variables["cache"]


def make_logits_fn(cfg: TransformerConfig, params) -> Callable:
  """logits_fn(ids int [B, L], cache) -> (logits float32 [B, V] at the last position, new cache).

  ``params``: the model's parameters, or those of :func:`prepare_for_decoding`."""
  kernel = params.get(OUTPUT_KERNEL) if isinstance(params, dict) else None
  cfg, params = _unrolled(cfg, _model_params(params))
  model = build_model(cfg, decode=True)

  def logits_fn(ids: jnp.ndarray, cache) -> Tuple[jnp.ndarray, dict]:
    apply = lambda: model.apply({"params": params, "cache": cache}, ids,
                                method=model.decode_step, mutable=["cache"])
    if kernel is None:
      logits, variables = apply()
    else:
      with nn.intercept_methods(_output_kernel(kernel)):
        logits, variables = apply()
    return logits[:, -1], variables["cache"]

  return logits_fn


# Entry that prepare_for_decoding adds to the parameters: the tied output table transposed, E^T
# [d_model, V], so that the decode step's output projection h E^T is a plain [N, d] @ [d, V] dot.
OUTPUT_KERNEL = "decode_output_kernel"


def prepare_for_decoding(cfg: TransformerConfig, params, dtype: Optional[str] = None):
  """(cfg, params) for decoding, made once outside the decode call: the same model, laid out for it.

  - ``dtype`` (e.g. "bfloat16"): the weights cast to it once and the compute dtype set to it (as
    :func:`cast_for_decoding`); None keeps them.
  - With a tied output layer (``cfg.tie_output``), a transposed copy of the target embedding table,
    E^T [d_model, V], under :data:`OUTPUT_KERNEL`: :func:`make_logits_fn` then computes the logits
    h E^T as h @ E^T, a dot whose right operand is contracted on its first axis. XLA:CPU runs that
    layout on the bf16 dot instructions (the [V, d] table contracted on its last axis is converted
    to float32 first) and reads it as contiguous rows; the values are those of h E^T.

  Pass the result to :func:`init_cache` and :func:`make_logits_fn` (both accept plain parameters
  too). Costs one extra copy of the table in memory. Call it outside jit (under jit XLA may fold
  the transpose back into the dot).
  """
  if dtype is not None:
    cast = lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
    cfg, params = dataclasses.replace(cfg, dtype=dtype), jax.tree_util.tree_map(cast, params)
  if cfg.tie_output:
    name = "embed" if cfg.share_embeddings or families.get(cfg.family).decoding == "lm" else "target_embed"
    params = dict(params, **{OUTPUT_KERNEL: jnp.asarray(params[name]["embedding"]).T.copy()})
  return cfg, params


def cast_for_decoding(cfg: TransformerConfig, params, dtype: str = "bfloat16"):
  """(cfg with compute dtype ``dtype``, params cast to ``dtype`` once): decoding with low-precision
  weights; :func:`prepare_for_decoding` with a dtype. Pass both to :func:`init_cache` and
  :func:`make_logits_fn`.

  The model's maths is unchanged (LayerNorm statistics and softmax stay in float32, matmuls
  accumulate in float32); only the weights and activations are rounded to ``dtype``. Casting once,
  outside the decode loop, keeps every step from re-reading the float32 weights; with bfloat16
  weights XLA:CPU can use the bf16 dot instructions where the CPU has them (AVX512-BF16).
  """
  return prepare_for_decoding(cfg, params, dtype)


def _model_params(params):
  """The model's own parameters: ``params`` without the entry :func:`prepare_for_decoding` adds."""
  if isinstance(params, dict) and OUTPUT_KERNEL in params:
    return {k: v for k, v in params.items() if k != OUTPUT_KERNEL}
  return params


def _unrolled(cfg: TransformerConfig, params):
  """(cfg, params) of the unrolled stack: decoding keeps one KV cache per layer, so a scanned
  model (``scan_layers``) decodes with its parameters unstacked (txf.nn.stack.unstack_layers)."""
  if not cfg.scan_layers:
    return cfg, params
  return dataclasses.replace(cfg, scan_layers=False), unstack_layers(params)


def _output_kernel(kernel):
  """Flax interceptor: the tied output projection h E^T computed as h @ kernel, kernel = E^T."""
  def interceptor(next_fun, args, kwargs, context):
    if isinstance(context.module, Embed) and context.method_name == "attend":
      h = args[0]
      # float32 results (the decoder casts the logits to float32 anyway): XLA:CPU then runs a
      # bfloat16 h @ E^T on the bf16 dot instructions instead of converting both operands
      logits = jnp.dot(h.reshape(-1, h.shape[-1]), kernel.astype(h.dtype),
                       preferred_element_type=jnp.float32)
      return logits.reshape(*h.shape[:-1], kernel.shape[1])
    return next_fun(*args, **kwargs)
  return interceptor


def expand_cache(cache, beam: int):
  """Beam search's initial cache for txf's models: the cache of B sources laid out for B*beam beams
  (:func:`txf.nn.kv_cache.expand_for_beams`: each source's self-attention K/V [B, h, beam*T, d_k]
  (K transposed where the kernel table says) in beam slots with a ``beam_slots`` table
  [B*beam, T], the per-source entries at B rows, other per-row leaves repeated).

  Pass as ``beam_search(..., expand_cache=expand_cache, reorder_cache=reorder_cache)``; the
  decoded ids and scores are those of the generic expand-and-gather cache (tests/test_kv_cache.py).
  """
  return kv_cache.expand_for_beams(cache, beam)


def reorder_cache(cache, rows: jnp.ndarray):
  """Beam search's cache reorder for txf's models: out[i] = cache[rows[i]] for every per-row leaf
  [N, ...] but the per-source entries (:data:`txf.nn.kv_cache.PER_SOURCE`); rows int [N]
  (:func:`txf.nn.kv_cache.reorder_beams`).

  Pass as ``beam_search(..., expand_cache=expand_cache, reorder_cache=reorder_cache)`` (or with
  the default expansion, every per-row leaf repeated).
  """
  return kv_cache.reorder_beams(cache, rows)


def init_uncached_cache(cfg: TransformerConfig, params, batch_size: int, max_len: int,
                        inputs=None) -> Dict[str, jnp.ndarray]:
  """State of the uncached callback: {"prefix": int32 [B, max_len] zeros, "step": 0-d int32}, plus
  for the encoder-decoder {"encoded": [B, S, d_model], "valid": bool [B, S]} (encoder run once)."""
  if max_len < 1:
    raise ValueError(f"the uncached decoder needs max_len >= 1, got {max_len}")
  cache = {"prefix": jnp.zeros((batch_size, max_len), jnp.int32), "step": jnp.array(0, jnp.int32)}
  if families.get(cfg.family).decoding == "seq2seq":
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
  seq2seq = families.get(cfg.family).decoding == "seq2seq"

  def logits_fn(ids, cache):
    step, length = cache["step"], ids.shape[1]
    prefix = jax.lax.dynamic_update_slice(cache["prefix"], ids.astype(jnp.int32), (0, step))
    position = step + length - 1
    if seq2seq:
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
