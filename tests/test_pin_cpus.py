"""TXF_CPUS: a run kept to some CPUs once jax's backend has started (txf sweep --pin_cpus)."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_txf
from txf.core.errors import TxfError
from txf.runtime import machine


def test_a_cpu_list_is_numbers_and_inclusive_ranges():
  assert machine.parse_cpus("0-3,6") == {0, 1, 2, 3, 6}
  assert machine.parse_cpus(" 1 ") == {1}
  for bad in ("", "x", "-1", "3-1", "0,,1"):
    with pytest.raises(TxfError, match="TXF_CPUS=.* is not a list of CPUs"):
      machine.parse_cpus(bad)


def _thread_cpus(env_cpus):
  """The Cpus_allowed_list of every thread of a process that ran pin_from_environment."""
  code = ("from txf.runtime import machine\nimport os\nmachine.pin_from_environment()\n"
          "for t in sorted(os.listdir('/proc/self/task')):\n"
          "  print([l.split()[1] for l in open(f'/proc/self/task/{t}/status') "
          "if l.startswith('Cpus_allowed_list')][0])\n")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", machine.CPUS_ENV: env_cpus}
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)


def test_every_thread_keeps_to_the_cpus_named_and_a_cpu_the_machine_lacks_is_refused():
  first = str(min(os.sched_getaffinity(0)))
  done = _thread_cpus(first)
  assert done.returncode == 0, done.stderr
  cpus = done.stdout.split()
  assert len(cpus) > 1 and set(cpus) == {first}, cpus   # XLA's pool threads among them
  missing = _thread_cpus(str(max(os.sched_getaffinity(0)) + 1))
  assert missing.returncode != 0 and "which this process may not run on" in missing.stderr


@pytest.mark.slow  # three short training runs
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin one of")
def test_a_run_kept_to_one_cpu_after_its_start_computes_what_it_computes_unpinned(tmp_path):
  args = ["train", "--config.num_train_steps=100", "--config.eval_every=0",
          "--config.log_every=50", "--config.checkpoint_every=0", "--progress=false"]
  plain = run_txf(*args, "--workdir", str(tmp_path / "plain"))
  second = sorted(os.sched_getaffinity(0))[1]
  pinned = run_txf(*args, "--workdir", str(tmp_path / "pinned"),
                   env={machine.CPUS_ENV: str(second)})
  assert plain.returncode == 0 and pinned.returncode == 0, plain.stderr + pinned.stderr
  # kept to one CPU from its start, XLA's thread pool has one thread and the sums another order
  started_on_one = subprocess.run(
      [sys.executable, "-m", "txf.cli", *args, "--workdir", str(tmp_path / "one")], cwd=ROOT,
      env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=300,
      preexec_fn=lambda: os.sched_setaffinity(0, {second}))
  assert started_on_one.returncode == 0, started_on_one.stderr
  read = lambda name: open(tmp_path / name / "params.msgpack", "rb").read()
  assert read("plain") == read("pinned") != read("one")
