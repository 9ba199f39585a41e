"""A killed job loses nothing: ``txf train`` subprocesses (run through tests/faults.py, which injects
the NaN and the slow save from outside txf) stopped by SIGTERM, killed with SIGKILL
mid-training and mid-save, broken by an injected NaN, resumed, extended, and compared with one
uninterrupted run, step for step (metrics.jsonl without timing fields) and bit for bit (params).

Every run is a tiny copy model (dropout on, so the per-step RNG is exercised). Subprocesses share
a persistent JAX compilation cache (TXF_TEST_JAX_CACHE, default <tmp>/txf-test-jax-cache), so
only the first run of a session compiles.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import pytest

from tests.conftest import EXPERIMENTS, ROOT
from txf.runtime import workdir as workdir_lib
from txf.train.averaging import average_checkpoints
from txf.train.checkpoint import Checkpointer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("checkpoint_resume")]  # one reference run

STEPS = 80  # checkpoints and evaluations every 20, logs every 10
ARGS = ["--config", os.path.join(EXPERIMENTS, "copy.py"), "--progress=false",
        "--config.checkpoint_every=20", "--config.eval_every=20", "--config.log_every=10",
        "--config.keep_checkpoints=3", "--config.batch_size=8", "--config.model.d_model=32",
        "--config.model.d_ff=64", "--config.model.dropout_rate=0.1", "--config.decode_examples=0",
        "--config.num_samples=0", "--config.eval_batches=1"]
TIMING_FIELDS = ("tokens_per_second",)


def _env(**extra):
  cache = os.environ.get("TXF_TEST_JAX_CACHE") or os.path.join(tempfile.gettempdir(),
                                                               "txf-test-jax-cache")
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  env.pop("FAULT_SAVE_DELAY_S", None)
  env.pop("FAULT_NAN_AT_STEP", None)
  env.update(extra)
  return env


class Run:
  """``txf train`` in the background, its stdout/stderr in files next to the workdir."""

  def __init__(self, workdir, *extra, env=None, steps=STEPS):
    self.workdir = str(workdir)
    n = len([p for p in os.listdir(os.path.dirname(self.workdir)) if p.endswith(".out")])
    self.out_path = f"{self.workdir}.{n}.out"
    self.err_path = f"{self.workdir}.{n}.err"
    with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
      self.proc = subprocess.Popen(
          [sys.executable, "-m", "tests.faults", "train", *ARGS, f"--config.num_train_steps={steps}",
           "--workdir", self.workdir, *extra], stdout=out, stderr=err, env=env or _env(), cwd=ROOT)

  @property
  def out(self) -> str:
    with open(self.out_path) as f:
      return f.read()

  @property
  def err(self) -> str:
    with open(self.err_path) as f:
      return f.read()

  def until(self, condition, what: str, timeout: float = 240):
    """Poll ``condition()`` until true; fails if the process ends first."""
    end = time.time() + timeout
    while not condition():
      if self.proc.poll() is not None:
        pytest.fail(f"txf train exited ({self.proc.returncode}) before {what}:\n{self.err[-3000:]}")
      if time.time() > end:
        self.proc.kill()
        pytest.fail(f"timed out waiting for {what}")
      time.sleep(0.02)

  def wait(self, timeout: float = 300) -> int:
    return self.proc.wait(timeout=timeout)

  def finish(self) -> "Run":
    rc = self.wait()
    assert rc == 0, f"exit {rc}:\n{self.out[-2000:]}\n{self.err[-4000:]}"
    return self


def _rows(workdir, timing=False):
  rows = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if not timing:
        for k in TIMING_FIELDS:
          row.pop(k, None)
      rows.append(row)
  return rows


def _has_row(workdir, min_step, split="train"):
  def check():
    try:
      return any(r["step"] >= min_step and r["split"] == split for r in _rows(workdir))
    except (OSError, ValueError):
      return False
  return check


def _steps(workdir):
  ck = Checkpointer(str(workdir))
  try:
    return ck.all_steps()
  finally:
    ck.close()


def _params_at(workdir, step):
  ck = Checkpointer(str(workdir))
  try:
    return ck.restore_params(step)
  finally:
    ck.close()


def _assert_same_run(workdir, reference):
  """Same metrics.jsonl step for step (bitwise, timing fields aside), same final parameters."""
  got, want = _rows(workdir), _rows(reference)
  assert [(r["step"], r["split"]) for r in got] == [(r["step"], r["split"]) for r in want]
  for g, w in zip(got, want):
    assert g == w, f"step {w['step']} {w['split']}:\n  resumed       {g}\n  uninterrupted {w}"
  with open(os.path.join(workdir, "params.msgpack"), "rb") as a, \
       open(os.path.join(reference, "params.msgpack"), "rb") as b:
    assert a.read() == b.read(), "final parameters differ"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One uninterrupted run of STEPS steps."""
  workdir = tmp_path_factory.mktemp("reference") / "run"
  Run(workdir).finish()
  assert _steps(workdir) == [40, 60, 80]
  return str(workdir)


