"""The log window: per-step train metrics gathered between two log steps, averaged into one row of
metrics.jsonl, and saved with a checkpoint so a resumed run logs exactly what an uninterrupted one
would."""

import time
from typing import Any, Dict, List

import jax
import numpy as np


def mean_metrics(rows: List[Dict[str, np.ndarray]]) -> Dict[str, float]:
  """Means over the finite steps of a log window (all NaN if none was finite); tokens summed."""
  keys = [k for k in rows[0] if k not in ("finite", "tokens")]
  good = [r for r in rows if float(r["finite"]) != 0.0]
  out = {k: float(np.mean([r[k] for r in good])) if good else float("nan") for k in keys}
  out["tokens"] = float(np.sum([r["tokens"] for r in rows]))
  return out


def pack_rows(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Per-step metric rows -> JSON (value, dtype and shape kept, so unpacking is exact)."""
  return [{k: [np.asarray(v).tolist(), str(np.asarray(v).dtype)] for k, v in r.items()}
          for r in jax.device_get(rows)]


def unpack_rows(packed: List[Dict[str, Any]]) -> List[Dict[str, np.ndarray]]:
  return [{k: np.asarray(v, dtype) for k, (v, dtype) in r.items()} for r in packed]


class LogWindow:
  """The train metrics of the steps since the last log row (``rows``, device values)."""

  def __init__(self, rows=()):
    self.rows, self.since = list(rows), time.time()

  def add(self, metrics) -> None:
    self.rows.append(metrics)

  def close(self) -> Dict[str, float]:
    """The row to log: means over the finite steps, ``tokens_per_second`` since the last row and
    ``skipped`` (non-finite steps); starts a new window."""
    rows = jax.device_get(self.rows)
    m = mean_metrics(rows)
    now = time.time()
    m["tokens_per_second"] = m.pop("tokens") / max(now - self.since, 1e-9)
    m["skipped"] = float(sum(1.0 - r["finite"] for r in rows))
    self.rows, self.since = [], now
    return m

  def restart_clock(self) -> None:
    """Do not count the time just spent (an evaluation) in tokens_per_second."""
    self.since = time.time()

  def packed(self) -> List[Dict[str, Any]]:
    return pack_rows(self.rows)
