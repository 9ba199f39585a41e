"""Runs ``txf bench``; its usage text and flags are declared in txf.commands.declared.bench
(``txf bench --help``), which txf/cli.py parses before importing this module."""

import importlib
import os
import sys

from absl import flags

from txf.core.errors import TxfError


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
