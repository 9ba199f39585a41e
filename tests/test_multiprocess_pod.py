"""Pod jobs on one machine (jax.distributed on 127.0.0.1, gloo): the paths a pod user launches.

- bucketed real data (Multi30k, SST-2 in ../shared/data, or a stand-in of the same layout when
  absent), packing off: 1, 2 and 4 processes train the same global batches, step-1 and step-2
  losses equal (every process decides every batch's shape alike, fills its own rows);
- a bucketed run resumes on another process count (2 -> 1 -> 2 -> 4) with the losses of an
  uninterrupted run;
- a mesh whose tensor axis spans both processes (dcn_mesh_shape) feeds the right rows: the losses
  of one device;
- failures agreed by all: kill -9 of one of two independent processes (no launcher) ends the other
  with one ``txf: error: lost process ...`` line naming the last checkpoint, exit 75, within the
  heartbeat bound; a bad data row on one process ends both with its one line, exit 2;
- SIGTERM to process 1 stops both after the same step with the same line naming the signal;
- launch/local.py ends its children however it ends, and hides gloo's connection lines.

Tiny models, XLA optimisation level 0 and the shared persistent compilation cache (as
tests/test_multiprocess.py).
"""

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.test_data_fixtures import parallel_dir, tsv_dir
from tests.test_multiprocess import ARGS, LAUNCH, _env, _launch, _train_rows
from txf.core.errors import EXIT_RESUMABLE

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
TINY = ["--progress=false", "--config.model.d_model=16", "--config.model.d_ff=32",
        "--config.model.num_heads=2", "--config.model.num_encoder_layers=1",
        "--config.model.num_decoder_layers=1", "--config.model.dropout_rate=0.0",
        "--config.log_every=1", "--config.eval_every=0", "--config.checkpoint_every=0",
        "--config.decode_examples=0", "--config.num_samples=0", "--config.eval_batches=1",
        "--config.time_limit_minutes=0", "--config.data.vocab_size=400"]
