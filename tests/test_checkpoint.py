"""txf.train.checkpoint on small hand-made train states (no training): save/restore, keep-N + best,
a killed save, an unreadable checkpoint, restoring onto another device count, averaging; and the
workdir guard (txf.runtime.workdir) that decides whether a run may resume.

End-to-end kills, signals and NaNs through ``txf train`` are in test_checkpoint_resume.py.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.conftest import ROOT
from txf.runtime import workdir as workdir_lib
from txf.train.averaging import average_checkpoints
from txf.train.checkpoint import Checkpointer, CheckpointFallbackWarning, CheckpointSpec
from txf.core.config import base_config
from txf.train.steps import TrainState, create_train_state
from tests import faults


def _state(offset: float, step: int) -> TrainState:
  """A host TrainState whose params and Adam moments all depend on ``offset``."""
  params = {"dense": {"kernel": np.full((4, 6), offset, np.float32),
                      "bias": np.arange(3, dtype=np.float32) * offset},
            "embed": np.linspace(0, offset, 10, dtype=np.float32).reshape(5, 2)}
  state = jax.device_get(create_train_state(params, optax.adam(1e-3)))
  opt_state = jax.tree_util.tree_map(lambda x: np.asarray(x) + offset / 2, state.opt_state)
  return state.replace(step=np.asarray(step, np.int32), opt_state=opt_state)


def _template() -> TrainState:
  """What the loop restores onto: a freshly initialised state on the default device."""
  return jax.tree_util.tree_map(jnp.asarray, _state(0.0, 0))


def _config(**kw):
  c = base_config()
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def _spec(**kw) -> CheckpointSpec:
  """The checkpointer's spec (``base_config``'s defaults but for ``kw``)."""
  return CheckpointSpec(**kw)


def _assert_tree_equal(a, b):
  la, ta = jax.tree_util.tree_flatten(a)
  lb, tb = jax.tree_util.tree_flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_save_restore_roundtrip_with_data_and_loop_state(tmp_path):
  ck = Checkpointer(str(tmp_path), _spec(keep_checkpoints=3))
  saved = _state(1.5, 20)
  assert ck.save(20, saved, {"next_index": 20, "epoch": 0}, {"loss": 2.5},
                 {"pending": [{"loss": [1.25, "float32"]}]})
  assert not ck.save(20, saved, {"next_index": 20})  # an existing step is never overwritten
  ck.close()

  ck = Checkpointer(str(tmp_path), _spec(keep_checkpoints=3))  # a new process
  restored = ck.restore_latest(_template())
  ck.close()
  assert isinstance(restored.state, TrainState) and restored.step == 20
  _assert_tree_equal(jax.device_get(restored.state), saved)
  assert isinstance(restored.state.params["embed"], jax.Array)  # onto the template's devices
  assert restored.data_state == {"next_index": 20, "epoch": 0}
  assert restored.eval_metrics == {"loss": 2.5}
  assert restored.loop_state == {"pending": [{"loss": [1.25, "float32"]}]}
  meta = json.loads((tmp_path / "checkpoints" / "20" / "meta" / "metadata").read_text())
  assert meta["seed"] == 0 and meta["data_iterator"] == [{"next_index": 20, "epoch": 0}]


def test_no_checkpoint_restores_none(tmp_path):
  ck = Checkpointer(str(tmp_path), _spec())
  assert ck.restore_latest(_template()) is None
  ck.close()


@pytest.mark.parametrize("mode, best", [("max", 40), ("min", 20)])
def test_keeps_last_n_plus_best(tmp_path, mode, best):
  ck = Checkpointer(str(tmp_path), _spec(keep_checkpoints=2, best_metric="bleu", best_mode=mode))
  bleu = {20: 10.0, 40: 30.0, 60: 20.0, 80: None, 100: None}
  for step, b in bleu.items():  # no eval at 80 and 100: never "best"
    ck.save(step, _state(step, step), {"next_index": step},
            None if b is None else {"bleu": b, "loss": 1.0})
  ck.wait()
  assert ck.all_steps() == sorted({best, 80, 100})
  assert ck.best_step() == best
  ck.close()
  assert sorted(os.listdir(tmp_path / "checkpoints")) == sorted(str(s) for s in {best, 80, 100})


def test_keep_without_best_metric_keeps_last_n(tmp_path):
  ck = Checkpointer(str(tmp_path), _spec(keep_checkpoints=2))
  for step in (10, 20, 30):
    ck.save(step, _state(step, step), {"next_index": step}, {"loss": 1.0 / step})
  ck.close()
  ck = Checkpointer(str(tmp_path))
  assert ck.all_steps() == [20, 30]
  ck.close()


def test_save_is_asynchronous(tmp_path, monkeypatch):
  """save() returns while the write is still going on; wait() finishes it."""
  faults.slow_saves(monkeypatch, 1.0)
  ck = Checkpointer(str(tmp_path), _spec())
  ck.save(10, _state(1.0, 10), {"next_index": 10})
  assert "10" not in os.listdir(tmp_path / "checkpoints")  # returned before the write ended
  # the write is under way in the background: its temporary directory appears (orbax's thread
  # may create it a moment after save() returns), and the checkpoint is not final meanwhile
  deadline, names = time.time() + 0.8, []
  while time.time() < deadline and not any(n.startswith("10.orbax-checkpoint-tmp") for n in names):
    time.sleep(0.01)
    names = os.listdir(tmp_path / "checkpoints")
  assert "10" not in names and any(n.startswith("10.orbax-checkpoint-tmp") for n in names), names
  ck.wait()
  assert os.listdir(tmp_path / "checkpoints") == ["10"]
  ck.close()


def test_unfinished_save_is_not_a_checkpoint(tmp_path):
  """What a process killed mid-save leaves (a temporary directory) is ignored and cleaned up.

  (test_checkpoint_resume.py kills a real ``txf train`` during a save.)
  """
  ck = Checkpointer(str(tmp_path), _spec())
  ck.save(10, _state(1.0, 10), {"next_index": 10})
  ck.close()
  partial = tmp_path / "checkpoints" / "20.orbax-checkpoint-tmp-1234"
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "half_written").write_bytes(b"\0" * 10)
  ck = Checkpointer(str(tmp_path), _spec())
  assert ck.all_steps() == [10]
  assert ck.restore_latest(_template()).step == 10
  ck.close()


def _truncate_files(directory):
  for root, _, files in os.walk(directory):
    for name in files:
      if name != "_CHECKPOINT_METADATA":
        with open(os.path.join(root, name), "r+b") as f:
          f.truncate(0)


def test_unreadable_latest_falls_back_to_previous_with_warning(tmp_path):
  ck = Checkpointer(str(tmp_path), _spec(keep_checkpoints=5))
  for step in (10, 20, 30):
    ck.save(step, _state(step, step), {"next_index": step})
  ck.close()
  _truncate_files(tmp_path / "checkpoints" / "30" / "state")       # truncated array files
  os.remove(tmp_path / "checkpoints" / "20" / "meta" / "metadata")  # a missing file
  ck = Checkpointer(str(tmp_path), _spec(keep_checkpoints=5))
  with pytest.warns(CheckpointFallbackWarning) as record:
    restored = ck.restore_latest(_template())
  assert restored.step == 10 and restored.data_state == {"next_index": 10}
  _assert_tree_equal(jax.device_get(restored.state), _state(10, 10))
  messages = " ".join(str(w.message) for w in record)
  assert "step 30 is unreadable" in messages and "step 20 is unreadable" in messages
  assert ck.all_steps() == [10]
  # nothing deleted: the unreadable ones were moved aside, and new saves of those steps work
  aside = sorted(os.listdir(tmp_path / "checkpoints-unreadable"))
  assert [a.split("-")[0] for a in aside] == ["20", "30"]
  assert ck.save(20, _state(20, 20), {"next_index": 20})
  ck.close()


def test_checkpoint_that_does_not_fit_the_target_is_kept_and_refused(tmp_path):
  """A readable checkpoint is never moved aside because the new run's state has another shape."""
  ck = Checkpointer(str(tmp_path), _spec())
  ck.save(10, _state(1.0, 10), {"next_index": 10})
  ck.close()
  wider = _template().replace(params={**_template().params, "embed": jnp.zeros((5, 3))})
  ck = Checkpointer(str(tmp_path), _spec())
  with pytest.raises(ValueError, match="step 10 .* is readable but does not fit"):
    ck.restore_latest(wider)
  assert ck.all_steps() == [10] and not (tmp_path / "checkpoints-unreadable").exists()
  ck.close()


