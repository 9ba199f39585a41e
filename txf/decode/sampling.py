"""Ancestral sampling with temperature, top-k and nucleus (top-p) filtering (decoder-only LM)."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from txf.decode.greedy import BOS_ID, EOS_ID, PAD_ID, LogitsFn, check_length
from txf.kernels.topk import argmax

MASKED = -1.0e30  # logit of a filtered-out token (finite: exp underflows to exactly 0)


def filter_logits(logits: jnp.ndarray, top_k: int = 0, top_p: float = 1.0) -> jnp.ndarray:
  """Keep the top-k and/or nucleus tokens of each row, set the others to a huge negative logit.

  top-k: keep the k largest logits (ties at the k-th value are all kept); k = 0 keeps all.
  top-p: sort p = softmax(logits) descending, keep token j iff the mass of the tokens ranked
  before it is < top_p (the smallest prefix whose mass reaches top_p; the top token always
  survives; tokens tied with the last kept one are kept too); top_p >= 1 keeps all.
  top-k is applied first, top-p to the renormalised remainder.

  Args:
    logits: float [N, V] (already divided by the temperature).
    top_k: static int >= 0; top_p: float in (0, 1].
  Returns:
    float32 [N, V], filtered logits.
  """
  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  if top_k and top_k < vocab:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits >= kth, logits, MASKED)
  if top_p < 1.0:
    probs = jax.nn.softmax(logits, axis=-1)
    sorted_probs = jax.lax.top_k(probs, vocab)[0]  # descending
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    count = jnp.sum(mass_before < top_p, axis=-1, keepdims=True)  # >= 1
    threshold = jnp.take_along_axis(sorted_probs, count - 1, axis=-1)
    logits = jnp.where(probs >= threshold, logits, MASKED)
  return logits


def row_keys(rng: jax.Array, batch: int) -> jax.Array:
  """One PRNG key per row: ``rng`` itself when it already holds B keys ([B] typed or [B, 2] raw),
  else ``fold_in(rng, b)`` for row b. A row's draws depend only on its own key."""
  rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
  typed = jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
  single = rng.ndim == (0 if typed else 1)
  if single:
    return jax.vmap(lambda b: jax.random.fold_in(rng, b))(jnp.arange(batch))
  if rng.shape[0] != batch:
    raise ValueError(f"rng holds {rng.shape[0]} keys for {batch} prompts: give one key or one per row")
  return rng