def test_stopped_and_killed_run_resumes_exactly(reference, tmp_path):
  workdir = str(tmp_path / "run")
  # 1. SIGTERM mid-run: finishes the step, checkpoints it, exits 0 (many steps, so it is mid-run).
  run = Run(workdir, steps=5000)
  run.until(_has_row(workdir, 30), "step 30")
  run.proc.send_signal(signal.SIGTERM)
  assert run.wait() == 0, run.err[-3000:]
  stopped = int(re.search(r"stopped by SIGTERM after step (\d+);", run.out).group(1))
  assert 30 <= stopped < 60, stopped
  assert _steps(workdir)[-1] == stopped
  assert not os.path.exists(os.path.join(workdir, "params.msgpack"))
  next_save = (stopped // 20 + 1) * 20

  # 2. SIGKILL while the next checkpoint is being written (the save is slowed down).
  run = Run(workdir, env=_env(FAULT_SAVE_DELAY_S="60"))
  run.until(lambda: f"{next_save}: slow save started" in run.err, f"the save at {next_save}")
  run.proc.kill()
  run.wait()
  assert f"resumed from the checkpoint at step {stopped}" in run.out
  names = os.listdir(os.path.join(workdir, "checkpoints"))
  assert str(next_save) not in names
  assert any(n.startswith(f"{next_save}.orbax-checkpoint-tmp") for n in names), names
  assert _steps(workdir)[-1] == stopped

  # 3. SIGKILL mid-training, between checkpoints (once the next one is on disk).
  run = Run(workdir, steps=5000)
  run.until(lambda: os.path.isdir(os.path.join(workdir, "checkpoints", str(next_save))),
            f"checkpoint {next_save}")
  run.proc.kill()
  run.wait()
  assert f"resumed from the checkpoint at step {stopped}" in run.out
  last = _steps(workdir)[-1]
  assert next_save <= last < STEPS

  # 4. Resume to the end: equal to the uninterrupted run.
  run = Run(workdir).finish()
  assert f"resumed from the checkpoint at step {last}" in run.out
  _assert_same_run(workdir, reference)


def test_corrupt_latest_falls_back_and_extended_run_skips_a_nan(reference, tmp_path):
  """Checkpoint 80 truncated: resume from 60 (redoing 61..80 exactly), then extend the finished
  run to 100 steps with nan_policy='skip' and a NaN at step 95, which is skipped and counted."""
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  for root, _, files in os.walk(os.path.join(workdir, "checkpoints", "80", "state")):
    for name in files:
      open(os.path.join(root, name), "wb").close()  # truncate
  run = Run(workdir, "--config.nan_policy=skip", env=_env(FAULT_NAN_AT_STEP="95"),
            steps=STEPS + 20).finish()
  assert "the checkpoint at step 80 is unreadable" in run.err
  assert "resumed from the checkpoint at step 60" in run.out
  assert os.listdir(os.path.join(workdir, "checkpoints-unreadable"))[0].startswith("80-")
  rows, want = _rows(workdir), _rows(reference)
  assert rows[:len(want)] == want  # steps 61..80 were redone exactly
  extra = rows[len(want):]
  assert [(r["step"], r["split"]) for r in extra] == [(90, "train"), (100, "train"), (100, "eval")]
  assert extra[0]["skipped"] == 0.0 and extra[1]["skipped"] == 1.0
  assert all(np.isfinite(r["loss"]) for r in extra)
  assert _steps(workdir) == [60, 80, 100]
  params = workdir_lib.load_params(workdir)
  assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(params))


def test_average_of_real_checkpoints(reference, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  path, steps = average_checkpoints(workdir, 3)
  assert steps == [40, 60, 80] and path == os.path.join(workdir, "params_avg3.msgpack")
  averaged = workdir_lib.load_params(workdir, "params_avg3.msgpack")
  each = [_params_at(workdir, s) for s in steps]
  expected = jax.tree_util.tree_map(
      lambda *xs: np.mean(np.stack(xs).astype(np.float64), axis=0).astype(np.float32), *each)
  assert jax.tree_util.tree_structure(averaged) == jax.tree_util.tree_structure(expected)
  for a, b in zip(jax.tree_util.tree_leaves(averaged), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_array_equal(a, b)


def test_nan_stops_the_run_and_keeps_the_last_good_checkpoint(reference, tmp_path):
  """A finished run extended to 100 steps meets a NaN at step 90: exit 2 with one line naming
  the step; nothing is saved after it, checkpoint 80 is untouched."""
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  run = Run(workdir, env=_env(FAULT_NAN_AT_STEP="90"), steps=STEPS + 20)
  assert run.wait() == 2, run.err[-3000:]
  errors = [line for line in run.err.splitlines() if line.startswith("txf: error:")]
  assert len(errors) == 1 and "non-finite loss or gradient at step 90" in errors[0], run.err[-2000:]
  assert "last good checkpoint (step 80) is kept" in errors[0]
  assert "Traceback" not in run.err
  assert _steps(workdir) == [40, 60, 80]
  for step in (40, 60, 80):
    for a, b in zip(jax.tree_util.tree_leaves(_params_at(workdir, step)),
                    jax.tree_util.tree_leaves(_params_at(reference, step))):
      np.testing.assert_array_equal(a, b)
  train = [r for r in _rows(workdir) if r["split"] == "train"]
  assert train[-1]["step"] == 90 and train[-1]["skipped"] == 1.0  # logged, then stopped
