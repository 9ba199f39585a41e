"""Several processes as one job, over loopback (jax.distributed on 127.0.0.1, gloo CPU collectives),
started by launch/local.py exactly as a user would:

- 2 processes x 2 devices train with parallelism='mesh' (fsdp=2 across the processes, tensor=2
  within each), checkpoint (every process writes its own shards), and the run is resumed by
  1 process x 4 devices; steps and final parameters equal an uninterrupted 2-process pmap run.
- when one process dies, the other exits with an error within a bounded time (jax.distributed's
  heartbeat timeout) instead of hanging in a collective.

Every run is a tiny copy model with dropout 0 (pmap and mesh draw dropout masks differently);
subprocesses use XLA optimisation level 0 and a shared persistent compilation cache to compile fast.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from tests.conftest import EXPERIMENTS, ROOT
from txf import workdir as workdir_lib

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
             XLA_FLAGS="--xla_backend_optimization_level=0", TF_CPP_MIN_LOG_LEVEL="3")
  env.update(extra)
  return env


def _launch(processes, devices, command, timeout=300, **launch_flags):
  """launch/local.py -n processes -d devices [flags] -- command; returns (status, output, seconds)."""
  flags = [f"--{k.replace('_', '-')}={v}" for k, v in launch_flags.items()]
  start = time.time()
  proc = subprocess.run([sys.executable, LAUNCH, "-n", str(processes), "-d", str(devices),
                         f"--timeout={timeout}", *flags, "--", *command],
                        capture_output=True, text=True, timeout=timeout + 60, env=_env(), cwd=ROOT)
  return proc.returncode, proc.stdout + proc.stderr, time.time() - start


def _train(workdir, processes, devices, steps, *extra):
  status, out, _ = _launch(processes, devices, [sys.executable, "-m", "txf.cli", "train", *ARGS,
                                                f"--config.num_train_steps={steps}",
                                                "--workdir", str(workdir), *extra])
  assert status == 0, out[-5000:]
  return out


def _train_rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r for r in rows if r["split"] == "train"}


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
