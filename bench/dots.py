"""The matmuls of a profiled program, by shape: FLOPs, the rate they ran at there, and alone.

  python -m bench.profile --config base --program beam4 --trace_dir /tmp/p   (the trace)
  python -m bench.dots --read /tmp/p                    (its dots by shape)
  python -m bench.dots --read /tmp/p --alone            (and each shape timed alone)
  python -m bench.dots --read /tmp/p --peak 213         (and the step at a given product rate)

Reads what ``bench.profile --trace_dir`` leaves (the trace, the optimized HLO and the run's
details). Every instruction that bench.profile counts as a matmul is looked up in the HLO for the
``dot`` it computes (the instruction itself, or the one inside its fusion: XLA:CPU's YNNPACK
fusions hold one). Dots with the same operand shapes, dtypes and dimension numbers form one row:

- ``ms/step``: the rows' wall time per traced step (bench.profile's share of each instant);
- ``runs``: how many times per step such a dot ran (a dot inside a search loop counts per
  iteration);
- ``GFLOP/s``: 2 * (output elements) * (contracted elements) per dot, times ``runs``, over
  ``ms/step``;
- with ``--alone``, ``alone GFLOP/s``: the same ``lax.dot_general`` (same shapes, dtypes and
  dimension numbers, random operands) jit-compiled by itself and timed warm, the minimum of
  ``--repeats`` calls. The difference from the program's rate is what the program's context costs
  the dot: operands not in cache (weights streamed from memory every step), the fusion's other
  work, threads busy elsewhere.
- the last lines bound what the program can gain: the step with nothing but its products (the
  most any change outside them can give), and with ``--peak``, every product at that rate.

The alone timing includes one jit dispatch (a few microseconds): read it for dots that take
tens of microseconds or more.
"""

import argparse
import collections
import dataclasses
import math
import re
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from bench import profile

_SHAPE = re.compile(r"^\s*(\w+)\[([\d,]*)\]")  # an instruction's result: element type, dims
_OPERANDS = re.compile(r"\sdot\(%?([\w.\-]+),\s*%?([\w.\-]+)\)(.*)$")
_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "f64": jnp.float64,
           "s8": jnp.int8, "s32": jnp.int32}  # HLO's element type names
_DIMS = re.compile(r"(lhs_batch_dims|rhs_batch_dims|lhs_contracting_dims|rhs_contracting_dims)="
                   r"\{([\d,]*)\}")


@dataclasses.dataclass(frozen=True)
class Dot:
  """One dot's signature: operand dtypes and shapes, dimension numbers, output dtype and shape."""
  lhs: Tuple[int, ...]
  rhs: Tuple[int, ...]
  lhs_dtype: str
  rhs_dtype: str
  out_dtype: str
  out: Tuple[int, ...]
  lhs_contracting: Tuple[int, ...]
  rhs_contracting: Tuple[int, ...]
  lhs_batch: Tuple[int, ...] = ()
  rhs_batch: Tuple[int, ...] = ()

  @property
  def flops(self) -> int:
    """2 * prod(output shape) * prod(the contracted sizes): multiply-adds counted as two."""
    return 2 * math.prod(self.out) * math.prod(self.lhs[d] for d in self.lhs_contracting)

  def describe(self) -> str:
    """e.g. ``f32[64,512] x f32[512,2048] -> f32[64,2048]`` (+ the dimension numbers when they
    are not the plain [M, K] x [K, N])."""
    shape = lambda dtype, dims: f"{dtype}[{','.join(map(str, dims))}]"
    text = (f"{shape(self.lhs_dtype, self.lhs)} x {shape(self.rhs_dtype, self.rhs)} -> "
            f"{shape(self.out_dtype, self.out)}")
    plain = (len(self.lhs) == len(self.rhs) == 2 and self.lhs_contracting == (1,)
             and self.rhs_contracting == (0,))
    if not plain:
      text += f" contract {list(self.lhs_contracting)}/{list(self.rhs_contracting)}"
      if self.lhs_batch:
        text += f" batch {list(self.lhs_batch)}/{list(self.rhs_batch)}"
    return text


def _tuple(text: str) -> Tuple[int, ...]:
  return tuple(int(x) for x in text.split(",") if x)


