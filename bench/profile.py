"""Where a train step or a decode call spends its time: a jax.profiler trace, summed by XLA op kind.

  python -m bench.profile --config base --dtype bfloat16 [--steps 3] [--trace_dir DIR]
  python -m bench.profile --config small --program beam4   (a decode call, as the peers time it)
  python -m bench.profile --read DIR      (the table of an earlier run's --trace_dir)

Builds the train step exactly as ``python -m bench`` does (:func:`bench.train.build_step` on the
random batch of a bench config: tiny, small, base), compiles it, runs one untraced warm-up step,
then traces ``--steps`` steps with ``jax.profiler.trace``. XLA:CPU's thunk executor writes one
trace event per HLO instruction it runs (``args.hlo_op``, ``args.hlo_module``); this module reads
the trace file (``*.trace.json.gz``), keeps the events of the step's module, takes each event's
exclusive time (its duration less the events nested in it on the same thread: a ``while`` or
``conditional`` keeps only its own overhead) and sorts the instructions into categories by what
the optimized HLO (``compiled.as_text()``) says they compute:

* matmul: ``dot``/``convolution``, a fusion that contains one (XLA:CPU's YNNPACK/oneDNN fusions),
  a custom-call to a matmul library;
* convert: a ``convert`` or a fusion that only converts dtypes (with a transpose/copy or not);
* copy/transpose: ``copy``, ``transpose``, slices, concatenates, pads, broadcasts, and fusions of
  only those (data movement, no arithmetic);
* reduction: an unfused ``reduce``/``reduce-window``;
* fusion: the other (elementwise and reduce) fusions;
* other: everything else (control flow's own time, rng, gather/scatter, sort, custom-calls).

``--program greedy`` or ``beamK`` profiles a decode call instead, built as the peers' sitting builds
it (:func:`bench.peer_worker.decode_program`: a random model of the config, 16 sources of 32
tokens, 32 tokens out, never stopping early); a "step" is then one whole call (encoder, cache and
every search step), and an instruction inside the search loop is summed over its iterations.

The step time is the traced one: per execution (``args.run_id``), from its first op's start to its
last op's end; the wall time of each traced step (``time.perf_counter``) is printed beside it.
The executor runs independent ops on several threads at once, so a category's ``ms/step`` is wall
time shared out (each instant split evenly between the ops running at that instant); ``thread ms``
beside it sums the ops' own durations; ``idle`` is time in which no op ran. The HLO text and the
run's details are saved beside the trace (``--trace_dir``): ``--read DIR`` prints the table again.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import jax

from bench import peer_worker
from bench import train as train_bench
from txf import kernels

HLO_FILE, META_FILE = "step.hlo.txt", "profile.json"  # written beside the trace
CATEGORIES = ("matmul", "convert", "fusion", "copy/transpose", "reduction", "other")
_MOVE = {"copy", "transpose", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate",
         "pad", "broadcast", "reverse", "copy-start", "copy-done", "iota"}
_STRUCTURE = {"parameter", "constant", "bitcast", "reshape", "tuple", "get-tuple-element"}
_MATMUL_TARGET = re.compile(r"matmul|gemm|dot|conv", re.IGNORECASE)
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"(?<![\w.\-%])([a-z][a-z0-9\-]*)\(")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


class HloOp:
  """One instruction of the optimized HLO: opcode, called computations, custom-call target, and
  ``text``, what follows its ``name =`` (result shape, opcode, operands, attributes)."""

  def __init__(self, name: str, opcode: str, calls: List[str], target: str, text: str = ""):
    self.name, self.opcode, self.calls, self.target = name, opcode, calls, target
    self.text = text


def parse_hlo(text: str) -> Tuple[str, Dict[str, HloOp], Dict[str, List[str]]]:
  """(module name, {instruction name: HloOp}, {computation name: [its instruction names]}) of an
  HLO module's text (``compiled.as_text()``); instruction names are unique in a module."""
  module = re.search(r"HloModule\s+([\w.\-]+)", text)
  ops: Dict[str, HloOp] = {}
  computations: Dict[str, List[str]] = {}
  current: Optional[List[str]] = None
  for line in text.splitlines():
    line = re.sub(r"/\*.*?\*/", "", line)  # /*index=5*/ comments in long operand lists
    match = _COMPUTATION.match(line)
    if match and "=" not in line.split("{")[0]:
      current = computations.setdefault(match.group(1), [])
      continue
    if line.strip() == "}":
      current = None
      continue
    match = _INSTRUCTION.match(line)
    if current is None or not match:
      continue
    rest = match.group(2)
    opcode = _OPCODE.search(rest)
    calls = _CALLS.findall(rest)
    for branches in _BRANCHES.findall(rest):
      calls += [b.strip().lstrip("%") for b in branches.split(",") if b.strip()]
    target = _TARGET.search(rest)
    ops[match.group(1)] = HloOp(match.group(1), opcode.group(1) if opcode else "?", calls,
                                target.group(1) if target else "", rest)
    current.append(match.group(1))
  return (module.group(1) if module else ""), ops, computations


