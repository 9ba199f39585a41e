"""When training stops early: signals (SIGTERM/SIGINT), the time limit, and non-finite losses.

Signals: the first SIGTERM or SIGINT finishes the current step, writes a checkpoint and returns
(``txf train`` exits 0); a second one exits at once with status 128 + signal number.

Time limit: ``config.time_limit_minutes > 0`` ends training once the run has trained that long in
all (compilation and in-loop evaluations included), counted across restarts: each checkpoint
records the training seconds behind it, so a resumed run gets what is left of its budget.

Agreement: with several processes, a stop is decided by all of them at once, so every process
leaves the loop after the same step (txf/runtime/agree.py). A signal is voted on every step
(``agree.LaggedMax``: one tiny all-reduce of one int per process, read one step later so the host
never waits on the devices for it): a signal to any one process stops all of them within two
steps of it, whatever ``log_every`` is. The time limit is compared at log steps (``any_process``).

Signals keep being handled until ``train`` returns: a SIGTERM while the final parameters and plots
are written lets them finish. What the handler has to say goes to ``notify`` (the reporter's
``signal``); the library writes nothing itself (``txf train`` writes it to stderr, and keeps a run
whose stdout reader died going: txf/commands/reporting.py).

Non-finite losses: ``train_step`` leaves the state unchanged on such a step; with
``nan_policy='stop'`` the ``NonFiniteGuard`` raises NonFiniteLossError naming the step before any
later state is saved, with ``'skip'`` training carries on (the ``skipped`` metric counts them).

Divergence: a finite loss that explodes (a learning rate far too high) is stopped the same way by
the ``DivergenceGuard``: a smoothed train loss above ``divergence_factor`` times its lowest value
(and above where it started) raises DivergenceError before any later state is saved.
"""

import os
import signal
import threading
import time
from typing import Callable, Optional, Tuple

import jax
import numpy as np

from txf.runtime import agree
from txf.core.errors import TxfError


class NonFiniteLossError(TxfError, RuntimeError):
  """A NaN or Inf loss with nan_policy='stop'."""


class DivergenceError(TxfError, RuntimeError):
  """A train loss far above its running minimum (divergence_factor)."""


def any_process(flag: Callable[[], bool], done: int, log_every: int) -> bool:
  """``flag()`` of this process alone, or with several processes, whether any process's flag is
  set; they compare only at log steps (one ``agree.any_true`` per ``log_every`` steps), so all
  agree."""
  if jax.process_count() == 1:
    return flag()
  if done % log_every:
    return False
  return agree.any_true(flag())


class Preemption:
  """SIGTERM/SIGINT handling while training (main thread only; elsewhere a no-op).

  The first signal sets ``signum``: the loop finishes its step, checkpoints and stops. A second
  signal exits the process at once with status 128 + signum (no checkpoint; a save in flight is
  left incomplete, which orbax never mistakes for a checkpoint).
  """
  SIGNALS = (signal.SIGTERM, signal.SIGINT)
  # Set once a signal has stopped a run of this process before its last step (its checkpoint is
  # written by the time train() returns): `txf train` then exits with EXIT_RESUMABLE when asked to.
  stopped_a_run = False

  def __init__(self, notify: Optional[Callable[[str], None]] = None):
    """``notify(text)`` hears what a signal does (called in the handler; default: nothing)."""
    self.notify = notify or (lambda text: None)
    self.signum, self._previous = None, {}
    self._vote = agree.LaggedMax()  # the stop vote: max over processes, one step late
    self.agreed = 0               # the agreed vote: signum + 256 * (1 + the process that got it)

  @property
  def signal_name(self) -> str:
    """What stopped the run, the same on every process: 'SIGTERM' (one process), 'SIGTERM on
    process 1' (several: the highest process index that got a signal)."""
    if self.agreed:
      signum, process = self.agreed % 256, self.agreed // 256 - 1
      try:
        name = signal.Signals(signum).name
      except ValueError:
        name = f"signal {signum}"
      return f"{name} on process {process}" if self._vote.multi else name
    return signal.Signals(self.signum).name if self.signum else ""

  def _handle(self, signum, frame):
    if self.signum is not None:
      self.notify(f"\ntxf: second {signal.Signals(signum).name}: exiting now\n")
      os._exit(128 + signum)
    self.signum = signum
    self.notify(f"\ntxf: {signal.Signals(signum).name} received: finishing this step and writing "
         f"a checkpoint (send it again to exit at once)\n")

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in self.SIGNALS:
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    return False

  def requested(self) -> bool:
    """Whether to stop after this step; call once per step on every process: a flag raised
    before step n's vote (``agree.LaggedMax``) stops every process after step n + 1, the same step
    everywhere, at most two steps after the signal reached any of them."""
    mine = 0 if self.signum is None else int(self.signum) + 256 * (jax.process_index() + 1)
    agreed = self._vote.vote(mine)
    if agreed:
      self.agreed = agreed
      Preemption.stopped_a_run = True
    return bool(agreed)


