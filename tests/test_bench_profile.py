"""bench/profile.py: a jax.profiler trace of train steps or decode calls, summed by XLA op category."""

import gzip
import json

import pytest

from bench import peer_worker, profile

# A hand-written optimized-HLO module: one instruction of each category (names as XLA:CPU prints).
HLO = """HloModule jit_example, entry_computation_layout={(f32[4,4]{1,0})->f32[]}

%fused_dot (param_0: f32[4,4], param_1: f32[4,4]) -> f32[4,4] {
  %param_0 = f32[4,4]{1,0} parameter(0)
  %param_1 = f32[4,4]{1,0} parameter(1)
  %dot.0 = f32[4,4]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %tanh.0 = f32[4,4]{1,0} tanh(%dot.0)
}

%wrapped_convert_computation (param_0.1: f32[4,4]) -> bf16[4,4] {
  %param_0.1 = f32[4,4]{1,0} parameter(0)
  ROOT %convert.1 = bf16[4,4]{1,0} convert(%param_0.1)
}

%fused_transpose (param_0.2: bf16[4,4]) -> bf16[4,4] {
  %param_0.2 = bf16[4,4]{1,0} parameter(0)
  %bitcast.1 = bf16[4,4]{0,1} bitcast(%param_0.2)
  ROOT %copy.1 = bf16[4,4]{1,0} copy(%bitcast.1)
}

%fused_add (param_0.3: bf16[4,4], param_1.3: f32[4,4]) -> f32[4,4] {
  %param_0.3 = bf16[4,4]{1,0} parameter(0)
  %convert.2 = f32[4,4]{1,0} convert(%param_0.3)
  %param_1.3 = f32[4,4]{1,0} parameter(1)
  ROOT %add.1 = f32[4,4]{1,0} add(%convert.2, %param_1.3)
}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.2 = f32[] add(%a, %b)
}

ENTRY %main.1 (x.1: f32[4,4]) -> f32[] {
  %x.1 = f32[4,4]{1,0} parameter(0)
  %ynn_fusion = f32[4,4]{1,0} fusion(%x.1, %x.1), kind=kCustom, calls=%fused_dot, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  %wrapped_convert = bf16[4,4]{1,0} fusion(%ynn_fusion), kind=kLoop, calls=%wrapped_convert_computation
  %transpose_copy_fusion = bf16[4,4]{1,0} fusion(%wrapped_convert), kind=kLoop, calls=%fused_transpose
  %add_fusion = f32[4,4]{1,0} fusion(%transpose_copy_fusion, /*index=1*/%x.1), kind=kLoop, calls=%fused_add
  %dot.3 = f32[4,4]{1,0} dot(%add_fusion, %x.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %constant.1 = f32[] constant(0)
  ROOT %reduce.1 = f32[] reduce(%dot.3, %constant.1), dimensions={0,1}, to_apply=%sum
}
"""


def test_classify_hand_written_module():
  module, ops, computations = profile.parse_hlo(HLO)
  assert module == "jit_example"
  expected = {"ynn_fusion": "matmul", "wrapped_convert": "convert",
              "transpose_copy_fusion": "copy/transpose", "add_fusion": "fusion", "dot.3": "matmul",
              "reduce.1": "reduction", "constant.1": "other"}
  assert {n: profile.classify(ops[n], ops, computations) for n in expected} == expected
  assert profile.describe(ops["add_fusion"], ops, computations) == "fusion: add,convert"


