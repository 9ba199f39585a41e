"""Which of XLA:CPU's matrix-product libraries is fastest here: products and whole programs.

  python -m bench.dotlibs                                   (the default shapes, every library)
  python -m bench.dotlibs --shapes 64x256x256 16x512x512    (M x K x N products)
  python -m bench.dotlibs --shapes --programs small:beam4 base:greedy transformer_tiny:train

XLA:CPU hands each ``dot`` to a library chosen by compiler options; jaxlib 0.10.2 sends them to
YNNPACK. Every program here is compiled once per library, with that library's options passed to
``compile(compiler_options=...)`` (the process's XLA_FLAGS are not touched), and the optimised HLO
says which library got the dots: a fusion of kind ``__ynn_fusion``, ``__onednn_fusion`` or
``__xnn_fusion`` holds one; a plain ``dot`` runs on XLA's own Eigen kernels.

- ``--shapes``: ``x @ w`` for float32 x [M, K], w [K, N] (random), jit-compiled alone, timed warm:
  the minimum of ``--calls`` calls, as GFLOP/s (2 M K N / s). Beside them, numpy's ``matmul``
  (the BLAS numpy links, outside XLA), and the same called from a compiled program through
  ``jax.pure_callback`` (what a product handed to the host's BLAS costs inside a program).
- ``--programs config:program``: the train step (``train``, ``bench.train.build_step``) or the
  sitting's cached decoder (``greedy``, ``beamK``: ``bench.peer_worker.decode_program``, 16 random
  sources of 32 tokens, 32 tokens out) of a bench config. The libraries' executables are called
  in ``--rounds`` alternating rounds of ``--calls`` calls each (the machine's drift falls on all);
  min and median ms a call, and the output against the default library's: decoded ids equal, or
  the train step's loss difference.

A library the installed XLA does not know (``txf.runtime.process.xla_knows``) is skipped with a line.
"""

import argparse
import collections
import re
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from txf.core.errors import TxfError
from txf.runtime.process import xla_knows

