"""Faults injected from outside txf's code: a NaN at one training step, slow checkpoint saves,
a full disk at one checkpoint, a signal at one step (on one process of several), a SIGTERM
while the final parameters are saved.

In-process tests call ``nan_at_step`` / ``slow_saves`` with pytest's ``monkeypatch``. Subprocess
tests run ``python -m tests.faults <txf command and flags>`` with ``FAULT_NAN_AT_STEP=k``,
``FAULT_SAVE_DELAY_S=s``, ``FAULT_ENOSPC_AT_CHECKPOINT=step``, ``FAULT_DISK_FULL_IN_ASYNC_SAVE=step``
(the disk fills in orbax's background write) and/or ``FAULT_DISK_FULL_FOR=NAME`` (files named
``*NAME*`` cannot be written) in the environment: this
installs the faults, then runs ``txf`` as usual.
``FAULT_EVAL_DELAY_S=s`` announces each in-loop evaluation and waits before it;
``FAULT_SAVE_FROM_STEP`` / ``FAULT_EVAL_FROM_STEP=k``: only from step k on. ``FAULT_SUPERVISED=1``:
one process of several runs under txf's supervising parent, as ``txf`` itself does.
``FAULT_SIGNAL_AT_STEP=k`` (with ``FAULT_SIGNAL=TERM|INT``, ``FAULT_SIGNAL_PROCESS=i``,
``FAULT_SIGNAL_WHEN_PIPE_CLOSED=1``) and ``FAULT_SIGNAL_IN_FINISH=TERM`` likewise; every
subprocess run also writes ``process i: the loop ended after step n`` to stderr when training ends.
``FAULT_ERROR_AT_STEP=k`` with ``FAULT_ERROR=data|bug`` and ``FAULT_ERROR_PROCESS=i``: that process
alone raises a DataError (a bad data row) or a RuntimeError (a bug) after step k.
``FAULT_HIDE_CHECKPOINT=step:i``: process i's listing of the checkpoints folder misses that step.
"""

import asyncio
import errno
import os
import select
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from txf import cli
from txf.runtime import workdir as workdir_lib
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
      if int(np.asarray(state.step.addressable_shards[0].data).reshape(-1)[0]) + 1 != k:
        return step(state, batch, rng)
      good = jax.tree_util.tree_map(jnp.copy, state)  # the step donates its input
      poisoned = state.replace(params=jax.tree_util.tree_map(lambda p: p * jnp.nan, state.params))
      new, metrics = step(poisoned, batch, rng)
      return new.replace(params=good.params, opt_state=good.opt_state), metrics

    runner.train_step = train_step
    return runner

  monkeypatch.setattr(loop, "make_runner", make_faulty_runner)


def slow_saves(monkeypatch, delay_s: float, from_step: int = 0) -> None:
  """Every checkpoint's ``meta`` item (of step ``from_step`` on) waits ``delay_s`` inside orbax's
  background write, after writing ``<step>: slow save started`` to stderr, so a test can kill a
  process mid-save."""
  save = ocp.handlers.JsonCheckpointHandler._save_fn

  async def slow_save(self, x, directory):
    if isinstance(x, dict) and "data_iterator" in x and int(x.get("step", 0)) >= from_step:
      os.write(2, f"{x.get('step')}: slow save started\n".encode())
      await asyncio.sleep(delay_s)
    await save(self, x, directory)

  monkeypatch.setattr(ocp.handlers.JsonCheckpointHandler, "_save_fn", slow_save)


def slow_evaluations(monkeypatch, delay_s: float, from_step: int = 0) -> None:
  """Every in-loop evaluation (of step ``from_step`` on) writes ``<step>: evaluation started`` to
  stderr, then waits ``delay_s`` before it evaluates, so a test can kill a process while it
  evaluates."""
  evaluate = loop.evaluate

  def slow_evaluate(run, state, is_last):
    every = run.config.eval_every
    if ((every and state.step % every == 0) or is_last) and state.step >= from_step:
      os.write(2, f"{state.step}: evaluation started\n".encode())
      time.sleep(delay_s)
    return evaluate(run, state, is_last)

  monkeypatch.setattr(loop, "evaluate", slow_evaluate)


