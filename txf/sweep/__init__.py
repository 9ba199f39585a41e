"""Sweeps: a grid of config overrides x seeds, run locally (N at a time) or written out for a
scheduler, and compared arm by arm with a noise floor (means, Student-t intervals, Welch's t-test).

``grid`` reads and expands a sweep file, ``runner`` runs or emits its runs, ``stats`` holds the
statistics, ``report`` the table, CSV and figure (a table per metric when a sweep compares
several), ``reference`` the comparison with published deltas and its forest plot; ``fit`` and
``scaling`` the scaling-law fits with bootstrap intervals (``--fit``). The command is ``txf sweep``
(docs/sweeps.md).
"""

from txf.sweep.grid import Run, Sweep, SweepError, load_sweep, read_sweep, write_sweep
from txf.sweep.report import write_report
from txf.sweep.runner import emit_commands, emit_slurm, is_complete, run_local
from txf.sweep.stats import Summary, Welch, summarize, welch
