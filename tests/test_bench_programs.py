"""bench.programs: XLA's optimised module reduced to its instructions, compared across checkouts."""

import os
import shutil

import pytest

from bench import programs
from txf.core.errors import TxfError

# two builds of one program: numbering, metadata and the frame tables differ, nothing else
BUILD_A = """HloModule jit_run, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

FileNames
1 "/old/tree/txf/ops/norm.py"

StackFrames
1 {file_location_id=1 parent_frame_id=1}

%fused_computation.12 (param_0.2920: f32[4]) -> f32[4] {
  %param_0.2920 = f32[4]{0} parameter(0)
  %constant.7 = f32[] constant(1.5)
  %broadcast.3 = f32[4]{0} broadcast(%constant.7), dimensions={}
  ROOT %add.1 = f32[4]{0} add(%param_0.2920, %broadcast.3), metadata={op_name="jit(run)/add" source_file=1 source_line=17}
}

ENTRY %main.9 (x.1: f32[4]) -> f32[4] {
  %x.1 = f32[4]{0} parameter(0), metadata={op_name="x"}
  ROOT %add_fusion.2 = f32[4]{0} fusion(%x.1), kind=kLoop, calls=%fused_computation.12, stack_frame_id=1
}
"""
BUILD_B = (BUILD_A.replace("/old/tree", "/new/tree").replace("2920", "2931")
           .replace("fused_computation.12", "fused_computation.40").replace("source_line=17",
                                                                          "source_line=230")
           .replace("stack_frame_id=1", "stack_frame_id=7"))


def test_normalise_keeps_what_the_program_computes_and_drops_where_it_came_from():
  a, b = programs.normalise(BUILD_A), programs.normalise(BUILD_B)
  assert a == b
  assert not any("metadata" in line or "source_line" in line or "stack_frame_id" in line
                 or "/tree/" in line or "file_location_id" in line for line in a)
  assert "  ROOT %add_fusion = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_computation" in a
  # 4 instructions in the fusion, 2 in the entry computation
  assert programs.instruction_count(a) == 6


@pytest.mark.parametrize("change", [
    ("constant(1.5)", "constant(1.7)"),          # a constant
    ("f32[4]{0} add(", "f32[4]{0} multiply("),   # an opcode
    ("kind=kLoop", "kind=kInput"),               # an attribute
    ("dimensions={}", "dimensions={0}"),         # a dimension list
])
def test_normalise_tells_programs_that_compute_differently_apart(change):
  assert programs.normalise(BUILD_A) != programs.normalise(BUILD_B.replace(*change))


def test_bad_arguments_are_one_line_errors(tmp_path):
  with pytest.raises(TxfError, match="--program='beam'"):
    programs.check_args("small", "beam", None)
  with pytest.raises(TxfError, match="--config='huge'"):
    programs.check_args("huge", "greedy", None)
  with pytest.raises(TxfError, match="holds no txf/ package"):
    programs.check_args("small", "beam4", str(tmp_path))
  assert programs.main(["--program", "topk"]) == 2


@pytest.mark.slow
def test_a_copy_of_this_tree_builds_the_same_program_and_a_beam_differs_from_greedy(tmp_path,
                                                                                     monkeypatch):
  compiled, real = {}, programs.compiled_text  # each (tree, config, program) compiled once here
  monkeypatch.setattr(programs, "compiled_text",
                      lambda *key: compiled[key] if key in compiled else compiled.setdefault(key, real(*key)))
  # the copy's files live elsewhere, so its HLO metadata names other source paths
  copy = tmp_path / "copy"
  os.makedirs(copy)
  for name in ("txf", "bench"):
    shutil.copytree(os.path.join(programs.ROOT, name), copy / name,
                    ignore=shutil.ignore_patterns("__pycache__"))
  result = programs.compare("tiny", "greedy", str(copy))
  assert result["identical"] is True and result["diff"] == []
  assert set(result["trees"].values()) == {result["trees"][programs.ROOT]} and \
      result["trees"][programs.ROOT] > 50
  raw = [programs.compiled_text(str(copy), "tiny", p) for p in ("greedy", "beam2")]
  assert raw[0] != programs.compiled_text(programs.ROOT, "tiny", "greedy")  # paths differ ...
  assert programs.normalise(raw[0]) != programs.normalise(raw[1])           # ... programs too
