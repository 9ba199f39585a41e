"""bench/dots.py: the matmuls of a profiled program by shape, with their FLOPs and rates."""

import math

import pytest

from bench import dots, peer_worker, profile
from bench import train as train_bench
from tests.test_bench_profile import HLO

# A batched dot inside a fusion, as XLA:CPU prints attention scores: [B, h, q, d] x [B, h, k, d]
BATCHED = """HloModule jit_scores, entry_computation_layout={(f32[2,3,4,5]{3,2,1,0})->f32[2,3,4,6]}

%fused_scores (param_0.1: f32[2,3,4,5], param_1.1: f32[2,3,6,5]) -> f32[2,3,4,6] {
  %param_0.1 = f32[2,3,4,5]{3,2,1,0} parameter(0)
  %param_1.1 = f32[2,3,6,5]{3,2,1,0} parameter(1)
  ROOT %dot_general.1 = f32[2,3,4,6]{3,2,1,0} dot(%param_0.1, %param_1.1), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={3}
}

ENTRY %main.2 (x.2: f32[2,3,4,5], y.2: f32[2,3,6,5]) -> f32[2,3,4,6] {
  %x.2 = f32[2,3,4,5]{3,2,1,0} parameter(0)
  %y.2 = f32[2,3,6,5]{3,2,1,0} parameter(1)
  ROOT %ynn_fusion.7 = f32[2,3,4,6]{3,2,1,0} fusion(%x.2, %y.2), kind=kCustom, calls=%fused_scores
}
"""


def test_dots_of_a_hand_written_module():
  found = dots.parse_dots(HLO)
  plain = dots.Dot((4, 4), (4, 4), "f32", "f32", "f32", (4, 4), (1,), (0,))
  assert found["dot.0"] == [plain] and found["fused_dot"] == [plain]  # by name and by computation
  assert found["dot.3"] == [plain]
  _, ops, _ = profile.parse_hlo(HLO)
  assert dots.dots_of("ynn_fusion", ops, found) == [plain]  # the fusion's dot
  assert dots.dots_of("dot.3", ops, found) == [plain]       # a dot instruction itself
  assert dots.dots_of("add_fusion", ops, found) == []
  assert plain.flops == 2 * 4 * 4 * 4
  assert plain.describe() == "f32[4,4] x f32[4,4] -> f32[4,4]"


def test_a_batched_dot_counts_batch_and_contracted_dimensions():
  found = dots.parse_dots(BATCHED)
  _, ops, _ = profile.parse_hlo(BATCHED)
  (d,) = dots.dots_of("ynn_fusion.7", ops, found)
  assert d.lhs == (2, 3, 4, 5) and d.rhs == (2, 3, 6, 5) and d.out == (2, 3, 4, 6)
  assert d.lhs_batch == (0, 1) and d.lhs_contracting == (3,) and d.rhs_contracting == (3,)
  # per (batch, head): a [4, 5] x [5, 6] product, 4 * 6 * 5 multiply-adds
  assert d.flops == 2 * (2 * 3) * (4 * 6 * 5)
  assert "contract [3]/[3] batch [0, 1]/[0, 1]" in d.describe()
  assert math.isfinite(dots.time_alone(d, repeats=2)) and dots.time_alone(d, repeats=2) > 0


# The scores' fusion called from inside another fusion
NESTED = BATCHED.replace("""ENTRY %main.2""", """%outer (param_0.4: f32[2,3,4,5], param_1.4: f32[2,3,6,5]) -> f32[2,3,4,6] {
  %param_0.4 = f32[2,3,4,5]{3,2,1,0} parameter(0)
  %param_1.4 = f32[2,3,6,5]{3,2,1,0} parameter(1)
  ROOT %inner = f32[2,3,4,6]{3,2,1,0} fusion(%param_0.4, %param_1.4), kind=kLoop, calls=%fused_scores
}

ENTRY %main.2""").replace("kind=kCustom, calls=%fused_scores", "kind=kCustom, calls=%outer")


