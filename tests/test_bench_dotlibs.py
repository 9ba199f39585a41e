"""bench/dotlibs.py: XLA:CPU's matrix-product libraries compared on products and programs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import dotlibs
from txf.core.errors import TxfError

# Three library fusions and two plain dots: a YNNPACK fusion, a oneDNN fusion whose computation
# reaches its dot through a call, a fusion without a dot, a plain dot in the entry computation and
# one in a while loop's body.
HLO = """HloModule jit_f, entry_computation_layout={(f32[4,4]{1,0})->f32[4,4]{1,0}}

%fused_ynn (param_0: f32[4,4]) -> f32[4,4] {
  %param_0 = f32[4,4]{1,0} parameter(0)
  ROOT %dot.1 = f32[4,4]{1,0} dot(%param_0, %param_0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%inner (p.0: f32[4,4]) -> f32[4,4] {
  %p.0 = f32[4,4]{1,0} parameter(0)
  ROOT %dot.2 = f32[4,4]{1,0} dot(%p.0, %p.0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_onednn (param_0.1: f32[4,4]) -> f32[4,4] {
  %param_0.1 = f32[4,4]{1,0} parameter(0)
  ROOT %call.1 = f32[4,4]{1,0} call(%param_0.1), to_apply=%inner
}

%fused_add (param_0.2: f32[4,4]) -> f32[4,4] {
  %param_0.2 = f32[4,4]{1,0} parameter(0)
  ROOT %add.1 = f32[4,4]{1,0} add(%param_0.2, %param_0.2)
}

%body (q.0: f32[4,4]) -> f32[4,4] {
  %q.0 = f32[4,4]{1,0} parameter(0)
  ROOT %dot.3 = f32[4,4]{1,0} dot(%q.0, %q.0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main.1 (x.1: f32[4,4]) -> f32[4,4] {
  %x.1 = f32[4,4]{1,0} parameter(0)
  %ynn_fusion = f32[4,4]{1,0} fusion(%x.1), kind=kCustom, calls=%fused_ynn, backend_config={"fusion_config":{"kind":"__ynn_fusion"},"outer_dimension_partitions":[]}
  %onednn_fusion = f32[4,4]{1,0} fusion(%ynn_fusion), kind=kCustom, calls=%fused_onednn, backend_config={"fusion_config":{"kind":"__onednn_fusion"},"outer_dimension_partitions":[]}
  %add_fusion = f32[4,4]{1,0} fusion(%onednn_fusion), kind=kLoop, calls=%fused_add
  %dot.4 = f32[4,4]{1,0} dot(%add_fusion, %add_fusion), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %while.1 = f32[4,4]{1,0} while(%dot.4), condition=%cond, body=%body
}
"""


def test_shapes_and_programs_are_parsed_or_refused():
  assert dotlibs.parse_shape("64x256x8000") == (64, 256, 8000)
  assert dotlibs.parse_shape("16X512X512") == (16, 512, 512)
  for bad in ("64x256", "64x0x8", "ax2x3", "1x2x3x4", ""):
    with pytest.raises(TxfError, match="MxKxN"):
      dotlibs.parse_shape(bad)
  assert dotlibs.parse_program("small:beam4") == ("small", "beam4")
  assert dotlibs.parse_program("transformer_tiny:train") == ("transformer_tiny", "train")
  for bad in ("small", "nano:train", "small:beam0", "small:sample"):
    with pytest.raises(TxfError, match="config:program"):
      dotlibs.parse_program(bad)


def test_dots_are_placed_by_the_fusion_that_calls_them():
  assert dotlibs.dots_by_library(HLO) == {"ynn": 1, "onednn": 1, "eigen": 2}
  assert dotlibs.dots_by_library(HLO.replace("__onednn_fusion", "__ynn_fusion")) == {
      "ynn": 2, "eigen": 2}
  assert dotlibs.dots_by_library("ENTRY %main (x: f32[2]) -> f32[2] {\n}\n") == {}


@pytest.mark.parametrize("library", list(dotlibs.LIBRARIES))
def test_each_library_computes_the_product_where_it_says(library):
  if library not in dotlibs.available([library])[0]:
    pytest.skip(f"this XLA does not know {library}'s options")
  rng = np.random.default_rng(0)
  a = rng.standard_normal((8, 16)).astype(np.float32)
  b = rng.standard_normal((16, 32)).astype(np.float32)
  compiled = dotlibs.compile_with(jax.jit(jnp.matmul), (jnp.asarray(a), jnp.asarray(b)), library)
  np.testing.assert_allclose(np.asarray(compiled(a, b), np.float64),
                             a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
  placed = dotlibs.dots_by_library(compiled.as_text())
  assert sum(placed.values()) == 1
  # jaxlib 0.10.2 sends this dot to YNNPACK by default; the options move it to Eigen or oneDNN
  # (XNNPACK's options leave a float32 dot to Eigen)
  expected = {"ynnpack": "ynn", "eigen": "eigen", "onednn": "onednn"}.get(library)
  if expected and jax.__version__ == "0.10.2":
    assert placed == {expected: 1}


def test_product_rates_give_every_library_and_numpy():
  libraries = dotlibs.available(["ynnpack", "eigen"])[0]
  rates = dotlibs.product_rates((16, 32, 24), libraries, calls=2)
  assert set(rates) == {*libraries, "numpy", "callback"}
  assert all(r > 0 for r, _ in rates.values())
  assert rates["numpy"][1] == {} and rates["callback"][1] == {}


@pytest.mark.slow
def test_the_command_compares_products_and_programs(capsys):
  assert dotlibs.main(["--shapes", "32x64x48", "--programs", "tiny:greedy",
                       "tiny:train", "--libraries", "ynnpack", "eigen",
                       "--rounds", "1", "--calls", "2"]) == 0
  lines = capsys.readouterr().out.splitlines()
  product = next(line for line in lines if line.startswith("[32, 64] x [64, 48]"))
  rates = product[len("[32, 64] x [64, 48]"):].split()[:4]  # ynnpack, eigen, numpy, callback
  assert all(float(r) > 0 for r in rates)
  assert "eigen: eigen 1" in product
  greedy = lines.index("tiny greedy: ms a call, 1 alternating rounds")
  train = lines.index("tiny train: ms a call, 1 alternating rounds")
  for first, what in ((greedy, "rows equal to the first's"), (train, "|loss - first|")):
    ynn, eigen = lines[first + 1].split(), lines[first + 2].split()
    assert ynn[0] == "ynnpack" and eigen[0] == "eigen"
    assert what in lines[first + 1] and "1.00x by min" in lines[first + 1]
  # the first library against itself: every row equal, loss difference 0
  assert lines[greedy + 1].split("rows equal to the first's ")[1].split()[0] == "1"
  assert lines[train + 1].split("|loss - first| ")[1].split()[0] == "0"
  # Eigen's products give the same ids and a loss within float32 rounding of YNNPACK's
  assert float(lines[train + 2].split("|loss - first| ")[1].split()[0]) < 1e-4
  assert "dots: eigen" in lines[greedy + 2] and "ynn" not in lines[greedy + 2].split("dots:")[1]


def test_which_shapes_the_command_times(monkeypatch, capsys):
  asked = []
  monkeypatch.setattr(dotlibs, "product_rates", lambda shape, libs, calls: (
      asked.append(shape), {k: (1.0, {}) for k in (*libs, "numpy", "callback")})[1])
  monkeypatch.setattr(dotlibs, "program_times", lambda config, program, libs, rounds, calls: {
      lib: {"min_ms": 2.0, "median_ms": 2.0, "dots": {}, "output": 1.0} for lib in libs})
  defaults = [dotlibs.parse_shape(s) for s in dotlibs.DEFAULT_SHAPES]
  for argv, expected in ((["--libraries", "eigen"], defaults),                      # nothing asked
                         (["--shapes", "--libraries", "eigen"], defaults),          # --shapes alone
                         (["--shapes", "8x4x2", "--libraries", "eigen"], [(8, 4, 2)]),
                         (["--programs", "small:greedy", "--libraries", "eigen"], []),
                         (["--shapes", "--programs", "small:greedy", "--libraries", "eigen"],
                          defaults)):
    asked.clear()
    assert dotlibs.main(argv) == 0
    assert asked == expected, argv
  assert "small greedy: ms a call" in capsys.readouterr().out
  with pytest.raises(SystemExit) as exit_info:
    dotlibs.main(["--shapes", "8x4"])
  assert exit_info.value.code == 2
