"""The dropout rng of step n derived on device inside the step (``fold_step_into_key``) has the same
bits as ``fold_in(key, n)`` folded on the host, which the loop passed before: the default run's
metrics and parameters do not move."""

import jax
import numpy as np

from txf.train.steps import TrainState, fold_step_into_key


def test_step_key_equals_the_host_fold_in():
  key = jax.random.split(jax.random.key(0))[1]
  seen = []

  def step(state, batch, rng):
    return state, jax.random.key_data(rng)

  wrapped = jax.jit(fold_step_into_key(step))
  for n in (0, 1, 7, 399, 1199, 2**31 - 1):
    state = TrainState(step=np.int32(n), params={}, opt_state=())
    _, on_device = wrapped(state, None, key)
    host = jax.random.key_data(jax.random.fold_in(key, n))
    np.testing.assert_array_equal(np.asarray(on_device), np.asarray(host))
    seen.append(tuple(np.asarray(on_device)))
  assert len(set(seen)) == len(seen)  # different steps, different keys
