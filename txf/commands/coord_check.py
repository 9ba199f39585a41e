"""Runs ``txf coord-check``; its usage text and flags are declared in
txf.commands.declared.coord_check (``txf coord-check --help``), which txf/cli.py parses before
importing this module."""

import os

from absl import flags

from txf.core.config import complete
from txf.core.errors import TxfError
from txf.train import coord_check
from txf.train.tables import validate


def parse_widths(text: str):
  """"64,128,256" -> [64, 128, 256]: at least two distinct positive widths."""
  try:
    widths = [int(w) for w in text.split(",") if w.strip()]
  except ValueError:
    widths = []
  if len(set(widths)) < 2 or min(widths) <= 0:
    raise TxfError(f"--widths={text!r}: give two or more positive widths, e.g. --widths 64,128,256,512")
  return widths


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}: flags look like --widths 64,128 --steps 5")
  f = flags.FLAGS
  widths = parse_widths(f.widths)
  if f.steps < 1 or f.seeds < 1 or f.learning_rate < 0:
    raise TxfError(f"--steps={f.steps} and --seeds={f.seeds} must be >= 1 and --learning_rate="
                   f"{f.learning_rate} >= 0")
  config = complete(f.config)
  heads = config.model.num_heads
  bad = [w for w in widths if w % heads]
  if bad:
    raise TxfError(f"--widths {bad} are not divisible by model.num_heads={heads}: d_k = width / "
                   f"num_heads must be an integer")
  for width in widths:
    validate(coord_check.width_config(config, width))
  check = coord_check.run(config, widths, f.steps, f.learning_rate, f.seeds)
  out = f.out or os.path.join("runs", "coord_check",
                              f"{config.name}-{config.model.parametrization}")
  paths = coord_check.write(check, out)
  print(coord_check.table(check) + f"\nwritten: {', '.join(paths.values())}", flush=True)