_YNN_OFF = {"xla_cpu_experimental_ynn_fusion_type": ""}
LIBRARIES: Dict[str, Dict[str, object]] = {
    "ynnpack": {},                                  # jaxlib 0.10.2's default for dots
    "eigen": dict(_YNN_OFF),                        # no library: XLA's own dot kernels
    "onednn": dict(_YNN_OFF, xla_cpu_use_onednn=True,
                   xla_cpu_experimental_onednn_fusion_type="LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),
    "xnnpack": dict(_YNN_OFF, xla_cpu_use_xnnpack=True,
                    xla_cpu_experimental_xnn_fusion_type="LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),
}
DEFAULT_SHAPES = ("64x256x256", "16x512x512", "64x512x512", "64x256x8000", "64x512x32000",
                  "4096x128x128", "512x128x8000")
_FUSION_KIND = re.compile(r'"kind":"__(\w+?)_fusion"')
_DOT = re.compile(r"=\s*\w+\[[\d,]*\](?:\{[\d,]*\})?\s+dot\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")  # a computation's first line
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")


def parse_shape(text: str) -> Tuple[int, int, int]:
  """``"MxKxN"`` -> (M, K, N), each a positive int; TxfError otherwise."""
  parts = text.lower().split("x")
  if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise TxfError(f"--shapes {text!r}: write a product as MxKxN, e.g. 64x256x256")
  return tuple(int(p) for p in parts)


def parse_program(text: str) -> Tuple[str, str]:
  """``"config:program"`` -> (config, program): a bench config and train, greedy or beamK."""
  from bench.train import BENCH_CONFIGS
  config, _, program = text.partition(":")
  if config not in BENCH_CONFIGS or not re.fullmatch(r"train|greedy|beam[1-9]\d*", program):
    raise TxfError(f"--programs {text!r}: write config:program with config one of "
                   f"{', '.join(BENCH_CONFIGS)} and program train, greedy or beamK (e.g. small:beam4)")
  return config, program


def available(libraries: Sequence[str]) -> Tuple[List[str], List[str]]:
  """(the libraries whose every option the installed XLA knows, the others)."""
  known = [name for name in libraries if all(xla_knows(k) for k in LIBRARIES[name])]
  return known, [name for name in libraries if name not in known]


def dots_by_library(hlo_text: str) -> Dict[str, int]:
  """Which library runs each ``dot`` of an optimised module: {library: dots}. A dot inside the
  computation that a ``__<library>_fusion`` calls counts for that library (followed through the
  computations it calls in turn); any other dot runs on XLA's own kernels, ``"eigen"``."""
  bodies, name = {}, None
  for line in hlo_text.splitlines():
    head = _COMPUTATION.match(line)
    if head:
      name = head.group(1)
      bodies[name] = []
    elif line.startswith("}"):
      name = None
    elif name is not None:
      bodies[name].append(line)

  def dots_under(comp: str, seen: frozenset) -> int:
    if comp in seen or comp not in bodies:
      return 0
    return sum(len(_DOT.findall(line)) + sum(dots_under(c, seen | {comp})
                                             for c in _CALLS.findall(line))
               for line in bodies[comp])

  out: Dict[str, int] = collections.Counter()
  for line in hlo_text.splitlines():
    kind = _FUSION_KIND.search(line)
    if kind and " fusion(" in line:
      out[kind.group(1)] += sum(dots_under(c, frozenset()) for c in _CALLS.findall(line))
  plain = len(_DOT.findall(hlo_text)) - sum(out.values())
  if plain > 0:
    out["eigen"] = plain
  return {k: v for k, v in out.items() if v}


def compile_with(fn: Callable, args: Sequence, library: str):
  """``fn`` (a jax.jit'd function) lowered for ``args`` and compiled with ``library``'s options."""
  options = LIBRARIES[library]
  lowered = fn.lower(*args)
  return lowered.compile(compiler_options=options) if options else lowered.compile()


def _min_seconds(call: Callable[[], object], calls: int) -> float:
  jax.block_until_ready(call())
  best = float("inf")
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(call())
    best = min(best, time.perf_counter() - start)
  return best


def product_rates(shape: Tuple[int, int, int], libraries: Sequence[str], calls: int = 50,
                  seed: int = 0) -> Dict[str, Tuple[float, Dict[str, int]]]:
  """{library: (GFLOP/s, dots_by_library)} for ``x @ w`` at ``shape`` = (M, K, N), float32, plus
  ``"numpy"``: (GFLOP/s, {}) for numpy's matmul into a preallocated output, and ``"callback"``: the
  same numpy matmul called from a jit'd program through ``jax.pure_callback`` (numpy's kernel plus
  the cost of leaving XLA and coming back). Each result is checked against numpy in float64
  (relative error < 1e-4; AssertionError otherwise)."""
  m, k, n = shape
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((m, k), dtype=np.float32)
  b = rng.standard_normal((k, n), dtype=np.float32)
  exact = a.astype(np.float64) @ b.astype(np.float64)
  flops = 2.0 * m * k * n
  x, w = jnp.asarray(a), jnp.asarray(b)
  out = {}
  for library in libraries:
    compiled = compile_with(jax.jit(jnp.matmul), (x, w), library)
    got = np.asarray(compiled(x, w), np.float64)
    err = np.abs(got - exact).max() / max(np.abs(exact).max(), 1e-30)
    assert err < 1e-4, f"{library} at {shape}: relative error {err:.2e}"
    out[library] = (flops / _min_seconds(lambda: compiled(x, w), calls) / 1e9,
                    dots_by_library(compiled.as_text()))
  buf = np.empty((m, n), np.float32)
  out["numpy"] = (flops / _min_seconds(lambda: np.matmul(a, b, out=buf), calls) / 1e9, {})
  result = jax.ShapeDtypeStruct((m, n), jnp.float32)
  callback = jax.jit(lambda x, w: jax.pure_callback(np.matmul, result, x, w))
  got = np.asarray(callback(x, w), np.float64)
  assert np.abs(got - exact).max() / max(np.abs(exact).max(), 1e-30) < 1e-4
  out["callback"] = (flops / _min_seconds(lambda: callback(x, w), calls) / 1e9, {})
  return out


def _program(config: str, program: str):
  """(jit'd fn, args, call) for a bench program: ``call(compiled, state)`` -> (outputs, state)."""
  from bench import train as train_bench
  from bench.peer_worker import decode_program
  if program == "train":
    cfg = train_bench.config_for(config, "float32", "auto")
    shape = train_bench.BENCH_CONFIGS[config]
    batch = train_bench.random_batch(cfg, shape["batch"], shape["source_len"], shape["target_len"])
    runner, state = train_bench.build_step(cfg, batch)
    rng = jax.random.key(1)

    def step(compiled, st):
      st, metrics = compiled(st, batch, rng)
      return metrics["loss"], st

    return runner.train_jit, (state, batch, rng), step
  fn, params, inputs = decode_program(config, program)
  return fn, (params, inputs), lambda compiled, st: (compiled(params, inputs), st)


def program_times(config: str, program: str, libraries: Sequence[str], rounds: int = 3,
                  calls: int = 5) -> Dict[str, dict]:
  """{library: {"min_ms", "median_ms", "dots": dots_by_library, "output": ...}} for a bench
  program compiled once per library and called in ``rounds`` alternating rounds of ``calls``.
  ``output``: for a decoder the share of rows whose ids equal the first library's; for the train
  step |loss - the first library's loss| after the same number of steps."""
  fn, args, call = _program(config, program)
  compiled = {lib: compile_with(fn, args, lib) for lib in libraries}
  train = program == "train"
  # the train step donates its state: each library steps its own copy
  states = {lib: jax.tree_util.tree_map(jnp.copy, args[0]) if train else None for lib in libraries}
  first = {}
  for lib in libraries:  # one untimed call each: the first output, warm caches
    out, states[lib] = call(compiled[lib], states[lib])
    first[lib] = np.asarray(out)
  times = {lib: [] for lib in libraries}
  for _ in range(rounds):
    for lib in libraries:
      for _ in range(calls):
        start = time.perf_counter()
        out, states[lib] = call(compiled[lib], states[lib])
        jax.block_until_ready(out)
        times[lib].append(time.perf_counter() - start)
  ref = first[libraries[0]]
  result = {}
  for lib in libraries:
    got = first[lib]
    output = (float(abs(got - ref)) if train
              else float(np.mean(np.all(got.reshape(got.shape[0], -1) ==
                                        ref.reshape(ref.shape[0], -1), axis=1))))
    result[lib] = {"min_ms": 1e3 * min(times[lib]), "median_ms": 1e3 * statistics.median(times[lib]),
                   "dots": dots_by_library(compiled[lib].as_text()), "output": output}
  return result


def _placed(dots: Dict[str, int]) -> str:
  return ", ".join(f"{k} {v}" for k, v in sorted(dots.items())) or "-"


def main(argv: Optional[List[str]] = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shapes", nargs="*", default=None,
                 help=f"MxKxN float32 products (given alone, or not given without --programs: "
                      f"{' '.join(DEFAULT_SHAPES)})")
  p.add_argument("--programs", nargs="*", default=(),
                 help="config:program (train, greedy, beamK), e.g. small:beam4")
  p.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=list(LIBRARIES))
  p.add_argument("--calls", type=int, default=None,
                 help="calls timed per product (default 50) or per round of a program (default 5)")
  p.add_argument("--rounds", type=int, default=3)
  args = p.parse_args(argv)
  try:
    if args.shapes is None:  # not given: the default shapes unless programs were asked for
      given = () if args.programs else DEFAULT_SHAPES
    else:                    # given alone: the default shapes
      given = args.shapes or DEFAULT_SHAPES
    shapes = [parse_shape(s) for s in given]
    programs = [parse_program(s) for s in args.programs]
  except TxfError as e:
    p.error(str(e))
  libraries, unknown = available(args.libraries)
  for name in unknown:
    print(f"{name}: skipped, the installed XLA does not know its options")
  if not libraries:
    p.error("no library left to compare")
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {len(libraries)} libraries: "
        f"{', '.join(libraries)}")
  if shapes:
    print("\nproduct (float32)       " + "".join(f"{lib:>9}" for lib in libraries) +
          f"{'numpy':>9}{'callback':>9}   GFLOP/s; dots placed on")
  for shape in shapes:
    rates = product_rates(shape, libraries, calls=args.calls or 50)
    name = "[{}, {}] x [{}, {}]".format(shape[0], shape[1], shape[1], shape[2])
    placed = "; ".join(f"{lib}: {_placed(rates[lib][1])}" for lib in libraries)
    print(f"{name:<24}" + "".join(f"{rates[k][0]:9.1f}" for k in (*libraries, "numpy", "callback")) +
          f"   {placed}")
  for config, program in programs:
    res = program_times(config, program, libraries, rounds=args.rounds, calls=args.calls or 5)
    base = res[libraries[0]]["min_ms"]
    print(f"\n{config} {program}: ms a call, {args.rounds} alternating rounds")
    for lib in libraries:
      r = res[lib]
      what = "|loss - first|" if program == "train" else "rows equal to the first's"
      print(f"  {lib:<8} min {r['min_ms']:8.1f}  median {r['median_ms']:8.1f}  "
            f"{base / r['min_ms']:5.2f}x by min  {what} {r['output']:.3g}  dots: {_placed(r['dots'])}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
