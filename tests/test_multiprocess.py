"""Several processes as one job, over loopback (jax.distributed on 127.0.0.1, gloo CPU collectives),
started by launch/local.py exactly as a user would:

- 2 processes x 2 devices train with parallelism='mesh' (fsdp=2 across the processes, tensor=2
  within each), checkpoint (every process writes its own shards), and the run is resumed by
  1 process x 4 devices; steps and final parameters equal an uninterrupted 2-process pmap run.
- when one process dies, the other exits with an error within a bounded time (jax.distributed's
  heartbeat timeout) instead of hanging in a collective.
- 2 processes x 4 devices, mesh with fsdp: a SIGTERM to process 1 alone stops both after the same
  step (within two steps of the signal, though log_every is larger), with one checkpoint and exit 0;
  1 process x 8 devices resumes it, and metrics.jsonl equals an uninterrupted run.
- in-loop evaluation (loss, accuracy, decoding and BLEU) under a 2-process mesh equals the
  single-device evaluation.
- a workdir conflict found by process 0 stops every process with the same error line, exit 2.

Every run is a tiny copy model with dropout 0 (pmap and mesh draw dropout masks differently);
subprocesses use XLA optimisation level 0 and a shared persistent compilation cache to compile fast.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from tests.conftest import EXPERIMENTS, ROOT
from txf.runtime import workdir as workdir_lib

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

LAUNCH = os.path.join(ROOT, "launch", "local.py")
ARGS = ["--config", os.path.join(EXPERIMENTS, "copy.py"), "--progress=false",
        "--config.batch_size=8", "--config.model.d_model=32", "--config.model.d_ff=64",
        "--config.model.num_heads=2", "--config.model.dropout_rate=0.0", "--config.log_every=1",
        "--config.eval_every=0", "--config.checkpoint_every=3", "--config.decode_examples=0",
        "--config.num_samples=0", "--config.eval_batches=1"]


def _env(**extra):
  cache = os.environ.get("TXF_TEST_JAX_CACHE") or os.path.join(tempfile.gettempdir(),
                                                               "txf-test-jax-cache")
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
             TF_CPP_MIN_LOG_LEVEL="3")  # XLA_FLAGS: the session's (tests/conftest.py)
  env.update(extra)
  return env


def _launch(processes, devices, command, timeout=300, env=None, **launch_flags):
  """launch/local.py -n processes -d devices [flags] -- command; returns (status, output, seconds)."""
  flags = [f"--{k.replace('_', '-')}={v}" for k, v in launch_flags.items()]
  start = time.time()
  proc = subprocess.run([sys.executable, LAUNCH, "-n", str(processes), "-d", str(devices),
                         f"--timeout={timeout}", *flags, "--", *command],
                        capture_output=True, text=True, timeout=timeout + 60,
                        env=_env(**(env or {})), cwd=ROOT)
  return proc.returncode, proc.stdout + proc.stderr, time.time() - start


def _train(workdir, processes, devices, steps, *extra, faults=None):
  """Train through tests/faults.py (``faults``: its FAULT_* variables) on processes x devices."""
  status, out, _ = _launch(processes, devices, [sys.executable, "-m", "tests.faults", "train", *ARGS,
                                                f"--config.num_train_steps={steps}",
                                                "--workdir", str(workdir), *extra], env=faults)
  assert status == 0, out[-5000:]
  return out


def _train_rows(workdir, split="train"):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r for r in rows if r["split"] == split}


def test_two_processes_train_checkpoint_and_one_process_resumes(tmp_path):
  reference, resumed = tmp_path / "pmap", tmp_path / "mesh"
  out = _train(reference, 2, 2, 6, "--config.parallelism=pmap")
  assert "[0] txf:" in out and "[1] txf:" not in out  # only process 0 prints

  mesh = ["--config.parallelism=mesh", "--config.mesh_shape=(1,2,2)"]
  _train(resumed, 2, 2, 3, *mesh)
  assert os.path.isdir(resumed / "checkpoints" / "3")
  out = _train(resumed, 1, 4, 6, *mesh)  # another process count, the same 4-device mesh
  assert "resumed from the checkpoint at step 3" in out, out[-3000:]

  ref_rows, rows = _train_rows(reference), _train_rows(resumed)
  assert sorted(rows) == sorted(ref_rows) == [1, 2, 3, 4, 5, 6]
  for step in ref_rows:
    for key in ("loss", "grad_norm", "accuracy"):
      np.testing.assert_allclose(rows[step][key], ref_rows[step][key], rtol=1e-5, atol=1e-6,
                                 err_msg=f"{key} at step {step}")
  ref_params = workdir_lib.load_params(str(reference))
  params = workdir_lib.load_params(str(resumed))
  import jax
  for a, b in zip(jax.tree_util.tree_leaves(ref_params), jax.tree_util.tree_leaves(params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)

  # both processes average the checkpoints of steps 3 and 6 shard by shard (the default with
  # several processes): params_avg2/ holds the mean that one process takes in float64
  status, out, _ = _launch(2, 2, [sys.executable, "-m", "txf.cli", "average-checkpoints",
                                  "--workdir", str(resumed), "--last", "2"])
  assert status == 0 and "checkpoints at steps 3, 6" in out, out[-3000:]
  assert os.path.isdir(resumed / "params_avg2")
  from txf.train.averaging import average_checkpoints
  average_checkpoints(str(resumed), 2)  # one process, float64 sums: params_avg2.msgpack
  whole = workdir_lib.load_params(str(resumed), "params_avg2.msgpack")
  sharded = workdir_lib.load_params(str(resumed), "params_avg2")
  for a, b in zip(jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(sharded)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)


def test_every_process_resumes_from_the_step_process_0_lists(tmp_path):
  """Process 1 does not see the newest checkpoint (a stale view of the shared folder): it resumes
  from process 0's step all the same, and redoes the last steps exactly."""
  run = tmp_path / "run"
  args = ["--config.parallelism=mesh", "--config.mesh_shape=(1,2,1)", "--config.checkpoint_every=2",
          "--config.keep_checkpoints=0"]
  _train(run, 2, 1, 6, *args)
  first = _train_rows(run)
  assert sorted(os.listdir(run / "checkpoints")) == ["2", "4", "6"]
  shutil.rmtree(run / "checkpoints" / "6")  # as if stopped after step 6's rows, before its checkpoint
  for final in ("params.msgpack", "params"):
    if os.path.isdir(run / final):
      shutil.rmtree(run / final)
    elif os.path.exists(run / final):
      os.remove(run / final)
  # without agreement process 1 would restore step 2 and process 0 step 4: different steps
  out = _train(run, 2, 1, 6, *args, faults={"FAULT_HIDE_CHECKPOINT": "4:1"})
  assert "resumed from the checkpoint at step 4" in out, out[-3000:]
  rows = _train_rows(run)
  assert sorted(rows) == sorted(first) == [1, 2, 3, 4, 5, 6]
  for step in (5, 6):
    for key in ("loss", "grad_norm"):
      assert rows[step][key] == first[step][key], (key, step)  # the same topology: exactly


