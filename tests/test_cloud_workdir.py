"""A workdir in a bucket (``--workdir gs://bucket/run``): every file of a run goes through epath.

The bucket is a local folder standing in for Cloud Storage: fsspec's ``gs``/``gcs`` protocols are
registered (for this test only) to a ``DirFileSystem`` rooted in a temporary folder, which is what
etils.epath reaches for gs:// paths; orbax writes its arrays through TensorStore, whose gs:// kvstore
is pointed at the same folder (the ``file`` driver), and its Cloud Storage client calls (the
hierarchical-namespace probe) answer "no". The runs train in-process from an empty current
directory, which must stay empty. What the bucket holds is read back with plain ``open`` and
compared with a run of the same config in a local workdir.
"""

import copy
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from etils.epath import backend as epath_backend
from flax import serialization
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from orbax.checkpoint._src.path import gcs_utils

from tb_events import read_events
from test_init_from import small_run_config
from txf import inference
from txf.runtime import storage
from txf.runtime import workdir as workdir_lib
from txf.core.errors import TxfError
from txf.train.metrics import MetricWriter
from txf.train import train
from txf.train.profile import StepProfiler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FakeBucket(DirFileSystem):
  """gs://BUCKET/PATH -> FakeBucket.root/BUCKET/PATH on the local disk."""
  protocol = ("gs", "gcs")
  cachable = False
  root = ""

  def __init__(self, *args, **kwargs):
    super().__init__(path=FakeBucket.root, fs=LocalFileSystem())


@pytest.fixture
def bucket(tmp_path, monkeypatch):
  """The local folder behind gs://; the test runs in an empty current directory ``cwd``."""
  root = tmp_path / "bucket-root"
  root.mkdir()
  monkeypatch.setattr(FakeBucket, "root", str(root))
  for name in FakeBucket.protocol:
    monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, name, FakeBucket)
  epath_backend.fsspec_backend._get_filesystem.cache_clear()
  monkeypatch.setattr(storage, "EXTRA_MODULES", {})  # the Cloud Storage client is not needed here

  def kvstore(path):
    name, rest = gcs_utils.parse_gcs_path(path, add_trailing_slash=False)
    return {"driver": "file", "path": os.path.join(str(root), name, rest)}

  monkeypatch.setattr(gcs_utils, "get_kvstore_for_gcs", kvstore)
  monkeypatch.setattr(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False)
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  yield root
  epath_backend.fsspec_backend._get_filesystem.cache_clear()


_MADE = {}


def _config(tmp_path, steps):
  """The tiny run of test_init_from with ``steps`` steps, a checkpoint and an eval every 2 steps;
  its text files are written once per test (their times are part of the data's fingerprint)."""
  if tmp_path not in _MADE:
    _MADE[tmp_path] = small_run_config(tmp_path)
  c = copy.deepcopy(_MADE[tmp_path])
  c.num_train_steps, c.checkpoint_every, c.eval_every = steps, 2, 2
  return c


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _without_speed(rows):
  return [{k: v for k, v in r.items() if k not in ("tokens_per_second", "train_seconds")}
          for r in rows]


