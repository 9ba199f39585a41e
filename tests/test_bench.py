"""Smoke tests of the benchmark code (tiny config): it runs and reports the expected fields.

Never asserts on timings. Also checks the properties of a lean train step that are not timings:
one compilation for many steps (no recompilation after the first) and a donated state.
"""

import json
import warnings

import jax
import numpy as np
import pytest

from bench import run as bench_run
from bench import train as bench_train

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

TRAIN_FIELDS = {"config", "dtype", "attention_impl", "attention_resolved", "compile_s", "step_s_best",
                "step_s_median", "target_tokens_per_s", "tokens_per_s", "flops_model", "flops_xla",
                "model_gflops_per_s", "mfu_float32", "mfu_bfloat16", "mfu_paired_float32", "memory", "max_rss_mib",
                "load_before", "load_after", "donated", "donation_warnings", "step_cpu_s"}


@pytest.fixture(scope="module")
def results():
  return bench_run.run_benchmarks(["tiny"], steps=2, decode=True, decode_batch=2, decode_length=4,
                                  beam_size=2, peak_size=128, say=lambda *a: None)


def test_results_have_every_field(results):
  assert set(results["peaks"]) == {"float32", "bfloat16"}
  for peak in results["peaks"].values():
    assert peak["gflops_best"] > 0 and peak["runs"] >= 2
  (row,) = results["train"]
  assert TRAIN_FIELDS <= set(row)
  assert row["config"] == "tiny" and row["steps"] >= 2
  assert row["flops_model"] > 0 and row["flops_xla"] and row["flops_xla"] > 0
  assert {"arguments_mib", "temp_mib", "peak_mib"} <= set(row["memory"])
  assert row["donated"] and not row["donation_warnings"]
  methods = {(r["method"], r["cached"]) for r in results["decode"]}
  assert {("greedy", True), ("beam2", True)} <= methods
  assert all(r["tokens_per_s"] > 0 for r in results["decode"])
  json.dumps(results, default=str)  # serialisable


def test_report_names_every_column(results):
  text = bench_run.format_report(results)
  for word in ("matmul peak float32", "matmul peak bfloat16", "tgt tok/s", "MFU32", "compile s",
               "peak MiB", "greedy", "beam2", "load"):
    assert word in text


def test_model_flops_formula_matches_a_hand_count():
  cfg = bench_train.config_for("tiny")  # d 32, f 64, 1+1 layers, V 64
  d, f, s, t, v = 32, 64, 8, 8, 64
  forward = (s * (8 * d * d + 4 * d * f + 4 * s * d) + t * (12 * d * d + 4 * d * f + 4 * t * d + 4 * s * d)
             + s * 4 * d * d + 2 * t * d * v)
  assert bench_train.model_train_flops(cfg, 4, s, t) == 3 * 4 * forward


def test_cli_writes_json(tmp_path, txf_cli):
  out = tmp_path / "bench.json"
  proc = txf_cli("bench", "--configs=tiny", f"--output={out}", "--steps=2", "--nodecode",
                 "--dtypes=float32,bfloat16", "--bf16_dots=layout,xla", timeout=600)
  assert proc.returncode == 0, proc.stderr
  assert "MFU32" in proc.stdout
  data = json.loads(out.read_text())
  assert data["train"][0]["config"] == "tiny" and "uptime_start" in data
  # one float32 row, then one bfloat16 row per kind of bf16 product, each recording its kernels
  rows = [(r["dtype"], r["kernels"]["bf16_dots"]) for r in data["train"]]
  assert rows == [("float32", "xla"), ("bfloat16", "layout"), ("bfloat16", "xla")], rows
  assert data["kernels"]["backend"] == "cpu" and data["kernels"]["jax"]


def test_cli_rejects_unknown_config(txf_cli):
  proc = txf_cli("bench", "--configs=huge", "--nodecode")
  assert proc.returncode == 2 and "unknown bench config" in proc.stderr


def test_train_step_compiles_once_and_donates_the_state():
  cfg = bench_train.config_for("tiny")
  batch = bench_train.random_batch(cfg, 4, 8, 8)
  runner, state = bench_train.build_step(cfg, batch)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for step in range(4):
      old = jax.tree_util.tree_leaves(state)
      state, metrics = runner.train_step(state, dict(batch), jax.random.fold_in(jax.random.key(0), step))
      assert all(leaf.is_deleted() for leaf in old)  # every state buffer was donated
  assert not [w for w in caught if "donat" in str(w.message).lower()]  # "not usable" would be here
  assert runner.train_jit._cache_size() == 1  # one compilation for all steps
  assert np.isfinite(float(metrics["loss"]))


