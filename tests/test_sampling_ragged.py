"""txf.decode.sample with prompts of different lengths in one batch (``prompt_lengths``).

References: a hand-built logits function whose next token is a known function of everything
fed so far (checked against a plain Python loop), each row decoded alone, and the model's
teacher-forced forward pass.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_kv_cache import setup_model, small_config
from txf.decode import sample
from txf.decode.sampling import row_keys
from txf.models import build_model
from txf.decode.adapter import init_cache, make_logits_fn

V = 11


def weighted_sum_fn(ids, cache):
  """Next token = (sum over fed tokens of (position + 1) * id) % V, per row: order matters."""
  pos = cache["count"][:, None] + jnp.arange(ids.shape[1])[None, :]
  total = cache["total"] + jnp.sum((pos + 1) * ids, axis=1)
  logits = jnp.where(jnp.arange(V)[None, :] == (total % V)[:, None], 0.0, -9.0)
  return logits, {"total": total, "count": cache["count"] + ids.shape[1]}


def empty(batch):
  return {"total": jnp.zeros(batch, jnp.int32), "count": jnp.zeros(batch, jnp.int32)}


def python_greedy(prompt, new):
  """The same rule as weighted_sum_fn, one row, by hand: BOS (1), the prompt, then each choice."""
  fed, out = [1] + list(prompt), []
  for _ in range(new):
    out.append(sum((i + 1) * t for i, t in enumerate(fed)) % V)
    fed.append(out[-1])
  return out


PROMPTS = [[3, 4, 5, 6], [7], [], [9, 8]]


def padded(prompts, width):
  return jnp.asarray([p + [0] * (width - len(p)) for p in prompts], jnp.int32), \
      np.asarray([len(p) for p in prompts])


def test_ragged_greedy_follows_each_rows_own_prompt():
  prompt, lengths = padded(PROMPTS, 5)  # one pad column beyond the longest prompt too
  got = sample(weighted_sum_fn, empty(4), prompt, jax.random.key(0), 6, temperature=0.0,
               eos_id=-1, prompt_lengths=lengths)
  expected = [python_greedy(p, 6) for p in PROMPTS]
  assert len({tuple(e) for e in expected}) == 4
  np.testing.assert_array_equal(got, expected)


def test_each_row_may_start_with_its_own_first_token():
  """bos_id int [B]: row b is fed bos_id[b] first (a prompt's own first token), then its prompt;
  the hand rule with that start instead of BOS."""
  starts = [6, 2, 9, 1]
  prompt, lengths = padded(PROMPTS, 4)
  got = sample(weighted_sum_fn, empty(4), prompt, jax.random.key(0), 5, temperature=0.0,
               eos_id=-1, prompt_lengths=lengths, bos_id=jnp.asarray(starts))
  for row, start, p in zip(np.asarray(got), starts, PROMPTS):
    fed, out = [start] + p, []
    for _ in range(5):
      out.append(sum((i + 1) * t for i, t in enumerate(fed)) % V)
      fed.append(out[-1])
    np.testing.assert_array_equal(row, out)


def test_ragged_greedy_under_jit_with_traced_lengths():
  prompt, lengths = padded(PROMPTS, 4)
  run = jax.jit(lambda p, n: sample(weighted_sum_fn, empty(4), p, jax.random.key(0), 5,
                                    temperature=0.0, eos_id=-1, prompt_lengths=n))
  np.testing.assert_array_equal(run(prompt, jnp.asarray(lengths)), [python_greedy(p, 5) for p in PROMPTS])


def test_eos_ends_a_row_only_after_its_prompt():
  # a forced prompt token equal to EOS does not end the row; a drawn EOS does, PAD after it
  prompt, lengths = padded([[2, 3], [4]], 2)
  got = sample(weighted_sum_fn, empty(2), prompt, jax.random.key(0), 5, temperature=0.0,
               eos_id=2, prompt_lengths=lengths)
  for row, p in enumerate([[2, 3], [4]]):
    ref = python_greedy(p, 5)
    end = ref.index(2) + 1 if 2 in ref else 5
    np.testing.assert_array_equal(got[row], ref[:end] + [0] * (5 - end))


def test_row_keys_one_key_or_one_per_row():
  key = jax.random.key(3)
  keys = row_keys(key, 3)
  for b in range(3):
    assert jnp.array_equal(jax.random.key_data(keys[b]),
                           jax.random.key_data(jax.random.fold_in(key, b)))
  assert row_keys(keys, 3) is keys
  with pytest.raises(ValueError, match="2 keys for 3 prompts"):
    row_keys(jax.random.split(key, 2), 3)


def test_bad_prompt_lengths():
  prompt = jnp.zeros((2, 3), jnp.int32)
  with pytest.raises(ValueError, match="prompt_lengths"):
    sample(weighted_sum_fn, empty(2), prompt, jax.random.key(0), 2, prompt_lengths=[1, 4])
  with pytest.raises(ValueError, match="prompt_lengths"):
    sample(weighted_sum_fn, empty(2), prompt, jax.random.key(0), 2, prompt_lengths=[1])


@pytest.fixture(scope="module")
def lm():
  cfg = small_config("decoder_lm", tie_output=False)
  return cfg, setup_model(cfg, seed=5)


LM_PROMPTS = [[5, 6, 7, 8, 9], [4], [10, 11, 3]]
NEW = 6


def lm_sample(cfg, params, prompts, keys, temperature):
  width = max(len(p) for p in prompts)
  prompt, lengths = padded(prompts, width)
  cache = init_cache(cfg, params, len(prompts), 1 + width + NEW)
  return np.asarray(sample(make_logits_fn(cfg, params), cache, prompt, keys, NEW,
                           temperature=temperature, eos_id=-1, prompt_lengths=lengths))


@pytest.mark.slow
def test_ragged_batch_samples_each_row_as_alone(lm):
  cfg, params = lm
  keys = jax.random.split(jax.random.key(7), 3)
  batch = lm_sample(cfg, params, LM_PROMPTS, keys, temperature=1.0)
  assert len({tuple(r) for r in batch}) == 3
  for b, p in enumerate(LM_PROMPTS):
    alone = lm_sample(cfg, params, [p], keys[b:b + 1], temperature=1.0)
    np.testing.assert_array_equal(batch[b], alone[0])
  # another key gives another continuation (the key is used)
  other = lm_sample(cfg, params, LM_PROMPTS, jax.random.split(jax.random.key(8), 3), 1.0)
  assert not np.array_equal(other, batch)


@pytest.mark.slow  # a decode and a forward pass per row (10 s): the end-to-end tier
def test_ragged_greedy_matches_the_teacher_forced_forward(lm):
  cfg, params = lm
  got = lm_sample(cfg, params, LM_PROMPTS, jax.random.key(0), temperature=0.0)
  model = build_model(cfg, deterministic=True)
  for b, p in enumerate(LM_PROMPTS):
    seq = jnp.asarray([p + list(got[b])], jnp.int32)
    logits = model.apply({"params": params}, seq)  # BOS is prepended by the model (shifted right)
    np.testing.assert_array_equal(np.argmax(logits[0, len(p):], -1), got[b])


def test_generation_never_samples_ids_that_are_no_text():
  """txf.decode.decoders.text_logits_fn: PAD, BOS and UNK (U+FFFD for a character model) are
  never drawn, even when the model puts almost all its mass on them; the other ids keep their
  relative probabilities (here uniform), so every other id still appears."""
  from txf.decode.decoders import NEVER_SAMPLED, text_logits_fn
  vocab = 8
  bias = jnp.zeros(vocab).at[jnp.asarray(NEVER_SAMPLED)].set(20.0).at[2].set(-1e9)  # EOS off too

  def logits_fn(ids, cache):
    return jnp.broadcast_to(bias, (ids.shape[0], vocab)), cache

  prompt = jnp.full((16, 1), 5, jnp.int32)
  raw = np.asarray(sample(logits_fn, jnp.zeros(()), prompt, jax.random.key(0), 12))
  assert set(raw.ravel()) & set(NEVER_SAMPLED)   # without the mask they dominate
  out = np.asarray(sample(text_logits_fn(logits_fn), jnp.zeros(()), prompt, jax.random.key(0), 12))
  assert not set(out.ravel()) & set(NEVER_SAMPLED)
  assert set(out.ravel()) == {4, 5, 6, 7}
