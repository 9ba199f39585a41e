"""Runs ``txf train``; its usage text and flags are declared in txf.commands.declared.train
(``txf train --help``), which txf/cli.py parses before importing this module."""

import os
import sys

from absl import flags

from txf.commands.reporting import (TerminalReporter, drop_closed_loop_noise,
                                    drop_output_on_broken_pipe, one_line_warnings,
                                    quiet_full_disk_in_threads)
from txf.core.config import complete
from txf.core.errors import EXIT_RESUMABLE, TxfError, requeued
from txf.parallel import distributed
from txf.runtime import machine
from txf.train import train
from txf.train.checkpoint import CheckpointFallbackWarning
from txf.train.stopping import Preemption

# txf.core.errors.REQUEUE_ENV, set to 1 by a launcher that requeues (launch/slurm.sbatch): a run
# stopped by a signal before its end (checkpoint written) exits with EXIT_RESUMABLE (75) instead of
# 0, so the script requeues it.


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}: flags look like --config.model.num_heads=2")
  distributed.maybe_initialize()
  machine.pin_from_environment()  # TXF_CPUS: a sweep's run keeps to its share of the cores
  config = complete(flags.FLAGS.config)  # an experiment file may leave fields at their defaults
  workdir = flags.FLAGS.workdir or os.path.join("runs", config.name)
  distributed.note_workdir(workdir)
  progress = flags.FLAGS.progress
  if progress is None:
    progress = sys.stdout.isatty()
  drop_output_on_broken_pipe()  # a `txf train | tee log` whose reader died does not fail the run
  drop_closed_loop_noise()      # a failed background checkpoint write is one line, not hundreds
  one_line_warnings((CheckpointFallbackWarning,))  # an unreadable checkpoint moved aside: one line
  quiet_full_disk_in_threads()  # TensorBoard's writer meeting a full disk: the run's own line says it
  train(config, workdir, fresh=flags.FLAGS.fresh, report=TerminalReporter(progress))
  if Preemption.stopped_a_run and requeued():
    sys.exit(EXIT_RESUMABLE)
