"""One command for every speed figure: matmul peaks, train steps, decoding; a table and a JSON file.

  txf bench [--configs small,base] [--output runs/bench.json] [--steps 5]
  python -m bench --configs small,base --output runs/bench.json   (the same, without absl)

Order of a run: the machine (CPU, SIMD features, jax, XLA_FLAGS, ``uptime``), the fp32 and bf16
matmul peaks (:func:`bench.train.matmul_peak`), then for each config and each (dtype,
attention_impl) the train step (:func:`bench.train.train_benchmark`), then cached greedy and
beam decoding (:func:`bench.decode.decode_benchmark`, whose rows also time the uncached
baseline). Every row carries the load average before and after it: on a shared machine compare
figures only at similar load, or re-run the same command on a quiet machine.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from bench import train as train_bench
from bench.decode import decode_benchmark
from txf import kernels
from txf.core.config import ConfigError
from txf.kernels import resolve_impl


def uptime() -> str:
  """``uptime`` output (load averages over 1, 5, 15 minutes), or the load average if unavailable."""
  try:
    return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return f"load average: {train_bench.load_average()}"


def run_benchmarks(configs: Sequence[str] = ("small", "base"), steps: int = 5,
                   dtypes: Sequence[str] = ("float32",), attention_impls: Sequence[str] = ("auto",),
                   decode: bool = True, decode_batch: int = 8, decode_length: int = 32,
                   beam_size: int = 4, peak_size: int = 2048, say=print,
                   bf16_dots: Sequence[str] = ("auto",)) -> Dict[str, object]:
  """Run everything; returns the JSON-able results (``say`` gets progress lines).

  Args:
    configs: names in bench.train.BENCH_CONFIGS.
    steps: timed train steps per row (after 2 warm-up steps).
    dtypes: model.dtype values to time ("float32", "bfloat16"); peaks are measured for both.
    attention_impls: model.attention_impl values to time ("auto", "reference", "fused").
    decode: also time decoding (greedy and beam ``beam_size``, ``decode_batch`` sources,
      ``decode_length`` output tokens; first dtype and attention_impl).
    bf16_dots: for bfloat16 rows, the kinds of bf16 product to time ("auto": what
      ``txf.kernels.select`` chooses; "layout", "xla": txf.kernels.BF16_DOTS), one row each.
  """
  import jax

  started = time.time()
  results: Dict[str, object] = {"command": " ".join(sys.argv), "machine": train_bench.machine_info(),
                                "kernels": kernels.describe(),
                                "uptime_start": uptime(), "peaks": {}, "train": [], "decode": []}
  say(f"machine: {results['machine']['cpu']}, {results['machine']['cpu_count']} cores, "
      f"SIMD {','.join(results['machine']['simd'])}, jax {jax.__version__}; {results['uptime_start']}")
  for dtype in ("float32", "bfloat16"):
    peak = train_bench.matmul_peak(dtype, n=peak_size)
    results["peaks"][dtype] = peak
    say(f"matmul peak {dtype}: {peak['gflops_best']:.1f} GFLOP/s best, {peak['gflops_median']:.1f} "
        f"median ({peak_size}^3, load {peak['load_before']})")
  peaks = {k: v["gflops_best"] for k, v in results["peaks"].items()}
  probes = {dtype: train_bench.matmul_probe(dtype, peak_size) for dtype in results["peaks"]}
  for name in configs:
    shape = train_bench.BENCH_CONFIGS[name]
    for dtype in dtypes:
      for impl in attention_impls:
        for dots in (bf16_dots if dtype == "bfloat16" else ("auto",)):
          choice = {} if dots == "auto" else {"bf16_dots": dots}
          with kernels.use(**choice):  # the step is traced and compiled inside
            cfg = train_bench.config_for(name, dtype, impl)
            chosen = kernels.describe(dtype)
            say(f"train {name} {dtype} attention {impl} ({resolve_impl(impl)}), "
                f"dots {chosen['bf16_dots']} ...")
            row = train_bench.train_benchmark(name, cfg, shape["batch"], shape["source_len"],
                                              shape["target_len"], steps=steps, peaks=peaks,
                                              probes=probes)
          row.update(attention_resolved=resolve_impl(impl), kernels=chosen)
          results["train"].append(row)
          say("  " + _train_line(row))
    if decode:
      cfg = train_bench.config_for(name, dtypes[0], attention_impls[0])
      say(f"decode {name}: batch {decode_batch}, {decode_length} tokens, greedy and beam {beam_size} ...")
      load = train_bench.load_average()
      for row in decode_benchmark(cfg, decode_batch, (decode_length,), beam_size, repeats=3,
                                  source_len=shape["source_len"], max_seconds=20.0):
        row.update(config=name, dtype=cfg.dtype, load_before=load, load_after=train_bench.load_average())
        results["decode"].append(row)
  results["uptime_end"] = uptime()
  results["wall_s"] = time.time() - started
  return results


def _train_line(r: dict) -> str:
  return (f"compile {r['compile_s']:.1f}s, step {r['step_s_best']:.3f}s, {r['target_tokens_per_s']:.0f} "
          f"target tok/s, {r['model_gflops_per_s']:.1f} model GFLOP/s, MFU fp32 "
          f"{100 * _mfu(r, 'float32'):.0f}%, load {r['load_before']}->{r['load_after']}")


def _mfu(row: dict, dtype: str) -> float:
  """The paired MFU (step vs the matmul run right after it) if measured, else against the peak."""
  return row.get(f"mfu_paired_{dtype}", row.get(f"mfu_{dtype}", float("nan")))


def format_report(results: Dict[str, object]) -> str:
  """The results as text tables: peaks, train steps, decoding."""
  m = results["machine"]
  lines = [f"machine: {m['cpu']}, {m['cpu_count']} cores, SIMD {','.join(m['simd'])}, "
           f"{m['platform']}, jax {m['jax']}, XLA_FLAGS='{m['xla_flags']}', "
           f"malloc {m.get('allocator', 'system')}",
           f"start: {results['uptime_start']}", f"end:   {results.get('uptime_end', '')}", ""]
  for dtype, p in results["peaks"].items():
    lines.append(f"matmul peak {dtype:<8} {p['gflops_best']:7.1f} GFLOP/s best, {p['gflops_median']:7.1f} "
                 f"median, {p['gflops_per_cpu_s']:6.1f} per CPU-second  (load {p['load_before']})")
  head = (f"{'config':<6} {'dtype':<8} {'attn':<9} {'dots':<6} {'compile s':>9} {'step s':>7} {'median':>7} "
          f"{'tgt tok/s':>9} {'all tok/s':>9} {'GFLOP/step':>10} {'XLA GFLOP':>9} {'GFLOP/s':>8} "
          f"{'MFU32':>6} {'MFUbf16':>7} {'MFUcpu':>6} {'peak MiB':>8} {'RSS MiB':>8} {'load':>11}")
  lines += ["", head, "-" * len(head)]
  fp32_cpu = results["peaks"].get("float32", {}).get("gflops_per_cpu_s")
  for r in results["train"]:
    mfu_cpu = r["model_gflops_per_cpu_s"] / fp32_cpu if fp32_cpu else float("nan")
    xla = r["flops_xla"] / 1e9 if r["flops_xla"] else float("nan")
    lines.append(
        f"{r['config']:<6} {r['dtype']:<8} {r['attention_resolved'][:9]:<9} "
        f"{r.get('kernels', {}).get('bf16_dots', '')[:6]:<6} {r['compile_s']:>9.1f} "
        f"{r['step_s_best']:>7.3f} {r['step_s_median']:>7.3f} {r['target_tokens_per_s']:>9.0f} "
        f"{r['tokens_per_s']:>9.0f} {r['flops_model'] / 1e9:>10.1f} {xla:>9.1f} "
        f"{r['model_gflops_per_s']:>8.1f} {100 * _mfu(r, 'float32'):>5.0f}% "
        f"{100 * _mfu(r, 'bfloat16'):>6.0f}% {100 * mfu_cpu:>5.0f}% "
        f"{r['memory'].get('peak_mib', float('nan')):>8.0f} {r['max_rss_mib']:>8.0f} "
        f"{r['load_before']:>5.1f}->{r['load_after']:<5.1f}")
  if results["decode"]:
    head = (f"{'config':<6} {'method':<7} {'cache':<5} {'len':>4} {'batch':>5} {'compile s':>9} "
            f"{'run s':>7} {'tok/s':>8} {'ms/step':>8} {'load':>11}")
    lines += ["", head, "-" * len(head)]
    for r in results["decode"]:
      lines.append(f"{r['config']:<6} {r['method']:<7} {'yes' if r['cached'] else 'no':<5} "
                   f"{r['length']:>4} {r['batch']:>5} {r['compile_s']:>9.1f} {r['seconds']:>7.3f} "
                   f"{r['tokens_per_s']:>8.1f} {r['ms_per_token']:>8.2f} "
                   f"{r['load_before']:>5.1f}->{r['load_after']:<5.1f}")
  lines += ["", "step s: best of the timed steps (median beside it); tok/s and GFLOP/s use the best step.",
            "MFU32/MFUbf16: median over steps of (model GFLOP/s of the step) / (GFLOP/s of the fp32/bf16 "
            "2048^3 matmul, best of 3 runs right after it);",
            "MFUcpu: model GFLOP per CPU-second of this process / fp32 matmul GFLOP per CPU-second. "
            "Model FLOPs: analytic, matmuls only (BENCHMARKS.md)."]
  return "\n".join(lines)


def run_and_report(configs: Sequence[str], output: Optional[str], steps: int,
                   dtypes: Sequence[str] = ("float32",), attention_impls: Sequence[str] = ("auto",),
                   decode: bool = True, decode_batch: int = 8, decode_length: int = 32,
                   beam_size: int = 4, bf16_dots: Sequence[str] = ("auto",)) -> Dict[str, object]:
  """Run, print the report, write JSON to ``output`` (if given); returns the results."""
  unknown = [c for c in configs if c not in train_bench.BENCH_CONFIGS]
  if unknown:
    raise ConfigError(f"unknown bench config(s) {unknown}; choose from {sorted(train_bench.BENCH_CONFIGS)}")
  results = run_benchmarks(configs, steps, dtypes, attention_impls, decode, decode_batch,
                           decode_length, beam_size, bf16_dots=bf16_dots)
  print()
  print(format_report(results))
  if output:
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
      json.dump(results, f, indent=1, default=str)
    print(f"\nwrote {output}")
  return results


def _csv(text: str) -> List[str]:
  return [x.strip() for x in text.split(",") if x.strip()]


def main(argv=None) -> None:
  """``python -m bench`` (argparse flags mirror ``txf bench``)."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--configs", default="small,base", help="comma-separated: small,base")
  p.add_argument("--output", default="runs/bench.json", help="JSON results file ('' = none)")
  p.add_argument("--steps", type=int, default=5, help="timed train steps per row")
  p.add_argument("--dtypes", default="float32", help="comma-separated model dtypes: float32,bfloat16")
  p.add_argument("--attention_impls", default="auto", help="comma-separated: auto,reference,fused")
  p.add_argument("--decode", action=argparse.BooleanOptionalAction, default=True)
  p.add_argument("--decode_batch", type=int, default=8)
  p.add_argument("--decode_length", type=int, default=32)
  p.add_argument("--beam", type=int, default=4)
  p.add_argument("--bf16_dots", default="auto", help="comma-separated, for bfloat16 rows: auto,layout,xla")
  a = p.parse_args(argv)
  run_and_report(_csv(a.configs), a.output or None, a.steps, _csv(a.dtypes), _csv(a.attention_impls),
                 a.decode, a.decode_batch, a.decode_length, a.beam, _csv(a.bf16_dots))


if __name__ == "__main__":
  main()
