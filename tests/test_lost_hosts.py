"""A lost or hung host, tried as a pod would meet it: two ``txf train`` processes (one CPU device
each, parallelism=mesh, as a user starts them: ``python -m txf.cli`` with the TXF_* variables),
and one of them, the coordinator included, killed (``kill -9``) or stopped (``kill -STOP``) after
its first checkpoint. The survivor prints exactly one line naming the lost process and the last
checkpoint and exits 75 within the heartbeat bound; a stopped process, once continued, exits too
without writing a checkpoint; the killed job, started again, resumes and ends equal to a run that
was never interrupted.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.conftest import EXPERIMENTS, ROOT
from tests.test_disk_full import metrics as rows  # metrics.jsonl rows without tokens/s
from tests.test_multiprocess import _env

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

HEARTBEAT = 5
STEPS = 96  # enough that both processes are still training when one is signalled
ARGS = ["train", "--config", os.path.join(EXPERIMENTS, "copy.py"), "--progress=false",
        "--config.batch_size=8", "--config.model.d_model=16", "--config.model.d_ff=32",
        "--config.model.num_heads=2", "--config.model.dropout_rate=0.0", "--config.log_every=1",
        "--config.eval_every=0", "--config.checkpoint_every=4", "--config.keep_checkpoints=0",
        "--config.decode_examples=0", "--config.num_samples=0", "--config.parallelism=mesh",
        f"--config.num_train_steps={STEPS}"]


class Job:
  """Two `txf train` processes of one job, each in its own session (a host: killed or stopped
  as a whole); stderr lines are collected with the time they arrived."""

  def __init__(self, workdir, faults=None):
    """``faults``: {process: {FAULT_*: value}}, tests/faults.py's faults for that process."""
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    self.lines = {0: [], 1: []}
    self.procs = []
    for p in range(2):
      env = _env(TXF_COORDINATOR=f"127.0.0.1:{port}", TXF_NUM_PROCESSES="2", TXF_PROCESS_ID=str(p),
                 TXF_HEARTBEAT_TIMEOUT=str(HEARTBEAT), TXF_MALLOC="system")
      env.update((faults or {}).get(p, {}) or ({"FAULT_QUIET_END": "1"} if faults else {}))
      # with faults every process starts the same way (tests.faults, which imports jax before txf's
      # command line runs): under jax 0.12.1 a job whose processes start one each way waits
      # forever at its first collective
      module = "tests.faults" if faults else "txf.cli"
      proc = subprocess.Popen([sys.executable, "-m", module, *ARGS, "--workdir", str(workdir)],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
      threading.Thread(target=self._read, args=(p, proc.stderr), daemon=True).start()
      self.procs.append(proc)

  def _read(self, p, stream):
    for line in stream:
      self.lines[p].append((time.time(), line.rstrip("\n")))

  def signal(self, p, signum):
    os.killpg(self.procs[p].pid, signum)

  def wait(self, p, timeout):
    try:
      return self.procs[p].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      return None

  def after(self, p, t):
    time.sleep(0.3)  # the reader thread's last lines
    return [line for when, line in self.lines[p] if when >= t]

  def end(self):
    for proc in self.procs:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except OSError:
        pass
      proc.wait(timeout=30)


def checkpoints(workdir):
  path = workdir / "checkpoints"
  return sorted(int(n) for n in os.listdir(path) if n.isdigit()) if path.is_dir() else []


def wait_for_checkpoint(job, workdir, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline and not checkpoints(workdir):
    assert all(proc.poll() is None for proc in job.procs), job.lines
    time.sleep(0.2)
  assert checkpoints(workdir), job.lines
  time.sleep(1.0)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("lost") / "uninterrupted"
  job = Job(workdir)
  try:
    assert job.wait(0, 300) == 0 and job.wait(1, 60) == 0, job.lines
  finally:
    job.end()
  return workdir


# a killed process 1 is tests/test_multiprocess.py's case too; here the coordinator, and a hung host
# on either side
@pytest.mark.parametrize("victim,how", [(0, "KILL"), (0, "STOP"), (1, "STOP")])
def test_a_lost_or_hung_process_is_one_line_and_exit_75_on_the_survivor(victim, how, tmp_path,
                                                                      request):
  workdir = tmp_path / "run"
  job = Job(workdir)
  try:
    wait_for_checkpoint(job, workdir)
    start = time.time()
    job.signal(victim, getattr(signal, "SIG" + how))
    survivor = 1 - victim
    status = job.wait(survivor, HEARTBEAT + 30)
    seconds = time.time() - start
    said = job.after(survivor, start)
    assert status == 75, (status, said)
    assert len(said) == 1, said
    assert said[0].startswith(f"txf: error: lost process {victim}"), said
    assert "the run's last checkpoint: step " in said[0] and said[0].endswith(
        "run the same command again to resume"), said
    assert seconds < HEARTBEAT + 10, seconds
    if how == "STOP":  # continued, the hung process ends too, and starts no checkpoint
      # (a save already under way when it was stopped may still be completed)
      in_flight = {int(n.split(".")[0]) for n in os.listdir(workdir / "checkpoints")
                   if ".orbax-checkpoint-tmp" in n}
      written = checkpoints(workdir)
      resumed_at = time.time()
      job.signal(victim, signal.SIGCONT)
      status = job.wait(victim, 60)
      said = job.after(victim, resumed_at)
      assert status == 75, (status, said)
      assert len(said) == 1 and said[0].startswith("txf: error: "), said
      assert set(written) <= set(checkpoints(workdir)) <= set(written) | in_flight
  finally:
    job.end()
  if (victim, how) == (0, "KILL"):  # the same command again resumes, and ends as if never stopped
    job = Job(workdir)
    try:
      assert job.wait(0, 300) == 0 and job.wait(1, 60) == 0, job.lines
    finally:
      job.end()
    uninterrupted = request.getfixturevalue("uninterrupted")
    assert rows(workdir) == rows(uninterrupted)
    from txf.runtime import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
    import jax  # pylint: disable=import-outside-toplevel
    for a, b in zip(jax.tree_util.tree_leaves(workdir_lib.load_params(str(workdir))),
                    jax.tree_util.tree_leaves(workdir_lib.load_params(str(uninterrupted)))):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_save_that_fails_on_one_process_ends_the_job_at_once(tmp_path):
  """The disk fills while process 0 writes checkpoint 8 in orbax's background thread: its write
  fails there, the other process's succeeds. Orbax's finalize thread would then wait at a barrier
  the other process never reaches, for orbax's 20-minute timeout (the chaos run met it); txf raises
  the failure in the main thread at the next save, so both processes end with the disk's one line
  within seconds."""
  workdir = tmp_path / "run"
  job = Job(workdir, faults={0: {"FAULT_DISK_FULL_IN_ASYNC_SAVE": "8"}})
  try:
    statuses = [job.wait(0, 240), job.wait(1, HEARTBEAT + 30)]
    said = [job.after(p, 0) for p in (0, 1)]
    assert statuses == [2, 2], (statuses, said)
    for lines in said:
      errors = [line for line in lines if line.startswith("txf: error:")]
      assert len(errors) == 1 and "no space left on" in errors[0], lines
    assert 8 not in checkpoints(workdir)
  finally:
    job.end()