FSDP8 = ["--config.parallelism=mesh", "--config.mesh_shape=(1,8,1)"]


@pytest.mark.slow
def test_sigterm_to_one_process_stops_all_on_the_same_step_and_resumes_exactly(tmp_path):
  reference, stopped = tmp_path / "reference", tmp_path / "stopped"
  steps, signal_at, log = ["--config.log_every=5", "--config.checkpoint_every=0"], 3, 5
  _train(reference, 1, 8, 8, *FSDP8, *steps)
  out = _train(stopped, 2, 4, 8, *FSDP8, *steps,
               faults={"FAULT_SIGNAL_AT_STEP": str(signal_at), "FAULT_SIGNAL_PROCESS": "1"})
  assert "[1] \ntxf: SIGTERM received" in out or "[1] txf: SIGTERM received" in out, out[-3000:]
  ended = {int(line.split()[-1]) for line in out.splitlines() if "the loop ended after step" in line}
  assert len(ended) == 1, out[-3000:]  # both processes stopped after the same step
  stop = ended.pop()
  delay = stop - signal_at
  print(f"stop delay: {delay} step(s) after the signal (log_every={log})")
  assert 0 <= delay <= 2 and stop < log, (stop, out[-3000:])
  assert sorted(os.listdir(stopped / "checkpoints")) == [str(stop)]  # one checkpoint
  assert "process 0 exit status 0" in out and "process 1 exit status 0" in out
  assert not (stopped / "params.msgpack").exists()

  out = _train(stopped, 1, 8, 8, *FSDP8, *steps)
  assert f"resumed from the checkpoint at step {stop}" in out, out[-3000:]
  for split in ("train", "eval"):
    ref_rows, rows = _train_rows(reference, split), _train_rows(stopped, split)
    assert sorted(rows) == sorted(ref_rows) and rows, (split, sorted(rows), sorted(ref_rows))
    for step, ref in ref_rows.items():
      for key, value in ref.items():
        if isinstance(value, float) and key not in ("tokens_per_second", "elapsed_seconds"):
          np.testing.assert_allclose(rows[step][key], value, rtol=1e-5, atol=1e-7,
                                     err_msg=f"{split} {key} at step {step}")


