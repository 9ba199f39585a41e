"""The chaos harness (bench/chaos.py) and what it relies on: its seeded schedule, the exit statuses a
requeueing launcher acts on (a full disk is resumable: 75 under such a launcher, 2 otherwise), and
the short mode end to end (5 faults in sequence on one process, the copy task, then the run equal
to an uninterrupted one, bit for bit)."""

import errno
import os
import subprocess
import sys
import threading

import pytest

from bench import chaos, chaos_faults
from tests.conftest import ROOT
from txf.commands import reporting
from txf.core import errors
from txf.runtime import workdir as workdir_lib


def test_the_schedule_has_every_kind_twice_in_twenty_and_is_the_seed_s():
  plan = chaos.schedule(0, 20, 96, short=False)
  kinds = [f["kind"] for f in plan]
  assert len(plan) == 20 and all(kinds.count(k) >= 2 for k in chaos.KINDS)
  steps = [f["step"] for f in plan]
  assert steps == sorted(steps) and len(set(steps)) == 20 and 3 <= steps[0] and steps[-1] < 93
  assert {f["process"] for f in plan} == {0, 1}
  for kind in chaos.KINDS:  # each kind meets both processes
    assert {f["process"] for f in plan if f["kind"] == kind} == {0, 1}, kind
  assert chaos.schedule(0, 20, 96, short=False) == plan
  assert chaos.schedule(1, 20, 96, short=False) != plan
  short = chaos.schedule(0, 5, 36, short=True, kinds=[k for k in chaos.KINDS if k != "disk_full"])
  assert len({f["kind"] for f in short}) == 5 and "disk_full" not in {f["kind"] for f in short}


def test_a_full_disk_is_resumable_under_a_requeueing_launcher(tmp_path):
  def raised(errnum):
    with pytest.raises(workdir_lib.DiskError) as e:
      with workdir_lib.disk_errors(str(tmp_path), "writing"):
        raise OSError(errnum, os.strerror(errnum))
    return e.value

  full, denied = raised(errno.ENOSPC), raised(errno.EACCES)
  requeue = {errors.REQUEUE_ENV: "1"}
  assert errors.exit_status(full, requeue) == errors.EXIT_RESUMABLE == 75
  assert errors.exit_status(full, {}) == errors.exit_status(full, {errors.REQUEUE_ENV: "0"}) == 2
  assert errors.exit_status(denied, requeue) == 2  # a read-only or foreign workdir needs a hand
  assert errors.exit_status(errors.TxfError("a bad config"), requeue) == 2


def test_the_latest_checkpoint_and_the_cut(tmp_path):
  for step in (2, 4, 10):
    (tmp_path / "checkpoints" / str(step) / "meta").mkdir(parents=True)
    (tmp_path / "checkpoints" / str(step) / "meta" / "metadata").write_bytes(b"m" * 30)
    (tmp_path / "checkpoints" / str(step) / "d").write_bytes(b"x" * 90)
  (tmp_path / "checkpoints" / "12.orbax-checkpoint-tmp-1").mkdir()  # a save in flight
  assert chaos_faults.latest_checkpoint(str(tmp_path)).endswith(os.path.join("checkpoints", "10"))
  assert chaos_faults.truncate_latest(str(tmp_path), 1).endswith(os.path.join("10", "d"))
  assert os.path.getsize(tmp_path / "checkpoints" / "10" / "d") == 30
  assert chaos_faults.truncate_latest(str(tmp_path), 2).endswith(os.path.join("10", "meta", "metadata"))
  assert os.path.getsize(tmp_path / "checkpoints" / "10" / "meta" / "metadata") == 10


def test_a_thread_that_meets_a_full_disk_says_nothing_and_others_are_shown(monkeypatch):
  """Found by the chaos run: TensorBoard's event writer thread printed a 14-line traceback on a full
  disk, before the run's own one line about it."""
  shown = []
  monkeypatch.setattr(threading, "excepthook", lambda args: shown.append(args.exc_value))
  reporting.quiet_full_disk_in_threads()

  def fails(exc):
    def run():
      raise exc
    t = threading.Thread(target=run)
    t.start()
    t.join()

  fails(OSError(errno.ENOSPC, "No space left on device"))
  fails(ValueError('Error writing local file "x": [OS error: No space left on device]'))
  assert shown == []
  denied, bug = OSError(errno.EACCES, "Permission denied"), RuntimeError("a bug in a thread")
  fails(denied)
  fails(bug)
  assert shown == [denied, bug]


@pytest.mark.slow  # a chaos run of about six starts of a training job: the end-to-end tier
def test_the_short_chaos_run_ends_bit_identical(tmp_path):
  r = subprocess.run([sys.executable, "-m", "bench.chaos", "--short", "--dir", str(tmp_path)],
                     capture_output=True, text=True, timeout=600, cwd=ROOT,
                     env={**os.environ, "JAX_PLATFORMS": "cpu"})
  out = r.stdout + r.stderr[-3000:]
  assert r.returncode == 0, out
  assert "total                 5" in r.stdout, out
  assert "ended by itself: yes" in r.stdout, out
  assert "over one line per fault met: 0" in r.stdout, out
  assert "metrics.jsonl rows equal (timings aside): yes" in r.stdout, out
  assert "final parameters equal (bit for bit): yes" in r.stdout, out


def test_the_multi30k_job_without_its_data_is_one_error_line(capsys, tmp_path):
  assert chaos.main(["--task", "multi30k", "--data", str(tmp_path), "--dir", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("txf: error: the Multi30k job needs the shared data")


def test_the_multi30k_job_is_packed_and_decodes():
  """The long mode's job: Multi30k en->de with packing on and decoding at each evaluation,
  checkpointed every 2 steps; the copy task's flags are those the short mode always had."""
  args = chaos.job_args(96, 2, eval_every=8, task="multi30k")
  assert args[:3] == ["train", "--config", os.path.join(ROOT, "experiments", "multi30k_en_de_tiny.py")]
  assert "--config.parallelism=mesh" in args and "--config.checkpoint_every=2" in args
  assert "--config.data.packing=false" not in args and "--config.decode_examples=16" in args
  from txf.core.config import load_experiment  # pylint: disable=import-outside-toplevel
  config = load_experiment(args[2])
  assert config.data.packing and config.bleu_protocol == "tok-lc"
  copy = chaos.job_args(36, 1, eval_every=6)
  assert "--config.decode_examples=8" in copy and "--config.parallelism=mesh" not in copy