def _fused_opcodes(op: HloOp, ops: Dict[str, HloOp], computations: Dict[str, List[str]]) -> set:
  """The opcodes (and custom-call targets) computed inside a fusion, nested fusions included."""
  found, todo, seen = set(), list(op.calls), set()
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    for inner in (ops[i] for i in computations.get(name, ())):
      found.add(inner.opcode)
      if inner.opcode == "custom-call":
        found.add("custom-call:" + inner.target)
      todo += inner.calls if inner.opcode == "fusion" else []
  return found


def classify(op: HloOp, ops: Dict[str, HloOp], computations: Dict[str, List[str]]) -> str:
  """The category (one of CATEGORIES) of an instruction, by its opcode or its fusion's contents."""
  if op.opcode in ("dot", "convolution"):
    return "matmul"
  if op.opcode == "custom-call":
    return "matmul" if _MATMUL_TARGET.search(op.target) else "other"
  if op.opcode == "fusion":
    inner = _fused_opcodes(op, ops, computations)
    if inner & {"dot", "convolution"} or any(
        o.startswith("custom-call:") and _MATMUL_TARGET.search(o) for o in inner):
      return "matmul"
    compute = inner - _STRUCTURE
    if compute and compute <= _MOVE | {"convert"}:  # a cast (maybe with a layout change), or a copy
      return "convert" if "convert" in compute else "copy/transpose"
    return "fusion"
  if op.opcode == "convert":
    return "convert"
  if op.opcode in _MOVE:
    return "copy/transpose"
  if op.opcode in ("reduce", "reduce-window"):
    return "reduction"
  return "other"


def describe(op: HloOp, ops: Dict[str, HloOp], computations: Dict[str, List[str]]) -> str:
  """A short summary of what an instruction computes: its opcode, a fusion's inner opcodes."""
  if op.opcode != "fusion":
    return op.opcode + (f" {op.target}" if op.target else "")
  inner = sorted(_fused_opcodes(op, ops, computations) - _STRUCTURE)
  return "fusion: " + ",".join(o for o in inner if not o.startswith("custom-call:"))


def find_trace(directory: str) -> str:
  """The newest trace file jax.profiler wrote under ``directory`` (perfetto's, else the host's)."""
  files = (glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True)
           or glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True))
  if not files:
    raise FileNotFoundError(f"no *.trace.json.gz under {directory}")
  return max(files, key=os.path.getmtime)


def op_events(trace_file: str, module: str) -> List[dict]:
  """The complete ('X') events of HLO instructions of ``module`` in a trace file, each with

  * ``self_us``: its exclusive duration (less the op events nested in it on the same thread);
  * ``wall_us``: its share of the wall time: each instant goes to the innermost op running on
    each thread, split evenly between threads running one at that instant (XLA:CPU's executor
    runs independent ops on 2+ threads at once, so summed durations exceed the step).
  """
  with gzip.open(trace_file, "rt") as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  ours = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
  modules = collections.Counter(e["args"].get("hlo_module", "") for e in ours)
  if module not in modules and modules:  # a renamed module: the one with the most events
    module = modules.most_common(1)[0][0]
  ours = [dict(e, self_us=float(e["dur"]), wall_us=0.0) for e in ours
          if e["args"].get("hlo_module") == module]
  by_thread = collections.defaultdict(list)
  for e in ours:
    by_thread[e["tid"]].append(e)
  for thread in by_thread.values():
    thread.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack: List[dict] = []
    for e in thread:
      while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
        stack.pop()
      if stack:  # nested in the top of the stack: not the parent's own time
        stack[-1]["self_us"] -= e["dur"]
      stack.append(e)
  _share_wall_time(ours)
  return ours


