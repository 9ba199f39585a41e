"""Ancestral sampling with temperature, top-k and nucleus (top-p) filtering (decoder-only LM)."""

from typing import Any

import jax
import jax.numpy as jnp

from txf.decode.greedy import BOS_ID, EOS_ID, PAD_ID, LogitsFn, check_length

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


def sample(logits_fn: LogitsFn, cache: Any, prompt: jnp.ndarray, rng: jax.Array,
           max_new_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           eos_id: int = EOS_ID, bos_id: int = BOS_ID) -> jnp.ndarray:
  """Sample continuations y_t ~ softmax(filter(logits_t / T)) of a prompt, until EOS or a length.

  The prompt is fed once as [BOS, prompt_1 .. prompt_P] (logits_fn must accept several positions
  in one call and return the last one's logits: a prefill), then each sampled token is fed back
  one at a time: 1 + (max_new_tokens - 1) calls, so a cache must hold P + max_new_tokens
  positions. Step t draws with ``jax.random.fold_in(rng, t)``.

  Prompts of different lengths are NOT supported: all B prompts are P real tokens (no PAD);
  a padded prompt would be read as PAD tokens, and the continuation would follow them. Decode
  prompts of different lengths in separate calls (or batches grouped by length).

  Args:
    logits_fn: ``(ids int32 [B, L], cache) -> (logits float32 [B, V] at position L-1, cache)``.
    cache: empty cache for B rows (e.g. ``txf.models.inference.init_cache`` of the LM).
    prompt: int [B, P], P >= 0, equal-length prompts (without BOS).
    rng: PRNG key.
    max_new_tokens: static int >= 1.
    temperature: static float >= 0; 0 means greedy (argmax, no randomness).
    top_k: static int >= 0 (0 = off); top_p: static float in (0, 1] (1 = off).
    eos_id, bos_id: special ids.
  Returns:
    int32 [B, max_new_tokens]: sampled tokens, EOS included, PAD (0) after it.
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
  batch = prompt.shape[0]

  def draw(logits, step):
    if temperature == 0:
      return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    filtered = filter_logits(logits.astype(jnp.float32) / temperature, top_k, top_p)
    key = jax.random.fold_in(rng, step)
    return jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)

  def cond(state):
    step, _, done, _, _ = state
    return (step < max_new_tokens) & ~jnp.all(done)

  def body(state):
    # one draw site (threefry compiles slowly on CPU); feed the token back only if it is needed
    step, out, done, logits, cache = state
    token = jnp.where(done, PAD_ID, draw(logits, step))
    out = jax.lax.dynamic_update_slice(out, token[:, None], (0, step))
    done = done | (token == eos_id)
    more = (step + 1 < max_new_tokens) & ~jnp.all(done)
    logits, cache = jax.lax.cond(more, lambda: logits_fn(token[:, None], cache),
                                 lambda: (logits, cache))
    return step + 1, out, done, logits, cache

  prefix = jnp.concatenate([jnp.full((batch, 1), bos_id, jnp.int32), prompt], axis=1)
  logits, cache = logits_fn(prefix, cache)
  state = (jnp.array(0, jnp.int32), jnp.zeros((batch, max_new_tokens), jnp.int32),
           jnp.zeros((batch,), bool), logits.astype(jnp.float32), cache)
  return jax.lax.while_loop(cond, body, state)[1]
