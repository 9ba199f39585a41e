"""The terminal side of ``txf train``: its lines on stdout, the progress bar, signals on stderr, and
a stdout/stderr whose reader went away.

``TerminalReporter`` is the ``txf.train.report.Reporter`` the command hands to ``train``: it prints
the run's lines and, with ``progress``, draws a tqdm bar on stderr (the logged rows then show on the
bar instead of as lines). A notebook may pass one too: ``train(config, workdir,
report=TerminalReporter(progress=True))``.

Broken pipes: once training starts, a closed stdout or stderr (``txf train | tee log`` whose reader
died, e.g. on Ctrl-C) no longer fails the run: txf's further output is dropped
(``drop_output_on_broken_pipe``), so the stop checkpoint is still written and the run exits 0.
"""

import errno
import os
import re
import sys
import threading
import warnings
from typing import Dict, Optional

from tqdm import tqdm

from txf.core.errors import disk_errno_of

from txf.train.logs import log_line
from txf.train.report import Reporter


class TerminalReporter(Reporter):
  """Prints a training run's lines on stdout; with ``progress``, a progress bar on stderr shows
  the steps and the last logged loss and accuracy (no line per logged row then)."""

  def __init__(self, progress: bool = False):
    self.progress = progress
    self.bar = None

  def line(self, text: str) -> None:
    """Print ``text`` on stdout, flushed."""
    print(text, flush=True)

  def start(self, total: int, done: int) -> None:
    """Open the progress bar (with ``progress``) at ``done`` of ``total`` steps."""
    if self.progress:
      self.bar = tqdm(total=total, initial=done, dynamic_ncols=True, desc="train")

  def step(self, done: int) -> None:
    """Move the bar on by one step."""
    if self.bar is not None:
      self.bar.update(1)

  def train_row(self, step: int, total: int, metrics: Dict[str, float],
                eta_seconds: Optional[float]) -> None:
    """The row's loss and accuracy on the bar, or without one its line (``logs.log_line``)."""
    if self.bar is not None:
      self.bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['accuracy']:.3f}")
    else:
      self.line(log_line(step, total, metrics, eta_seconds))

  def evaluating(self) -> None:
    """Clear the bar so the evaluation's lines print cleanly."""
    if self.bar is not None:
      self.bar.clear()

  def signal(self, text: str) -> None:
    """Write ``text`` to fd 2 (safe in a signal handler); a closed stderr is ignored."""
    try:
      os.write(2, text.encode())
    except OSError:
      pass

  def close(self) -> None:
    """Close the bar."""
    if self.bar is not None:
      self.bar.close()
      self.bar = None


class _DropOnBrokenPipe:
  """A text stream that drops its output once its reader is gone (EPIPE) instead of raising.

  Flushes after every write, so a closed pipe shows up here and not in a buffered flush at exit;
  on EPIPE the file descriptor is pointed at /dev/null, so later writes through any other handle
  on it (the interpreter's final flush included) succeed too.
  """

  def __init__(self, stream):
    self._stream = stream

  def _guard(self, fn, *args):
    try:
      out = fn(*args)
      self._stream.flush()
      return out
    except (BrokenPipeError, ValueError) as e:  # ValueError: already closed
      if isinstance(e, ValueError) and "closed" not in str(e):
        raise
      self._to_devnull()
      return None
    except OSError as e:
      if e.errno != errno.EPIPE:
        raise
      self._to_devnull()
      return None

  def _to_devnull(self):
    try:
      devnull = os.open(os.devnull, os.O_WRONLY)
      os.dup2(devnull, self._stream.fileno())
      os.close(devnull)
    except (OSError, ValueError):
      pass

  def write(self, text):
    out = self._guard(self._stream.write, text)
    return len(text) if out is None else out

  def flush(self):
    self._guard(lambda: None)

  def __getattr__(self, name):
    return getattr(self._stream, name)


# A traceback printed from a storage thread once orbax has closed a failed save's event loop (a
# full disk: one per write still in flight, hundreds of lines before txf's one line): only
# asyncio's frames, then this error.
_CLOSED_LOOP_NOISE = re.compile(r"Traceback \(most recent call last\):\n"
                                r"(?:  File \"[^\n]*asyncio[^\n]*\n(?:    [^\n]*\n)?)+"
                                r"RuntimeError: Event loop is closed\n$")


class _WithoutClosedLoopNoise:
  """A text stream that drops the "Event loop is closed" tracebacks of ``_CLOSED_LOOP_NOISE``.

  A write that starts a traceback is held, per thread (tracebacks of several threads
  interleave), until its exception line ends it; the block is then dropped if it is that noise and
  written out otherwise. Everything else is written at once.
  """

  def __init__(self, stream):
    self._stream = stream
    self._held: Dict[int, str] = {}

  def write(self, text):
    me = threading.get_ident()
    held = self._held.get(me)
    if held is None and not text.startswith("Traceback (most recent call last):"):
      return self._stream.write(text)
    held = (held or "") + text
    lines = held.split("\n")
    # the block ends at its first complete line that is neither the header nor indented (a frame)
    ended = any(line and not line.startswith((" ", "Traceback (most recent call last):"))
                for line in lines[:-1])
    if not ended:
      self._held[me] = held
      return len(text)
    del self._held[me]
    if not _CLOSED_LOOP_NOISE.fullmatch(held):
      self._stream.write(held)
    return len(text)

  def flush(self):
    self._stream.flush()

  def __getattr__(self, name):
    return getattr(self._stream, name)


def one_line_warnings(categories) -> None:
  """From now on a warning of one of ``categories`` (txf's own, e.g. an unreadable checkpoint
  moved aside) is one ``txf: warning: MESSAGE`` line on stderr, not Python's two lines naming the
  source; every other warning is shown as before."""
  shown = warnings.showwarning

  def show(message, category, filename, lineno, file=None, line=None):
    if isinstance(message, tuple(categories)) or (isinstance(category, type)
                                                 and issubclass(category, tuple(categories))):
      print(f"txf: warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
      return
    shown(message, category, filename, lineno, file, line)

  warnings.showwarning = show


def quiet_full_disk_in_threads() -> None:
  """From now on a background thread that dies of a full disk (TensorBoard's event writer) says
  nothing: the same disk fails txf's own next write (a metrics row, a checkpoint), which is the
  run's one ``txf: error:`` line. Any other exception in a thread is shown as before."""
  previous = threading.excepthook

  def hook(args) -> None:
    if args.exc_value is not None and disk_errno_of(args.exc_value) in (errno.ENOSPC, errno.EDQUOT):
      return
    previous(args)

  threading.excepthook = hook


def drop_closed_loop_noise() -> None:
  """From now on ``sys.stderr`` drops the tracebacks a failed background checkpoint write prints
  after its event loop closed (``_WithoutClosedLoopNoise``); the failure itself is raised by orbax
  and reported as one ``txf: error:`` line. For the command line only (replaces ``sys.stderr``)."""
  if sys.stderr is not None and not isinstance(sys.stderr, _WithoutClosedLoopNoise):
    sys.stderr = _WithoutClosedLoopNoise(sys.stderr)


def drop_output_on_broken_pipe() -> None:
  """From now on, writes to a stdout/stderr whose reader is gone are dropped, not raised (once per
  process; see ``_DropOnBrokenPipe``). For the command line only: it replaces ``sys.stdout`` and
  ``sys.stderr`` for the whole process."""
  for name in ("stdout", "stderr"):
    stream = getattr(sys, name)
    if stream is not None and not isinstance(stream, _DropOnBrokenPipe):
      setattr(sys, name, _DropOnBrokenPipe(stream))
