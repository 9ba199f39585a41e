"""``txf plan``: compile-only sizing on 8 fake CPU devices (the command re-runs itself with
XLA_FLAGS), its JSON, the per-device split of the state under FSDP, and its one-line errors."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_BATCH = ["--config.data.tokens_per_batch=0", "--config.batch_size=16",
               "--config.data.max_input_len=32", "--config.data.max_target_len=32"]


def _plan(*args, timeout=300):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  env.pop("TXF_PLAN_FAKE_DEVICES", None)
  return subprocess.run([sys.executable, "-m", "txf.cli", "plan", *args], capture_output=True,
                        text=True, timeout=timeout, cwd=ROOT, env=env)


def _base_param_count(d=512, f=2048, v=32000, layers=6):
  """The paper's base model with one shared, tied embedding, post-LN, counted by hand."""
  attention, ffn, norm = 4 * d * d, 2 * d * f + f + d, 2 * d
  encoder_layer = attention + ffn + 2 * norm
  decoder_layer = 2 * attention + ffn + 3 * norm
  return v * d + layers * (encoder_layer + decoder_layer)


def _train_flops(b, s, t, d=512, f=2048, v=32000, n=6):
  """6 x weights x tokens for the matmuls (cross K/V on source tokens) + 12 L^2 d attention."""
  weights = s * n * (4 * d * d + 2 * d * f) + t * n * (6 * d * d + 2 * d * f) + s * n * 2 * d * d + t * d * v
  attention = n * 2 * s * s * d + n * (2 * t * t * d + 2 * t * s * d)
  return 6.0 * b * (weights + attention)


@pytest.mark.slow
def test_plan_base_with_fsdp_8_splits_the_state_eight_ways(tmp_path):
  out = tmp_path / "plan.json"
  proc = _plan("--config", "experiments/wmt14_en_de_base.py", "--devices", "8",
               "--config.parallelism=mesh", "--config.mesh_shape=(1,8,1)", *SMALL_BATCH,
               "--device_peak_tflops=100", "--mfu=0.5", "--hosts", "2", "--json", str(out))
  assert proc.returncode == 0, proc.stderr[-3000:]
  plan = json.loads(out.read_text())
  for key in ("devices", "mesh_shape", "param_bytes_total", "param_bytes_per_device",
              "opt_bytes_per_device", "peak_bytes_per_device", "flops_per_step"):
    assert key in plan, key
  assert plan["devices"] == 8 and plan["mesh_shape"] == [1, 8, 1]
  assert plan["param_bytes_total"] == 4 * _base_param_count()
  per_device = plan["param_bytes_per_device"]
  assert abs(per_device - plan["param_bytes_total"] / 8) < 0.1 * plan["param_bytes_total"] / 8
  assert abs(plan["opt_bytes_per_device"] - 2 * per_device) < 0.01 * per_device  # Adam: mu, nu
  assert plan["peak_bytes_per_device"] >= per_device + plan["opt_bytes_per_device"]
  assert plan["flops_per_step"] == pytest.approx(_train_flops(16, 32, 32), rel=1e-9)
  step_s = plan["flops_per_step"] / (8 * 100e12 * 0.5)
  assert plan["step_seconds"] == pytest.approx(step_s, rel=1e-9)
  assert plan["train_hours"] == pytest.approx(step_s * 100000 / 3600, rel=1e-9)
  assert "parameters" in proc.stdout and "peak" in proc.stdout and "ms/step" in proc.stdout
  # 2 hosts of 4 devices: a host holds half of every sharded array (and the few small replicated ones)
  hosts, total = plan["hosts"], plan["param_bytes_total"]
  assert hosts["count"] == 2 and hosts["devices_per_host"] == 4
  assert total / 2 <= hosts["param_bytes"] < 1.01 * total / 2
  assert 2 * total / 2 <= hosts["opt_bytes"] < 2 * 1.01 * total / 2
  assert hosts["state_bytes"] == hosts["param_bytes"] + hosts["opt_bytes"]
  assert hosts["largest_array"] == "embed/embedding" and hosts["largest_array_bytes"] == 32000 * 512 * 4
  assert hosts["largest_layer_bytes"] >= hosts["largest_array_bytes"]
  assert "per host (2 hosts x 4 devices)" in proc.stdout


