"""Decoding algorithms against hand-built logits functions whose best sequences are known."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.decode import greedy_decode

NEG = -1e9


def table_logits_fn(table):
  """logits_fn whose next-token log-probs depend only on the last token: table float [V, V].

  Cache: {"step": 0-d int (shared counter)}.
  """
  table = jnp.asarray(table, jnp.float32)

  def logits_fn(ids, cache):
    return table[ids[:, -1]], {"step": cache["step"] + 1}

  return logits_fn


def row_step_logits_fn(tokens):
  """Row b at step t strongly prefers tokens[b][t]; cache {"row": int [N], "step": 0-d}.

  tokens int [B, T]; vocab V = 8.
  """
  tokens = jnp.asarray(tokens, jnp.int32)

  def logits_fn(ids, cache):
    step = jnp.minimum(cache["step"], tokens.shape[1] - 1)
    want = tokens[cache["row"], step]
    logits = jnp.where(jnp.arange(8)[None, :] == want[:, None], 0.0, -5.0)
    return logits, {"row": cache["row"], "step": cache["step"] + 1}

  return logits_fn


def test_greedy_follows_table_and_stops_at_eos():
  # BOS(1) -> 5 -> 6 -> EOS(2)
  t = np.full((8, 8), -3.0)
  t[1, 5] = t[5, 6] = t[6, 2] = t[2, 2] = 0.0
  ids = greedy_decode(table_logits_fn(t), {"step": jnp.array(0)}, batch_size=2, max_len=6)
  np.testing.assert_array_equal(ids, [[5, 6, 2, 0, 0, 0]] * 2)


def test_greedy_eos_at_different_lengths():
  tokens = [[4, 2, 7, 7], [4, 5, 6, 2], [7, 7, 7, 7]]
  cache = {"row": jnp.arange(3), "step": jnp.array(0)}
  fn = jax.jit(lambda c: greedy_decode(row_step_logits_fn(tokens), c, 3, 4))
  np.testing.assert_array_equal(fn(cache), [[4, 2, 0, 0], [4, 5, 6, 2], [7, 7, 7, 7]])


def test_greedy_exits_once_every_row_has_eos():
  tokens = [[4, 2, 7, 7, 7], [4, 5, 6, 2, 7]]
  calls = []
  inner = row_step_logits_fn(tokens)

  def counting(ids, cache):
    jax.debug.callback(lambda: calls.append(1))
    return inner(ids, cache)
  out = jax.jit(lambda c: greedy_decode(counting, c, 2, 10))(
      {"row": jnp.arange(2), "step": jnp.array(0)})
  jax.effects_barrier()
  np.testing.assert_array_equal(out, [[4, 2] + [0] * 8, [4, 5, 6, 2] + [0] * 6])
  assert len(calls) == 4  # stopped after the last row's EOS, not at max_len=10


def test_greedy_bad_arguments():
  fn = table_logits_fn(np.zeros((4, 4)))
  with pytest.raises(ValueError, match="max_len"):
    greedy_decode(fn, {"step": jnp.array(0)}, 1, 0)
  with pytest.raises(ValueError, match="batch_size"):
    greedy_decode(fn, {"step": jnp.array(0)}, 0, 3)
