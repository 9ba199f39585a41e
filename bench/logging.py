"""Training-loop throughput against the logging frequency: steps/s at log_every=1 and at 100.

  python -m bench.logging                         # the default experiment, 200 steps each
  python -m bench.logging --steps 400 --log_every 1,10,100 --parallelism pmap

A step's only host work is feeding the next batch (txf/train/loop.py): its dropout key is derived
on device and its metrics stay there until the log row fetches the window. So logging every step
should cost about one small fetch per step, not a host wait per step. Each setting trains the
experiment twice through ``txf.train.train`` (what ``txf train`` runs), ``--warm`` steps and
``--warm + --steps`` steps, and reports the difference: seconds (wall and process CPU) per step of
the loop with set-up, compilation (a persistent compilation cache is shared by the runs) and the
final evaluation cancelled out. Evaluation and checkpoints happen only at the end. Wall time on a
shared machine depends on the load (printed with each row); compare CPU ms/step there.
"""

import argparse
import contextlib
import io
import os
import shutil
import tempfile
import time
from typing import Dict, List

import jax

from txf.core.config import load_experiment


def _timed_run(config, workdir: str) -> Dict[str, float]:
  from txf.commands.reporting import TerminalReporter  # deferred: argument errors come first
  from txf.train import train
  shutil.rmtree(workdir, ignore_errors=True)
  wall, cpu = time.perf_counter(), time.process_time()
  with contextlib.redirect_stdout(io.StringIO()):  # the lines `txf train` prints, then dropped
    train(config, workdir, report=TerminalReporter())
  return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def measure(experiment: str, log_every: int, steps: int, warm: int, parallelism: str,
            base: str) -> Dict[str, float]:
  """{steps_per_s, wall_ms, cpu_ms, load}: the loop's cost per step at ``log_every`` (the
  difference of a ``warm + steps`` and a ``warm``-step run, see the module docstring)."""
  times = []
  for total in (warm, warm + steps):
    config = load_experiment(experiment)
    config.num_train_steps, config.log_every = total, log_every
    config.eval_every, config.checkpoint_every = 0, 0
    config.decode_examples, config.num_samples, config.eval_batches = 0, 0, 1
    config.parallelism = parallelism
    times.append(_timed_run(config, os.path.join(base, f"log{log_every}-{total}")))
  wall = (times[1]["wall"] - times[0]["wall"]) / steps
  cpu = (times[1]["cpu"] - times[0]["cpu"]) / steps
  return {"steps_per_s": 1.0 / max(wall, 1e-9), "wall_ms": 1e3 * wall, "cpu_ms": 1e3 * cpu,
          "load": os.getloadavg()[0]}


def main(argv: List[str] = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m bench.logging", description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="default", help="experiment name or file")
  parser.add_argument("--steps", type=int, default=200, help="measured steps per setting")
  parser.add_argument("--warm", type=int, default=20, help="steps of the shorter run")
  parser.add_argument("--log_every", default="1,100", help="comma-separated log_every values")
  parser.add_argument("--parallelism", default="single", choices=("single", "pmap", "mesh"))
  args = parser.parse_args(argv)
  if args.steps < 1 or args.warm < 1:
    parser.error("--steps and --warm must be >= 1")
  every = [int(v) for v in args.log_every.split(",") if v.strip()]
  base = tempfile.mkdtemp(prefix="txf-bench-logging-")
  jax.config.update("jax_compilation_cache_dir", os.path.join(base, "jax-cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  print(f"bench.logging: {args.config}, {args.parallelism} on {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s), {args.steps} steps after {args.warm}")
  print(f"{'log_every':>9}  {'steps/s':>8}  {'wall ms/step':>12}  {'cpu ms/step':>11}  {'load':>5}")
  try:
    for n in every:
      r = measure(args.config, n, args.steps, args.warm, args.parallelism, base)
      print(f"{n:>9}  {r['steps_per_s']:>8.2f}  {r['wall_ms']:>12.2f}  {r['cpu_ms']:>11.2f}  "
            f"{r['load']:>5.1f}", flush=True)
  finally:
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
  main()
