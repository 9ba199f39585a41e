"""How a training run reports what it does: a ``Reporter`` handed to ``train(..., report=...)``.

The library never writes to the terminal itself. Every line ``train`` has to say (its header, one
line per logged train row, evaluation results and samples, how it ended) goes to a ``Reporter``;
the default one sends them to the ``txf.train`` logger at INFO level, which a program that set up
no logging never shows. ``txf train`` passes a reporter of its own that prints them and draws the
progress bar (txf/commands/reporting.py); a notebook may pass that one, or any object with these
methods, to see them.

With several processes, ``train`` calls the reporter of process 0 only, except ``stopped`` (every
process says why it ended) and ``signal`` (each process notes the signals it gets).
"""

import logging
from typing import Dict, Optional

from txf.train.logs import log_line

LOGGER = logging.getLogger("txf.train")


class Reporter:
  """What ``train`` tells as it runs; this default logs each line on the ``txf.train`` logger
  (INFO) and draws nothing. Subclass it (or duck-type it) to show progress elsewhere."""

  def line(self, text: str) -> None:
    """One line of the run's account (the header, an evaluation, samples, how it ended)."""
    LOGGER.info(text)

  def start(self, total: int, done: int) -> None:
    """Training of ``total`` steps starts (or resumes) with ``done`` steps already done."""

  def step(self, done: int) -> None:
    """One optimizer step is done; ``done`` steps in all."""

  def train_row(self, step: int, total: int, metrics: Dict[str, float],
                eta_seconds: Optional[float]) -> None:
    """A train row was logged (metrics.jsonl) at ``step`` of ``total``; ``eta_seconds``: the time
    left, None when unknown. The default gives its one-line summary (``logs.log_line``) to
    ``line``."""
    self.line(log_line(step, total, metrics, eta_seconds))

  def evaluating(self) -> None:
    """An evaluation starts (its lines follow)."""

  def stopped(self, text: str) -> None:
    """The run was stopped by a signal before its end (said by every process)."""
    self.line(text)

  def signal(self, text: str) -> None:
    """A signal arrived (called from the signal handler: do nothing that may block)."""

  def close(self) -> None:
    """Training is over (also after an error)."""


class Silent(Reporter):
  """A reporter that says nothing at all (not even to logging): for processes other than 0."""

  def line(self, text: str) -> None:
    """Drops the line."""

  def train_row(self, step, total, metrics, eta_seconds) -> None:
    """Drops the row."""