def _share_wall_time(events: List[dict]) -> None:
  """Sets each event's ``wall_us`` (see :func:`op_events`) by a sweep over all start/end times:
  ends before starts at equal times, a parent pushed before the children starting with it."""
  points = []
  for i, e in enumerate(events):
    points.append((e["ts"], 1, -e["dur"], i))
    points.append((e["ts"] + e["dur"], 0, 0.0, i))
  points.sort()
  stacks: Dict[object, List[int]] = collections.defaultdict(list)
  last = None
  for time_us, is_start, _, i in points:
    active = [stack[-1] for stack in stacks.values() if stack]
    if last is not None and active and time_us > last:
      for j in active:
        events[j]["wall_us"] += (time_us - last) / len(active)
    last = time_us
    stack = stacks[events[i]["tid"]]
    if is_start:
      stack.append(i)
    else:
      stack.remove(i)


def _covered(events: List[dict]) -> float:
  """Microseconds covered by the union of the events' intervals (any thread)."""
  total, end = 0.0, float("-inf")
  for e in sorted(events, key=lambda e: e["ts"]):
    start, stop = max(e["ts"], end), e["ts"] + e["dur"]
    total += max(stop - start, 0.0)
    end = max(end, stop)
  return total


def summarize(events: List[dict], ops: Dict[str, HloOp], computations: Dict[str, List[str]],
              top: int = 10) -> Dict[str, object]:
  """Per-step figures of the op events (:func:`op_events`) of several executions of one module.

  Returns {"steps": executions, "step_ms": mean traced step (first op start to last op end),
  "idle_ms": time per step in no op (hand-offs between the executor's threads),
  "categories": {category: wall ms per step}, "thread_ms": {category: summed exclusive
  durations, ms per step}, "runs": {category: ops run per step}, "ops_ms": the categories'
  sum, "top": [(name, category, description, wall ms per step, runs per step)], "unknown": op
  names not in the HLO}.
  """
  runs = collections.defaultdict(list)
  for e in events:
    runs[e["args"].get("run_id", "")].append(e)
  steps = max(len(runs), 1)
  spans = [max(e["ts"] + e["dur"] for e in r) - min(e["ts"] for e in r) for r in runs.values()]
  idle = [span - _covered(r) for span, r in zip(spans, runs.values())]
  per_op = collections.defaultdict(lambda: [0.0, 0.0, 0])
  for e in events:
    row = per_op[e["args"]["hlo_op"]]
    row[0] += e["wall_us"]
    row[1] += e["self_us"]
    row[2] += 1
  figures = {key: {c: 0.0 for c in CATEGORIES} for key in ("categories", "thread_ms", "runs")}
  rows, unknown = [], []
  for name, (wall_us, self_us, count) in per_op.items():
    op = ops.get(name)
    if op is None:
      unknown.append(name)
    category = classify(op, ops, computations) if op else "other"
    figures["categories"][category] += wall_us / 1e3 / steps
    figures["thread_ms"][category] += self_us / 1e3 / steps
    figures["runs"][category] += count / steps
    rows.append((name, category, describe(op, ops, computations) if op else "?",
                 wall_us / 1e3 / steps, count / steps))
  rows.sort(key=lambda r: -r[3])
  return dict(figures, steps=len(runs), step_ms=statistics.mean(spans) / 1e3 if spans else 0.0,
              idle_ms=statistics.mean(idle) / 1e3 if idle else 0.0,
              ops_ms=sum(figures["categories"].values()), top=rows[:top], unknown=sorted(unknown))


