"""``txf bench [--configs small,base] [--output runs/bench.json] [--steps 5] [--dtypes float32,bfloat16]
[--bf16_dots auto,layout,xla]``.

Prints the machine's fp32/bf16 matmul peaks, train-step compile seconds, tokens/s, model FLOPs
(analytic and XLA's count), MFU, memory, and cached greedy/beam decode tokens/s, and writes them
as JSON. The benchmarks are not part of the installed package: they live in bench/ of a source
checkout, beside txf/ and BENCHMARKS.md (bench/run.py does the work; ``python -m bench`` runs the
same from the checkout's root). Figures and how to read them are in BENCHMARKS.md.
"""

import importlib
import os
import sys

from absl import flags

from txf.core.errors import TxfError

flags.DEFINE_list("configs", ["small", "base"], "bench configs to run (bench/train.py BENCH_CONFIGS)")
flags.DEFINE_string("output", "runs/bench.json", "JSON results file ('' = do not write)")
flags.DEFINE_integer("steps", 5, "timed train steps per row (after 2 warm-up steps)")
flags.DEFINE_list("dtypes", ["float32"], "model.dtype values to time: float32, bfloat16")
flags.DEFINE_list("attention_impls", ["auto"], "model.attention_impl values to time: auto, reference, fused")
flags.DEFINE_bool("decode", True, "also time cached greedy and beam decoding")
flags.DEFINE_integer("decode_batch", 8, "sources decoded at once")
flags.DEFINE_integer("decode_length", 32, "output tokens per decode")
flags.DEFINE_integer("beam", 4, "beam size of the beam-search row")
flags.DEFINE_list("bf16_dots", ["auto"], "for bfloat16 rows, the bf16 products to time: auto (txf.kernels."
                  "select's choice), layout (txf.kernels.dots), xla (XLA's own bf16 dot); one row each")


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}: see txf bench --help")
  f = flags.FLAGS
  if f.steps < 1:
    raise TxfError(f"--steps={f.steps} must be >= 1")
  load_bench_run().run_and_report(f.configs, f.output or None, f.steps, f.dtypes,
                                  f.attention_impls, f.decode, f.decode_batch, f.decode_length, f.beam,
                                  f.bf16_dots)


def checkout_root() -> str:
  """The folder that holds the txf package (a source checkout's root when txf is not installed
  from a wheel)."""
  return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_bench_run():
  """The module bench.run of the checkout txf runs from; TxfError when there is none (txf was
  installed from a wheel, which does not ship the benchmarks)."""
  root = checkout_root()
  if not os.path.isfile(os.path.join(root, "bench", "run.py")):
    raise TxfError(f"txf bench needs the benchmarks of a source checkout (bench/ beside txf/), and "
                   f"there is none in {root}: clone the txf repository and `pip install -e .` "
                   f"there, or run `python -m bench` from its root")
  if root not in sys.path:
    sys.path.insert(0, root)
  return importlib.import_module("bench.run")
