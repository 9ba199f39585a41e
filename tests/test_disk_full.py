"""A disk that fills while txf writes: one ``txf: error:`` line, exit 2, nothing lost, resumable.

The faults come from outside txf (tests/faults.py, run as ``python -m tests.faults <txf command>``):
the disk fills in orbax's background checkpoint write (the failure surfaces in another thread,
after ``save`` returned), or files named ``params.msgpack``, ``loss_curves.png`` or an eval report
cannot be written. After space is back (the same command without the fault) the run resumes and
ends bit-identical to a run that never failed.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import EXPERIMENTS, ROOT, run_txf

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

COPY = os.path.join(EXPERIMENTS, "copy.py")
TINY = ("--progress=false", "--config.num_train_steps=6", "--config.log_every=2",
        "--config.checkpoint_every=2", "--config.keep_checkpoints=0", "--config.decode_examples=4",
        "--config.model.d_model=16", "--config.model.d_ff=32", "--config.batch_size=8")


def train(workdir, **faults):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TXF_MALLOC": "system", **faults}
  return subprocess.run([sys.executable, "-m", "tests.faults", "train", "--config", COPY,
                         "--workdir", str(workdir), *TINY],
                        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


def one_full_disk_line(r, what, path, elsewhere="--workdir"):
  """The single stderr line of a full disk: exit 2, no traceback, no library log lines."""
  assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
  lines = [line for line in r.stderr.splitlines()  # txf's progress lines go before the error
           if line.strip() and not line.startswith(("process 0: the loop ended", "txf eval: "))]
  assert len(lines) == 1, r.stderr[-5000:]
  line = lines[0]
  assert line.startswith(f"txf: error: {what} {path}: no space left on "), line
  assert f"GiB there or choose another {elsewhere}, then run the same command again" in line, line
  return line


def finished_steps(workdir):
  ckpt = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(ckpt) if n.isdigit())


def metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  for r in rows:
    r.pop("tokens_per_second", None)
  return rows


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("disk") / "uninterrupted"
  r = train(workdir)
  assert r.returncode == 0, r.stderr[-3000:]
  return workdir


@pytest.mark.slow
def test_a_disk_that_fills_during_an_async_checkpoint_is_one_line_and_resumes_bit_exactly(
    tmp_path, uninterrupted):
  workdir = tmp_path / "w"
  r = train(workdir, FAULT_DISK_FULL_IN_ASYNC_SAVE="4")
  one_full_disk_line(r, "saving a checkpoint to", workdir / "checkpoints")
  assert finished_steps(workdir) == [2]  # the last complete checkpoint is kept; 4 never looks done
  assert not (workdir / "params.msgpack").exists()
  r = train(workdir)  # space is back: the same command resumes from step 2
  assert r.returncode == 0, r.stderr[-3000:]
  assert metrics(workdir) == metrics(uninterrupted)
  assert (workdir / "params.msgpack").read_bytes() == (uninterrupted / "params.msgpack").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("name,what", [("params.msgpack", "writing"),
                                       ("loss_curves.png", "writing the plots to")])
def test_a_full_disk_at_the_end_of_training_is_one_line_and_the_same_command_finishes(
    tmp_path, uninterrupted, name, what):
  workdir = tmp_path / "w"
  r = train(workdir, FAULT_DISK_FULL_FOR=name)
  path = workdir / name if name == "params.msgpack" else workdir
  one_full_disk_line(r, what, path)
  assert finished_steps(workdir)[-1] == 6  # the final checkpoint is written before
  r = train(workdir)
  assert r.returncode == 0, r.stderr[-3000:]
  assert (workdir / "params.msgpack").read_bytes() == (uninterrupted / "params.msgpack").read_bytes()
  assert (workdir / "loss_curves.png").is_file()


@pytest.mark.slow
def test_a_full_disk_while_writing_an_eval_report_is_one_line_naming_output(tmp_path, uninterrupted):
  report = tmp_path / "report.json"
  env = {"FAULT_DISK_FULL_FOR": "report.json", "TXF_MALLOC": "system"}
  r = subprocess.run([sys.executable, "-m", "tests.faults", "eval", "--workdir", str(uninterrupted),
                      "--output", str(report), "--max_examples=4"], capture_output=True, text=True,
                     timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu", **env}, cwd=ROOT)
  one_full_disk_line(r, "writing", report, "--output")
  assert not report.exists() and not [p for p in os.listdir(tmp_path) if p.startswith("report.json")]
  assert run_txf("eval", "--workdir", str(uninterrupted), "--output", str(report),
                 "--max_examples=4").returncode == 0
  assert json.loads(report.read_text())


def test_orbax_background_failure_of_a_full_disk_is_a_disk_error_and_its_logs_are_dropped(
    tmp_path, monkeypatch):
  """The same fault without a training run: orbax really fails in its background thread, the error
  reaches the caller at the next wait, the checkpoint before stays, and txf's log filter drops
  orbax's traceback records of it."""
  import logging
  import numpy as np
  from tests import faults
  from txf.runtime import process as runtime
  from txf.runtime import workdir as workdir_lib
  from txf.train.checkpoint import Checkpointer, CheckpointSpec
  records = []

  class Keep(logging.Handler):
    def emit(self, record):
      records.append(record)

  handler = Keep(level=logging.DEBUG)
  handler.addFilter(runtime.LibraryFilter())
  logging.getLogger().addHandler(handler)
  try:
    faults.disk_full_in_async_save(monkeypatch, 4)
    ckpt = Checkpointer(str(tmp_path), CheckpointSpec(keep_checkpoints=0))
    state = {"w": np.arange(6, dtype=np.float32), "step": np.int32(0)}
    ckpt.save(2, state, {"position": 2})
    ckpt.wait()
    ckpt.save(4, state, {"position": 4})  # returns: the write fails later, in orbax's thread
    with pytest.raises(workdir_lib.DiskError, match="no space left on .* GiB there or choose another"):
      with workdir_lib.disk_errors(ckpt.directory, "saving a checkpoint to"):
        ckpt.wait()
    ckpt.close()
  finally:
    logging.getLogger().removeHandler(handler)
  assert ckpt.all_steps() == [2]
  assert sorted(os.listdir(ckpt.directory))[0] == "2"
  assert not [r for r in records if r.levelno >= logging.ERROR], [r.getMessage() for r in records]