def profile_step(name: str = "base", dtype: str = "float32", steps: int = 3,
                 trace_dir: Optional[str] = None, top: int = 10, batch_size: Optional[int] = None,
                 length: Optional[int] = None) -> Dict[str, object]:
  """Compile the train step of bench config ``name`` in ``dtype``, warm it up (1 step), trace
  ``steps`` steps; returns :func:`summarize`'s figures plus the wall time of the traced steps
  (``wall_ms``), the load average, jax's version and the trace file. ``batch_size``/``length``
  replace the config's batch and source/target lengths."""
  bc = train_bench.BENCH_CONFIGS[name]
  model_cfg = train_bench.config_for(name, dtype)
  batch = train_bench.random_batch(model_cfg, batch_size or bc["batch"], length or bc["source_len"],
                                   length or bc["target_len"])
  runner, state = train_bench.build_step(model_cfg, batch)
  rng = jax.random.key(1)
  compiled = runner.train_jit.lower(state, batch, rng).compile()
  hlo_text = compiled.as_text()
  state, metrics = compiled(state, batch, rng)
  jax.block_until_ready(metrics)
  trace_dir = trace_dir or tempfile.mkdtemp(prefix="txf-profile-")
  load_before, walls = train_bench.load_average(), []
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(steps):
      start = time.perf_counter()
      state, metrics = compiled(state, batch, rng)
      jax.block_until_ready(metrics)
      walls.append(time.perf_counter() - start)
  meta = dict(config=name, dtype=dtype, batch=int(batch["targets"].shape[0]),
              length=int(batch["targets"].shape[1]), jax=jax.__version__,
              bf16_dots=kernels.describe(dtype)["bf16_dots"] if dtype == "bfloat16" else "",
              wall_ms=1e3 * statistics.mean(walls), load_before=load_before,
              load_after=train_bench.load_average())
  with open(os.path.join(trace_dir, HLO_FILE), "w") as f:  # to re-read the trace later
    f.write(hlo_text)
  with open(os.path.join(trace_dir, META_FILE), "w") as f:
    json.dump(meta, f)
  return read_profile(trace_dir, top)


def profile_decode(name: str = "small", program: str = "beam4", dtype: str = "float32",
                   calls: int = 3, trace_dir: Optional[str] = None, top: int = 10
                   ) -> Dict[str, object]:
  """Compile the peers' decode call (:func:`bench.peer_worker.decode_program`: ``program``
  "greedy" or "beamK" at bench config ``name``), run it once untraced, trace ``calls`` calls;
  returns :func:`summarize`'s figures (a "step" = one call) as :func:`profile_step` does."""
  fn, params, inputs = peer_worker.decode_program(name, program, dtype)
  compiled = fn.lower(params, inputs).compile()
  hlo_text = compiled.as_text()
  jax.block_until_ready(compiled(params, inputs))
  trace_dir = trace_dir or tempfile.mkdtemp(prefix="txf-profile-")
  load_before, walls = train_bench.load_average(), []
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(calls):
      start = time.perf_counter()
      jax.block_until_ready(compiled(params, inputs))
      walls.append(time.perf_counter() - start)
  meta = dict(config=f"{name} {program}", dtype=dtype, batch=int(inputs.shape[0]),
              length=peer_worker.DECODE_OUT, jax=jax.__version__, bf16_dots="",
              wall_ms=1e3 * statistics.mean(walls), load_before=load_before,
              load_after=train_bench.load_average())
  with open(os.path.join(trace_dir, HLO_FILE), "w") as f:
    f.write(hlo_text)
  with open(os.path.join(trace_dir, META_FILE), "w") as f:
    json.dump(meta, f)
  return read_profile(trace_dir, top)


def read_profile(trace_dir: str, top: int = 10) -> Dict[str, object]:
  """:func:`summarize`'s figures of the trace that :func:`profile_step` left in ``trace_dir``
  (with its HLO text and run details), and the trace file's path."""
  with open(os.path.join(trace_dir, HLO_FILE)) as f:
    module, ops, computations = parse_hlo(f.read())
  with open(os.path.join(trace_dir, META_FILE)) as f:
    meta = json.load(f)
  trace_file = find_trace(trace_dir)
  result = summarize(op_events(trace_file, module), ops, computations, top)
  result.update(meta, module=module, trace_file=trace_file)
  return result


