"""``txf bench [--configs small,base] [--output runs/bench.json] [--steps 5] [--dtypes float32,bfloat16]``.

Prints the machine's fp32/bf16 matmul peaks, train-step compile seconds, tokens/s, model FLOPs
(analytic and XLA's count), MFU, memory, and cached greedy/beam decode tokens/s, and writes them
as JSON. The work is in txf/bench/run.py; figures and how to read them are in BENCHMARKS.md.
"""

from absl import flags

from txf.bench.run import run_and_report
from txf.errors import TxfError

flags.DEFINE_list("configs", ["small", "base"], "bench configs to run (txf/bench/train.py BENCH_CONFIGS)")
flags.DEFINE_string("output", "runs/bench.json", "JSON results file ('' = do not write)")
flags.DEFINE_integer("steps", 5, "timed train steps per row (after 2 warm-up steps)")
flags.DEFINE_list("dtypes", ["float32"], "model.dtype values to time: float32, bfloat16")
flags.DEFINE_list("attention_impls", ["auto"], "model.attention_impl values to time: auto, reference, fused")
flags.DEFINE_bool("decode", True, "also time cached greedy and beam decoding")
flags.DEFINE_integer("decode_batch", 8, "sources decoded at once")
flags.DEFINE_integer("decode_length", 32, "output tokens per decode")
flags.DEFINE_integer("beam", 4, "beam size of the beam-search row")


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}: see txf bench --help")
  f = flags.FLAGS
  if f.steps < 1:
    raise TxfError(f"--steps={f.steps} must be >= 1")
  run_and_report(f.configs, f.output or None, f.steps, f.dtypes, f.attention_impls, f.decode,
                 f.decode_batch, f.decode_length, f.beam)
