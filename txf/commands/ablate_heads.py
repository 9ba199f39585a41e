"""Runs ``txf ablate-heads``; its usage text and flags are declared in
txf.commands.declared.ablate_heads (``txf ablate-heads --help``), which txf/cli.py parses before
importing this module."""

import csv
import json
import os
import sys

import numpy as np
from absl import flags

from txf.commands import terminal
from txf.core.errors import TxfError
from txf.inspect import heads as heads_lib
from txf.train import viz


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}")
  f = flags.FLAGS
  if f.max_examples < 1 or f.batch_size < 1:
    raise TxfError(f"--max_examples={f.max_examples} and --batch_size={f.batch_size} must be >= 1")
  run = terminal.load_run(f.workdir, f.params)
  try:
    batches = list(run.task.eval_batches(f.split, f.batch_size, f.max_examples))
  except KeyError:
    d = run.config.data
    raise TxfError(f"split {f.split!r} is not in this run's data: use one of {d.train_split!r}, "
                   f"{d.eval_split!r}, {d.test_split!r}") from None
  if not batches:
    raise TxfError(f"split {f.split!r} has no examples")
  progress = lambda done, total: print(f"txf ablate-heads: {done}/{total} heads", file=sys.stderr,
                                       flush=True) if done % 4 == 0 or done == total else None
  table = heads_lib.head_ablation(run, batches, mode=f.mode, decode=f.decode, progress=progress)
  out = f.output or os.path.join(f.workdir, f"ablate_heads_{f.split}")
  os.makedirs(out, exist_ok=True)
  metrics = list(table["baseline"])
  fields = ["module", "head"] + metrics + [f"{m}_change" for m in metrics]
  csv_path = os.path.join(out, "heads.csv")
  with open(csv_path, "w", newline="") as fh:
    writer = csv.DictWriter(fh, fieldnames=fields)
    writer.writeheader()
    writer.writerow({"module": "baseline", "head": "", **table["baseline"],
                     **{f"{m}_change": 0.0 for m in metrics}})
    for row in table["rows"]:
      writer.writerow(row)
  modules = list(dict.fromkeys(r["module"] for r in table["rows"]))
  written = [csv_path]
  for metric in metrics:
    grid = np.array([[r[f"{metric}_change"] for r in table["rows"] if r["module"] == m]
                     for m in modules])
    written.append(viz.plot_head_table(
        grid, modules, f"{metric} change when one head is removed ({f.mode}; baseline "
        f"{table['baseline'][metric]:.4g}, {f.split})",
        os.path.join(out, f"heads_{metric}.png"), label=f"{metric} change"))
  with open(os.path.join(out, "baseline.json"), "w") as fh:
    json.dump({"split": f.split, "mode": f.mode, "examples": f.max_examples, **table["baseline"]},
              fh, indent=1)
  print("\n".join(written))
  worst = max(table["rows"], key=lambda r: r["loss_change"])
  print(f"txf ablate-heads: baseline {json.dumps(table['baseline'])}; the costliest head is "
        f"{worst['module']} head {worst['head']} (loss +{worst['loss_change']:.4g})", file=sys.stderr)