@pytest.fixture
def small_disk(tmp_path):
  """A real 3 MiB file system (tmpfs; needs root, as CI has): skipped where it cannot be mounted."""
  mount = tmp_path / "small"
  mount.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                    capture_output=True).returncode != 0:
    pytest.skip("cannot mount a tmpfs here (not root)")
  try:
    yield mount
  finally:
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.slow
def test_a_really_full_disk_during_background_saves_is_one_line(small_disk):
  """Not an injected fault: checkpoints of the default model fill a real 3 MiB disk while orbax
  writes them in the background; the storage threads' "Event loop is closed" tracebacks are
  dropped and the run ends on its one line, exit 2, as any full disk."""
  workdir = small_disk / "run"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TXF_MALLOC": "system"}
  r = subprocess.run([sys.executable, "-m", "txf.cli", "train", "--workdir", str(workdir),
                      "--progress=false", "--config.num_train_steps=40", "--config.checkpoint_every=5",
                      "--config.keep_checkpoints=0", "--config.eval_every=0"],
                     capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
  one_full_disk_line(r, "saving a checkpoint to", workdir / "checkpoints")
  assert "Event loop is closed" not in r.stderr


EXIT_ON_A_FULL_DISK = """
import errno, sys
from txf.commands.reporting import quiet_full_disk_in_threads
from txf.train.metrics import MetricWriter
quiet_full_disk_in_threads()         # as txf train sets it up: the writer's thread dies quietly
writer = MetricWriter(sys.argv[1])
writer.write(1, "train", {"loss": 1.0})
def full(*args, **kwargs):
  raise OSError(errno.ENOSPC, "No space left on device")
events = writer._tb.file_writer.event_writer._ev_writer
events.flush = events.write = full   # the disk is full from now on; the run ends by an error
writer.write(2, "train", {"loss": 0.5})  # the writer's thread meets the full disk and dies quietly
import time; time.sleep(1)
"""


def test_tensorboards_close_at_exit_on_a_full_disk_prints_nothing(tmp_path):
  """A run that stops on a full disk exits with its events unwritten: tensorboardX's own close at
  interpreter exit meets the full disk again, and prints nothing (the run's one line has said it;
  without txf.train.metrics' exit hook, Python prints "Exception ignored in atexit callback" and a
  traceback)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run([sys.executable, "-c", EXIT_ON_A_FULL_DISK, str(tmp_path)], cwd=root,
                     capture_output=True, text=True, timeout=120,
                     env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": root})
  assert r.returncode == 0 and r.stderr == "", r.stderr
