"""Multi-host set-up: ``jax.distributed.initialize`` when the environment asks for it.

Every process of a job runs the same command; this decides, from the environment, whether it is
one of several and how to find the others:

  TXF_COORDINATOR=host:port, TXF_NUM_PROCESSES=N, TXF_PROCESS_ID=i
      explicit (launch/local.py sets these; works on any cluster)
  TXF_DISTRIBUTED=auto
      ``jax.distributed.initialize()`` with no arguments: jax's cluster detection (Cloud TPU pods,
      SLURM, Open MPI, Kubernetes). launch/tpu_pod.sh and launch/slurm.sbatch set it.
  SLURM_STEP_NUM_TASKS > 1 (inside `srun` with several tasks; not the batch script itself)
      the same as TXF_DISTRIBUTED=auto
  TXF_DISTRIBUTED=off
      never initialise (e.g. one process per node of a SLURM allocation on purpose)

Options (all processes must agree):
  TXF_HEARTBEAT_TIMEOUT  seconds without heartbeats after which a process counts as lost: every
                         other process prints one ``txf: error: lost process N ...`` line naming the
                         run's last checkpoint and exits with status 75 (``EXIT_RESUMABLE``: run
                         the same command again to resume) instead of hanging (default 30)
  TXF_INIT_TIMEOUT       seconds to wait for all processes to connect (default 300)
  TXF_SHUTDOWN_TIMEOUT   seconds a finishing (or failing) process waits for the others at exit
                         (default 300)
  TXF_LOCAL_DEVICE_IDS   comma list of the accelerator ids this process drives, e.g. "0,1,2,3"
                         for one process per node on SLURM (jax's SLURM detection otherwise
                         gives each process only the GPU of its SLURM_LOCALID)

Failures are agreed (``stop_all``, ``start_failure_watch``): a process that fails (a ``TxfError``,
a bug, an error in a collective) publishes one line and its exit status in the coordination
service's key-value store; every other process polls it (a daemon thread, once a second), prints
the same line and exits with the same status, whatever collective its main thread waits in. A
process that dies without a word (``kill -9``, a lost host) or stops answering (``kill -STOP``, a
hung host) is found by txf's own heartbeat (``txf/alive/<i>`` in the store, read every second, and
a watchdog for a store that stops answering) within ``TXF_HEARTBEAT_TIMEOUT`` seconds: the others
say so in one line and exit 75. Losing process 0 takes the coordination service with it, which
ends every other process from inside jaxlib at once; the ``txf`` command's supervising parent
(txf.runtime.supervise) turns that into the same line and exit 75.
"""

import atexit
import os
import re
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import jax

from txf.runtime import agree, compile_cache
from txf.runtime import supervise
from txf.runtime.supervise import distributed_args  # noqa: F401  (re-exported: txf.parallel.distributed_args)
from txf.runtime import workdir as workdir_lib
from txf.core.errors import EXIT_RESUMABLE, TxfError, error_line

HEARTBEAT_TIMEOUT = supervise.HEARTBEAT_TIMEOUT  # default TXF_HEARTBEAT_TIMEOUT, seconds
ACK_TIMEOUT = 10.0                   # seconds a failing process waits for the others to see it
_FAILURE_KEY = "txf/failure"
_state: Dict[str, Any] = {"client": None, "heartbeat": HEARTBEAT_TIMEOUT, "workdir": "",
                          "done": False, "lock": threading.Lock(), "threads": []}


def maybe_initialize(env: Mapping[str, str] = os.environ) -> bool:
  """Initialise jax.distributed if the environment says so (see the module docstring).

  Call before anything touches a jax device. Returns True when running as one process of several.
  """
  args = distributed_args(env)
  if args is None:
    return False
  _state["heartbeat"] = args["heartbeat_timeout_seconds"]
  # txf's own beat (start_failure_watch) names a lost process within TXF_HEARTBEAT_TIMEOUT; jax's
  # heartbeat check, which aborts the process with a core dump, gets twice that and 10 s more
  args = dict(args, heartbeat_timeout_seconds=2 * args["heartbeat_timeout_seconds"] + 10)
  _initialize(args)
  if jax.process_count() > 1:
    if not compile_cache.serves_multi_process(jax.__version__, jax.default_backend()):
      compile_cache.force_off(jax.config)
    start_failure_watch()
  return jax.process_count() > 1


