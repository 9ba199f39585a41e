"""Runs ``txf sweep``; its usage text and flags are declared in txf.commands.declared.sweep
(``txf sweep --help``), which txf/cli.py parses before importing this module."""

import sys

from absl import flags

from txf.core.errors import TxfError
from txf.sweep import (emit_commands, emit_slurm, load_sweep, read_sweep, run_local, write_report,
                       write_sweep)
from txf.sweep.grid import parse_sets


def main(argv):
  args = argv[1:]
  if args[:1] == ["report"]:
    if len(args) != 2:
      raise TxfError("usage: txf sweep report ROOT (the folder of a sweep)")
    text, paths = write_report(read_sweep(args[1]))
    print(text + f"\nwritten: {', '.join(paths.values())}")
    return
  if len(args) != 1:
    raise TxfError(f"give one sweep file (txf sweep SWEEP_FILE) or `txf sweep report ROOT`, not "
                   f"{' '.join(args) or 'nothing'}")
  fl = flags.FLAGS
  if fl.parallel < 1:
    raise TxfError(f"--parallel={fl.parallel} must be at least 1")
  sweep = load_sweep(args[0], fl.root, parse_sets(fl["set"].value))
  write_sweep(sweep)
  if fl.emit == "commands":
    sys.stdout.write(emit_commands(sweep))
    return
  if fl.emit == "slurm":
    sys.stdout.write(emit_slurm(sweep, fl.sbatch))
    return
  print(f"txf sweep {sweep.name}: {len(sweep.arms)} arm(s) x {len(sweep.seeds)} seed(s) = "
        f"{len(sweep.runs)} runs under {sweep.root}, {fl.parallel} at a time", flush=True)
  try:
    outcomes = run_local(sweep.runs, fl.parallel, say=lambda line: print(line, flush=True))
  except KeyboardInterrupt:
    print(f"txf: sweep interrupted: run the same command to resume ({sweep.root})", flush=True)
    sys.exit(130)
  bad = [o for o in outcomes if o.status in ("failed", "incomplete")]
  if fl.report:
    text, paths = write_report(sweep)
    print("\n" + text + f"\nwritten: {', '.join(paths.values())}", flush=True)
  if bad:
    print(f"txf: {len(bad)} of {len(outcomes)} runs did not finish: "
          f"{', '.join(o.run.label for o in bad)} (their logs: root/<arm>/seed-<k>.log); run the "
          f"same command to retry them", file=sys.stderr, flush=True)
    sys.exit(1)