@pytest.mark.slow
def test_in_loop_evaluation_on_a_two_process_mesh_equals_one_device(tmp_path):
  # copy.py's own model trained for 179 steps on one device (about 3/4 of sentences right: varied,
  # imperfect hypotheses), then resumed for step 180 on one device and on a 2 x 2 mesh; step 180
  # is skipped (a NaN injected, nan_policy=skip), so both evaluate the very same parameters
  args = ["--config.batch_size=32", "--config.model.d_model=64", "--config.model.d_ff=128",
          "--config.log_every=60", "--config.checkpoint_every=0", "--config.decode_examples=24",
          "--config.num_samples=24", "--config.eval_batches=2", "--config.nan_policy=skip"]
  single = ["--config.parallelism=single"]
  _train(tmp_path / "single", 1, 1, 179, *single, *args)
  shutil.copytree(tmp_path / "single", tmp_path / "mesh")
  hyps, skip = {}, {"FAULT_NAN_AT_STEP": "180"}
  for name, processes, devices, layout in [
      ("single", 1, 1, single),
      ("mesh", 2, 2, ["--config.parallelism=mesh", "--config.mesh_shape=(1,4,1)"])]:
    out = _train(tmp_path / name, processes, devices, 180, *layout, *args, faults=skip)
    assert "resumed from the checkpoint at step 179" in out, out[-3000:]
    hyps[name] = [line.split("hyp:", 1)[1] for line in out.splitlines() if "hyp:" in line][-24:]
  assert len({h for h in hyps["single"]}) > 5, hyps["single"]
  assert hyps["mesh"] == hyps["single"]  # every sentence decoded, in order, to the same text
  single, mesh = _train_rows(tmp_path / "single", "eval"), _train_rows(tmp_path / "mesh", "eval")
  assert 0 < single[180]["exact_match"] < 1, single[180]
  for key in ("loss", "accuracy", "nll", "exact_match", "bleu"):
    np.testing.assert_allclose(mesh[180][key], single[180][key], rtol=1e-5, err_msg=key)


def test_a_workdir_conflict_on_process_0_stops_every_process_with_its_error(tmp_path):
  workdir = tmp_path / "taken"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("not a txf run")
  status, out, seconds = _launch(2, 1, [sys.executable, "-m", "txf.cli", "train", *ARGS,
                                        "--config.parallelism=pmap", "--workdir", str(workdir)],
                                 timeout=120, kill_after=60)
  errors = [line for line in out.splitlines() if "txf: error:" in line]
  assert len(errors) == 2 and {e[:4] for e in errors} == {"[0] ", "[1] "}, out[-3000:]
  assert errors[0][4:] == errors[1][4:] and "holds no txf run" in errors[0]
  assert status == 2 and "process 1 exit status 2" in out, out[-3000:]
  assert os.listdir(workdir) == ["notes.txt"]  # nothing written


LATE_FAILURE = """
import time
from txf.runtime import supervise
from txf.parallel import distributed
distributed._initialize(supervise.distributed_args())  # no failure watch: stop_all alone hands over
import jax
if jax.process_index() == 1:
  time.sleep(6)  # process 0 has published the failure long ago and waits for this process
distributed.stop_all('txf: error: the same failure on every process', 2)
"""


def test_a_process_that_meets_another_processs_failure_in_stop_all_exits_with_it_at_once():
  # both fail with the same error (main_first raises it everywhere); process 1 reaches stop_all
  # 6 s after process 0 published it. Process 0 must still be up (its coordination service with
  # it) when process 1 exits: process 1 acknowledges and exits at once, process 0 after that.
  status, out, seconds = _launch(2, 1, [sys.executable, "-c", LATE_FAILURE], timeout=90,
                                 kill_after=60)
  errors = [line for line in out.splitlines() if "txf: error:" in line]
  assert sorted(e[:4] for e in errors) == ["[0] ", "[1] "], out[-3000:]
  assert all(e.endswith("the same failure on every process") for e in errors), out[-3000:]
  assert status == 2 and "process 1 exit status 2" in out and "process 0 exit status 2" in out, \
      out[-3000:]
  assert seconds < 60, seconds


WORKER = """
import os, sys, time
from txf.parallel import distributed
distributed.maybe_initialize()
import jax, jax.numpy as jnp
total = jax.pmap(lambda x: jax.lax.psum(x, 'i'), axis_name='i')
for step in range(600):
  value = float(total(jnp.ones(jax.local_device_count()))[0])
  print('step', step, value, flush=True)
  if step == 2 and jax.process_index() == 1:
    os._exit(3)  # process 1 dies in the middle of the job
  time.sleep(0.1)
"""


def test_a_dead_process_makes_the_others_fail_within_the_heartbeat_timeout():
  # --kill-after is longer than the test allows: process 0 must stop on its own
  status, out, seconds = _launch(2, 2, [sys.executable, "-c", WORKER], timeout=150,
                                 kill_after=600, heartbeat=5)
  assert "[0] step 2 4.0" in out and "[1] step 2 4.0" in out, out[-3000:]
  assert "process 1 exit status 3" in out
  assert status != 0 and status != 124, out[-3000:]
  assert "process 0 exit status 0" not in out
  assert "[0] step 500" not in out
  assert seconds < 120, seconds


def test_the_launcher_stops_the_others_when_one_fails():
  # a long heartbeat: the launcher's own watchdog (--kill-after) ends process 0
  status, out, seconds = _launch(2, 1, [sys.executable, "-c", WORKER], timeout=150,
                                 kill_after=2, heartbeat=300)
  assert "process 1 exited with status 3" in out, out[-3000:]
  assert status == 3  # the first failure's status
  assert "process 0 exit status 0" not in out  # killed by the launcher, or failed on its own
  assert seconds < 100, seconds