def _initialize(args: Dict[str, Any]) -> None:
  """``jax.distributed.initialize(**args)``; keeps its runtime client for the failure watch."""
  from jax._src import distributed as jax_distributed  # pylint: disable=import-outside-toplevel
  jax.distributed.initialize(**args)
  _state["client"] = jax_distributed.global_state.client
  supervise.write_note("processes", str(jax.process_count()))
  atexit.register(_finished_normally)  # runs before jax's own shutdown (LIFO)


def note_workdir(workdir: str) -> None:
  """The run directory whose last checkpoint a lost-process message names (here, and in the
  supervising parent's, txf.runtime.supervise)."""
  _state["workdir"] = workdir
  supervise.write_note("workdir", workdir)


def _say_and_exit(line: str, status: int) -> None:
  """Print ``line`` on stderr (once per process) and end the process now with ``status``."""
  if not _state["lock"].acquire(blocking=False):
    time.sleep(3600)  # another thread is already ending this process
  _state["done"] = True
  _say_and_exit_now(line, status)


def _peer_lost(status=None, *_) -> None:
  """txf's heartbeat verdict (the failure watch): a peer (or the coordinator) is gone."""
  if _state["done"]:
    return
  text = str(status or "")
  found = re.findall(r"task[:_ ](\d+)", text)
  me = jax.process_index()
  lost = sorted({int(t) for t in found} - {me})
  who = (f"process {', '.join(map(str, lost))}" if lost else
         "process 0 (the coordinator)" if me != 0 else "a process")
  _say_and_exit(error_line(f"lost {who} of {jax.process_count()} (no heartbeat for "
                f"{_state['heartbeat']} s, TXF_HEARTBEAT_TIMEOUT){_checkpoint_words()}: run the "
                f"same command again to resume"), EXIT_RESUMABLE)


def _checkpoint_words() -> str:
  """'; the run's last checkpoint: step S (DIR)' for the noted workdir ('' without one)."""
  workdir = _state["workdir"]
  return f"; the run's last checkpoint: {workdir_lib.last_checkpoint(workdir)}" if workdir else ""


