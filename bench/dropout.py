"""CPU seconds of dropout's random masks and of the train step, jax's draw against txf's, in one process.

  python -m bench.dropout --masks                 # [4096, 2048] and one base step's mask shapes
  python -m bench.dropout --step small --steps 3  # the train step with each dropout
  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python -m bench.dropout --step base

``jax``: ``jax.random.bernoulli`` (flax ``nn.Dropout``), whose threefry lowers on CPU to a rolled
while loop; ``txf``: ``txf.kernels.bernoulli``, the same bits from straight-line fusible ops.
``--alternatives`` adds draws with other bits (rbg, unsafe_rbg, threefry non-partitionable) for the
record. Timings are process CPU seconds (``time.process_time``) around blocked calls, the two paths
alternating, best and median of the repeats, with the 1-minute load average: on a shared machine
compare CPU seconds, not wall time.
"""

import argparse
import contextlib
import math
import os
import statistics
import time
from typing import Callable, Dict, List, Sequence, Tuple
from unittest import mock

import flax.linen as nn
import jax
import numpy as np

from bench import train as train_bench
from txf.nn import attention, layers
from txf.kernels import threefry as dropout_ops

KEEP = 0.9


def step_mask_shapes(name: str) -> List[Tuple[int, ...]]:
  """The dropout masks of one train step of a bench config: embeddings + PE and every sublayer."""
  bc, cfg = train_bench.BENCH_CONFIGS[name], train_bench.config_for(name)
  enc = [(bc["batch"], bc["source_len"], cfg.d_model)] * (1 + 2 * cfg.num_encoder_layers)
  dec = [(bc["batch"], bc["target_len"], cfg.d_model)] * (1 + 3 * cfg.num_decoder_layers)
  return enc + dec


def _draws(draw: Callable, shapes: Sequence[Tuple[int, ...]]):
  def all_masks(key):
    return [draw(jax.random.fold_in(key, i), KEEP, s) for i, s in enumerate(shapes)]
  return jax.jit(all_masks)


def _cpu(fn: Callable, *args) -> float:
  t = time.process_time()
  jax.block_until_ready(fn(*args))
  return time.process_time() - t


def compare(fns: Dict[str, Tuple[Callable, tuple]], repeats: int) -> Dict[str, Tuple[float, float]]:
  """{name: (best, median) CPU s} of each fn(*args), after one warm-up call each, interleaved."""
  for fn, args in fns.values():
    jax.block_until_ready(fn(*args))
  times = {k: [] for k in fns}
  for _ in range(repeats):
    for k, (fn, args) in fns.items():
      times[k].append(_cpu(fn, *args))
  return {k: (min(v), statistics.median(v)) for k, v in times.items()}


def mask_figures(repeats: int, alternatives: bool) -> None:
  """Print the CPU s of the masks of one [4096, 2048] array and of one base step's shapes."""
  key = jax.random.key(0)
  for label, shapes in (("[4096, 2048]", [(4096, 2048)]), ("base step", step_mask_shapes("base"))):
    n = sum(math.prod(s) for s in shapes)
    fns = {"jax": (_draws(jax.random.bernoulli, shapes), (key,)),
           "txf": (_draws(dropout_ops.bernoulli, shapes), (key,))}
    if alternatives:
      for impl in ("rbg", "unsafe_rbg"):
        fns[impl] = (_draws(jax.random.bernoulli, shapes), (jax.random.key(0, impl=impl),))
    got = compare(fns, repeats)
    if alternatives:  # the non-partitionable threefry layout traces differently: its own jit
      with jax.threefry_partitionable(False):
        got.update(compare({"threefry, partitionable off": (_draws(jax.random.bernoulli, shapes),
                                                            (key,))}, repeats))
    for k, (best, med) in got.items():
      print(f"masks {label} ({n / 1e6:.1f} M): {k}: best {best:.3f} CPU-s, median {med:.3f} "
            f"(load {os.getloadavg()[0]:.1f})")


@contextlib.contextmanager
def _flax_dropout():
  """Trace the model with flax's nn.Dropout in the layers (the path before txf's Dropout)."""
  with mock.patch.object(layers, "Dropout", nn.Dropout), \
       mock.patch.object(attention, "Dropout", nn.Dropout):
    yield


def step_figures(name: str, steps: int) -> None:
  """Print CPU s per train step of a bench config with flax's and with txf's dropout."""
  bc = train_bench.BENCH_CONFIGS[name]
  cfg = train_bench.config_for(name)
  batch = train_bench.random_batch(cfg, bc["batch"], bc["source_len"], bc["target_len"])
  key = jax.random.key(0)
  runs = {}
  for label, ctx in (("jax", _flax_dropout), ("txf", contextlib.nullcontext)):
    with ctx():
      runner, state = train_bench.build_step(cfg, batch)
      t = time.process_time()
      state, metrics = runner.train_step(state, batch, key)  # traces and compiles under ctx
      jax.block_until_ready(metrics)
      print(f"step {name}: {label}: first step (trace + compile + step) {time.process_time() - t:.1f} CPU-s")
    runs[label] = [runner, state, []]
  for _ in range(steps):
    for label, run in runs.items():
      runner, state, times = run
      t = time.process_time()
      state, metrics = runner.train_step(state, batch, key)
      jax.block_until_ready(metrics)
      times.append(time.process_time() - t)
      run[1] = state
  for label, (_, _, times) in runs.items():
    print(f"step {name}: {label}: best {min(times):.2f} CPU-s, median {statistics.median(times):.2f} "
          f"over {steps} (load {os.getloadavg()[0]:.1f})")
  a, b = (jax.tree.leaves(jax.device_get(run[1])) for run in runs.values())
  same = all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))
  print(f"step {name}: train states after {steps + 1} steps bit-identical: {'yes' if same else 'NO'}")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--masks", action="store_true", help="time the masks alone")
  p.add_argument("--alternatives", action="store_true", help="with --masks: rbg, unsafe_rbg, ...")
  p.add_argument("--step", choices=sorted(train_bench.BENCH_CONFIGS), help="time a train step")
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args(argv)
  if args.masks:
    mask_figures(args.repeats, args.alternatives)
  if args.step:
    step_figures(args.step, args.steps)


if __name__ == "__main__":
  main()
