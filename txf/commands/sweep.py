"""Runs ``txf sweep``; its usage text and flags are declared in txf.commands.declared.sweep
(``txf sweep --help``), which txf/cli.py parses before importing this module."""

import os
import sys

from absl import flags

from txf.core.errors import TxfError
from txf.sweep import (emit_commands, emit_slurm, load_sweep, read_sweep, run_local, write_report,
                       write_sweep)
from txf.sweep import ledger as ledger_lib
from txf.sweep.grid import parse_sets
from txf.sweep.runner import cpu_shares
from txf.sweep.scaling import check_holdout, parse_predict, write_fit_report


def _fit(sweep) -> None:
  """--fit: the scaling-law fits of the sweep's runs, printed and written under its root."""
  fl = flags.FLAGS
  if not fl.fit:
    for name in ("predict", "holdout"):
      if fl[name].value:
        raise TxfError(f"--{name} needs --fit (it is about the fitted laws)")
    return
  if fl.bootstrap < 20:
    raise TxfError(f"--bootstrap={fl.bootstrap}: the 90% intervals need at least 20 draws (1000 "
                   f"by default)")
  text, paths = write_fit_report(sweep, parse_predict(fl.predict), fl.bootstrap, fl.holdout)
  print("\n" + text + f"\nwritten: {', '.join(paths.values())}", flush=True)


def main(argv):
  args = argv[1:]
  parse_predict(flags.FLAGS.predict)  # a malformed --predict is refused before anything runs
  fl = flags.FLAGS
  if args[:1] == ["report"]:
    if len(args) != 2:
      raise TxfError("usage: txf sweep report ROOT (the folder of a sweep) or txf sweep report "
                     "SWEEP_FILE")
    if os.path.isfile(args[1]):  # a sweep file: its root (default or --root), nothing trained
      sweep = load_sweep(args[1], fl.root, parse_sets(fl["set"].value))
    else:
      sweep = read_sweep(args[1])
    if fl.ledger is not None:
      sweep.ledger = fl.ledger
    if sweep.ledger and not os.path.isfile(sweep.ledger):
      raise TxfError(f"--ledger {sweep.ledger}: no such file (the runs a ledger records are written "
                     f"there by `txf sweep SWEEP_FILE --ledger FILE`)")
    ledger_lib.of(sweep)  # a malformed ledger is refused before anything is written
    write_sweep(sweep)
    check_holdout(sweep, flags.FLAGS.holdout)  # refused before anything runs
    text, paths = write_report(sweep)
    print(text + f"\nwritten: {', '.join(paths.values())}")
    _fit(sweep)
    return
  if len(args) != 1:
    raise TxfError(f"give one sweep file (txf sweep SWEEP_FILE) or `txf sweep report ROOT`, not "
                   f"{' '.join(args) or 'nothing'}")
  if fl.parallel < 1:
    raise TxfError(f"--parallel={fl.parallel} must be at least 1")
  sweep = load_sweep(args[0], fl.root, parse_sets(fl["set"].value))
  sweep.ledger = fl.ledger or ""
  check_holdout(sweep, flags.FLAGS.holdout)  # refused before anything runs
  ledger = ledger_lib.of(sweep)  # a malformed ledger is refused before anything runs
  write_sweep(sweep)
  if fl.emit == "commands":
    sys.stdout.write(emit_commands(sweep))
    return
  if fl.emit == "slurm":
    sys.stdout.write(emit_slurm(sweep, fl.sbatch))
    return
  cpus = cpu_shares(fl.parallel, os.sched_getaffinity(0)) if fl.pin_cpus else None
  print(f"txf sweep {sweep.name}: {len(sweep.arms)} arm(s) x {len(sweep.seeds)} seed(s) = "
        f"{len(sweep.runs)} runs under {sweep.root}, {fl.parallel} at a time"
        + (f", on CPUs {' | '.join(cpus)}" if cpus else ""), flush=True)
  try:
    outcomes = run_local(sweep.runs, fl.parallel, say=lambda line: print(line, flush=True),
                         ledger=ledger, cpus=cpus)
  except KeyboardInterrupt:
    print(f"txf: sweep interrupted: run the same command to resume ({sweep.root})", flush=True)
    sys.exit(130)
  bad = [o for o in outcomes if o.status in ("failed", "incomplete")]
  if fl.report:
    text, paths = write_report(sweep)
    print("\n" + text + f"\nwritten: {', '.join(paths.values())}", flush=True)
    _fit(sweep)
  if bad:
    print(f"txf: {len(bad)} of {len(outcomes)} runs did not finish: "
          f"{', '.join(o.run.label for o in bad)} (their logs: root/<arm>/seed-<k>.log); run the "
          f"same command to retry them", file=sys.stderr, flush=True)
    sys.exit(1)