def _finished_normally() -> None:
  """At a normal exit: tell the others this process is done, not lost, then stop watching.

  The watch threads are joined here, before the interpreter finalises: a daemon thread still
  inside a blocking call of the runtime client when Python finalises is ended by ``pthread_exit``,
  whose unwinding through the extension's C++ frames aborts the process (status -6)."""
  client = _state["client"]
  if client is not None and not _state["done"]:
    try:
      client.key_value_set(f"txf/alive/{jax.process_index()}", "done", allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except
      pass
  _state["done"] = True
  for thread in _state["threads"]:
    if thread is not threading.current_thread():
      thread.join(timeout=5.0)  # each wakes within a second or so (sleep 1 s, a 1 s blocking get)


def start_failure_watch() -> None:
  """Daemon threads: one beats (``txf/alive/<i>`` counts up every second); the other ends this
  process with the line and status another process published (``stop_all``) within about a
  second, or with the lost-process line (exit 75) when a peer's beat has not moved for
  ``TXF_HEARTBEAT_TIMEOUT`` seconds (the coordinator's: its store cannot be read)."""
  client = _state["client"]
  me, count = jax.process_index(), jax.process_count()
  others = [p for p in range(count) if p != me]
  bound = float(_state["heartbeat"])

  def beat():
    n, last = 0, time.monotonic()
    while not _state["done"]:
      now = time.monotonic()
      if now - last > bound and not _state["done"]:  # this process itself was stopped (kill -STOP)
        _say_and_exit(error_line(
            f"process {me} of {count} was stopped for {now - last:.0f} s, longer than "
            f"TXF_HEARTBEAT_TIMEOUT={bound:.0f} s: the others have ended the "
            f"run{_checkpoint_words()}: run the same command again to resume"), EXIT_RESUMABLE)
      last = now
      n += 1
      try:
        client.key_value_set(f"txf/alive/{me}", str(n), allow_overwrite=True)
      except Exception:  # pylint: disable=broad-except
        pass
      time.sleep(1.0)

  seen = {p: (None, time.time()) for p in others}

  def silent() -> list:
    now, lost = time.time(), []
    for p in others:
      try:
        value = client.key_value_try_get(f"txf/alive/{p}")
      except Exception:  # pylint: disable=broad-except  # not yet written, or the store is gone
        value = None
      if value == "done":
        seen[p] = (value, now + 1e9)
      elif value is not None and value != seen[p][0]:
        seen[p] = (value, now)
      elif now - seen[p][1] > bound:
        lost.append(p)
    return lost

  _state["round"] = time.time()

  def watch():
    while not _state["done"]:
      _state["round"] = time.time()
      lost = silent()
      if lost and not _state["done"]:
        _peer_lost(" ".join(f"task:{p}" for p in lost) if (me == 0 or len(lost) < len(others))
                   else "the coordinator")
      try:
        value = client.blocking_key_value_get(_FAILURE_KEY, 1000)
      except Exception:  # pylint: disable=broad-except  # nothing yet (or the service is gone)
        time.sleep(0.2)
        continue
      status, origin, line = value.split("|", 2)
      if int(origin) == me or _state["done"]:
        return
      if not _state["lock"].acquire(blocking=False):
        time.sleep(3600)  # another thread is already ending this process
      _state["done"] = True
      _acknowledge_and_exit(client, int(status), line)

  def watchdog():  # the store does not answer (a stopped coordinator): the watch is stuck in it
    stale = 0
    while not _state["done"]:
      time.sleep(1.0)
      # twice in a row: after this process itself was stopped and continued, the watch names
      # the silent peer first
      stale = stale + 1 if time.time() - _state["round"] > bound + 2 else 0
      if stale >= 2 and not _state["done"]:
        _peer_lost("the coordinator" if me != 0 else "")

  _state["threads"] = [threading.Thread(target=beat, name="txf-heartbeat", daemon=True),
                       threading.Thread(target=watch, name="txf-failure-watch", daemon=True),
                       threading.Thread(target=watchdog, name="txf-watchdog", daemon=True)]
  for thread in _state["threads"]:
    thread.start()


def stop_all(line: str, status: int) -> None:
  """This process failed: print ``line``, make every other process print it and exit with
  ``status`` too (waiting up to ACK_TIMEOUT s for them to see it), then exit. With one process
  (or before jax.distributed is up) it returns, and the caller exits as usual."""
  client = _state["client"]
  if client is None or jax.process_count() == 1:
    return
  if not _state["lock"].acquire(blocking=False):
    time.sleep(3600)  # the failure watch is already ending this process with another's failure
  _state["done"] = True
  me, count = jax.process_index(), jax.process_count()
  try:
    client.key_value_set(_FAILURE_KEY, f"{status}|{me}|{line}")
  except Exception:  # pylint: disable=broad-except  # another process's failure came first
    first = _published_failure(client)
    if first is not None and first[1] != me:  # stop with it now, as the failure watch would:
      _acknowledge_and_exit(client, first[0], first[2])  # its process waits for this
  deadline = time.time() + ACK_TIMEOUT
  for p in range(count):
    if p == me:
      continue
    try:
      client.blocking_key_value_get(f"txf/ack/{p}", max(1, int(1000 * (deadline - time.time()))))
    except Exception:  # pylint: disable=broad-except  # gone already, or failed itself
      pass
  if me == 0:  # the coordination service lives here: let the others exit before it goes away
    time.sleep(3.0)
  _say_and_exit_now(line, status)


def _published_failure(client) -> Optional[Tuple[int, int, str]]:
  """(status, process, line) of the failure a process published with ``stop_all``, or None."""
  try:
    value = client.key_value_try_get(_FAILURE_KEY)
  except Exception:  # pylint: disable=broad-except  # none, or the store is gone
    return None
  status, origin, line = value.split("|", 2)
  return int(status), int(origin), line


def _acknowledge_and_exit(client, status: int, line: str) -> None:
  """Another process published a failure: tell it this process has seen it, then exit with its
  ``line`` and ``status`` (process 0, which holds the coordination service, after giving the
  others time to exit first)."""
  try:
    client.key_value_set(f"txf/ack/{jax.process_index()}", "1")
  except Exception:  # pylint: disable=broad-except
    pass
  if jax.process_index() == 0:
    time.sleep(3.0)
  _say_and_exit_now(line, status)


def _say_and_exit_now(line: str, status: int) -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  try:
    os.write(2, (line.rstrip("\n") + "\n").encode())
  except OSError:
    pass
  os._exit(status)


def is_collective_failure(error: BaseException) -> bool:
  """Whether ``error`` looks like a collective whose peer went away (gloo / coordination errors),
  which the heartbeat check will name; a plain bug is reported at once."""
  text = f"{type(error).__name__}: {error}"
  return jax.process_count() > 1 and bool(re.search(
      r"[Gg]loo|[Cc]onnection|[Pp]eer|UNAVAILABLE|DEADLINE_EXCEEDED|coordination|heartbeat", text))


def fail(error: BaseException) -> None:
  """Several processes and an exception that is not a ``TxfError``: a lost peer (a collective
  broke) waits for the heartbeat verdict (exit 75); a bug prints its traceback and stops every
  process with one line naming it (exit 1). Returns with one process."""
  if _state["client"] is None or jax.process_count() == 1:
    return
  if is_collective_failure(error):
    deadline = time.time() + _state["heartbeat"] + 15
    while time.time() < deadline:       # _peer_lost ends the process when the heartbeat says so
      time.sleep(0.5)
  traceback.print_exc()
  first = (str(error).strip().splitlines() or [""])[0][:300]
  stop_all(error_line(f"process {jax.process_index()} failed with {type(error).__name__}: "
                      f"{first} (a bug: its traceback is in process {jax.process_index()}'s "
                      f"output)"), 1)


def describe() -> str:
  """'process i of n, l local / g global devices (platform)' for logs."""
  return (f"process {jax.process_index()} of {jax.process_count()}, {jax.local_device_count()} local / "
          f"{jax.device_count()} global {jax.devices()[0].platform} devices")


def main_first(fn: Callable[[], int], name: str) -> int:
  """Run ``fn() -> int`` on process 0 alone, then meet every process at a barrier; returns
  process 0's result on every process.

  The barrier is a broadcast of process 0's outcome (``agree.broadcast_json``), so nobody reads
  what ``fn`` writes before it is done, and a failure there stops everyone at once instead of
  leaving the others waiting: a ``TxfError`` raised by ``fn`` is raised on process 0 as it is and
  on the others as a ``TxfError`` with the same message, whole (one ``txf: error:`` line and exit 2
  everywhere); any other exception is re-raised on process 0 and the others raise a RuntimeError
  naming ``name``. With one process, simply ``fn()``.
  """
  if jax.process_count() == 1:
    return fn()
  outcome, error = {"status": 0, "result": 0, "message": ""}, None
  if jax.process_index() == 0:
    try:
      outcome["result"] = int(fn())
    except TxfError as e:
      outcome, error = {"status": 1, "result": 0, "message": str(e)}, e
    except BaseException as e:  # a bug on process 0: the others must not wait for it
      outcome, error = {"status": 2, "result": 0, "message": ""}, e
  outcome = agree.broadcast_json(outcome)
  if error is not None:
    raise error
  if outcome["status"] == 1:
    raise TxfError(outcome["message"])
  if outcome["status"] == 2:
    raise RuntimeError(f"process 0 failed during {name}: see its traceback")
  return int(outcome["result"])
