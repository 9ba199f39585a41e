"""`txf plan --topology NAME`: TPU slices compiled ahead of time from this CPU host (libtpu).

The name parsing and the one-line error need no libtpu; the compiled plans skip without it
(`pip install -e '.[tpu]'`)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from txf.plan import topology
from txf.core.config import ConfigError

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
TINY = ["--config=experiments/copy.py", "--config.parallelism=mesh", "--config.mesh_shape=(1,-1,1)",
        "--config.model.d_model=64", "--config.batch_size=32"]


def test_topology_names():
  assert topology.parse_topology("v5e-8") == ("v5e", "v5e:2x4", 1)
  assert topology.parse_topology("v4-32") == ("v4", "v4:2x2x4", 1)        # 32 TensorCores, 16 chips
  assert topology.parse_topology("v5p-128") == ("v5p", "v5p:4x4x4", 1)
  assert topology.parse_topology("v6e-256") == ("v6e", "v6e:16x16", 1)
  assert topology.parse_topology("2xv5e-256") == ("v5e", "v5e:16x16", 2)
  assert topology.parse_topology("v5e:2x2") == ("v5e", "v5e:2x2", 1)
  assert topology.chip("v5e-8")["hbm_bytes"] == 16 * 2 ** 30
  with pytest.raises(ConfigError, match="v5e-8.*v6e-256|v4-32"):
    topology.parse_topology("v9z-8")


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_unknown_topology_is_one_error_line():
  out = subprocess.run([sys.executable, "-m", "txf.cli", "plan", "--topology", "v9z-8", *TINY], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3"))
  assert out.returncode == 2, out.stderr[-2000:]
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("txf: error: unknown TPU topology 'v9z-8'")
  assert "v5e-8" in lines[0] and "2xv5e-256" in lines[0]


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (pip install -e '.[tpu]')")
def test_plan_for_a_v5e_8_slice(tmp_path):
  out = subprocess.run([sys.executable, "-m", "txf.cli", "plan", "--topology", "v5e-8", *TINY,
                        "--json", str(tmp_path / "plan.json")], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert out.returncode == 0, out.stderr[-3000:]
  plan = json.loads((tmp_path / "plan.json").read_text())
  assert plan["platform"] == "tpu" and plan["devices"] == 8 and plan["topology"] == "v5e-8"
  assert plan["mesh_shape"] == [1, 8, 1]
  assert plan["model"]["dtype"] == "bfloat16"           # auto: bf16 compute on TPU
  assert plan["hbm_bytes_per_device"] == 16 * 2 ** 30 and plan["fits"] is True
  # the compiled program holds at least the device's shard of parameters and Adam moments
  assert plan["peak_bytes_per_device"] >= plan["param_bytes_per_device"] + plan["opt_bytes_per_device"]
  assert plan["device_peak_tflops"] == 197.0 and plan["step_seconds"] > 0
  assert "fits" in out.stdout and "8 tpu devices" in out.stdout