@pytest.mark.parametrize("args, words", [
    (["--devices", "8", "--config.parallelism=mesh", "--config.mesh_shape=(1,16,1)"], "mesh_shape"),
    (["--devices", "8", "--config.parallelism=mesh", "--config.sharding_rules.embed=fdsp"], "fdsp"),
    (["--devices", "8", "--config.parallelism=mesh", "--config.mesh_shape=(1,1,8)",
      "--config.model.num_heads=4", "--config.model.d_model=64"], "'heads' axis"),
])
def test_plan_refuses_a_mesh_that_cannot_work_in_one_line(args, words):
  proc = _plan("--config", "experiments/default.py", *args, *SMALL_BATCH)
  assert proc.returncode == 2, proc.stderr[-3000:]
  # one error (a config's list of problems under one "invalid config:" line), no traceback
  assert proc.stderr.startswith("txf: error:") and words in proc.stderr, proc.stderr
  assert "Traceback" not in proc.stderr and proc.stderr.count("txf: error:") == 1, proc.stderr


@pytest.mark.slow
def test_plan_counts_a_gated_ffn_with_matched_parameters(tmp_path):
  # the default experiment (encoder_decoder, d 128, 2+2 layers, post-LN, one shared tied table)
  # with a SwiGLU FFN matched to d_ff 2048: hidden h = 1368 (2 * 2048 / 3 = 1365.33, the nearest
  # multiple of 8 within 1%); V = 1000
  out = tmp_path / "plan.json"
  proc = _plan("--config", "experiments/default.py", "--vocab_size=1000", *SMALL_BATCH,
               "--config.model.d_ff=2048", "--config.model.activation=swiglu",
               "--config.model.ffn_match_params=True", "--json", str(out))
  assert proc.returncode == 0, proc.stderr[-3000:]
  plan = json.loads(out.read_text())
  d, h, v, n = 128, 1368, 1000, 2
  ffn = 3 * d * h + 2 * h + d                    # W1, V [d, h], W2 [h, d]; b1, c [h], b2 [d]
  encoder_layer = 4 * d * d + ffn + 2 * 2 * d    # Q, K, V, O; FFN; two LayerNorms (gamma, beta)
  decoder_layer = 8 * d * d + ffn + 3 * 2 * d    # self and cross attention; FFN; three LayerNorms
  assert plan["params"] == v * d + n * (encoder_layer + decoder_layer)
  assert plan["model"]["ffn_hidden"] == h and plan["model"]["d_ff"] == 2048
  assert "d_ff 1368 (swiglu, matched to d_ff 2048)" in proc.stdout, proc.stdout
  # FLOPs: 6 x weights x tokens with the FFN's three matmuls (3 d h weights), + attention
  b, s, t = 16, 32, 32
  weights = (s * n * (4 * d * d + 3 * d * h) + t * n * (6 * d * d + 3 * d * h) + s * n * 2 * d * d
             + t * d * v)
  attention = n * 2 * s * s * d + n * (2 * t * t * d + 2 * t * s * d)
  assert plan["flops_per_step"] == pytest.approx(6.0 * b * (weights + attention), rel=1e-9)


def test_plan_counts_the_smaller_key_value_kernels_of_grouped_query_attention(tmp_path):
  # default experiment (d 128, h 4, d_ff 512, 2+2 layers) with 2 key/value heads, split over a
  # tensor axis of 2 with the query heads: W^K, W^V are [d, 2, d_k], counted by hand
  out = tmp_path / "plan.json"
  proc = _plan("--config", "experiments/default.py", "--devices", "8", "--config.parallelism=mesh",
               "--config.mesh_shape=(4,1,2)", "--config.model.num_kv_heads=2", *SMALL_BATCH,
               "--json", str(out))
  assert proc.returncode == 0, proc.stderr[-3000:]
  plan = json.loads(out.read_text())
  d, f, h, hk, n = 128, 512, 4, 2, 2
  attention = 2 * d * d + 2 * d * hk * (d // h)  # W^Q, W^O [d, d]; W^K, W^V [d, h_kv d_k]
  ffn, norm = 2 * d * f + f + d, 2 * d
  rows = plan["params"] - n * (attention + ffn + 2 * norm) - n * (2 * attention + ffn + 3 * norm)
  vocab = plan["model"]["vocab_size"]  # what is left is the one shared table, rows padded to 128
  assert rows == -(-vocab // 128) * 128 * d
  assert plan["model"]["num_kv_heads"] == 2
  assert "4 query / 2 key-value heads" in proc.stdout


def test_plan_refuses_key_value_heads_the_tensor_axis_does_not_split():
  proc = _plan("--config", "experiments/default.py", "--devices", "8", "--config.parallelism=mesh",
               "--config.mesh_shape=(2,1,4)", "--config.model.num_kv_heads=2", *SMALL_BATCH)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "model.num_kv_heads=2" in proc.stderr and "sharding_rules.kv_heads=''" in proc.stderr
  assert "Traceback" not in proc.stderr