def parse_dots(text: str) -> Dict[str, List[Dot]]:
  """:func:`dots_in` of an optimized HLO module's text."""
  return dots_in(*profile.parse_hlo(text)[1:])


def dots_in(ops: Dict[str, profile.HloOp], computations: Dict[str, List[str]]
            ) -> Dict[str, List[Dot]]:
  """{instruction or computation name: the dots it computes}, from
  :func:`bench.profile.parse_hlo`'s instructions and computations.

  Each ``dot`` instruction is listed under its own name, and under the name of the computation
  that holds it and of every computation whose fusions call that one; operand shapes come from the
  instructions that define the operands in that computation (parameters of a fusion included)."""
  found: Dict[str, List[Dot]] = collections.defaultdict(list)
  for computation, names in computations.items():
    shapes = {n: _SHAPE.match(ops[n].text) for n in names}
    for name in names:
      dot = _OPERANDS.search(ops[name].text) if ops[name].opcode == "dot" else None
      if dot is None:
        continue
      out, lhs, rhs = shapes[name], shapes.get(dot.group(1)), shapes.get(dot.group(2))
      if not (out and lhs and rhs):
        continue
      dims = {k: _tuple(v) for k, v in _DIMS.findall(dot.group(3))}
      d = Dot(lhs=_tuple(lhs.group(2)), rhs=_tuple(rhs.group(2)), lhs_dtype=lhs.group(1),
              rhs_dtype=rhs.group(1), out_dtype=out.group(1), out=_tuple(out.group(2)),
              lhs_contracting=dims.get("lhs_contracting_dims", ()),
              rhs_contracting=dims.get("rhs_contracting_dims", ()),
              lhs_batch=dims.get("lhs_batch_dims", ()), rhs_batch=dims.get("rhs_batch_dims", ()))
      found[name].append(d)
      found[computation].append(d)
  nested = {c: [op.calls for op in (ops[n] for n in names) if op.opcode == "fusion"]
            for c, names in computations.items()}

  def within(computation: str, seen: frozenset) -> List[Dot]:  # its dots and its fusions'
    inner = [within(c, seen | {computation}) for calls in nested.get(computation, ())
             for c in calls if c not in seen]
    return found.get(computation, []) + [d for ds in inner for d in ds]

  listed = {name: ds for name, ds in found.items() if name not in computations}
  for computation in computations:
    ds = within(computation, frozenset())
    if ds:
      listed[computation] = ds
  return listed


def dots_of(name: str, ops: Dict[str, profile.HloOp], dots: Dict[str, List[Dot]]) -> List[Dot]:
  """The dots an instruction computes: its own, or those of the computations it calls (nested
  fusions included, as :func:`parse_dots` lists them)."""
  if name not in ops:
    return []
  if ops[name].opcode == "dot":
    return dots.get(name, [])
  return [d for computation in ops[name].calls for d in dots.get(computation, [])]


def by_shape(trace_dir: str) -> Tuple[Dict[str, object], List[dict]]:
  """(bench.profile's figures of the trace in ``trace_dir``, one row per dot signature, slowest
  first: {"dot": Dot, "ms": wall ms per step, "runs": per step, "gflops": GFLOP/s there}).

  A matmul instruction with no dot found in the HLO (a library custom-call) is left out; one with
  several dots (rare) has its time shared evenly between them."""
  figures = profile.read_profile(trace_dir, top=10 ** 9)
  with open(f"{trace_dir}/{profile.HLO_FILE}") as f:
    text = f.read()
  _, ops, computations = profile.parse_hlo(text)
  dots = dots_in(ops, computations)
  rows: Dict[Dot, List[float]] = collections.defaultdict(lambda: [0.0, 0.0])
  for name, category, _, ms, runs in figures["top"]:
    found = dots_of(name, ops, dots) if category == "matmul" else []
    for d in found:
      rows[d][0] += ms / len(found)
      rows[d][1] += runs
  table = [dict(dot=d, ms=ms, runs=runs, gflops=d.flops * runs / (ms * 1e6) if ms else 0.0)
           for d, (ms, runs) in rows.items()]
  table.sort(key=lambda r: -r["ms"])
  return figures, table


