"""Running a sweep's runs: locally, N at a time, each a ``txf train`` subprocess; or written out as
shell commands or a SLURM job array for a scheduler.

A run is **complete** when its workdir holds a checkpoint at its last step (``num_train_steps``) and
its final parameters (``txf train`` writes params.msgpack after that checkpoint, at the end of the
run): a complete run is skipped. Any other run is started with the same ``txf train`` command,
which resumes it from its latest checkpoint if it has one. A run that fails (its process exits
non-zero) is reported with its log and does not stop the others.
"""

import dataclasses
import os
import shlex
import signal
import subprocess
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from txf.core.errors import is_error_line
from txf.runtime import process as runtime, workdir as workdir_lib
from txf.runtime.machine import CPUS_ENV
from txf.sweep.grid import Run, Sweep, SweepError
from txf.sweep.ledger import Ledger

POLL_SECONDS = 0.2   # how often the running processes are polled
STOP_SECONDS = 300   # after an interrupt: how long the runs have to write their checkpoints


def checkpoint_steps(workdir: str) -> List[int]:
  """The steps of the checkpoints in ``workdir/checkpoints/`` (numbered folders), ascending."""
  folder = workdir_lib.path_of(workdir, workdir_lib.CHECKPOINTS_DIR)
  if not os.path.isdir(folder):
    return []
  return sorted(int(n) for n in os.listdir(folder) if n.isdigit())


def is_complete(workdir: str, steps: int) -> bool:
  """Whether the run in ``workdir`` reached its last step ``steps``: a checkpoint at a step >=
  ``steps`` and its final parameters (params.msgpack, or a multi-process run's params/)."""
  done = checkpoint_steps(workdir)
  final = (os.path.exists(workdir_lib.path_of(workdir, workdir_lib.PARAMS_FILE))
           or os.path.isdir(workdir_lib.path_of(workdir, workdir_lib.SHARDED_PARAMS)))
  return bool(done) and done[-1] >= steps and final


def state_of(run: Run) -> str:
  """'complete', 'partial' (it has a checkpoint: it resumes) or 'new'."""
  if is_complete(run.workdir, run.steps):
    return "complete"
  return "partial" if checkpoint_steps(run.workdir) else "new"


def txf_command(run: Run) -> List[str]:
  """The process that trains ``run``: this Python's ``-P -m txf.cli train ...``
  (txf.runtime.process.txf_argv; with :func:`child_environment`, the same txf)."""
  return runtime.txf_argv(["train", *run.args])


def shell_command(run: Run) -> str:
  """``txf train ...`` for a shell (arguments quoted where needed)."""
  return shlex.join(["txf", "train", *run.args])


@dataclasses.dataclass
class Outcome:
  """How one run ended: status 'complete' (already, skipped), 'done', 'failed' or 'incomplete'
  (it exited 0 short of its last step: a time limit, or a stop); ``code`` its exit status."""
  run: Run
  status: str
  code: int = 0
  seconds: float = 0.0
  reason: str = ""


def last_error(log: str) -> str:
  """The ``txf: error:`` line of a run's log, else its last non-empty line ('' without a log)."""
  try:
    with open(log, encoding="utf-8", errors="replace") as f:
      lines = [line.rstrip() for line in f if line.strip()]
  except OSError:
    return ""
  errors = [line for line in lines if is_error_line(line)]
  return (errors or lines or [""])[-1]


def child_environment(parallel: int) -> Dict[str, str]:
  """The runs' environment: this one; several runs at once on one GPU share its memory
  (XLA_PYTHON_CLIENT_PREALLOCATE=false unless set: jax would otherwise take 75% per process)."""
  env = runtime.same_code_env(os.environ)
  if parallel > 1:
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  return env


def cpu_shares(parallel: int, cpus: Iterable[int]) -> List[str]:
  """``cpus`` split into ``parallel`` shares of equal size, each as a TXF_CPUS list (``0,1``);
  SweepError if there are fewer CPUs than shares."""
  cpus = sorted(cpus)
  size = len(cpus) // max(1, parallel)
  if size < 1:
    raise SweepError(f"--pin_cpus with --parallel={parallel}: this process may run on "
                     f"{len(cpus)} CPUs, fewer than the runs at once; lower --parallel")
  shares = [cpus[i * size:(i + 1) * size] for i in range(parallel)]
  return [",".join(str(c) for c in share) for share in shares]


