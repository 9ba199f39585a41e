"""`--config.profile_steps=START:END`: a jax.profiler trace of steps START..END-1 in
workdir/profile/, never of the step that compiles."""

import os
import subprocess
import sys

import pytest

from tests.conftest import EXPERIMENTS, ROOT
from txf.core.config import ConfigError, base_config, validate
from txf.train import profile

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)


def traced_steps(spec, first_step, total, monkeypatch, tmp_path):
  """The steps a StepProfiler traces over steps first_step+1..total (trace calls recorded)."""
  events = []
  monkeypatch.setattr(profile.jax.profiler, "start_trace", lambda d: events.append(("start", d)))
  monkeypatch.setattr(profile.jax.profiler, "stop_trace", lambda: events.append(("stop",)))
  monkeypatch.setattr(profile.jax, "block_until_ready", lambda x: x)
  p = profile.StepProfiler(spec, str(tmp_path), first_step)
  traced = []
  for done in range(first_step, total):
    p.before(done)
    if p.running:
      traced.append(done + 1)
    p.after(done + 1, None)
  p.close()
  assert [e[0] for e in events] == (["start", "stop"] if traced else [])
  return traced


def test_the_chosen_steps_are_traced_and_never_the_compiling_one(monkeypatch, tmp_path):
  assert traced_steps("3:6", 0, 10, monkeypatch, tmp_path) == [3, 4, 5]
  assert traced_steps("1:4", 0, 10, monkeypatch, tmp_path) == [2, 3]     # step 1 compiles
  assert traced_steps("5:9", 6, 10, monkeypatch, tmp_path) == [8]        # resumed at 6: 7 compiles
  assert traced_steps("2:3", 0, 10, monkeypatch, tmp_path) == [2]
  assert traced_steps("1:2", 0, 10, monkeypatch, tmp_path) == []         # only the compiling step
  assert traced_steps("", 0, 10, monkeypatch, tmp_path) == []
  assert traced_steps("8:20", 0, 10, monkeypatch, tmp_path) == [8, 9, 10]  # the run ends first


@pytest.mark.parametrize("spec", ["3", "5:5", "0:2", "a:b", "4:2"])
def test_bad_profile_steps_are_config_errors(spec):
  cfg = base_config()
  cfg.profile_steps = spec
  with pytest.raises(ConfigError, match="profile_steps"):
    validate(cfg)
  with pytest.raises(ConfigError, match="profile_steps"):
    profile.parse_steps(spec)


@pytest.mark.slow
def test_a_run_writes_a_trace_of_its_steps(tmp_path):
  workdir = tmp_path / "run"
  out = subprocess.run(
      [sys.executable, "-m", "txf.cli", "train", "--config", os.path.join(EXPERIMENTS, "copy.py"),
       "--progress=false", "--workdir", str(workdir), "--config.num_train_steps=4",
       "--config.profile_steps=2:4", "--config.batch_size=8", "--config.model.d_model=16",
       "--config.model.d_ff=32", "--config.eval_batches=1", "--config.decode_examples=0",
       "--config.num_samples=0"], cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3"))
  assert out.returncode == 0, out.stderr[-3000:]
  traces = [os.path.join(d, f) for d, _, files in os.walk(workdir / "profile") for f in files
            if f.endswith(".xplane.pb")]
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0, traces
