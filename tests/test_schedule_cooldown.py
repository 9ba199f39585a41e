"""optimizer.cooldown_steps: lr'(step) = lr(step) * min(1, (total - step + 1) / cooldown)."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from txf.core import config as config_lib
from txf.train.optimizer import make_optimizer, make_schedule, with_cooldown


def _opt_cfg(**kw):
  c = ml_collections.ConfigDict(dict(warmup_steps=4, learning_rate_scale=1.0, b1=0.9, b2=0.98, eps=1e-9,
                                     weight_decay=0.0, grad_clip_norm=0.0, schedule="inverse_sqrt",
                                     learning_rate=1e-3, cooldown_steps=0))
  c.update(kw)
  return c


def _paper_lr(step, d_model, warmup):
  """Section 5.3 in float64, step counted from 1."""
  return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def test_cooldown_matches_a_hand_computed_tail():
  total, cooldown, d, warmup = 10, 4, 16, 4
  lr = make_schedule(_opt_cfg(cooldown_steps=cooldown), d, total_steps=total)
  got = np.asarray(lr(jnp.arange(total)), np.float64)  # optax counts updates 0 .. total-1
  # Steps 1..6 keep the paper's rate; steps 7, 8, 9, 10 get 4/4, 3/4, 2/4, 1/4 of it.
  factors = [1, 1, 1, 1, 1, 1, 1.0, 0.75, 0.5, 0.25]
  want = [_paper_lr(s, d, warmup) * f for s, f in zip(range(1, total + 1), factors)]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cooldown_reaches_zero_after_the_last_step_and_never_goes_negative():
  lr = with_cooldown(lambda count: jnp.full_like(jnp.asarray(count, jnp.float32), 2.0), 5, 5)
  np.testing.assert_allclose(np.asarray(lr(jnp.arange(8))), [2.0, 1.6, 1.2, 0.8, 0.4, 0.0, 0.0, 0.0],
                             rtol=1e-6, atol=1e-7)


def test_no_cooldown_is_the_plain_schedule():
  plain = make_schedule(_opt_cfg(), 16)
  also = make_schedule(_opt_cfg(cooldown_steps=0), 16, total_steps=100)
  steps = jnp.arange(100)
  np.testing.assert_array_equal(np.asarray(plain(steps)), np.asarray(also(steps)))


def test_cooldown_needs_the_run_length_and_a_valid_size():
  with pytest.raises(ValueError, match="total_steps"):
    make_schedule(_opt_cfg(cooldown_steps=3), 16)
  with pytest.raises(ValueError, match="cooldown_steps"):
    with_cooldown(lambda c: c, total_steps=5, cooldown_steps=6)
  cfg = config_lib.base_config()
  cfg.num_train_steps = 100
  cfg.optimizer.cooldown_steps = 101
  with pytest.raises(config_lib.ConfigError, match="cooldown_steps=101"):
    config_lib.validate(cfg)
  cfg.optimizer.cooldown_steps = -1
  with pytest.raises(config_lib.ConfigError, match="cooldown_steps=-1"):
    config_lib.validate(cfg)


def test_adam_with_cooldown_takes_no_step_after_the_run_ends():
  tx = make_optimizer(_opt_cfg(schedule="constant", warmup_steps=1, cooldown_steps=2), 16, total_steps=2)
  params = {"w": jnp.array([1.0])}
  state = tx.init(params)
  moves = []
  for _ in range(3):  # steps 1 and 2 train at lr and lr/2; a third update is past the run: lr 0
    updates, state = tx.update({"w": jnp.array([0.5])}, state, params)
    moves.append(float(updates["w"][0]))
  np.testing.assert_allclose(moves, [-1e-3, -5e-4, 0.0], rtol=1e-5, atol=1e-12)
