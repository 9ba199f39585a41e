"""The compiled decoders of a trained model: translation ids (greedy or beam) and samples from a
language model.

Each joins a model (txf.decode.adapter: the KV cache and ``logits_fn``) with a model-agnostic
algorithm (greedy, beam, sampling) under one jit per (model config, batch size, lengths, settings),
so repeated calls (every in-loop evaluation, every ``txf translate`` batch) never recompile.
"""

import functools
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from txf.data.base import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Task, pad_batch
from txf.decode.adapter import (cast_for_decoding, expand_cache, init_cache, make_logits_fn,
                                reorder_cache)
from txf.decode.beam import beam_search
from txf.decode.greedy import greedy_decode
from txf.decode.sampling import sample
from txf.decode.spec import DecodingSpec
from txf.nn import TransformerConfig


def decoding_model(model_cfg: TransformerConfig, params, spec: DecodingSpec):
  """(model_cfg, params) to decode with, inside the compiled call: as given, or with
  ``spec.weights_dtype`` the weights cast to it and the compute dtype set to it
  (:func:`txf.decode.adapter.cast_for_decoding`). The cast runs once per call, before the search
  loop; the parameters passed in keep their dtype, layout and shardings."""
  if not spec.weights_dtype:
    return model_cfg, params
  return cast_for_decoding(model_cfg, params, spec.weights_dtype)


def _compiled_decoder(model_cfg: TransformerConfig, batch_size: int, max_len: int,
                      spec: DecodingSpec, wrap: Callable = jax.jit):
  """:func:`_compiled_search` for ``spec``'s search settings (``DecodingSpec.search_settings``):
  specs that differ only in how batches are shaped, or in sampling, share one program."""
  return _compiled_search(model_cfg, batch_size, max_len, spec.search_settings(), wrap)


@functools.lru_cache(maxsize=64)
def _compiled_search(model_cfg: TransformerConfig, batch_size: int, max_len: int,
                     spec: DecodingSpec, wrap: Callable = jax.jit):
  """``wrap(run)``, by default jit'd, of run(params, inputs [B, S]) -> ids [B, max_len] (best beam
  when ``spec.beam_size`` > 1); a runner's ``rows_fn`` as ``wrap`` decodes on all its devices.
  ``run`` takes its row count from ``inputs`` (under pmap each device sees batch_size / devices
  rows). Decoders start from ``model_cfg.decoder_start_id``; beam search scores and stops as
  ``spec`` says (txf.decode.beam); ``spec.banned_ids`` (and PAD when ``model_cfg.forbid_pad``)
  are never generated; ``spec.weights_dtype`` sets the weights' dtype (:func:`decoding_model`)."""
  never = tuple(sorted(set(spec.banned_ids) | ({PAD_ID} if model_cfg.forbid_pad else set())))
  search = SEARCHES[spec.strategy]

  def run(params, inputs):
    rows = inputs.shape[0]
    cfg, params = decoding_model(model_cfg, params, spec)
    cache = init_cache(cfg, params, rows, max_len, inputs)
    return search(make_logits_fn(cfg, params), cache, rows, max_len, spec,
                  bos_id=model_cfg.decoder_start_id, never_ids=never)

  return wrap(run)


def greedy_search(logits_fn: Callable, cache, rows: int, max_len: int, spec: DecodingSpec, *,
                  bos_id: int, never_ids: Tuple[int, ...]):
  """SEARCHES["greedy"]: ids [rows, max_len], the most likely token at each step."""
  del spec
  return greedy_decode(logits_fn, cache, rows, max_len, bos_id=bos_id, never_ids=never_ids)


def best_beam(logits_fn: Callable, cache, rows: int, max_len: int, spec: DecodingSpec, *,
              bos_id: int, never_ids: Tuple[int, ...]):
  """SEARCHES["beam"]: ids [rows, max_len], the best of ``spec.beam_size`` beams (scored and
  stopped as ``spec`` says, txf.decode.beam)."""
  ids, _ = beam_search(logits_fn, cache, rows, spec.beam_size, max_len, alpha=spec.alpha,
                       bos_id=bos_id, length_penalty=spec.length_penalty,
                       early_stopping=spec.early_stopping, never_ids=never_ids,
                       expand_cache=expand_cache, reorder_cache=reorder_cache)
  return ids[:, 0]


