"""Signals at the command line: ``txf train ... | tee log`` whose reader died on Ctrl-C still writes
its stop checkpoint and exits 0; a SIGTERM while the final parameters are written exits 0.

Each runs ``python -m tests.faults train ...`` (tests/faults.py sends the signal at a chosen point).
"""

import os
import subprocess
import sys

import pytest

from tests.conftest import EXPERIMENTS, ROOT

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

ARGS = ["train", "--config", os.path.join(EXPERIMENTS, "copy.py"), "--progress=false",
        "--config.batch_size=8", "--config.model.d_model=16", "--config.model.d_ff=32",
        "--config.model.num_heads=2", "--config.eval_batches=1", "--config.decode_examples=4",
        "--config.num_samples=0", "--config.checkpoint_every=0"]


def _env(**faults):
  return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",  # the session's XLA_FLAGS
              **faults)


@pytest.mark.parametrize("stderr_too", [True, False], ids=["stdout+stderr", "stdout-only"])
def test_ctrl_c_with_a_dead_pipe_reader_checkpoints_and_exits_0(tmp_path, stderr_too):
  workdir = tmp_path / "run"
  read, write = os.pipe()
  with open(tmp_path / "stderr.txt", "wb") as err:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.faults", *ARGS, "--config.num_train_steps=1000",
         "--workdir", str(workdir)], cwd=ROOT, stdout=write,
        stderr=write if stderr_too else err,
        env=_env(FAULT_SIGNAL_AT_STEP="3", FAULT_SIGNAL="INT", FAULT_SIGNAL_WHEN_PIPE_CLOSED="1"))
    os.close(write)
    with os.fdopen(read, "rb") as reader:
      first = reader.readline()  # the run has started and printed to the pipe
      assert b"txf:" in first, first
    # the reader is gone; the child notices at step 3, then gets SIGINT (as tee and txf do on ^C)
    status = proc.wait(timeout=300)
  assert status == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
  steps = sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())
  assert steps == [3], steps  # the stop checkpoint, after the step the signal came in
  assert not (workdir / "params.msgpack").exists()  # stopped, not finished


def test_sigterm_while_the_final_parameters_are_written_exits_0(tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "tests.faults", *ARGS, "--config.num_train_steps=2",
       "--workdir", str(workdir)], cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=_env(FAULT_SIGNAL_IN_FINISH="TERM"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "SIGTERM received" in proc.stderr
  assert (workdir / "params.msgpack").exists()
  assert os.listdir(workdir / "checkpoints") == ["2"]