def sample(logits_fn: LogitsFn, cache: Any, prompt: jnp.ndarray, rng: jax.Array,
           max_new_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           eos_id: int = EOS_ID, bos_id: int = BOS_ID, prompt_lengths=None) -> jnp.ndarray:
  """Sample continuations y_t ~ softmax(filter(logits_t / T)) of prompts, until EOS or a length.

  Row b's prompt is ``prompt[b, :prompt_lengths[b]]`` (the rest is padding, never read); rows
  may have different lengths. All rows move one position per step; a row whose prompt has not
  ended yet is fed its next prompt token (forced) instead of a draw, so every cache position of
  every row holds a real token: [BOS, prompt_b, y_b1, y_b2, ...], and no padding mask is needed.
  The shortest prompt's tokens go in one call with BOS (a prefill: logits_fn must accept several
  positions in one call and return the last one's logits), then one token per call: at most
  1 + (P - P_min) + (max_new_tokens - 1) calls, so a cache must hold P + max_new_tokens positions.

  Randomness is per row: row b draws its t-th new token with ``fold_in(key_b, t)``, where key_b is
  ``rng[b]`` when ``rng`` holds B keys, else ``fold_in(rng, b)`` (``row_keys``). So a row gives the
  same tokens in any batch as alone with its own key (up to the float rounding of batched logits).

  Args:
    logits_fn: ``(ids int32 [B, L], cache) -> (logits float32 [B, V] at position L-1, cache)``.
    cache: empty cache for B rows (e.g. ``txf.decode.adapter.init_cache`` of the LM).
    prompt: int [B, P], P >= 0, prompts (without BOS), padded on the right to P.
    rng: one PRNG key, or B keys (typed [B] or raw [B, 2]).
    max_new_tokens: static int >= 1.
    temperature: static float >= 0; 0 means greedy (argmax, no randomness).
    top_k: static int >= 0 (0 = off); top_p: static float in (0, 1] (1 = off).
    eos_id, bos_id: special ids; ``bos_id`` may be int [B], each row's own first token (a prompt
      that starts with its first token, as Hugging Face's generate continues ``tokenizer(P)``).
    prompt_lengths: int [B] with 0 <= length <= P, or None (every prompt is P tokens). When it is a
      concrete array the shortest prompt is prefilled in one call; under tracing only BOS is.
  Returns:
    int32 [B, max_new_tokens]: each row's new tokens, EOS included, PAD (0) after it.
  """
  check_length("max_new_tokens", max_new_tokens)
  if temperature < 0:
    raise ValueError(f"temperature must be >= 0, got {temperature!r}")
  if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
    raise ValueError(f"top_k must be an int >= 0, got {top_k!r}")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
  prompt = jnp.asarray(prompt, jnp.int32)
  if prompt.ndim != 2:
    raise ValueError(f"prompt must be int [B, P], got shape {prompt.shape}")
  batch, width = prompt.shape
  if prompt_lengths is None:
    lengths, prefill = jnp.full((batch,), width, jnp.int32), width
  else:
    try:
      concrete = np.asarray(prompt_lengths)
    except jax.errors.TracerArrayConversionError:  # traced: checked by the caller, BOS prefill
      concrete = None
    if concrete is None:
      lengths, prefill = jnp.asarray(prompt_lengths, jnp.int32), 0
    elif concrete.shape != (batch,) or concrete.min(initial=0) < 0 or concrete.max(initial=0) > width:
      raise ValueError(f"prompt_lengths must be int [{batch}] in [0, {width}], got {concrete!r}")
    else:
      lengths, prefill = jnp.asarray(concrete, jnp.int32), int(concrete.min(initial=width))
  keys = row_keys(rng, batch) if temperature > 0 else None
  last = width - prefill + max_new_tokens  # steps until the longest prompt's row is full

  def draw(logits, index):
    if temperature == 0:
      return argmax(logits)
    filtered = filter_logits(logits.astype(jnp.float32) / temperature, top_k, top_p)
    step_keys = jax.vmap(jax.random.fold_in)(keys, index)
    return jax.vmap(jax.random.categorical)(step_keys, filtered).astype(jnp.int32)

  def cond(state):
    step, _, done, _, _ = state
    return (step < last) & ~jnp.all(done)

  def body(state):
    # one draw site (threefry compiles slowly on CPU); feed the token back only if it is needed
    step, out, done, logits, cache = state
    position = prefill + step                   # index of this token after BOS in every row
    forced = position < lengths
    new_index = position - lengths              # which new token a row draws (< 0 while forced)
    prompt_token = prompt[:, jnp.minimum(position, width - 1)] if width else jnp.zeros_like(lengths)
    drawn = draw(logits, jnp.maximum(new_index, 0))
    token = jnp.where(forced, prompt_token, jnp.where(done, PAD_ID, drawn))
    write = ~forced & ~done
    column = jnp.clip(new_index, 0, max_new_tokens - 1)
    rows = jnp.arange(batch)
    out = out.at[rows, column].set(jnp.where(write, token, out[rows, column]))
    done = done | (write & ((token == eos_id) | (new_index + 1 >= max_new_tokens)))
    more = (step + 1 < last) & ~jnp.all(done)
    logits, cache = jax.lax.cond(more, lambda: logits_fn(token[:, None], cache),
                                 lambda: (logits, cache))
    return step + 1, out, done, logits, cache

  starts = jnp.broadcast_to(jnp.asarray(bos_id, jnp.int32).reshape(-1, 1), (batch, 1))
  prefix = jnp.concatenate([starts, prompt[:, :prefill]], axis=1)
  logits, cache = logits_fn(prefix, cache)
  state = (jnp.array(0, jnp.int32), jnp.zeros((batch, max_new_tokens), jnp.int32),
           jnp.zeros((batch,), bool), logits.astype(jnp.float32), cache)
  return jax.lax.while_loop(cond, body, state)[1]
