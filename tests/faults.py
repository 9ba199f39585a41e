"""Faults injected from outside txf's code: a NaN at one training step, slow checkpoint saves, a
full disk at one checkpoint.

In-process tests call ``nan_at_step`` / ``slow_saves`` with pytest's ``monkeypatch``. Subprocess
tests run ``python -m tests.faults <txf command and flags>`` with ``FAULT_NAN_AT_STEP=k``,
``FAULT_SAVE_DELAY_S=s`` and/or ``FAULT_ENOSPC_AT_CHECKPOINT=step`` in the environment: this
installs the faults, then runs ``txf`` as usual.
"""

import asyncio
import errno
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from txf import cli
from txf.train import loop


def nan_at_step(monkeypatch, k: int) -> None:
  """Optimizer step ``k`` (1-based, as in metrics.jsonl) of every ``txf.train`` run sees NaN
  parameters, so its loss and gradients are NaN; the good state is put back after it, as
  ``train_step`` itself does on a non-finite step (the same compiled step, no other effect)."""
  make_runner = loop.make_runner

  def make_faulty_runner(*args, **kwargs):
    runner = make_runner(*args, **kwargs)
    step = runner.train_step

    def train_step(state, batch, rng):
      if int(np.asarray(state.step).reshape(-1)[0]) + 1 != k:
        return step(state, batch, rng)
      good = jax.tree_util.tree_map(jnp.copy, state)  # the step donates its input
      poisoned = state.replace(params=jax.tree_util.tree_map(lambda p: p * jnp.nan, state.params))
      new, metrics = step(poisoned, batch, rng)
      return new.replace(params=good.params, opt_state=good.opt_state), metrics

    runner.train_step = train_step
    return runner

  monkeypatch.setattr(loop, "make_runner", make_faulty_runner)


def slow_saves(monkeypatch, delay_s: float) -> None:
  """Every checkpoint's ``meta`` item waits ``delay_s`` inside orbax's background write, after
  writing ``<step>: slow save started`` to stderr, so a test can kill a process mid-save."""
  save = ocp.handlers.JsonCheckpointHandler._save_fn

  async def slow_save(self, x, directory):
    if isinstance(x, dict) and "data_iterator" in x:
      os.write(2, f"{x.get('step')}: slow save started\n".encode())
      await asyncio.sleep(delay_s)
    await save(self, x, directory)

  monkeypatch.setattr(ocp.handlers.JsonCheckpointHandler, "_save_fn", slow_save)


def disk_full_at_checkpoint(monkeypatch, step: int) -> None:
  """Saving checkpoint ``step`` fails as a full disk does: orbax's ``CheckpointManager.save``
  raises ``OSError(ENOSPC)`` for that step (earlier checkpoints are written as usual)."""
  save = ocp.CheckpointManager.save

  def full_save(self, s, *args, **kwargs):
    if int(s) == step:
      raise OSError(errno.ENOSPC, "No space left on device", str(self.directory))
    return save(self, s, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", full_save)


class _Patch:
  """The part of pytest's monkeypatch that the faults use, for a subprocess."""

  def setattr(self, obj, name, value):
    setattr(obj, name, value)


if __name__ == "__main__":
  if os.environ.get("FAULT_NAN_AT_STEP"):
    nan_at_step(_Patch(), int(os.environ["FAULT_NAN_AT_STEP"]))
  if os.environ.get("FAULT_ENOSPC_AT_CHECKPOINT"):
    disk_full_at_checkpoint(_Patch(), int(os.environ["FAULT_ENOSPC_AT_CHECKPOINT"]))
  if os.environ.get("FAULT_SAVE_DELAY_S"):
    slow_saves(_Patch(), float(os.environ["FAULT_SAVE_DELAY_S"]))
  cli.main(["txf"] + sys.argv[1:])
