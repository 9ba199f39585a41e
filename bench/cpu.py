"""User, system and wall seconds and minor page faults per train step: for A/B of process settings.

  python -m bench.cpu --config small [--steps 5]
  TXF_MALLOC=system python -m txf.cli info   # (the txf command preloads tcmalloc; this module doesn't)
  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python -m bench.cpu --config small

Run two settings one after the other (or pinned to one core each with ``taskset``) and compare:
this is how the allocator row of BENCHMARKS.md was measured. Prints the median over the timed
steps after 2 warm-up steps.
"""

import argparse
import resource
import time
from typing import Dict

import jax

from txf.runtime import process as runtime
from bench import train as train_bench


def step_costs(name: str, steps: int = 5, warmup: int = 2) -> Dict[str, float]:
  """Median user s, system s, wall s and minor page faults per train step of a bench config."""
  bc = train_bench.BENCH_CONFIGS[name]
  model_cfg = train_bench.config_for(name)
  batch = train_bench.random_batch(model_cfg, bc["batch"], bc["source_len"], bc["target_len"])
  runner, state = train_bench.build_step(model_cfg, batch)
  key, rows = jax.random.key(0), []
  for i in range(warmup + steps):
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    state, metrics = runner.train_step(state, batch, key)
    jax.block_until_ready(metrics)
    r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if i >= warmup:
      rows.append({"user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
                   "wall_s": w1 - w0, "minor_faults": float(r1.ru_minflt - r0.ru_minflt)})
  return {k: sorted(r[k] for r in rows)[len(rows) // 2] for k in rows[0]}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", default="small", choices=sorted(train_bench.BENCH_CONFIGS))
  p.add_argument("--steps", type=int, default=5)
  args = p.parse_args(argv)
  c = step_costs(args.config, args.steps)
  print(f"{args.config}, malloc {runtime.allocator()}: user {c['user_s']:.2f} s, sys {c['sys_s']:.2f} s, "
        f"wall {c['wall_s']:.2f} s, {c['minor_faults']:.0f} minor page faults per step "
        f"(median of {args.steps})")


if __name__ == "__main__":
  main()
