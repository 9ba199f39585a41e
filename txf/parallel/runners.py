"""Runners: where the state lives and how a step is compiled. One interface for every layout.

Runner API (all take host numpy batches of the *global per-process* batch):
  place_state(state) -> state on device(s)
  train_step(state, batch, rng) -> (state, metrics)    compiled, state buffers donated
  eval_step(state, batch) -> metric sums
  host_params(state) -> params as one host copy (for decoding and saving)
  host_state(state) -> the state as one host copy (for checkpoints)
"""

from typing import Callable

import jax


class SingleDeviceRunner:
  """jax.jit on the default device; compiles once (fixed batch shapes), donates the state."""
  axis_name = None

  def __init__(self, train_step: Callable, eval_step: Callable):
    self._train = jax.jit(train_step, donate_argnums=(0,))
    self._eval = jax.jit(lambda state, batch: eval_step(state.params, batch))

  def place_state(self, state):
    return jax.device_put(state)

  def train_step(self, state, batch, rng):
    return self._train(state, batch, rng)

  def eval_step(self, state, batch):
    return self._eval(state, batch)

  def host_params(self, state):
    return jax.device_get(state.params)

  def host_state(self, state):
    return jax.device_get(state)


def make_runner(config, make_train_step: Callable, make_eval_step: Callable):
  """The runner for ``config.parallelism``; ``make_*_step(axis_name)`` build the pure steps."""
  if config.parallelism == "single":
    return SingleDeviceRunner(make_train_step(None), make_eval_step(None))
  raise NotImplementedError(f"parallelism={config.parallelism!r} is not available yet; use 'single'")