def test_a_dot_inside_a_nested_fusion_is_the_outer_fusions():
  found = dots.parse_dots(NESTED)
  _, ops, _ = profile.parse_hlo(NESTED)
  assert ops["ynn_fusion.7"].calls == ["outer"]
  (d,) = dots.dots_of("ynn_fusion.7", ops, found)
  assert d.out == (2, 3, 4, 6) and d.flops == 2 * (2 * 3) * (4 * 6 * 5)


def test_the_bounds_are_the_step_over_its_products_and_over_the_flops_at_a_peak():
  # a 100 ms step of which 80 ms are products: two [1000, 1000] x [1000, 1000] dots a step,
  # 2 * 1000^3 FLOPs each, so 4 GFLOP; at 100 GFLOP/s they would take 40 ms
  square = dots.Dot((1000, 1000), (1000, 1000), "f32", "f32", "f32", (1000, 1000), (1,), (0,))
  figures = {"step_ms": 100.0, "categories": {"matmul": 80.0}, "config": "hand", "dtype": ""}
  table = [dict(dot=square, ms=80.0, runs=2, gflops=50.0)]
  lines = dots.format_rows(figures, table, peak=100.0).splitlines()
  assert "4.00 GFLOP a step, 50 GFLOP/s over the matmul time" in lines[0]
  assert lines[-2] == ("nothing but the products: 80.00 ms, the step 1.25x as fast at most "
                       "without faster products")
  assert lines[-1] == "every product at 100 GFLOP/s: 40.00 ms, and with nothing else the step 2.50x as fast"
  assert "every product" not in dots.format_rows(figures, table)


def test_a_directory_without_a_trace_is_one_error_line(tmp_path, capsys):
  with pytest.raises(SystemExit) as stop:
    dots.main(["--read", str(tmp_path)])
  assert stop.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("txf: error:") and "bench.profile" in err[0], err


@pytest.mark.slow  # a profiled decode call (beam 2 at the tiny config): end-to-end tier
def test_the_output_projection_of_a_beam_call_is_found_with_its_flops(tmp_path):
  profile.profile_decode("tiny", "beam2", calls=1, trace_dir=str(tmp_path))
  figures, table = dots.by_shape(str(tmp_path))
  cfg = train_bench.config_for("tiny", "float32", "auto")
  rows = peer_worker.DECODE_BATCH * 2  # B sources x 2 beams
  head = [r for r in table
          if r["dot"].lhs == (rows, cfg.d_model) and r["dot"].out == (rows, cfg.vocab_size)]
  assert len(head) == 1, [r["dot"].describe() for r in table]
  d = head[0]["dot"]
  # the output projection runs once per search step (an FFN of the same shape, d_ff = V, once
  # per step and decoder layer)
  assert head[0]["runs"] % peer_worker.DECODE_OUT == 0 and head[0]["runs"] >= peer_worker.DECODE_OUT
  assert d.flops == 2 * rows * cfg.d_model * cfg.vocab_size
  assert head[0]["gflops"] == pytest.approx(d.flops * head[0]["runs"] / (head[0]["ms"] * 1e6))
  # every matmul instruction of the program holds a dot: the rows' time is the matmul time
  assert sum(r["ms"] for r in table) == pytest.approx(figures["categories"]["matmul"], rel=1e-6)
  text = dots.format_rows(figures, table)
  assert d.describe() in text
  # the first line's FLOPs are all the rows', whatever is listed
  first = dots.format_rows(figures, table, rows=1).splitlines()
  assert first[0] == text.splitlines()[0] and len(first) == 4
  # with the alone timings: the listed shapes' time at those rates, runs x seconds a call
  alone = dots.format_rows(figures, table, [0.001] * 2, rows=2).splitlines()
  want = 1e3 * 0.001 * (table[0]["runs"] + table[1]["runs"])
  assert f"{want:.2f} ms at their rates alone" in alone[-2], alone
  # then the bound: the traced call over its matmul time
  step, matmul = figures["step_ms"], figures["categories"]["matmul"]
  assert alone[-1].startswith(f"nothing but the products: {matmul:.2f} ms, the step "
                              f"{step / matmul:.2f}x"), alone