BUCKETED = ["--config.data.packing=False", "--config.data.bucketing=True"]
MESH = ["--config.parallelism=mesh", "--config.mesh_shape=(-1,1,1)"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """{"env": TXF_DATA / TXF_DATA_DIR, "multi30k": flags, "sst2": flags}: the shared files, or a
  stand-in of the same layout (tests/test_data_fixtures) when ../shared/data is absent."""
  root = tmp_path_factory.mktemp("poddata")
  if os.path.isdir(os.path.join(SHARED, "multi30k")) and os.path.isdir(os.path.join(SHARED, "sst2")):
    text = SHARED
  else:
    text = str(root / "text")
    parallel_dir(os.path.join(text, "multi30k"), n_train=600, n_val=40,
                 splits=("train", "val", "test_2016_flickr"))
    tsv_dir(os.path.join(text, "sst2"), n_train=600, n_val=40)
    shutil.copy(os.path.join(text, "sst2", "dev.tsv"), os.path.join(text, "sst2", "test.tsv"))
  return {"env": {"TXF_DATA": text, "TXF_DATA_DIR": str(root / "prepared")},
          "multi30k": ["--config", "multi30k_en_de", *TINY, *BUCKETED,
                       "--config.data.tokens_per_batch=512", "--config.batch_size=16"],
          "sst2": ["--config", "sst2", *TINY, *BUCKETED, "--config.batch_size=16"]}


def _txf(processes, devices, workdir, args, env, timeout=400):
  status, out, _ = _launch(processes, devices, [sys.executable, "-m", "tests.faults", "train", *args,
                                                "--workdir", str(workdir)], timeout=timeout, env=env)
  assert status == 0, out[-5000:]
  return out


def _assert_same_losses(rows, reference, steps, rtol=2e-5):
  assert sorted(rows) == sorted(reference) == list(steps), (sorted(rows), sorted(reference))
  for step in steps:
    np.testing.assert_allclose(rows[step]["loss"], reference[step]["loss"], rtol=rtol,
                               err_msg=f"loss at step {step}")


@pytest.mark.parametrize("name,counts", [("multi30k", (1, 2, 4)), ("sst2", (1, 2))])
def test_bucketed_real_data_trains_alike_on_any_process_count(tmp_path, data, name, counts):
  args = data[name] + MESH + ["--config.num_train_steps=2"]
  rows = {}
  for n in counts:
    out = _txf(n, 1, tmp_path / f"p{n}", args, data["env"])
    assert "[1] txf:" not in out and "[Gloo]" not in out, out[-3000:]
    rows[n] = _train_rows(tmp_path / f"p{n}")
    print(name, n, "process(es): losses", [rows[n][s]["loss"] for s in (1, 2)])
  for n in counts[1:]:
    _assert_same_losses(rows[n], rows[1], (1, 2))


@pytest.mark.slow
def test_a_bucketed_run_resumes_on_other_process_counts(tmp_path, data):
  args = data["multi30k"] + MESH + ["--config.checkpoint_every=1"]
  _txf(1, 1, tmp_path / "reference", args + ["--config.num_train_steps=3"], data["env"])
  run = tmp_path / "run"
  for n, steps in [(2, 1), (1, 2), (4, 3)]:  # 2 -> 1 -> 4 processes
    out = _txf(n, 1, run, args + [f"--config.num_train_steps={steps}"], data["env"])
    if steps > 1:
      assert f"resumed from the checkpoint at step {steps - 1}" in out, out[-3000:]
  _assert_same_losses(_train_rows(run), _train_rows(tmp_path / "reference"), (1, 2, 3))


def test_a_tensor_axis_across_processes_feeds_the_rows_of_one_device(tmp_path):
  # 2 processes x 2 devices: fsdp within each process, tensor across them (dcn_mesh_shape), so
  # both processes hold, and fill, every row of the batch
  common = ARGS + ["--config.num_train_steps=2", "--config.checkpoint_every=0"]
  _txf(1, 1, tmp_path / "single", common + ["--config.parallelism=single"], {})
  out = _txf(2, 2, tmp_path / "tensor", common + [
      "--config.parallelism=mesh", "--config.mesh_shape=(1,2,1)", "--config.dcn_mesh_shape=(1,1,2)"],
      {})
  _assert_same_losses(_train_rows(tmp_path / "tensor"), _train_rows(tmp_path / "single"), (1, 2))


# -- failures agreed by every process ---------------------------------------------------------

def _local_launcher():
  spec = importlib.util.spec_from_file_location("txf_launch_local", LAUNCH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _independent(workdir, extra, faults, heartbeat=20, timeout=900):
  """Two processes started on their own (no launcher to clean up, as on a pod); returns
  [(status, output, seconds from start to exit)] of each."""
  launcher = _local_launcher()
  port = launcher.free_port()
  command = [sys.executable, "-m", "tests.faults", "train", *ARGS, *extra, "--workdir", str(workdir)]
  start, procs = time.time(), []
  for i in range(2):
    env = launcher.process_env(i, 2, 1, port, heartbeat, base=_env(**faults))
    procs.append(subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  ended = [None, None]
  while None in ended and time.time() - start < timeout:
    for i, p in enumerate(procs):
      if ended[i] is None and p.poll() is not None:
        ended[i] = time.time() - start
    time.sleep(0.1)
  for p in procs:
    if p.poll() is None:
      p.kill()
  return [(p.wait(), p.stdout.read(), t) for p, t in zip(procs, ended)]


def _errors(out):
  return [line for line in out.splitlines() if line.startswith("txf: error:")]


def test_kill_9_of_one_process_ends_the_other_with_one_line_and_exit_75(tmp_path):
  steps = ["--config.parallelism=pmap", "--config.num_train_steps=400", "--config.checkpoint_every=2"]
  results = _independent(tmp_path / "run", steps, {"FAULT_SIGNAL_AT_STEP": "5", "FAULT_SIGNAL": "KILL",
                                                   "FAULT_SIGNAL_PROCESS": "1"})
  (status0, out0, t0), (status1, _, t1) = results
  assert status1 == -signal.SIGKILL, results
  assert status0 == EXIT_RESUMABLE, out0[-3000:]
  errors = _errors(out0)
  assert len(errors) == 1 and "lost process 1 of 2" in errors[0], out0[-3000:]
  named = re.search(r"last checkpoint: step (\d+) \((.*)\)", errors[0])  # the newest complete one
  assert named and int(named.group(1)) in (2, 4) and os.path.isdir(named.group(2)), errors[0]
  assert "run the same command again" in errors[0]
  noise = [line for line in out0.splitlines() if "Traceback" in line or
           ("gloo" in line.lower() and not line.startswith("[Gloo] Rank"))]  # connection lines only
  assert not noise, out0[-3000:]
  print(f"process 0 ended {t0 - t1:.1f} s after process 1 was killed (heartbeat 20 s)")
  assert t0 - t1 < 60, (t0, t1)


def test_a_bad_row_on_one_process_stops_both_with_its_line_and_exit_2(tmp_path):
  steps = ["--config.parallelism=pmap", "--config.num_train_steps=400"]
  results = _independent(tmp_path / "run", steps, {"FAULT_ERROR_AT_STEP": "3", "FAULT_ERROR": "data",
                                                   "FAULT_ERROR_PROCESS": "1"}, heartbeat=60)
  (status0, out0, t0), (status1, out1, t1) = results
  assert status0 == status1 == 2, results
  assert _errors(out0) == _errors(out1) and len(_errors(out0)) == 1, (out0[-3000:], out1[-3000:])
  assert "a bad row injected on process 1" in _errors(out0)[0]
  print(f"both ended within {abs(t0 - t1):.1f} s of each other")
  assert abs(t0 - t1) < 15


def test_sigterm_to_process_1_gives_every_process_the_same_stop_line(tmp_path):
  out = _txf(2, 1, tmp_path / "run", ARGS + ["--config.parallelism=pmap", "--config.num_train_steps=40",
                                              "--config.checkpoint_every=0"], {
      "FAULT_SIGNAL_AT_STEP": "2", "FAULT_SIGNAL_PROCESS": "1"})
  lines = {line[:4]: line[4:] for line in out.splitlines() if "txf: stopped by" in line}
  assert set(lines) == {"[0] ", "[1] "} and lines["[0] "] == lines["[1] "], out[-3000:]
  assert "stopped by SIGTERM on process 1 after step" in lines["[0] "], lines


# -- launch/local.py ---------------------------------------------------------------------------

STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a process stuck in a collective
print('pid', os.getpid(), flush=True)
time.sleep(600)
"""


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with open(f"/proc/{pid}/stat") as f:
    return f.read().split()[2] != "Z"


@pytest.mark.parametrize("how", ["timeout", "sigterm"])
def test_the_launcher_ends_its_children_however_it_ends(how):
  command = [sys.executable, LAUNCH, "-n", "2", "-d", "1", "--", sys.executable, "-c", STUBBORN]
  if how == "timeout":
    command[2:2] = ["--timeout=8"]
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=_env(), cwd=ROOT)
  pids, lines = [], []
  while len(pids) < 2:
    line = proc.stdout.readline()
    lines.append(line)
    assert line, "".join(lines)
    if " pid " in line:
      pids.append(int(line.split()[-1]))
  if how == "sigterm":
    proc.send_signal(signal.SIGTERM)
  proc.wait(timeout=60)
  time.sleep(0.5)
  assert not [p for p in pids if _alive(p)], (pids, "".join(lines) + proc.stdout.read())