@pytest.mark.slow  # three small trainings (~80 s of CPU): the end-to-end tier
def test_a_run_trains_resumes_and_loads_from_a_bucket(tmp_path, bucket):
  local = str(tmp_path / "local")
  train(_config(tmp_path, 4), local)
  train(_config(tmp_path, 4), "gs://runs/one")
  run = bucket / "runs" / "one"
  assert os.listdir(tmp_path / "cwd") == []  # nothing beside the bucket

  # the same files as a local run, with the same contents
  names = {"config.json", "task.json", "tokenizer", "metrics.jsonl", "params.msgpack", "checkpoints",
           "tensorboard", workdir_lib.LOSS_PLOT, workdir_lib.LR_PLOT}
  assert names <= set(os.listdir(run))
  assert names <= set(os.listdir(local))
  for name in ("params.msgpack", "task.json"):
    with open(run / name, "rb") as a, open(os.path.join(local, name), "rb") as b:
      assert a.read() == b.read(), name
  for name in sorted(os.listdir(os.path.join(local, "tokenizer"))):
    with open(run / "tokenizer" / name, "rb") as a, open(os.path.join(local, "tokenizer", name), "rb") as b:
      assert a.read() == b.read(), name
  rows = _rows(run / "metrics.jsonl")
  assert _without_speed(rows) == _without_speed(_rows(os.path.join(local, "metrics.jsonl")))
  assert sorted(int(n) for n in os.listdir(run / "checkpoints") if n.isdigit()) == [2, 4]
  with open(run / workdir_lib.LOSS_PLOT, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  losses = {e.step: e.summary.value[0].simple_value for e in read_events(str(run / "tensorboard"))
            if e.summary.value and e.summary.value[0].tag == "train/loss"}
  assert losses == pytest.approx({r["step"]: r["loss"] for r in rows if r["split"] == "train"})

  # resume: two more steps from the checkpoint at step 4
  train(_config(tmp_path, 6), "gs://runs/one")
  steps = [r["step"] for r in _rows(run / "metrics.jsonl") if r["split"] == "train"]
  assert steps == [1, 2, 3, 4, 5, 6]
  assert sorted(int(n) for n in os.listdir(run / "checkpoints") if n.isdigit())[-1] == 6
  assert os.listdir(tmp_path / "cwd") == []

  # read back for inference: the parameters in the bucket, and the run's tokenizer
  loaded = inference.load_run("gs://runs/one")
  with open(run / "params.msgpack", "rb") as f:
    expected = serialization.msgpack_restore(f.read())
  assert len(jax.tree_util.tree_leaves(expected)) == len(jax.tree_util.tree_leaves(loaded.params))
  for a, b in zip(jax.tree_util.tree_leaves(loaded.params), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_array_equal(np.asarray(a), b)
  local_run = inference.load_run(local)
  sentence = "a cat sees a dog"
  np.testing.assert_array_equal(loaded.task.encode_source(sentence),
                                local_run.task.encode_source(sentence))

  # an eval report written into the bucket
  workdir_lib.write_json(workdir_lib.path_of("gs://runs/one", workdir_lib.eval_report_name("test")),
                         {"split": "test", "loss": 1.5})
  with open(run / "eval_test.json") as f:
    assert json.load(f) == {"split": "test", "loss": 1.5}
  assert os.listdir(tmp_path / "cwd") == []


def test_fresh_moves_a_bucket_run_aside(tmp_path, bucket):
  assert workdir_lib.prepare("gs://runs/two", _config(tmp_path, 2)) is False
  MetricWriter("gs://runs/two", tensorboard=False).write(1, "train", {"loss": 2.0})
  workdir_lib.save_params("gs://runs/two", {"w": np.ones(3, np.float32)})
  assert workdir_lib.has_trained("gs://runs/two")
  with pytest.raises(workdir_lib.RunConflictError, match="seed"):  # a different run is refused
    changed = _config(tmp_path, 2)
    changed.seed = 7
    workdir_lib.prepare("gs://runs/two", changed)
  assert workdir_lib.prepare("gs://runs/two", _config(tmp_path, 2)) is True  # the same run: resumed
  lines = []
  config = _config(tmp_path, 2)
  config.seed = 7
  assert workdir_lib.prepare("gs://runs/two", config, fresh=True, say=lines.append) is False
  aside = [n for n in os.listdir(bucket / "runs") if n.startswith("two.old-")]
  assert len(aside) == 1 and "params.msgpack" in os.listdir(bucket / "runs" / aside[0])
  assert lines == [f"--fresh: moved the previous run to gs://runs/{aside[0]}"]
  assert os.listdir(bucket / "runs" / "two") == ["config.json"]
  with open(bucket / "runs" / "two" / "config.json") as f:
    assert json.load(f)["seed"] == 7


def test_a_scheme_orbax_cannot_reach_is_one_error(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(TxfError, match=r"s3://.*local or gs://"):
    workdir_lib.prepare("s3://bucket/run", _config(tmp_path, 1))


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_a_missing_filesystem_package_is_one_line_and_writes_nothing(tmp_path):
  if storage._importable("gcsfs"):
    pytest.skip("gcsfs is installed")
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "txf.cli", "train", "--workdir", "gs://bucket/run",
                        "--progress=false", "--config.num_train_steps=1"],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("txf: error:"), out.stderr
  assert "pip install gcsfs" in lines[0]
  assert os.listdir(cwd) == []


def test_a_profile_is_traced_locally_and_copied_up(tmp_path, bucket):
  profiler = StepProfiler("2:3", "gs://runs/profiled", first_step=0)
  profiler.before(1)  # step 2 starts the trace
  assert profiler.running
  profiler.after(2, jax.numpy.ones(3) * 2)
  assert not profiler.running
  traces = [os.path.join(root, name) for root, _, files in os.walk(bucket / "runs" / "profiled")
            for name in files if name.endswith(".xplane.pb")]
  assert traces and all(os.path.getsize(p) > 0 for p in traces)
  assert os.sep.join(["profile", "plugins", "profile"]) in traces[0]
  assert os.listdir(tmp_path / "cwd") == []
