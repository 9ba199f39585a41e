"""Data-pipeline speed and padding on Multi30k: plain padding vs bucketing vs packing.

  python -m bench.data [--data ../shared/data/multi30k] [--batches 200] [--batch_size 128]

For each batching mode, builds the real translation task (txf.data.real: tfds array_record source,
grain pipeline, joint SentencePiece) and pulls batches as fast as it can, reporting

* examples/s: real examples delivered per second (packed rows count each segment);
* tokens/s: real (non-PAD) source + target tokens per second;
* padding share: PAD slots / all slots of ``inputs`` + ``targets`` (what the model computes on
  for nothing);
* shapes: the distinct batch shapes seen (each one is an XLA compilation of the train step).

The data path is ``--data``, else ``$TXF_DATA/multi30k``. Prepared data and the tokenizer are
cached under ``--data_dir`` (default $TXF_DATA_DIR or ~/.cache/txf/tfds), so the first run also
prepares (seconds). Timings on a shared machine depend on its load: the 1-minute load average is
printed with the figures.
"""

import argparse
import os
import time
from typing import Dict, List, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before XLA loads: no C++ INFO/WARNING lines

import numpy as np  # noqa: E402

from txf.runtime import process as runtime
from txf.core.config import base_config
from txf.data.real import make_real_task

MODES = {
    "plain": {},
    "bucketing": {"bucketing": True},
    "bucketing+tokens": {"bucketing": True, "tokens_per_batch": 4096},
    "packing": {"packing": True},
}


def _config(data: str, data_dir: str, max_len: int, **overrides):
  c = base_config()
  d = c.data
  d.source, d.format, d.data_dir = f"text:{os.path.abspath(data)}", "parallel", data_dir
  d.test_split = "test_2016_flickr"
  d.tokenizer, d.vocab_size, d.spm_model_type = "sentencepiece", 8000, "bpe"
  d.max_input_len = d.max_target_len = max_len
  for k, v in overrides.items():
    setattr(d, k, v)
  return c


def _count(batch: Dict[str, np.ndarray]) -> Dict[str, int]:
  """Real examples, real tokens and token slots of one batch."""
  if "targets_segmentation" in batch:
    examples = int(batch["targets_segmentation"].max(1).sum())
  else:
    examples = int((batch["targets"] != 0).any(1).sum())
  real = sum(int((batch[k] != 0).sum()) for k in ("inputs", "targets"))
  slots = sum(batch[k].size for k in ("inputs", "targets"))
  return {"examples": examples, "real": real, "slots": slots}


def bench_mode(task, batches: int, batch_size: int, warmup: int = 5) -> Dict[str, float]:
  """Pull ``batches`` batches (after ``warmup``) from a fresh train iterator; figures as a dict."""
  it = task.train_iterator(batch_size, seed=0)
  for _ in range(warmup):
    next(it)
  totals, shapes = {"examples": 0, "real": 0, "slots": 0}, set()
  start = time.perf_counter()
  for _ in range(batches):
    batch = next(it)
    for k, v in _count(batch).items():
      totals[k] += v
    shapes.add((batch["inputs"].shape, batch["targets"].shape))
  seconds = time.perf_counter() - start
  return {"examples_per_s": totals["examples"] / seconds, "tokens_per_s": totals["real"] / seconds,
          "padding_share": 1.0 - totals["real"] / totals["slots"],
          "examples_per_batch": totals["examples"] / batches, "shapes": len(shapes),
          "seconds": seconds}


def main(argv: Optional[Sequence[str]] = None) -> List[Dict[str, float]]:
  """Run every mode and print one line each; returns the rows."""
  runtime.quiet_script_logging()
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", default="", help="Multi30k folder (default $TXF_DATA/multi30k)")
  parser.add_argument("--data_dir", default="", help="prepared-data cache (default ~/.cache/txf/tfds)")
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--batch_size", type=int, default=128)
  parser.add_argument("--max_len", type=int, default=64)
  parser.add_argument("--modes", default=",".join(MODES))
  args = parser.parse_args(argv)
  data = args.data or os.path.join(os.environ.get("TXF_DATA", ""), "multi30k")
  if not os.path.isdir(data):
    raise SystemExit(f"no Multi30k folder at {data!r}: pass --data DIR or set TXF_DATA "
                     f"(e.g. TXF_DATA=../shared/data)")
  print(f"bench.data: {data}, {args.batches} batches of {args.batch_size} rows, max_len "
        f"{args.max_len}, load average {os.getloadavg()[0]:.1f}")
  print(f"{'mode':18s} {'examples/s':>11s} {'tokens/s':>10s} {'padding':>8s} "
        f"{'ex/batch':>9s} {'shapes':>6s}")
  rows = []
  for mode in args.modes.split(","):
    task = make_real_task(_config(data, args.data_dir, args.max_len, **MODES[mode]), "")
    row = {"mode": mode, **bench_mode(task, args.batches, args.batch_size)}
    rows.append(row)
    print(f"{mode:18s} {row['examples_per_s']:11.0f} {row['tokens_per_s']:10.0f} "
          f"{row['padding_share']:8.1%} {row['examples_per_batch']:9.1f} {row['shapes']:6d}",
          flush=True)
  print(f"load average after: {os.getloadavg()[0]:.1f}")
  return rows


if __name__ == "__main__":
  main()
