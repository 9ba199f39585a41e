"""Greedy decoding over a ``logits_fn(ids, cache)`` callback; knows no model.

The callback contract shared by all of txf.decode:

  logits_fn(ids int32 [N, L], cache) -> (logits float32 [N, V] for the last position, new_cache)

``cache`` is a pytree whose leaves with a leading dimension N are per-row state (KV buffers,
encoder keys/values, masks) and whose 0-d leaves are counters shared by all rows.
"""

from typing import Any, Callable, Tuple

import jax
import jax.numpy as jnp

from txf.core.specials import BOS_ID, EOS_ID, PAD_ID
from txf.kernels.topk import argmax

LogitsFn = Callable[[jnp.ndarray, Any], Tuple[jnp.ndarray, Any]]


def check_length(name: str, value: int) -> None:
  """Raise ValueError unless ``value`` is a Python int >= 1 (lengths and beam sizes are static)."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def forbid(logits: jnp.ndarray, never_ids: Tuple[int, ...]) -> jnp.ndarray:
  """logits [..., V] with the entries of ``never_ids`` set to -inf (unchanged when there are none)."""
  if not never_ids:
    return logits
  return logits.at[..., jnp.asarray(never_ids)].set(-jnp.inf)


def greedy_decode(logits_fn: LogitsFn, cache: Any, batch_size: int, max_len: int,
                  eos_id: int = EOS_ID, bos_id: int = BOS_ID, never_ids: Tuple[int, ...] = ()
                  ) -> jnp.ndarray:
  """Greedy decoding: y_t = argmax_v logits_fn(y_{t-1}, cache)[v], starting from y_0 = BOS.

  One callback call per step, each fed the previous token ([N, 1]); at most ``max_len`` calls,
  so a cache must hold ``max_len`` positions. The loop is a ``lax.while_loop`` over fixed-shape
  state (jit-compatible, compiled once) that stops as soon as every row has produced EOS.
  Rows that have finished keep being fed PAD (their outputs are discarded). An ``eos_id`` that is
  never produced (e.g. -1) forces exactly ``max_len`` steps (used by the benchmark).

  Args:
    logits_fn: ``(ids int32 [B, 1], cache) -> (logits float32 [B, V], cache)``.
    cache: initial cache pytree for ``batch_size`` rows (e.g. ``txf.decode.adapter.init_cache``).
    batch_size: B (static).
    max_len: number of tokens to generate at most (static), >= 1.
    eos_id, bos_id: special ids.
    never_ids: ids never generated (their logits count as -inf), e.g. Marian's pad.
  Returns:
    ids int32 [B, max_len]: generated tokens (BOS not included), EOS included, PAD (0) after EOS;
    a row that never produced EOS is ``max_len`` real tokens.
  """
  check_length("batch_size", batch_size)
  check_length("max_len", max_len)

  def cond(state):
    step, _, _, done, _ = state
    return (step < max_len) & ~jnp.all(done)

  def body(state):
    step, last, out, done, cache = state
    logits, cache = logits_fn(last[:, None], cache)
    token = argmax(forbid(logits, never_ids))
    token = jnp.where(done, PAD_ID, token)
    out = jax.lax.dynamic_update_slice(out, token[:, None], (0, step))
    return step + 1, token, out, done | (token == eos_id), cache

  state = (jnp.array(0, jnp.int32), jnp.full((batch_size,), bos_id, jnp.int32),
           jnp.zeros((batch_size, max_len), jnp.int32), jnp.zeros((batch_size,), bool), cache)
  return jax.lax.while_loop(cond, body, state)[2]
