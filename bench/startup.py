"""Time to first step: process start to the first finished train step, cold and warm cache.

  python -m bench.startup [--configs default,small,base] [--repeats 2] [--output runs/startup.json]

Each measurement is a fresh process timed from its start (``Popen``) to the line that says its
first train step is done:

* ``default``: the real command, ``txf train`` on experiments/default.py (logging every step,
  no evaluation), until its ``step 1/`` line; then the process is stopped.
* ``small``, ``base``: the peers' shapes (bench.train.BENCH_CONFIGS), the train step the peer
  sitting times (bench.peer_worker), run by this module as a worker that reports as soon as one
  step is finished, under tcmalloc where a ``txf`` command would re-execute with it
  (``txf.runtime.process.reexec_plan``). The worker also reports its in-process first step (trace +
  compile + step, or reading the programs back), the figure the peer harnesses print as
  ``first_step_s``.

``cold`` runs with an empty compilation cache (a new ``TXF_COMPILE_CACHE`` folder); ``warm`` runs
again with the folder the cold run filled; ``off`` runs with ``TXF_COMPILE_CACHE=off``. Rounds
alternate cold / warm / off; cells are medians over ``--repeats`` rounds.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import jax

from bench import train as train_bench
from txf.runtime import compile_cache, process as runtime
from txf.runtime.machine import cpu_model_and_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ("default", "small", "base")
MODES = ("cold", "warm", "off")
DONE = "txf-startup: first step done"


def worker(config: str) -> None:
  """One train step of a bench config, then one line: ``DONE <in-process seconds>``."""
  compile_cache.apply(jax.config)
  start = time.perf_counter()
  cfg = train_bench.config_for(config)
  shape = train_bench.BENCH_CONFIGS[config]
  batch = train_bench.random_batch(cfg, shape["batch"], shape["source_len"], shape["target_len"])
  runner, state = train_bench.build_step(cfg, batch)
  state, metrics = runner.train_jit(state, batch, jax.random.key(1))
  jax.block_until_ready(metrics)
  print(f"{DONE} {time.perf_counter() - start:.3f}", flush=True)


def command(config: str, workdir: str) -> List[str]:
  """The process that is timed for ``config``."""
  if config == "default":
    return [sys.executable, "-m", "txf.cli", "train", "--config", "default", "--workdir", workdir,
            "--config.num_train_steps=3", "--config.log_every=1", "--config.eval_every=0",
            "--config.decode_examples=0", "--progress=false"]
  return [sys.executable, "-m", "bench.startup", "--worker", config]


def measure(config: str, cache: str, timeout: float = 600.0) -> Dict[str, Optional[float]]:
  """{"first_step_s": process start to the first step's line, "in_process_s": the worker's own
  figure (None for ``default``)} with ``TXF_COMPILE_CACHE=cache``."""
  workdir = tempfile.mkdtemp(prefix="txf-startup-run-")
  env = {**os.environ, "TXF_COMPILE_CACHE": cache, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  if config != "default":  # the worker runs under the allocator a txf command re-executes with
    plan = runtime.reexec_plan(env, ["txf"])
    if plan is not None:
      env = plan[1]
  start = time.perf_counter()
  proc = subprocess.Popen(command(config, workdir), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  found, in_process, tail = None, None, []
  try:
    for line in proc.stdout:
      tail.append(line)
      if line.startswith("step 1/") or line.startswith(DONE):
        found = time.perf_counter() - start
        if line.startswith(DONE):
          in_process = float(line.split()[-1])
        break
      if time.perf_counter() - start > timeout:
        break
  finally:
    proc.kill()
    proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)
  if found is None:
    raise RuntimeError(f"{config}: no first step in the output:\n{''.join(tail[-20:])}")
  return {"first_step_s": found, "in_process_s": in_process}


def sitting(configs, repeats: int, say=print) -> List[dict]:
  """Every (config, round): cold (a new cache folder), warm (the same folder again), off."""
  records = []
  for config in configs:
    for r in range(repeats):
      folder = tempfile.mkdtemp(prefix="txf-startup-cache-")
      try:
        for mode in MODES:
          result = measure(config, "off" if mode == "off" else folder)
          record = {"config": config, "round": r, "mode": mode, **result}
          records.append(record)
          say(json.dumps(record), flush=True)
      finally:
        shutil.rmtree(folder, ignore_errors=True)
  return records


def table(records: List[dict]) -> str:
  """Markdown: per config, the median first step cold / warm / off and cold / warm."""
  lines = ["| config | cold s | warm s | off s | cold / warm | in-process cold / warm s |",
           "|---|---|---|---|---|---|"]
  for config in dict.fromkeys(r["config"] for r in records):
    med = {}
    inproc = {}
    for mode in MODES:
      rows = [r for r in records if r["config"] == config and r["mode"] == mode]
      med[mode] = statistics.median(r["first_step_s"] for r in rows)
      values = [r["in_process_s"] for r in rows if r["in_process_s"] is not None]
      inproc[mode] = statistics.median(values) if values else None
    inner = (f"{inproc['cold']:.1f} / {inproc['warm']:.1f}" if inproc["cold"] is not None else "-")
    lines.append(f"| {config} | {med['cold']:.1f} | {med['warm']:.1f} | {med['off']:.1f} | "
                 f"{med['cold'] / med['warm']:.1f}x | {inner} |")
  return "\n".join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", default=",".join(CONFIGS))
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--output", default="")
  parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    worker(args.worker)
    return
  configs = [c for c in args.configs.split(",") if c]
  unknown = [c for c in configs if c not in CONFIGS]
  if unknown:
    parser.error(f"unknown config(s) {unknown}: choose from {', '.join(CONFIGS)}")
  print(f"cpu: {cpu_model_and_flags()[0]}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
  records = sitting(configs, args.repeats)
  print(table(records))
  if args.output:
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
      json.dump(records, f, indent=1)


if __name__ == "__main__":
  main()