def format_table(r: Dict[str, object]) -> str:
  """The figures as text: categories (wall ms/step, % of the traced step, summed thread time,
  ops run) and the top ops by wall time."""
  step = r["step_ms"] or float("nan")
  dots = f", bf16_dots {r['bf16_dots']}" if r.get("bf16_dots") else ""
  lines = [f"{r['config']} {r['dtype']}{dots} (batch {r['batch']}, length {r['length']}), jax {r['jax']}, "
           f"module {r['module']}: {r['steps']} traced steps, traced step {r['step_ms']:.2f} ms "
           f"(wall {r['wall_ms']:.2f} ms), load {r['load_before']}->{r['load_after']}",
           f"{'category':<16} {'ms/step':>9} {'% of step':>9} {'thread ms':>10} {'ops/step':>8}"]
  for c in CATEGORIES:
    lines.append(f"{c:<16} {r['categories'][c]:>9.2f} {100 * r['categories'][c] / step:>8.1f}% "
                 f"{r['thread_ms'][c]:>10.2f} {r['runs'][c]:>8.0f}")
  lines.append(f"{'idle (no op)':<16} {r['idle_ms']:>9.2f} {100 * r['idle_ms'] / step:>8.1f}%")
  lines.append(f"{'sum':<16} {r['ops_ms'] + r['idle_ms']:>9.2f} "
               f"{100 * (r['ops_ms'] + r['idle_ms']) / step:>8.1f}% "
               f"{sum(r['thread_ms'].values()):>10.2f} {sum(r['runs'].values()):>8.0f}")
  lines += ["ms/step: wall time, an instant split between the ops running on the executor's "
            "threads at that instant;", "thread ms: the ops' summed durations (more than the step "
            "when ops overlap); idle: no op running (thread hand-offs, load).", "",
            f"top {len(r['top'])} ops: {'ms/step':>9} {'%':>6} {'runs':>5}  category        op"]
  for name, category, what, ms, count in r["top"]:
    lines.append(f"  {name[:40]:<40} {ms:>9.2f} {100 * ms / step:>5.1f}% {count:>5.0f}  "
                 f"{category:<15} {what[:70]}")
  if r["unknown"]:
    lines.append(f"ops in the trace but not in the HLO text (counted as other): {r['unknown'][:5]}")
  if not r["steps"]:
    lines.append("the trace has no per-op events of this module (this jax writes none on CPU)")
  return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
  """``python -m bench.profile``: prints the table of :func:`format_table`."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", default="base", choices=sorted(train_bench.BENCH_CONFIGS),
                 help="bench config (model size, batch, lengths), as python -m bench --configs")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--program", default="train",
                 help="train (a train step), greedy or beamK (a decode call of the peers' sitting)")
  p.add_argument("--steps", type=int, default=3, help="traced steps or decode calls (after 1 warm-up)")
  p.add_argument("--top", type=int, default=10, help="how many individual ops to list")
  p.add_argument("--batch", type=int, default=0, help="batch size (default: the config's)")
  p.add_argument("--length", type=int, default=0, help="source and target length (default: the config's)")
  p.add_argument("--read", default="", help="print the table of an earlier run's --trace_dir, run nothing")
  p.add_argument("--trace_dir", default="", help="where the trace goes (default: a temp dir)")
  a = p.parse_args(argv)
  if a.read:
    print(format_table(read_profile(a.read, a.top)))
    return
  if a.program != "train":
    try:
      peer_worker.program_beam(a.program)
    except ValueError:
      print(f"txf: error: --program must be train, greedy or beamK (K >= 1), got {a.program!r}",
            file=sys.stderr)
      sys.exit(2)
    print(format_table(profile_decode(a.config, a.program, a.dtype, a.steps, a.trace_dir or None,
                                      a.top)))
    return
  print(format_table(profile_step(a.config, a.dtype, a.steps, a.trace_dir or None, a.top,
                                 a.batch or None, a.length or None)))


if __name__ == "__main__":
  main()