def test_trace_events_nested_and_concurrent_ops(tmp_path):
  # thread 1: a reduce (0-100 us) with a fusion nested in it (10-40 us); thread 2: a dot (20-40 us)
  # beside the fusion and a dot (120-150 us) after a gap. By hand: 150 us traced, 20 us in no op;
  # wall shares: fusion 10 + 20/2 = 20, dots 20/2 + 30 = 40, reduce 100 - 30 = 70 (sum 130);
  # summed own durations: fusion 30, dots 20 + 30 = 50, reduce 70.
  _, ops, computations = profile.parse_hlo(HLO)
  ev = lambda op, ts, dur, tid: {"ph": "X", "name": op, "ts": ts, "dur": dur, "pid": 1, "tid": tid,
                                 "args": {"hlo_op": op, "hlo_module": "jit_example", "run_id": "7"}}
  events = [ev("reduce.1", 0, 100, 1), ev("add_fusion", 10, 30, 1), ev("dot.3", 20, 20, 2),
            ev("dot.3", 120, 30, 2),
            {"ph": "X", "name": "end: dot.3", "ts": 150, "dur": 1, "pid": 1, "tid": 2, "args": {}},
            dict(ev("dot.3", 0, 500, 3), args={"hlo_op": "dot.3", "hlo_module": "jit_other"})]
  path = tmp_path / "host.trace.json.gz"
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": events}, f)
  assert profile.find_trace(str(tmp_path)) == str(path)
  r = profile.summarize(profile.op_events(str(path), "jit_example"), ops, computations)
  assert r["steps"] == 1
  assert r["step_ms"] == pytest.approx(0.150)
  assert r["idle_ms"] == pytest.approx(0.020)
  wall = {"reduction": 0.070, "fusion": 0.020, "matmul": 0.040}
  assert {c: r["categories"][c] for c in wall} == pytest.approx(wall)
  thread = {"reduction": 0.070, "fusion": 0.030, "matmul": 0.050}
  assert {c: r["thread_ms"][c] for c in thread} == pytest.approx(thread)
  assert r["runs"]["matmul"] == 2
  assert r["top"][0][:2] == ("reduce.1", "reduction")


@pytest.mark.slow  # a profiled train step (9 s): the benchmarks' own code, end-to-end tier
def test_profile_tiny_train_step(tmp_path):
  r = profile.profile_step("tiny", "float32", steps=2, trace_dir=str(tmp_path))
  assert r["steps"] == 2, "the trace has no per-op events of the train step"
  assert not r["unknown"], r["unknown"]
  # the categories plus the time in no op make up the traced step (no instant counted twice)
  assert sum(r["categories"].values()) + r["idle_ms"] == pytest.approx(r["step_ms"], rel=0.1)
  # every op's own time is counted: the summed durations cover the time some op ran
  assert sum(r["thread_ms"].values()) >= 0.99 * (r["step_ms"] - r["idle_ms"])
  # the traced step lies within the wall time of the step that Python measured around it
  assert 0 < r["step_ms"] <= 1.05 * r["wall_ms"]
  # the matmuls are found: 1 encoder + 1 decoder layer have 16 projections and the logits, each
  # at least once in the forward pass
  assert r["categories"]["matmul"] > 0 and r["runs"]["matmul"] >= 17
  text = profile.format_table(r)
  for category in profile.CATEGORIES:
    assert category in text


@pytest.mark.slow  # a profiled decode call (beam 2 at the tiny config): end-to-end tier
def test_profile_of_a_beam_decode_call_counts_the_search_loop_once_per_step(tmp_path):
  r = profile.profile_decode("tiny", "beam2", calls=2, trace_dir=str(tmp_path))
  assert r["steps"] == 2, "the trace has no per-op events of the decode call"
  assert not r["unknown"], r["unknown"]
  assert sum(r["categories"].values()) + r["idle_ms"] == pytest.approx(r["step_ms"], rel=0.1)
  assert 0 < r["step_ms"] <= 1.05 * r["wall_ms"]
  # the output projection runs once per search step: DECODE_OUT times in a call
  runs = {name: count for name, category, _, _, count in
          profile.summarize(profile.op_events(r["trace_file"], r["module"]),
                            *profile.parse_hlo((tmp_path / profile.HLO_FILE).read_text())[1:],
                            top=10 ** 6)["top"] if category == "matmul"}
  assert max(runs.values()) == peer_worker.DECODE_OUT, runs
  assert r["config"] == "tiny beam2" and r["batch"] == peer_worker.DECODE_BATCH


@pytest.mark.parametrize("program", ["beam0", "beam", "sample"])
def test_profile_refuses_a_program_it_cannot_build_in_one_line(program, capsys):
  with pytest.raises(SystemExit) as stop:
    profile.main(["--config", "tiny", "--program", program])
  assert stop.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("txf: error: --program must be"), err
