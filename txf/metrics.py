"""Metrics to metrics.jsonl (one JSON object per logged point) and TensorBoard event files.

TensorBoard files are written with tensorboardX (no TensorFlow): scalars per split, the run's
config (text and hparams) and eval samples (text). Only process 0 writes.
"""

import json
import os
from typing import Dict

import numpy as np

from txf.workdir import METRICS_FILE, TENSORBOARD_DIR, disk_errors


class MetricWriter:
  """``write(step, split, metrics)`` appends {"step", "split", **metrics} to metrics.jsonl and logs scalars."""

  def __init__(self, workdir: str, enabled: bool = True, tensorboard: bool = True):
    self.enabled = enabled
    self.path = os.path.join(workdir, METRICS_FILE)
    self._tb = None
    if enabled and tensorboard:
      try:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(os.path.join(workdir, TENSORBOARD_DIR))
      except ImportError:  # pragma: no cover - tensorboardX is a dependency
        self._tb = None

  def write(self, step: int, split: str, metrics: Dict[str, float]) -> Dict:
    row = {"step": int(step), "split": split}
    row.update({k: (float(v) if isinstance(v, (np.floating, np.integer, float, int)) or np.ndim(v) == 0 else v)
                for k, v in metrics.items()})
    if not self.enabled:
      return row
    with disk_errors(self.path):
      with open(self.path, "a") as f:
        f.write(json.dumps(row) + "\n")
    if self._tb is not None:
      for k, v in row.items():
        if k not in ("step", "split") and isinstance(v, float):
          self._tb.add_scalar(f"{split}/{k}", v, step)
    return row

  def write_text(self, tag: str, text: str, step: int) -> None:
    """Log ``text`` to TensorBoard's Text tab under ``tag`` (shown as preformatted lines)."""
    if self.enabled and self._tb is not None:
      self._tb.add_text(tag, "\n".join("    " + line for line in text.splitlines()), step)

  def write_config(self, config: Dict, step: int = 0) -> None:
    """Log a run's config to TensorBoard: the whole JSON as text (tag ``config``) and its flat
    scalar fields as hparams (the HParams tab)."""
    if not (self.enabled and self._tb is not None):
      return
    from tensorboardX.summary import hparams  # beside SummaryWriter: imported only when writing
    self.write_text("config", json.dumps(config, indent=2, sort_keys=True), step)
    flat = {}

    def walk(prefix, node):
      for k, v in node.items():
        if isinstance(v, dict):
          walk(f"{prefix}{k}.", v)
        elif isinstance(v, (bool, int, float, str)):
          flat[prefix + k] = v
    walk("", config)
    for summary in hparams(flat, {}):  # experiment, session start, session end
      self._tb.file_writer.add_summary(summary, step)

  def truncate_after(self, step: int) -> None:
    """Drop rows logged after ``step`` (a resumed run re-logs them exactly)."""
    if not (self.enabled and os.path.exists(self.path)):
      return
    def keep(line: str) -> bool:
      try:
        return json.loads(line)["step"] <= step
      except ValueError:  # a line cut short by a killed process
        return False

    with open(self.path) as f:
      rows = [line.rstrip("\n") + "\n" for line in f if line.strip() and keep(line)]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(rows)
    os.replace(tmp, self.path)

  def flush(self):
    if self._tb is not None:
      self._tb.flush()

  def close(self):
    if self._tb is not None:
      self._tb.close()

