"""Profiles of chosen steps: ``--config.profile_steps=START:END`` traces steps START..END-1.

Steps are numbered as in metrics.jsonl (the first optimizer step is step 1). The trace
(``jax.profiler.start_trace``) begins just before step START and ends after step END-1 has
finished on the devices; it is written under ``WORKDIR/profile/`` (``plugins/profile/<run>/
<host>.xplane.pb``, one file per process; a bucket workdir's trace is written in a local temporary
folder and copied up when it stops), which xprof and TensorBoard's profile plugin open:
``tensorboard --logdir WORKDIR/profile`` (with ``pip install tensorboard tensorboard-plugin-profile``)
or ``xprof --logdir WORKDIR/profile``. The first step a process runs compiles the step, so it is
never traced: a range that starts there starts one step later. The other steps pay one integer
comparison before and after each step.
"""

import os
import shutil
import tempfile
from typing import Optional, Tuple

import jax

from txf.runtime import storage
from txf.core.config import ConfigError

PROFILE_DIR = "profile"


def parse_steps(spec: str) -> Optional[Tuple[int, int]]:
  """"START:END" -> (START, END) with 1 <= START < END; "" -> None (no profile). Raises ConfigError."""
  if not spec:
    return None
  try:
    start, end = (int(p) for p in str(spec).split(":"))
  except ValueError:
    start = end = 0
  if not 1 <= start < end:
    raise ConfigError(f"profile_steps={spec!r} must be START:END with 1 <= START < END (steps START "
                      f"to END-1 are traced), e.g. profile_steps=10:13")
  return start, end


class StepProfiler:
  """Starts and stops the trace around the steps ``config.profile_steps`` names.

  Call ``before(step)`` with the number of steps done before each step and ``after(step, state)``
  with the number done after it; ``close()`` stops a trace still running when training ends early.
  """

  def __init__(self, spec: str, workdir: str, first_step: int):
    """``first_step``: steps done when this process starts (its next step is the compiling one)."""
    steps = parse_steps(spec)
    self.directory = storage.join(workdir, PROFILE_DIR)
    self.local = None  # where the trace is written: the directory, or a bucket's local stand-in
    self.start = self.end = -1
    if steps is not None:
      start, end = max(steps[0], first_step + 2), steps[1]
      if start < end:
        self.start, self.end = start, end
    self.running = False

  def before(self, done: int) -> None:
    """Before step ``done + 1``: start the trace when that step is START."""
    if done + 1 == self.start:
      if storage.is_local(self.directory):
        self.local = self.directory
        os.makedirs(self.directory, exist_ok=True)
      else:  # jax's profiler writes local files only
        self.local = tempfile.mkdtemp(prefix="txf-profile-")
      jax.profiler.start_trace(self.local)
      self.running = True

  def after(self, done: int, state) -> None:
    """After step ``done``: when it is END-1, wait for its result on the devices and stop the trace."""
    if self.running and done + 1 >= self.end:
      self.close(state)

  def close(self, state=None) -> None:
    """Stop a running trace (after ``state`` is ready, if given)."""
    if self.running:
      if state is not None:
        jax.block_until_ready(state)
      jax.profiler.stop_trace()
      self.running = False
      if self.local != self.directory:
        storage.upload_tree(self.local, self.directory)
        shutil.rmtree(self.local, ignore_errors=True)
