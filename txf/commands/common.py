"""Flags and error handling shared by the commands."""

import functools
import logging
import os
import select
import signal
import sys
import traceback

from absl import flags

from txf.core.errors import EXIT_USER, TxfError, error_line, exit_status  # noqa: F401  (error_line: re-exported)
from txf.core.config import experiment_path

flags.DEFINE_bool("verbose_errors", False, "show the full traceback of user errors")


class _StderrHandler(logging.StreamHandler):
  """A StreamHandler on whatever ``sys.stderr`` is when a record comes (tests swap it)."""

  def emit(self, record) -> None:
    self.stream = sys.stderr
    super().emit(record)


def show_preparations(stream=None) -> None:
  """Print the data layer's one line per data preparation (the ``txf.data.prepared`` logger's
  records, 'txf: prepared NAME: ... examples -> PATH') on stderr, whatever the log verbosity.
  Idempotent: a second call adds no second handler."""
  logger = logging.getLogger("txf.data.prepared")
  if not any(getattr(h, "txf_preparations", False) for h in logger.handlers):
    handler = _StderrHandler() if stream is None else logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.txf_preparations = True
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False  # not again through the root handlers


def fail(message: str, verbose_errors: bool = False, status: int = EXIT_USER) -> None:
  """Print one ``txf: error: MESSAGE`` line on stderr (after the traceback of the exception being
  handled when ``verbose_errors``) and exit with ``status``, 2 (``EXIT_USER``) unless told: the one
  place txf prints a user error."""
  if verbose_errors:
    traceback.print_exc()
  print(error_line(message), file=sys.stderr)
  sys.exit(status)


def guarded(fn):
  """Run a command's main; a ``txf.core.errors.TxfError`` (bad input) becomes one ``txf: error:`` line
  on stderr and exit status 2 (75 for a resumable one under a requeueing launcher:
  ``txf.core.errors.exit_status``). Every other exception is a bug and keeps its traceback. In a
  job of several processes every process stops with the same line and status
  (``txf.parallel.distributed.stop_all``)."""

  @functools.wraps(fn)
  def wrapper(argv):
    try:
      return fn(argv)
    except TxfError as e:
      if flags.FLAGS.verbose_errors:
        traceback.print_exc()
      status = exit_status(e)
      _distributed().stop_all(error_line(e), status)  # several processes: all stop with it
      fail(str(e), status=status)
    except BrokenPipeError:
      if not _stdout_closed():
        raise
      # the reader of stdout is gone (`txf info | head -1`): stop quietly, as a shell tool does
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
      sys.exit(128 + signal.SIGPIPE)
    except Exception as e:  # pylint: disable=broad-except
      _distributed().fail(e)  # several processes: a lost peer (exit 75) or a bug stops them all
      raise

  return wrapper


def _stdout_closed() -> bool:
  """Whether stdout is a pipe whose reader has closed it (its write end polls as an error)."""
  try:
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))
  except (AttributeError, OSError, ValueError):  # no poll here, or no stdout
    return False


def _distributed():
  """txf.parallel.distributed, imported only on a failure (it imports jax, seconds at start-up)."""
  from txf.parallel import distributed  # pylint: disable=import-outside-toplevel
  return distributed


def repo_experiments_dir() -> str:
  """experiments/ next to the txf package (an editable install or a source checkout)."""
  return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "experiments")


def default_config_path() -> str:
  """experiments/default.py of the checkout, or the copy packaged with an installed txf."""
  return experiment_path("default")
