"""The inverse-sqrt warmup schedule and Adam(0.9, 0.98, 1e-9), against hand-computed values."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from txf.train.optimizer import inverse_sqrt_schedule, make_optimizer


def test_schedule_values_at_1_warmup_and_4x_warmup():
  d, w = 512, 4000
  lr = inverse_sqrt_schedule(d, w)
  # optax counts updates from 0: count c is step c + 1
  np.testing.assert_allclose(float(lr(0)), 512 ** -0.5 * 1 * 4000 ** -1.5, rtol=1e-6)
  np.testing.assert_allclose(float(lr(w - 1)), 512 ** -0.5 * 4000 ** -0.5, rtol=1e-6)  # the peak
  np.testing.assert_allclose(float(lr(4 * w - 1)), 512 ** -0.5 * 16000 ** -0.5, rtol=1e-6)
  np.testing.assert_allclose(float(lr(4 * w - 1)) * 2, float(lr(w - 1)), rtol=1e-6)  # half the peak
  assert float(lr(w - 2)) < float(lr(w - 1)) > float(lr(w))


def test_schedule_scale():
  np.testing.assert_allclose(float(inverse_sqrt_schedule(64, 10, 2.0)(99)), 2 * 64 ** -0.5 * 100 ** -0.5,
                             rtol=1e-6)


def _opt_cfg(**kw):
  c = ml_collections.ConfigDict(dict(warmup_steps=10, learning_rate_scale=1.0, b1=0.9, b2=0.98, eps=1e-9,
                                     weight_decay=0.0, grad_clip_norm=0.0, schedule="inverse_sqrt",
                                     learning_rate=1e-3, cooldown_steps=0))
  c.update(kw)
  return c


def test_adam_matches_numpy_two_steps():
  d = 16
  tx = make_optimizer(_opt_cfg(), d)
  p = {"w": jnp.array([0.5, -1.0, 2.0])}
  grads = [np.array([0.1, -0.2, 0.3]), np.array([-0.5, 0.05, 0.0])]
  state = tx.init(p)
  m = v = np.zeros(3)
  ref = np.array([0.5, -1.0, 2.0])
  for t, g in enumerate(grads, start=1):
    upd, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state, p)
    p = optax.apply_updates(p, upd)
    m = 0.9 * m + 0.1 * g
    v = 0.98 * v + 0.02 * g * g
    mhat, vhat = m / (1 - 0.9 ** t), v / (1 - 0.98 ** t)
    lr = d ** -0.5 * min(t ** -0.5, t * 10 ** -1.5)
    ref = ref - lr * mhat / (np.sqrt(vhat) + 1e-9)
  np.testing.assert_allclose(p["w"], ref, rtol=1e-5)


def test_weight_decay_switches_to_adamw():
  tx = make_optimizer(_opt_cfg(weight_decay=0.1), 16)
  p = {"w": jnp.ones(2)}
  upd, _ = tx.update({"w": jnp.zeros(2)}, tx.init(p), p)
  lr0 = 16 ** -0.5 * 10 ** -1.5
  np.testing.assert_allclose(upd["w"], -lr0 * 0.1 * np.ones(2), rtol=1e-5)  # pure decoupled decay
