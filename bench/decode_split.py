"""Decode speed on real data: a trained run's split, decoded as ``txf eval`` decodes it, with
different length buckets (``decode_length_bucket``; 0 = one fixed shape in the data's order).

  python -m bench.decode_split --workdir runs/multi30k_en_de_tiny --data_path ../shared/data \
    --split val --beam 5 --alpha 1.0 --batch_size 32 --buckets 0 8 16 --rounds 3

Each arm first decodes the split once from a cold start (the compiled decoders and JAX's caches
cleared: "first pass", compiles included), then ``--rounds`` more times, the arms alternating
round by round (the median of those is "warm"). Prints per arm the seconds, sentences and output
tokens per second, the speed-up over the first arm, and how many outputs differ from the first
arm's (ids, row by row).
"""

import argparse
import os
import statistics
import time
from typing import Dict, List, Sequence

import jax
import numpy as np

from txf.data.base import truncate_keep_eos
from txf.decode import DecodingSpec
from txf.decode import decoders
from txf.inference.run import load_run
from txf.runtime.process import quiet_script_logging


def decode_split(run, sources: Sequence[np.ndarray], spec: DecodingSpec, batch_size: int
                 ) -> List[np.ndarray]:
  """The split's output ids as ``txf eval`` makes them (translate_ids, each row cut)."""
  buffer = decoders.decode_buffer_len(run.model_cfg, run.task, spec.max_extra)
  return decoders.translate_ids(run.model_cfg, run.params, sources, run.task.max_input_len, buffer,
                                spec, batch_size)


def split_benchmark(run, sources: Sequence[np.ndarray], spec: DecodingSpec, batch_size: int,
                    buckets: Sequence[int], rounds: int) -> List[Dict]:
  """One row per bucket: first-pass and warm seconds, output tokens, rows differing from the first
  bucket's outputs."""
  rows, outputs = [], {}
  for bucket in buckets:
    decoders._compiled_search.cache_clear()
    jax.clear_caches()
    arm = spec.replace(length_bucket=bucket)
    start = time.perf_counter()
    outputs[bucket] = decode_split(run, sources, arm, batch_size)
    rows.append({"bucket": bucket, "first_s": time.perf_counter() - start, "warm": [],
                 "tokens": int(sum(len(r) for r in outputs[bucket]))})
  for _ in range(rounds):
    for row in rows:
      start = time.perf_counter()
      decode_split(run, sources, spec.replace(length_bucket=row["bucket"]), batch_size)
      row["warm"].append(time.perf_counter() - start)
  first = outputs[buckets[0]]
  for row in rows:
    row["warm_s"] = statistics.median(row["warm"]) if row["warm"] else float("nan")
    row["differ"] = sum(not np.array_equal(a, b) for a, b in zip(first, outputs[row["bucket"]]))
  return rows


def format_table(rows: List[Dict], sentences: int) -> str:
  """The table: bucket, first pass s, warm s (median), sentences/s and tokens/s warm, speed-ups."""
  base = rows[0]
  lines = ["bucket  first pass s  warm s  sent/s  out tok/s  first-pass x  warm x  outputs differing",
           "------  ------------  ------  ------  ---------  ------------  ------  -----------------"]
  for r in rows:
    lines.append(f"{r['bucket']:>6}  {r['first_s']:>12.2f}  {r['warm_s']:>6.2f}  "
                 f"{sentences / r['warm_s']:>6.1f}  {r['tokens'] / r['warm_s']:>9.0f}  "
                 f"{base['first_s'] / r['first_s']:>11.2f}x  {base['warm_s'] / r['warm_s']:>5.2f}x  "
                 f"{r['differ']:>6} of {sentences}")
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True, help="a trained translation run")
  p.add_argument("--data_path", default=None, help="where the run's data is now (if it moved)")
  p.add_argument("--params", default=None, help="parameter file in the workdir (default: the final)")
  p.add_argument("--split", default="val")
  p.add_argument("--beam", type=int, default=5)
  p.add_argument("--alpha", type=float, default=None, help="default: the run's config.alpha")
  p.add_argument("--batch_size", type=int, default=32, help="as txf eval's --batch_size")
  p.add_argument("--buckets", type=int, nargs="+", default=[0, 8])
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--max_examples", type=int, default=0, help="0 = the whole split")
  a = p.parse_args(argv)
  quiet_script_logging()
  run = load_run(a.workdir, a.params, data_path=a.data_path)
  examples = run.task.examples(a.split, a.max_examples or 10 ** 9)
  sources = [truncate_keep_eos(e.source_ids, run.task.max_input_len) for e in examples]
  spec = DecodingSpec.from_config(run.config, beam_size=a.beam, alpha=a.alpha).check()
  lengths = [len(s) for s in sources]
  print(f"decode split: {a.workdir} {a.split}, {len(sources)} sentences (source tokens mean "
        f"{np.mean(lengths):.1f}, max {max(lengths)}; data.max_input_len {run.task.max_input_len}), "
        f"{spec.describe()}, batch {a.batch_size}, {os.cpu_count()} cpus, load average "
        f"{os.getloadavg()[0]:.1f} at start")
  rows = split_benchmark(run, sources, spec, a.batch_size, a.buckets, a.rounds)
  print(format_table(rows, len(sources)))
  print(f"load average {os.getloadavg()[0]:.1f} at the end; warm = median of {a.rounds} "
        f"alternating rounds; first pass = from cold caches, compiles included")


if __name__ == "__main__":
  main()