def signal_at_step(monkeypatch, k: int, signum: int, process: int = -1,
                   when_pipe_closed: bool = False) -> None:
  """Right after optimizer step ``k``, send ``signum`` to this process (only if it is process
  ``process`` of the job, when >= 0). ``when_pipe_closed``: first wait (up to 60 s) until the reader
  of stdout has gone (the pipe reports an error), so the signal meets a closed pipe."""
  take_step = loop.take_step

  def faulty_take_step(run, state):
    take_step(run, state)
    if state.step == k and process in (-1, jax.process_index()):
      if when_pipe_closed:
        poller, deadline = select.poll(), time.time() + 60
        poller.register(1, select.POLLERR)
        while not poller.poll(100) and time.time() < deadline:
          pass
      os.kill(os.getpid(), signum)
      time.sleep(0.2)  # the handler runs now, before the next step starts

  monkeypatch.setattr(loop, "take_step", faulty_take_step)


def error_at_step(monkeypatch, k: int, kind: str, process: int = -1) -> None:
  """Right after optimizer step ``k``, process ``process`` (all when -1) alone raises a DataError
  (``kind='data'``: a bad row, as a reader finds one) or a RuntimeError (``'bug'``)."""
  from txf.data.base import DataError
  take_step = loop.take_step

  def faulty_take_step(run, state):
    take_step(run, state)
    if state.step == k and process in (-1, jax.process_index()):
      if kind == "data":
        raise DataError(f"train.en:{k}: a bad row injected on process {jax.process_index()}")
      raise RuntimeError(f"a bug injected on process {jax.process_index()} after step {k}")

  monkeypatch.setattr(loop, "take_step", faulty_take_step)


def signal_in_finish(monkeypatch, signum: int) -> None:
  """Send ``signum`` to this process as the final parameters start being written."""
  save_params = workdir_lib.save_params

  def faulty_save_params(*args, **kwargs):
    os.kill(os.getpid(), signum)
    time.sleep(0.2)
    return save_params(*args, **kwargs)

  monkeypatch.setattr(workdir_lib, "save_params", faulty_save_params)


def report_end(monkeypatch) -> None:
  """Each process writes ``process i: the loop ended after step n`` to stderr when training ends."""
  finish = loop.finish

  def reporting_finish(run, state, preemption):
    try:
      os.write(2, f"process {jax.process_index()}: the loop ended after step {state.step}\n".encode())
    except OSError:
      pass
    return finish(run, state, preemption)

  monkeypatch.setattr(loop, "finish", reporting_finish)


