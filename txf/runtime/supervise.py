"""A supervising parent for each process of a multi-process job, so that losing the coordinator is
one line and exit 75 like losing any other process.

Process 0 of a ``jax.distributed`` job hosts the coordination service. When it dies (or its host
does), every other process's runtime client sees the service gone within a fraction of a second
and ends its process from a C++ thread (jaxlib 0.10: ``std::bad_cast`` and an abort; newer: a
fatal log line), with dozens of lines of C++ and thread dumps and an exit status a scheduler
cannot tell from a crash. Nothing inside that process can stop it. So ``txf`` runs the real work
in a child process (the same command, ``TXF_SUPERVISED=1``) and waits: the child's stdout is
passed straight through, its stderr line by line until the runtime client's "the service is gone"
lines appear; from then on the parent holds the rest back and, when the child has ended, prints
one line naming the lost coordinator and the run's last checkpoint and exits with
``EXIT_RESUMABLE`` (75). A ``txf: error:`` line the child printed itself in that time (txf's own
heartbeat watch, txf.parallel.distributed, was first) is printed instead of the parent's, and
one it printed just before (a stopped process, continued, says so and is then ended from inside
jaxlib before its own exit) is the only line.

Signals sent to the parent (SIGTERM, SIGHUP, SIGUSR1/2, and SIGINT unless it came from the
terminal, which sends it to the child too) are passed to the child; the child dies with the
parent (``PR_SET_PDEATHSIG`` on Linux). Any other ending of the child is the parent's: the same
status, or the same signal. This module imports no jax.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Mapping, Optional

from txf.runtime import process as runtime
from txf.core.config import ConfigError
from txf.core.errors import EXIT_RESUMABLE, error_line, is_error_line

HEARTBEAT_TIMEOUT = 30               # default TXF_HEARTBEAT_TIMEOUT, seconds
SUPERVISED_ENV = "TXF_SUPERVISED"    # set in the child: it runs the command itself
NOTES_ENV = "TXF_SUPERVISOR_NOTES"   # a file where the child writes its workdir and process count
# What a runtime client prints when the coordination service has gone away: from the first such
# line on, the child's stderr is held back.
SERVICE_GONE = re.compile(r"Polled an error from coordination service|Terminating process because"
                          r"|coordination service .*(unavailable|has shut down)|std::bad_cast"
                          r"|Failed to cancel preemption barrier")
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)


def distributed_args(env: Mapping[str, str] = os.environ) -> Optional[Dict[str, Any]]:
  """The keyword arguments for ``jax.distributed.initialize`` the environment asks for, or None
  (txf.parallel.distributed's module docstring lists the variables).

  Raises ConfigError for an incomplete explicit set-up (names the missing variables).
  """
  mode = env.get("TXF_DISTRIBUTED", "").strip().lower()
  if mode in ("off", "0", "false", "no"):
    return None
  args: Dict[str, Any] = {}
  if env.get("TXF_COORDINATOR"):
    missing = [k for k in ("TXF_NUM_PROCESSES", "TXF_PROCESS_ID") if not env.get(k)]
    if missing:
      raise ConfigError(f"TXF_COORDINATOR={env['TXF_COORDINATOR']} is set but {', '.join(missing)} "
                        f"is not: set all three (launch/local.py does)")
    args.update(coordinator_address=env["TXF_COORDINATOR"],
                num_processes=int(env["TXF_NUM_PROCESSES"]), process_id=int(env["TXF_PROCESS_ID"]))
  elif mode in ("auto", "1", "true", "yes"):
    pass  # jax detects the cluster (TPU pod metadata, SLURM variables, ...)
  elif int(env.get("SLURM_STEP_NUM_TASKS", "1") or 1) > 1:
    pass
  else:
    return None
  args["heartbeat_timeout_seconds"] = int(env.get("TXF_HEARTBEAT_TIMEOUT", "") or HEARTBEAT_TIMEOUT)
  args["initialization_timeout"] = int(env.get("TXF_INIT_TIMEOUT", "300"))
  args["shutdown_timeout_seconds"] = int(env.get("TXF_SHUTDOWN_TIMEOUT", "300"))
  if env.get("TXF_LOCAL_DEVICE_IDS"):
    args["local_device_ids"] = [int(i) for i in env["TXF_LOCAL_DEVICE_IDS"].split(",") if i.strip()]
  return args


def write_note(key: str, value: str) -> None:
  """In a supervised child: tell the parent ``key`` (``workdir`` or ``processes``)."""
  path = os.environ.get(NOTES_ENV)
  if path:
    try:
      with open(path, "a", encoding="utf-8") as f:
        f.write(f"{key}={value}\n")
    except OSError:
      pass


def _read_notes(path: str) -> Dict[str, str]:
  try:
    with open(path, encoding="utf-8") as f:
      return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
  except OSError:
    return {}


def _die_with_parent() -> None:
  """In the child, before exec: SIGKILL when the parent dies (Linux; elsewhere nothing)."""
  try:
    import ctypes  # pylint: disable=import-outside-toplevel
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


def _lost_coordinator_line(notes: Dict[str, str], env: Mapping[str, str]) -> str:
  processes = notes.get("processes") or env.get("TXF_NUM_PROCESSES", "?")
  checkpoint = ""
  if notes.get("workdir"):
    from txf.runtime import workdir as workdir_lib  # pylint: disable=import-outside-toplevel  # jax: only now
    checkpoint = f"; the run's last checkpoint: {workdir_lib.last_checkpoint(notes['workdir'])}"
  return error_line(f"lost process 0 (the coordinator) of {processes}: its coordination service "
                    f"is gone{checkpoint}: run the same command again to resume")


def supervise(argv: List[str], env: Mapping[str, str] = os.environ) -> None:
  """Run ``txf`` (``argv[1:]``) in a supervised child and exit as described in the module doc,
  when this is one process of a multi-process job and not the child itself; else return."""
  if env.get(SUPERVISED_ENV) or distributed_args(env) is None:
    return
  fd, notes = tempfile.mkstemp(prefix="txf-supervisor-")
  os.close(fd)
  child_env = runtime.same_code_env(dict(env, **{SUPERVISED_ENV: "1", NOTES_ENV: notes}))
  sys.stdout.flush()
  child = subprocess.Popen(runtime.txf_argv(argv[1:]), env=child_env,
                           stderr=subprocess.PIPE, preexec_fn=_die_with_parent)

  def forward(signum, _frame):
    if signum == signal.SIGINT and _from_terminal():
      return  # the terminal sent it to the whole foreground group: the child has it
    try:
      child.send_signal(signum)
    except OSError:
      pass

  for signum in FORWARDED:
    signal.signal(signum, forward)
  held: List[bytes] = []
  said = False  # the child printed its own txf: error: line before the service went
  for line in iter(child.stderr.readline, b""):
    if held or SERVICE_GONE.search(line.decode("utf-8", "replace")):
      held.append(line)
      continue
    os.write(2, line)
    said = said or is_error_line(line)
  status = child.wait()
  notes_read = _read_notes(notes)
  os.unlink(notes)
  if held and status != 0:
    own = [l for l in held if is_error_line(l)]
    if not said:  # one line in all: the child's own, else the parent's
      os.write(2, own[0] if own else (_lost_coordinator_line(notes_read, env) + "\n").encode())
    sys.exit(status if (said or own) and status > 0 else EXIT_RESUMABLE)
  for line in held:
    os.write(2, line)
  if status < 0:
    signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
  sys.exit(status)


def _from_terminal() -> bool:
  """Whether this process is in the foreground group of its terminal (a Ctrl-C reached the child
  too)."""
  try:
    return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
  except (OSError, ValueError, AttributeError):
    return False