def time_alone(d: Dot, repeats: int = 20, seed: int = 0) -> float:
  """Seconds of one warm call of the dot by itself (jit'd ``lax.dot_general``), the minimum of
  ``repeats`` calls."""
  rng = np.random.default_rng(seed)
  lhs = jnp.asarray(rng.standard_normal(d.lhs), _DTYPES[d.lhs_dtype])
  rhs = jnp.asarray(rng.standard_normal(d.rhs), _DTYPES[d.rhs_dtype])
  out_dtype = _DTYPES[d.out_dtype]
  numbers = ((d.lhs_contracting, d.rhs_contracting), (d.lhs_batch, d.rhs_batch))
  fn = jax.jit(lambda a, b: jax.lax.dot_general(a, b, numbers, preferred_element_type=out_dtype))
  jax.block_until_ready(fn(lhs, rhs))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(lhs, rhs))
    best = min(best, time.perf_counter() - start)
  return best


def format_rows(figures: Dict[str, object], table: List[dict], alone: Optional[List[float]] = None,
                rows: Optional[int] = None, peak: Optional[float] = None) -> str:
  """The first ``rows`` rows (all: None) as text, after a line with the traced step and the
  program's matmul time, FLOPs (all rows) and rate; ``alone``: seconds per call of those rows.

  The last lines bound what the program can gain: with everything but its products gone, the
  step is its matmul time M, so step / M is the most any change outside the products can give;
  with ``peak`` (GFLOP/s), every product at that rate takes F / peak (F: all rows' FLOPs)."""
  step, matmul = figures["step_ms"], figures["categories"]["matmul"]
  total_flops = sum(r["dot"].flops * r["runs"] for r in table)
  table = table[:rows]
  lines = [f"{figures.get('config', '?')} {figures.get('dtype', '')}: traced step {step:.2f} ms, "
           f"matmul {matmul:.2f} ms ({100 * matmul / step:.1f}%), "
           f"{total_flops / 1e9:.2f} GFLOP a step, {total_flops / (matmul * 1e6):.0f} GFLOP/s "
           f"over the matmul time",
           f"{'ms/step':>9} {'%':>6} {'runs':>6} {'GFLOP/s':>8}"
           + (f" {'alone':>7}" if alone is not None else "") + "  dot"]
  for i, r in enumerate(table):
    extra = (f" {r['dot'].flops / alone[i] / 1e9:>7.0f}" if alone is not None else "")
    lines.append(f"{r['ms']:>9.2f} {100 * r['ms'] / step:>5.1f}% {r['runs']:>6.0f} "
                 f"{r['gflops']:>8.0f}{extra}  {r['dot'].describe()}")
  if alone is not None:
    now = sum(r["ms"] for r in table)
    best = sum(r["runs"] * 1e3 * seconds for r, seconds in zip(table, alone))
    lines.append(f"these {len(table)} shapes: {now:.2f} ms a step here, {best:.2f} ms at their "
                 f"rates alone (the step less {now - best:.2f} ms)")
  lines.append(f"nothing but the products: {matmul:.2f} ms, the step {step / matmul:.2f}x as fast "
               f"at most without faster products")
  if peak:
    at_peak = total_flops / (peak * 1e6)
    lines.append(f"every product at {peak:.0f} GFLOP/s: {at_peak:.2f} ms, and with nothing else "
                 f"the step {step / at_peak:.2f}x as fast")
  return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
  """``python -m bench.dots --read DIR [--alone]``: prints :func:`format_rows`."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--read", required=True, help="a bench.profile --trace_dir")
  p.add_argument("--alone", action="store_true", help="also time each dot shape by itself")
  p.add_argument("--repeats", type=int, default=20, help="calls per dot timed alone (the minimum)")
  p.add_argument("--rows", type=int, default=30, help="how many dot shapes to list")
  p.add_argument("--peak", type=float, default=0.0,
                 help="a GFLOP/s rate (e.g. txf bench's matmul peak): the step's products at it")
  a = p.parse_args(argv)
  try:
    figures, table = by_shape(a.read)
  except FileNotFoundError as e:
    print(f"txf: error: {a.read} holds no bench.profile trace ({e.filename} is missing): "
          f"write one with python -m bench.profile --trace_dir {a.read}", file=sys.stderr)
    sys.exit(2)
  alone = [time_alone(r["dot"], a.repeats) for r in table[:a.rows]] if a.alone else None
  print(format_rows(figures, table, alone, a.rows, a.peak or None))


if __name__ == "__main__":
  main()