def disk_full_at_checkpoint(monkeypatch, step: int) -> None:
  """Saving checkpoint ``step`` fails as a full disk does: orbax's ``CheckpointManager.save``
  raises ``OSError(ENOSPC)`` for that step (earlier checkpoints are written as usual)."""
  save = ocp.CheckpointManager.save

  def full_save(self, s, *args, **kwargs):
    if int(s) == step:
      raise OSError(errno.ENOSPC, "No space left on device", str(self.directory))
    return save(self, s, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", full_save)


def disk_full_in_async_save(monkeypatch, step: int) -> None:
  """The disk fills while orbax writes checkpoint ``step`` in its background thread: the write fails
  there as TensorStore reports a full disk (a ValueError carrying the OS error text), after the save
  call has returned; orbax logs it and raises it at the next save or wait."""
  save = ocp.handlers.JsonCheckpointHandler._save_fn

  async def full_save(self, x, directory):
    if isinstance(x, dict) and "data_iterator" in x and x.get("step") == step:
      raise ValueError(f'Error writing local file "{directory}/meta/metadata": '
                       "[OS error: No space left on device]")
    await save(self, x, directory)

  monkeypatch.setattr(ocp.handlers.JsonCheckpointHandler, "_save_fn", full_save)


def disk_full_for(monkeypatch, name: str) -> None:
  """The disk is full for every file opened for writing whose name contains ``name`` (e.g.
  ``params.msgpack``, ``loss_curves.png``, ``report.json``): its first write raises ENOSPC."""
  import builtins
  real_open = builtins.open

  class FullFile:
    def __init__(self, f):
      self._f = f

    def write(self, *args, **kwargs):
      raise OSError(errno.ENOSPC, "No space left on device", self._f.name)

    def __getattr__(self, attr):
      return getattr(self._f, attr)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self._f.close()

  def full_open(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    if isinstance(file, (str, os.PathLike)) and name in os.fspath(file) and set(mode) & set("wax"):
      return FullFile(f)
    return f

  monkeypatch.setattr(builtins, "open", full_open)


def hide_checkpoint(monkeypatch, step: int, process: int) -> None:
  """Process ``process`` (its TXF_PROCESS_ID) does not see checkpoint ``step`` when it lists the
  checkpoints folder: a stale view of a shared file system (e.g. a late NFS attribute cache)."""
  if int(os.environ.get("TXF_PROCESS_ID", "0") or 0) != process:
    return
  from orbax.checkpoint._src.path import step as step_lib
  name_format = type(step_lib.standard_name_format())
  glob = name_format._glob_step_paths  # pylint: disable=protected-access

  def without_step(self, base_path):
    return [p for p in glob(self, base_path) if p.name != str(step)]

  monkeypatch.setattr(name_format, "_glob_step_paths", without_step)


def supervised(args) -> None:
  """As ``txf`` itself runs one process of several: under its supervising parent
  (txf.runtime.supervise), whose child runs this module again, with the same faults. Returns in
  the child, or at once when the job has one process; the parent exits with the child."""
  from txf.runtime import process as runtime_process, supervise
  runtime_process.txf_argv = lambda argv: [sys.executable, "-m", "tests.faults", *argv]
  supervise.supervise(["txf", *args])


class _Patch:
  """The part of pytest's monkeypatch that the faults use, for a subprocess."""

  def setattr(self, obj, name, value):
    setattr(obj, name, value)


if __name__ == "__main__":
  if os.environ.get("FAULT_NAN_AT_STEP"):
    nan_at_step(_Patch(), int(os.environ["FAULT_NAN_AT_STEP"]))
  if os.environ.get("FAULT_ENOSPC_AT_CHECKPOINT"):
    disk_full_at_checkpoint(_Patch(), int(os.environ["FAULT_ENOSPC_AT_CHECKPOINT"]))
  if os.environ.get("FAULT_DISK_FULL_IN_ASYNC_SAVE"):
    disk_full_in_async_save(_Patch(), int(os.environ["FAULT_DISK_FULL_IN_ASYNC_SAVE"]))
  if os.environ.get("FAULT_DISK_FULL_FOR"):
    disk_full_for(_Patch(), os.environ["FAULT_DISK_FULL_FOR"])
  if os.environ.get("FAULT_SUPERVISED"):
    supervised(sys.argv[1:])
  if os.environ.get("FAULT_SAVE_DELAY_S"):
    slow_saves(_Patch(), float(os.environ["FAULT_SAVE_DELAY_S"]),
               int(os.environ.get("FAULT_SAVE_FROM_STEP", "0")))
  if os.environ.get("FAULT_EVAL_DELAY_S"):
    slow_evaluations(_Patch(), float(os.environ["FAULT_EVAL_DELAY_S"]),
                     int(os.environ.get("FAULT_EVAL_FROM_STEP", "0")))
  if os.environ.get("FAULT_SIGNAL_AT_STEP"):
    signal_at_step(_Patch(), int(os.environ["FAULT_SIGNAL_AT_STEP"]),
                   getattr(signal, "SIG" + os.environ.get("FAULT_SIGNAL", "TERM")),
                   int(os.environ.get("FAULT_SIGNAL_PROCESS", "-1")),
                   bool(os.environ.get("FAULT_SIGNAL_WHEN_PIPE_CLOSED")))
  if os.environ.get("FAULT_SIGNAL_IN_FINISH"):
    signal_in_finish(_Patch(), getattr(signal, "SIG" + os.environ["FAULT_SIGNAL_IN_FINISH"]))
  if os.environ.get("FAULT_ERROR_AT_STEP"):
    error_at_step(_Patch(), int(os.environ["FAULT_ERROR_AT_STEP"]),
                  os.environ.get("FAULT_ERROR", "data"), int(os.environ.get("FAULT_ERROR_PROCESS", "-1")))
  if os.environ.get("FAULT_HIDE_CHECKPOINT"):  # STEP:PROCESS
    hide_checkpoint(_Patch(), *map(int, os.environ["FAULT_HIDE_CHECKPOINT"].split(":")))
  if not os.environ.get("FAULT_QUIET_END"):
    report_end(_Patch())
  cli.main(["txf"] + sys.argv[1:])