def run_local(runs: Sequence[Run], parallel: int = 1, say: Callable[[str], None] = print,
              command: Callable[[Run], List[str]] = txf_command,
              env: Optional[Dict[str, str]] = None, ledger: Optional[Ledger] = None,
              cpus: Optional[Sequence[str]] = None) -> List[Outcome]:
  """Run ``runs`` as subprocesses, at most ``parallel`` at once, each writing its output to its
  log file (root/<arm>/seed-<k>.log, appended). Complete runs are skipped; one line per finished
  run goes to ``say``. With a ``ledger`` (txf.sweep.ledger) a run it records is skipped too, and
  every complete run it does not record yet, found on disk or just finished, is recorded. An
  interrupt (Ctrl-C, SIGTERM) is passed on to the running runs, which write a checkpoint and stop
  (each run is in a session of its own: the sweep sends it one SIGTERM); then KeyboardInterrupt is
  raised. With ``cpus`` (:func:`cpu_shares`, one share per run at once) each run gets a share
  that no other running run holds, as TXF_CPUS. Returns the outcomes in ``runs``' order."""
  env = child_environment(parallel) if env is None else env
  outcomes: Dict[int, Outcome] = {}
  todo = []
  for run in runs:
    if ledger is not None and ledger.get(run) is not None:
      outcomes[run.index] = Outcome(run, "complete", reason="recorded")
      say(f"[{len(outcomes)}/{len(runs)}] {run.label}: recorded in {ledger.path}, skipped")
    elif is_complete(run.workdir, run.steps):
      outcomes[run.index] = Outcome(run, "complete")
      if ledger is not None:
        ledger.add(run, None)
      say(f"[{len(outcomes)}/{len(runs)}] {run.label}: complete, skipped"
          + (f" (recorded in {ledger.path})" if ledger is not None else ""))
    else:
      todo.append(run)
  running: Dict[int, tuple] = {}   # index -> (run, process, start time, log file)
  free = list(cpus or ())          # the CPU shares no running run holds
  held: Dict[int, str] = {}        # index -> its share
  previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _main_thread() else None
  try:
    while todo or running:
      while todo and len(running) < max(1, parallel):
        run = todo.pop(0)
        os.makedirs(os.path.dirname(run.log) or ".", exist_ok=True)
        log = open(run.log, "a", encoding="utf-8")  # pylint: disable=consider-using-with
        argv = command(run)
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}\n")
        log.flush()
        run_env = env
        if free:
          held[run.index] = free.pop(0)
          run_env = {**env, CPUS_ENV: held[run.index]}
        # its own session: a Ctrl-C reaches the sweep alone, which passes on one SIGTERM
        process = subprocess.Popen(  # pylint: disable=consider-using-with
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=run_env,
            start_new_session=True)
        running[run.index] = (run, process, time.monotonic(), log)
      time.sleep(POLL_SECONDS)
      for index in [i for i, (_, p, _, _) in running.items() if p.poll() is not None]:
        run, process, start, log = running.pop(index)
        log.close()
        if index in held:
          free.append(held.pop(index))
        outcome = _outcome(run, process.returncode, time.monotonic() - start)
        if ledger is not None and outcome.status == "done":
          ledger.add(run, outcome.seconds)
        outcomes[index] = outcome
        say(f"[{len(outcomes)}/{len(runs)}] {describe(outcome)}")
  except KeyboardInterrupt:
    _stop(running, say)
    raise
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
  return [outcomes[r.index] for r in runs]


def _outcome(run: Run, code: int, seconds: float) -> Outcome:
  if code != 0:
    return Outcome(run, "failed", code, seconds, last_error(run.log))
  if is_complete(run.workdir, run.steps):
    return Outcome(run, "done", 0, seconds)
  steps = checkpoint_steps(run.workdir)
  return Outcome(run, "incomplete", 0, seconds,
                 f"stopped at step {steps[-1] if steps else 0} of {run.steps}: " + last_error(run.log))


def describe(outcome: Outcome) -> str:
  """The one status line of a finished run."""
  run = outcome.run
  if outcome.status == "done":
    return f"{run.label}: done in {outcome.seconds:.0f} s"
  if outcome.status == "complete":
    return f"{run.label}: complete, skipped"
  if outcome.status == "failed":
    return (f"{run.label}: FAILED (exit {outcome.code}) after {outcome.seconds:.0f} s: "
            f"{outcome.reason or 'no output'} (log: {run.log})")
  return f"{run.label}: INCOMPLETE after {outcome.seconds:.0f} s, {outcome.reason} (log: {run.log})"


def _raise_interrupt(signum, frame):  # pylint: disable=unused-argument
  raise KeyboardInterrupt


def _main_thread() -> bool:
  return threading.current_thread() is threading.main_thread()


def _stop(running: Dict[int, tuple], say: Callable[[str], None]) -> None:
  """Pass an interrupt on to the running runs (SIGTERM: each finishes its step and writes a
  checkpoint) and wait for them, at most STOP_SECONDS, then kill what is left."""
  if running:
    say(f"txf: interrupted: stopping {len(running)} run(s) at a checkpoint; run the same command "
        f"to resume")
  for _, process, _, _ in running.values():
    if process.poll() is None:
      process.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + STOP_SECONDS
  for _, process, _, log in running.values():
    try:
      process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
    log.close()


def emit_commands(sweep: Sweep) -> str:
  """One ``txf train`` shell command per run, one per line (for GNU parallel, a cluster queue)."""
  return "".join(shell_command(run) + "\n" for run in sweep.runs)


def emit_slurm(sweep: Sweep, sbatch: Sequence[str] = ()) -> str:
  """A SLURM job-array script with one array task per run: ``#SBATCH --array=0-(n-1)`` and a case
  statement on ``$SLURM_ARRAY_TASK_ID`` that runs that run's ``txf train``. ``sbatch`` lines
  (e.g. ``--gres=gpu:1``) are added as ``#SBATCH`` directives."""
  root = sweep.root
  lines = ["#!/bin/bash",
           f"# txf sweep {sweep.name}: {len(sweep.arms)} arm(s) x {len(sweep.seeds)} seed(s) = "
           f"{len(sweep.runs)} runs under {root}",
           f"# submit: sbatch THIS_FILE; then compare the arms: txf sweep report {shlex.quote(root)}",
           f"#SBATCH --job-name={shlex.quote('txf-sweep-' + sweep.name)}",
           f"#SBATCH --array=0-{len(sweep.runs) - 1}",
           f"#SBATCH --output={os.path.join(root, 'slurm-%A_%a.log')}",
           "#SBATCH --open-mode=append"]
  lines += [f"#SBATCH {option}" for option in sbatch]
  lines += ["set -euo pipefail", 'case "$SLURM_ARRAY_TASK_ID" in']
  for run in sweep.runs:
    lines.append(f"  {run.index}) {shell_command(run)} ;;  # {run.label}")
  lines += ['  *) echo "no run $SLURM_ARRAY_TASK_ID in this sweep" >&2; exit 2 ;;', "esac", ""]
  return "\n".join(lines)