class TimeLimit:
  """The run's training-time budget: ``minutes`` (<= 0: none), of which ``used`` seconds were
  spent before this process started (restored from the checkpoint)."""

  def __init__(self, minutes: float, used: float = 0.0):
    self.minutes, self.used, self.started = float(minutes), float(used), time.time()
    self.deadline = self.started + 60.0 * self.minutes - self.used if self.minutes > 0 else None

  def trained_seconds(self) -> float:
    """The run's training time so far (saved with each checkpoint)."""
    return self.used + time.time() - self.started

  def spent(self) -> bool:
    """Whether the whole budget was used before this process started."""
    return self.deadline is not None and self.used >= 60.0 * self.minutes

  def passed(self, done: int, log_every: int) -> bool:
    """Whether the limit has passed after step ``done``; all processes agree (like a signal)."""
    if self.deadline is None:
      return False
    return any_process(lambda: time.time() >= self.deadline, done, log_every)


class NonFiniteGuard:
  """Checks each step's ``finite`` metric one step late (the host never waits on the current step).

  ``push(step, metrics)`` checks the step before and remembers this one; ``check()`` checks the
  remembered one now (before a checkpoint is saved and when training ends). With
  ``policy='stop'`` a non-finite step raises NonFiniteLossError; ``latest_kept()`` names the last
  good checkpoint in the message.
  """

  def __init__(self, policy: str, latest_kept: Callable[[], Optional[int]]):
    self.policy, self.latest_kept = policy, latest_kept
    self.previous: Optional[Tuple[int, dict]] = None

  def push(self, step: int, metrics) -> None:
    self.check()
    self.previous = (step, metrics)

  def check(self) -> None:
    if self.previous is None or self.policy != "stop" or float(self.previous[1]["finite"]) != 0.0:
      return
    kept = self.latest_kept()
    raise NonFiniteLossError(
        f"non-finite loss or gradient at step {self.previous[0]}: the run stopped; "
        + (f"its last good checkpoint (step {kept}) is kept" if kept is not None else
           "no checkpoint was written") +
        "; lower the learning rate, check the data, or set nan_policy='skip' to skip such batches")


class DivergenceGuard:
  """Stops a run whose loss explodes (a learning rate far too high), like the NonFiniteGuard.

  Each step's train loss (checked one step late, as the NonFiniteGuard does) updates a smoothed
  loss, an exponential moving average s_n = 0.9 s_{n-1} + 0.1 loss_n (s_1 = loss_1). The run
  diverged when s_n > max(factor * min_{m<=n} s_m, s_1): far above its best and worse than the
  untrained model it started from (so a loss near 0 may wobble freely). Non-finite losses are
  left to the NonFiniteGuard; ``factor == 0`` turns the check off. The reference starts afresh
  in each process (a resumed run starts from the loss it resumes at).
  """
  DECAY = 0.9

  def __init__(self, factor: float, latest_kept: Callable[[], Optional[int]]):
    self.factor, self.latest_kept = float(factor), latest_kept
    self.previous: Optional[Tuple[int, dict]] = None
    self.first: Optional[float] = None
    self.smoothed: Optional[float] = None
    self.best: Optional[Tuple[int, float]] = None

  def push(self, step: int, metrics) -> None:
    """Check the step before and remember this one (the host never waits on this step)."""
    self.check()
    self.previous = (step, metrics) if self.factor else None

  def check(self) -> None:
    """Take the remembered step's loss now; raises DivergenceError if the run diverged."""
    if self.previous is None:
      return
    (step, metrics), self.previous = self.previous, None
    loss = float(metrics["loss"])
    if not np.isfinite(loss):
      return
    self.smoothed = loss if self.smoothed is None else (
        self.DECAY * self.smoothed + (1.0 - self.DECAY) * loss)
    if self.first is None:
      self.first = self.smoothed
    if self.best is None or self.smoothed < self.best[1]:
      self.best = (step, self.smoothed)
    if self.smoothed <= max(self.factor * self.best[1], self.first):
      return
    kept = self.latest_kept()
    raise DivergenceError(
        f"the loss diverged at step {step}: the smoothed loss {self.smoothed:.4g} is over "
        f"{self.factor:g}x its lowest value ({self.best[1]:.4g} at step {self.best[0]}); the run "
        "stopped, " + (f"its last good checkpoint (step {kept}) is kept" if kept is not None else
                       "no checkpoint was written")
        + "; lower the learning rate (optimizer.learning_rate_scale), or raise divergence_factor "
          "(0 turns this check off)")