def test_cpu_step_costs_report_every_field():
  from bench import cpu
  c = cpu.step_costs("tiny", steps=2, warmup=1)
  assert set(c) == {"user_s", "sys_s", "wall_s", "minor_faults"}
  assert c["wall_s"] > 0 and c["user_s"] >= 0 and c["minor_faults"] >= 0


def test_weights_benchmark_times_each_dtype_and_compares_its_ids():
  """Each (method, dtype) arm: float32 first (speed-up 1, the same ids as itself), the bfloat16 arm
  decodes every row the same length; its rows' ids are compared with float32's."""
  from bench import decode as bench_decode
  from txf.nn import TransformerConfig
  cfg = TransformerConfig(family="encoder_decoder", d_model=16, num_encoder_layers=1,
                          num_decoder_layers=1, num_heads=2, d_ff=32, vocab_size=32, max_len=16)
  rows = bench_decode.weights_benchmark(cfg, ["float32", "bfloat16"], 2, 4, 2, rounds=2,
                                        source_len=5)
  assert [(r["method"], r["weights"]) for r in rows] == [
      ("greedy", "float32"), ("greedy", "bfloat16"), ("beam2", "float32"), ("beam2", "bfloat16")]
  assert rows[0]["speedup"] == 1.0 and rows[2]["speedup"] == 1.0
  assert rows[0]["same_ids"] == 1.0 and all(0.0 <= r["same_ids"] <= 1.0 for r in rows)
  assert all(r["runs"] == 2 and r["tokens_per_s"] == pytest.approx(2 * 4 / r["seconds"]) for r in rows)
  assert "same ids" in bench_decode.format_weights_table(rows)


def test_kv_heads_benchmark_reports_each_arm_and_its_cache():
  from bench import decode as bench_decode
  from txf.nn import TransformerConfig
  cfg = TransformerConfig(family="encoder_decoder", d_model=16, num_encoder_layers=1,
                          num_decoder_layers=2, num_heads=2, d_ff=32, vocab_size=32, max_len=16)
  b, beam, length, s = 2, 3, 4, 5
  rows = bench_decode.kv_heads_benchmark(cfg, [0, 1], b, length, beam, rounds=2, source_len=s)
  assert [r["num_kv_heads"] for r in rows] == [2, 1]
  assert rows[0]["speedup"] == 1.0 and all(r["runs"] == 2 and r["tokens_per_s"] > 0 for r in rows)
  # one K/V head fewer drops, per decoder layer, K and V of the self-attention beam slots
  # [B, beam * T, d_k] and of the cross-attention [B, S, d_k], float32
  d_k, layers = 8, 2
  dropped = layers * 2 * b * (beam * length + s) * d_k * 4
  assert (rows[0]["cache_mb"] - rows[1]["cache_mb"]) * 2**20 == pytest.approx(dropped)
  assert "speed-up" in bench_decode.format_kv_table(rows)


def test_split_benchmark_times_each_bucket_and_compares_its_outputs():
  """bench.decode_split on a hand-made run: a row per bucket, the outputs of every bucket compared
  with the first's (equal here: greedy), the table shows each arm."""
  import types
  from bench import decode_split
  from txf.decode import DecodingSpec
  from txf.models import init_params
  from txf.nn import TransformerConfig
  cfg = TransformerConfig(family="encoder_decoder", vocab_size=20, d_model=16, num_heads=2, d_ff=32,
                          num_encoder_layers=1, num_decoder_layers=1, max_len=40, dropout_rate=0.0)
  params = init_params(cfg, jax.random.key(0), {"inputs": np.ones((1, 8), np.int32),
                                                "targets": np.ones((1, 8), np.int32)})
  run = types.SimpleNamespace(model_cfg=cfg, params=params,
                              task=types.SimpleNamespace(max_input_len=16))
  rng = np.random.default_rng(0)
  sources = [np.append(rng.integers(3, 20, n), 2) for n in (2, 9, 4, 13, 6)]
  rows = decode_split.split_benchmark(run, sources, DecodingSpec(max_extra=3), 2, [0, 8], rounds=1)
  assert [r["bucket"] for r in rows] == [0, 8]
  assert [r["differ"] for r in rows] == [0, 0]
  assert rows[0]["tokens"] == rows[1]["tokens"] > 0
  assert all(r["first_s"] > 0 and r["warm_s"] > 0 for r in rows)
  table = decode_split.format_table(rows, len(sources))
  assert table.count("of 5") == 2