def test_restore_params_only_and_average(tmp_path):
  ck = Checkpointer(str(tmp_path), _spec(keep_checkpoints=4))
  for step in (10, 20, 30, 40):
    ck.save(step, _state(step / 7, step), {"next_index": step})
  ck.close()
  ck = Checkpointer(str(tmp_path))  # read-only
  _assert_tree_equal(ck.restore_params(30), _state(30 / 7, 30).params)
  full = [ck.restore(s).state["params"] for s in (20, 30, 40)]
  ck.close()
  path, steps = average_checkpoints(str(tmp_path), 3)
  assert steps == [20, 30, 40] and path == str(tmp_path / "params_avg3.msgpack")
  averaged = workdir_lib.load_params(str(tmp_path), "params_avg3.msgpack")
  expected = jax.tree_util.tree_map(
      lambda *xs: np.mean(np.stack(xs).astype(np.float64), axis=0).astype(np.float32), *full)
  la, ta = jax.tree_util.tree_flatten(averaged)
  lb, tb = jax.tree_util.tree_flatten(expected)
  assert ta == tb
  for a, b in zip(la, lb):
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="fewer than --last=5"):
    average_checkpoints(str(tmp_path), 5)


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_restore_onto_another_device_count(tmp_path):
  """Saved from one device; restored in a process with 4 CPU devices onto a sharded mesh target."""
  ck = Checkpointer(str(tmp_path), _spec())
  ck.save(10, _state(3.0, 10), {"next_index": 10})
  ck.close()
  script = textwrap.dedent(f"""
      import jax, numpy as np
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      from tests.test_checkpoint import _template, _state, _assert_tree_equal
      from txf.train.checkpoint import Checkpointer
      assert jax.device_count() == 4
      mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "tensor"))
      def sharding(x):
        spec = P("data", "tensor") if x.ndim == 2 and x.shape[0] % 2 == x.shape[1] % 2 == 0 else P()
        return NamedSharding(mesh, spec)
      target = jax.tree_util.tree_map(
          lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding(x)), _template())
      restored = Checkpointer({str(tmp_path)!r}).restore_latest(target)
      kernel = restored.state.params["dense"]["kernel"]
      assert kernel.sharding == sharding(kernel) and len(kernel.addressable_shards) == 4, kernel.sharding
      _assert_tree_equal(jax.device_get(restored.state), _state(3.0, 10))
      print("ok", restored.step)
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
  r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                     cwd=ROOT, timeout=300)
  assert r.returncode == 0 and "ok 10" in r.stdout, r.stderr[-3000:]


# -- the workdir guard: which runs may resume ---------------------------------------------------

def _trained(workdir):
  """Mark the run in ``workdir`` as one that has trained (a metrics row)."""
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.write('{"step": 1, "split": "train"}\n')


def test_different_model_config_is_refused_naming_the_fields(tmp_path):
  workdir = str(tmp_path / "run")
  assert workdir_lib.prepare(workdir, _config()) is False
  _trained(workdir)
  other = _config()
  other.model.d_model, other.model.num_heads = 256, 4
  with pytest.raises(workdir_lib.RunConflictError) as e:
    workdir_lib.prepare(workdir, other)
  message = str(e.value)
  assert "model.d_model: 512 (in workdir) != 256 (now)" in message
  assert "model.num_heads: 8 (in workdir) != 4 (now)" in message
  assert "--fresh" in message and "model.d_ff" not in message


def test_resumable_fields_may_change(tmp_path):
  workdir = str(tmp_path / "run")
  workdir_lib.prepare(workdir, _config())
  _trained(workdir)
  steps = _config().num_train_steps
  longer = _config(num_train_steps=5000, checkpoint_every=7, keep_checkpoints=9, nan_policy="skip")
  assert workdir_lib.prepare(workdir, longer) is True
  assert workdir_lib.load_config(workdir).num_train_steps == steps  # until it trains on
  workdir_lib.record_config(workdir, longer)
  assert workdir_lib.load_config(workdir).num_train_steps == 5000


def test_a_run_that_never_trained_is_replaced(tmp_path):
  workdir = str(tmp_path / "run")
  workdir_lib.prepare(workdir, _config())
  (tmp_path / "run" / "task.json").write_text("{}")  # a start that failed after preparing
  other = _config()
  other.model.d_model = 256
  assert workdir_lib.prepare(workdir, other) is False
  assert workdir_lib.load_config(workdir).model.d_model == 256
  (tmp_path / "run" / "checkpoints" / "3").mkdir(parents=True)  # now it has trained
  with pytest.raises(workdir_lib.RunConflictError):
    workdir_lib.prepare(workdir, _config())


def test_disk_errors_name_the_path_and_the_fix_and_pass_other_errors():
  import errno
  with pytest.raises(workdir_lib.DiskError) as e:
    with workdir_lib.disk_errors("/x/params.msgpack", need_bytes=3 * 2 ** 30):
      raise OSError(errno.ENOSPC, "No space left on device")
  # /x does not exist: the device named is the one of "/", its free space from os.statvfs
  st = os.statvfs("/")
  free = st.f_bavail * st.f_frsize / 2 ** 30
  match = re.fullmatch(r"writing /x/params\.msgpack: no space left on (\S+) \(mounted on /, "
                       r"([0-9.]+) GiB free\): free ([0-9.]+) GiB there or choose another "
                       r"--workdir, then run the same command again", str(e.value))
  assert match, str(e.value)
  assert float(match.group(2)) == pytest.approx(free, abs=0.02)
  assert float(match.group(3)) == pytest.approx(3.0, abs=0.01)
  with pytest.raises(workdir_lib.DiskError, match="saving to /c: the file system is read-only"):
    with workdir_lib.disk_errors("/c", "saving to"):
      try:
        raise OSError(errno.EROFS, "Read-only file system")
      except OSError as inner:  # a library re-raising it as its own error
        raise ValueError("save failed") from inner
  with pytest.raises(FileNotFoundError):
    with workdir_lib.disk_errors("/x"):
      raise FileNotFoundError(errno.ENOENT, "missing")


def test_fresh_moves_the_old_run_aside(tmp_path, capfd):
  workdir = str(tmp_path / "run")
  workdir_lib.prepare(workdir, _config())
  (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
  other = _config()
  other.model.d_model = 256
  said = []
  assert workdir_lib.prepare(workdir, other, fresh=True, say=said.append) is False
  aside = [p for p in os.listdir(tmp_path) if p.startswith("run.old-")]
  assert len(aside) == 1
  assert said == [f"--fresh: moved the previous run to {tmp_path / aside[0]}"]
  assert capfd.readouterr() == ("", "")   # the library says it through ``say`` only
  assert (tmp_path / aside[0] / "metrics.jsonl").read_text() == '{"step": 1}\n'
  assert workdir_lib.load_config(workdir).model.d_model == 256


# -- preemption signals (the loop's handler; test_checkpoint_resume.py sends a real SIGTERM) -----

def _wait_for(condition, timeout=5.0):
  end = time.time() + timeout
  while not condition() and time.time() < end:
    time.sleep(0.01)
  return condition()


@pytest.mark.parametrize("first, second", [(signal.SIGTERM, signal.SIGINT),
                                           (signal.SIGINT, signal.SIGINT)])
def test_first_signal_requests_a_stop_second_exits_at_once(monkeypatch, first, second):
  from txf.train.stopping import Preemption
  before = signal.getsignal(first)
  exits = []
  monkeypatch.setattr(os, "_exit", exits.append)
  with Preemption() as preemption:
    assert not preemption.requested()
    os.kill(os.getpid(), first)
    assert _wait_for(lambda: preemption.signum == first)
    assert preemption.requested() and preemption.signal_name == first.name
    assert exits == []
    os.kill(os.getpid(), second)
    assert _wait_for(lambda: exits == [128 + second])
  assert signal.getsignal(first) == before  # the previous handlers are back


def test_export_best_latest_and_numbered_checkpoint(tmp_path):
  """'best' is the checkpoint orbax keeps as best (the eval metric saved with it), 'latest' the
  newest, a number that step."""
  config = _config(keep_checkpoints=2, best_metric="accuracy")
  ck = Checkpointer(str(tmp_path), CheckpointSpec.from_config(config))
  for step, accuracy in ((10, 0.5), (20, 0.8), (30, 0.7), (40, 0.6)):
    ck.save(step, _state(step / 7, step), {"next_index": step}, {"accuracy": accuracy})
  ck.close()
  (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
  for which, expected in (("best", 20), ("latest", 40), ("30", 30)):
    path, steps = average_checkpoints(str(tmp_path), 1, step=which)
    assert steps == [expected] and path == str(tmp_path / f"params_{which}.msgpack")
    _assert_tree_equal(workdir_lib.load_params(str(tmp_path), path), _state(expected / 7, expected).params)
  with pytest.raises(ValueError, match="one of the saved steps"):
    average_checkpoints(str(tmp_path), 1, step="25")
  (tmp_path / "config.json").write_text(json.dumps(_config().to_dict()))
  with pytest.raises(ValueError, match="without best_metric"):
    average_checkpoints(str(tmp_path), 1, step="best")


def test_average_reads_one_array_at_a_time(tmp_path, monkeypatch):
  """Averaging never restores a whole checkpoint (or its whole params): every read is one array."""
  ck = Checkpointer(str(tmp_path), _spec(keep_checkpoints=3))
  for step in (1, 2):
    ck.save(step, _state(step * 0.5, step), {"next_index": step})
  ck.close()
  reads = []
  original = Checkpointer._restore_leaf
  monkeypatch.setattr(Checkpointer, "_restore_numpy",
                      lambda *a, **k: pytest.fail("a whole checkpoint was read"))
  monkeypatch.setattr(Checkpointer, "_restore_leaf",
                      lambda self, step, keys, meta: reads.append(keys) or original(self, step, keys, meta))
  average_checkpoints(str(tmp_path), 2)
  averaged = workdir_lib.load_params(str(tmp_path), "params_avg2.msgpack")
  leaves = jax.tree_util.tree_leaves(averaged)
  assert len(reads) == 2 * len(leaves)
  expected = jax.tree_util.tree_map(lambda a, b: ((a.astype(np.float64) + b) / 2).astype(a.dtype),
                                    _state(0.5, 1).params, _state(1.0, 2).params)
  for a, b in zip(leaves, jax.tree_util.tree_leaves(expected)):
    np.testing.assert_array_equal(a, b)


def test_average_shard_by_shard_over_four_devices(tmp_path):
  """--sharded: every checkpoint array is read as 4 shards of a global array (never whole), the
  mean is taken on the devices and written as an orbax directory of shards; it reads back as the
  float64 mean of the checkpoints (to float32 rounding), and one exported step exactly."""
  rng = np.random.default_rng(0)
  states = []
  ck = Checkpointer(str(tmp_path), _spec(keep_checkpoints=3))
  for step in (1, 2, 3):
    state = _state(step * 0.25, step)
    params = jax.tree_util.tree_map(lambda x: (x + rng.normal(size=x.shape)).astype(np.float32),
                                    state.params)
    states.append(state.replace(params=params))
    ck.save(step, states[-1], {"next_index": step})
  ck.close()
  expected = jax.tree_util.tree_map(
      lambda *xs: np.mean(np.stack(xs).astype(np.float64), axis=0), *[s.params for s in states[1:]])
  np.savez(tmp_path / "expected.npz", **{"/".join(map(str, k)): v for k, v in
                                        _flat_items(expected)})
  np.savez(tmp_path / "step2.npz", **{"/".join(map(str, k)): v for k, v in _flat_items(states[1].params)})
  script = textwrap.dedent(f"""
      import jax, numpy as np
      from txf.train.averaging import average_checkpoints
      from txf.train.checkpoint import Checkpointer
      from txf.runtime import workdir as workdir_lib
      reads = []
      original = Checkpointer._restore_leaf
      def spy(self, step, keys, meta, sharding=None):
        x = original(self, step, keys, meta, sharding)
        reads.append((x.shape, [s.data.shape for s in x.addressable_shards]))
        return x
      Checkpointer._restore_leaf = spy
      path, steps = average_checkpoints({str(tmp_path)!r}, 2, sharded=True)
      assert steps == [2, 3] and path.endswith("params_avg2"), path
      assert len(reads) == 2 * 3, reads
      kernel = [r for r in reads if r[0] == (4, 6)]
      assert kernel and all(shards == [(1, 6)] * 4 for _, shards in kernel), kernel
      got = workdir_lib.load_params({str(tmp_path)!r}, "params_avg2")
      want = np.load({str(tmp_path / "expected.npz")!r})
      flat = jax.tree_util.tree_flatten_with_path(got)[0]
      assert len(flat) == len(want.files)
      for k, v in flat:
        key = "/".join(p.key for p in k)
        assert v.dtype == np.float32
        np.testing.assert_allclose(v, want[key], rtol=1e-6, atol=1e-7)
      path, steps = average_checkpoints({str(tmp_path)!r}, 1, step="2", sharded=True)
      assert steps == [2] and path.endswith("params_2"), path
      one = np.load({str(tmp_path / "step2.npz")!r})
      for k, v in jax.tree_util.tree_flatten_with_path(workdir_lib.load_params({str(tmp_path)!r}, "params_2"))[0]:
        np.testing.assert_array_equal(v, one["/".join(p.key for p in k)])
      print("ok")
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
  r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                     cwd=ROOT, timeout=300)
  assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def _flat_items(tree):
  """(path of dict keys, leaf) of a nested-dict tree."""
  return [(tuple(p.key for p in k), v) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]]


def test_sharded_params_directory_loads_like_msgpack(tmp_path):
  """params/ (orbax shards, what a multi-process mesh run writes) reads back as params.msgpack does."""
  params = _state(0.25, 3).params
  path = workdir_lib.save_params_sharded(str(tmp_path), jax.device_put(params))
  assert path == str(tmp_path / "params") and workdir_lib.params_location(str(tmp_path)) == path
  loaded = workdir_lib.load_params(str(tmp_path))
  _assert_tree_equal(loaded, params)
  workdir_lib.save_params(str(tmp_path), params)  # a later finish on one process replaces them
  assert workdir_lib.params_location(str(tmp_path)) == str(tmp_path / "params.msgpack")
  assert not (tmp_path / "params").exists()
  workdir_lib.save_params_sharded(str(tmp_path), jax.device_put(params))  # and the reverse
  assert not (tmp_path / "params.msgpack").exists()
  _assert_tree_equal(workdir_lib.load_params(str(tmp_path)), params)
