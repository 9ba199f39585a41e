"""The one exception type for errors in what a user gave txf.

``TxfError`` (and its subclasses: ``ConfigError``, ``DataError``, ``RunConflictError``,
``NonFiniteLossError``, ...) means the input is at fault: a config that cannot work, a missing or
malformed file, an occupied workdir. ``txf`` prints such an error as one ``txf: error: ...`` line
naming the problem and the fix, and exits with status 2. Every other exception is a bug inside txf
and keeps its traceback. This module imports only the standard library, so every layer may raise it.

Exit statuses of ``txf`` (a scheduler may act on them):
  0   done, or stopped by a signal after writing its checkpoint (run it again to go on)
  1   a bug inside txf (with its traceback), or on another process of the job
  2   ``TxfError``: fix the input (config, data, workdir) and run again
  75  ``EXIT_RESUMABLE`` (EX_TEMPFAIL): the run stopped before its end and its last checkpoint is
      intact (a lost peer process, a requested requeue): run the same command again to resume

Under a launcher that requeues on 75 (it sets ``TXF_EXIT_RESUMABLE_ON_SIGNAL=1``: launch/slurm.sbatch,
launch/tpu_pod.sh, launch/gke_jobset.sh), a run stopped by a signal exits 75 instead of 0, and so
does a ``TxfError`` whose cause passes by itself with the checkpoints intact (``resumable``: a full
disk), instead of 2 (``exit_status``).
"""

import os
from typing import Mapping

EXIT_USER = 2
EXIT_RESUMABLE = 75
# set to 1 by a launcher that requeues a job on EXIT_RESUMABLE
REQUEUE_ENV = "TXF_EXIT_RESUMABLE_ON_SIGNAL"


def requeued(environ: Mapping[str, str] = os.environ) -> bool:
  """Whether a launcher that requeues on ``EXIT_RESUMABLE`` runs this process (``REQUEUE_ENV``)."""
  return environ.get(REQUEUE_ENV, "").strip() not in ("", "0")

# The start of the one line that reports an error on stderr; every process of txf writes it with
# error_line (the commands, the workers of a multi-process job, the jax-free supervising parent) and
# reads it back with is_error_line (the supervisor, the sweep runner).
ERROR_PREFIX = "txf: error: "


def error_line(message) -> str:
  """The one-line form of an error: ``txf: error: MESSAGE`` (``message``: text, or an exception)."""
  return f"{ERROR_PREFIX}{message}"


def is_error_line(line) -> bool:
  """Whether ``line`` (str or bytes, as read from a child's stderr) is such a line."""
  prefix = ERROR_PREFIX.rstrip()
  return line.startswith(prefix.encode() if isinstance(line, bytes) else prefix)


class TxfError(Exception):
  """Bad input, found on purpose by txf: the message names the problem and the fix.

  ``resumable``: the run's checkpoints are intact and the same command goes on once the cause has
  passed by itself (a full disk that another job frees); a requeueing launcher requeues it."""

  resumable = False


def exit_status(error: BaseException, environ: Mapping[str, str] = os.environ) -> int:
  """The exit status for a ``TxfError``: ``EXIT_RESUMABLE`` when it is ``resumable`` and a
  requeueing launcher runs the process (``requeued``), else ``EXIT_USER``."""
  return EXIT_RESUMABLE if getattr(error, "resumable", False) and requeued(environ) else EXIT_USER


class ConfigError(TxfError, ValueError):
  """A config that cannot work; the message names the field and the fix (``txf.core.config``)."""


# How libraries word the disk failures of OSError errnos (ENOSPC 28, EDQUOT 122, EROFS 30) when they
# re-raise them as other types: TensorStore (orbax's array writer) raises ValueError with the OS text.
DISK_FAILURE_TEXTS = {"no space left on device": 28, "disk quota exceeded": 122,
                      "read-only file system": 30}


def disk_errno_of(exc: BaseException) -> int:
  """The errno of a disk failure (full, over quota, read-only) behind ``exc``, else 0: an OSError's
  errno in (28, 122, 30), or such a failure's text in any exception of its cause/context chain."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if isinstance(exc, OSError) and exc.errno in (28, 122, 30):
      return exc.errno
    text = str(exc).lower()
    for phrase, number in DISK_FAILURE_TEXTS.items():
      if phrase in text:
        return number
    exc = exc.__cause__ or exc.__context__
  return 0