# The translation searches, by ``DecodingSpec.strategy``: each is
# ``search(logits_fn, cache, rows, max_len, spec, *, bos_id, never_ids) -> ids [rows, max_len]``
# (``logits_fn`` and ``cache`` as txf.decode.greedy's), traced inside the compiled decoder. A new
# search is one entry (``SEARCHES[name] = fn``) and a spec whose ``strategy`` is ``name``.
SEARCHES: Dict[str, Callable] = {"greedy": greedy_search, "beam": best_beam}


def decode_buffer_len(model_cfg: TransformerConfig, task: Task, max_extra: int) -> int:
  """The fixed decode length per batch: min(model.max_len, data.max_input_len + max_extra), >= 1."""
  return max(1, min(model_cfg.max_len, task.max_input_len + max_extra))


def batch_shape(lengths: Sequence[int], input_len: int, max_len: int, max_extra: int,
                bucket: int) -> Tuple[int, int]:
  """(source length, decode buffer) of one translation batch whose sources have ``lengths``.

  bucket > 0: S = min(input_len, ceil(max(lengths) / bucket) * bucket) and buffer
  min(max_len, S + max_extra), so every row's cut (its length + max_extra) fits the buffer;
  bucket 0: (input_len, max_len), one shape for every batch.
  """
  if bucket <= 0:
    return input_len, max_len
  longest = max(max(lengths, default=1), 1)
  source_len = min(input_len, -(-longest // bucket) * bucket)
  return source_len, max(1, min(max_len, source_len + max_extra))


def translate_ids(model_cfg: TransformerConfig, params, sources: Sequence[np.ndarray], input_len: int,
                  max_len: int, spec: DecodingSpec = DecodingSpec(), batch_size: int = 64,
                  wrap: Callable = jax.jit, progress: Optional[Callable[[int], None]] = None,
                  cut: bool = True) -> List[np.ndarray]:
  """Decode source id rows (each ending with EOS) -> generated id rows (EOS kept, padding dropped),
  in the order of ``sources``.

  Output length is at most ``max_len``, and with ``cut`` at most each row's own source length
  (EOS counted) + ``spec.max_extra``. The search is ``spec``'s (greedy or beam, its length
  penalty and stopping). Batches of ``batch_size`` rows: with ``cut`` and ``spec.length_bucket``
  > 0 the sources are taken longest first and each batch has the shape of :func:`batch_shape`
  (its longest source rounded up to the bucket, a buffer that holds every row's cut), so a batch
  of short sentences neither carries nor attends over the longest one's positions and the loop
  ends when its own rows are done; one compile per shape. Otherwise every batch is
  [batch_size, input_len] in the given order, decoded into ``max_len`` (one compile).
  ``wrap`` compiles the decoder (see ``_compiled_decoder``); ``progress(rows_done)`` is called
  after each batch.
  """
  bucket = spec.length_bucket if cut else 0
  order = list(range(len(sources)))
  if bucket > 0:
    order.sort(key=lambda i: -len(sources[i]))  # stable: equal lengths keep their order
  out: List[Optional[np.ndarray]] = [None] * len(sources)
  for s in range(0, len(order), batch_size):
    rows = order[s:s + batch_size]
    chunk = [sources[i] for i in rows]
    source_len, buffer_len = batch_shape([len(c) for c in chunk], input_len, max_len,
                                         spec.max_extra, bucket)
    fn = _compiled_decoder(model_cfg, batch_size, buffer_len, spec, wrap)
    ids = np.asarray(fn(params, jnp.asarray(pad_batch(chunk, source_len, batch_size))))
    for i, row, source in zip(rows, ids[:len(chunk)], chunk):
      if cut:
        row = row[:len(source) + spec.max_extra]
      end = np.nonzero(row == EOS_ID)[0]
      out[i] = row[: end[0] + 1] if len(end) else row
    if progress is not None:
      progress(s + len(chunk))
  return out


def translate_texts(model_cfg: TransformerConfig, params, task: Task, sources: Sequence[np.ndarray],
                    spec: DecodingSpec = DecodingSpec(), batch_size: int = 64,
                    wrap: Callable = jax.jit,
                    progress: Optional[Callable[[int], None]] = None) -> List[str]:
  """Detokenized translations of source id rows, searched as ``spec`` says (each at most its
  source length + ``spec.max_extra`` tokens); ``progress(rows_done)`` is called after each batch."""
  ids = translate_ids(model_cfg, params, sources, task.max_input_len,
                      decode_buffer_len(model_cfg, task, spec.max_extra), spec, batch_size,
                      wrap=wrap, progress=progress)
  return [task.decode_target(i) for i in ids]


NEVER_SAMPLED = (PAD_ID, BOS_ID, UNK_ID)  # no text: padding, a start, an unknown character (U+FFFD)


def text_logits_fn(logits_fn: Callable) -> Callable:
  """``logits_fn`` with the logits of the ids that are no text (NEVER_SAMPLED) at -inf, so a sample
  holds only real tokens and EOS: logits float32 [B, V] -> the same with those columns masked."""
  banned = jnp.asarray(NEVER_SAMPLED)

  def masked(ids, cache):
    logits, cache = logits_fn(ids, cache)
    return logits.at[:, banned].set(-jnp.inf), cache

  return masked


@functools.lru_cache(maxsize=8)
def compiled_sampler(model_cfg: TransformerConfig, num_samples: int, prompt_len: int,
                     max_new_tokens: int, spec: DecodingSpec):
  """jit'd (params, prompts int [num_samples, prompt_len], rng) -> int [num_samples, max_new_tokens],
  drawn with ``spec``'s temperature, top_k and top_p."""

  def run_sampler(params, prompts, rng):
    cfg, params = decoding_model(model_cfg, params, spec)
    cache = init_cache(cfg, params, num_samples, prompt_len + max_new_tokens)
    return sample(text_logits_fn(make_logits_fn(cfg, params)), cache, prompts, rng,
                  max_new_tokens, temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p,
                  bos_id=model_cfg.decoder_start_id)

  return jax.jit(run_sampler)


@functools.lru_cache(maxsize=8)
def greedy_continuation(model_cfg: TransformerConfig, prompt_len: int, max_new_tokens: int):
  """fn(params, prompts int [b, prompt_len]) -> int [b, max_new_tokens], the greedy continuations
  (uncompiled: ``DeviceParams.run`` or ``jax.jit`` compiles it; b is taken from ``prompts``)."""

  def run(params, prompts):
    cache = init_cache(model_cfg, params, prompts.shape[0], prompt_len + max_new_tokens)
    return sample(make_logits_fn(model_cfg, params), cache, prompts, jax.random.key(0),
                  max_new_tokens, temperature=0.0, top_k=0, top_p=1.0,
                  bos_id=model_cfg.decoder_start_id)

  return run


@functools.lru_cache(maxsize=8)
def compiled_ragged_sampler(model_cfg: TransformerConfig, rows: int, prompt_len: int,
                            max_new_tokens: int, spec: DecodingSpec):
  """jit'd (params, prompts int [rows, prompt_len] right-padded, lengths int [rows], keys [rows])
  -> int [rows, max_new_tokens]: row b continues ``prompts[b, :lengths[b]]`` drawing with its own
  key ``keys[b]`` (``txf.decode.sample`` with ``prompt_lengths``), so a row's tokens do not depend on
  the other rows of the batch. Draws with ``spec``'s temperature, top_k and top_p. Every row
  starts with ``model.decoder_start_id``, or with ``starts[b]`` (int [rows]) when given."""

  def run_sampler(params, prompts, lengths, keys, starts=None):
    cfg, params = decoding_model(model_cfg, params, spec)
    cache = init_cache(cfg, params, rows, prompt_len + max_new_tokens)
    return sample(text_logits_fn(make_logits_fn(cfg, params)), cache, prompts, keys,
                  max_new_tokens, temperature=spec.temperature, top_k=spec.top_k,
                  top_p=spec.top_p, prompt_lengths=lengths,
                  bos_id=model_cfg.decoder_start_id if starts is None else starts)

  return jax.jit(run_sampler)
