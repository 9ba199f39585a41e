"""The log window: per-step train metrics gathered between two log steps, averaged into one row of
metrics.jsonl, and saved with a checkpoint so a resumed run logs exactly what an uninterrupted one
would. ``log_line`` is the one-line summary of a row printed when there is no progress bar."""

import time
from typing import Any, Dict, List, Optional

import jax
import numpy as np


# Metrics that are the value at the window's last step, not a mean over the window.
AT_STEP = ("learning_rate",)


def mean_metrics(rows: List[Dict[str, np.ndarray]]) -> Dict[str, float]:
  """Means over the finite steps of a log window (all NaN if none was finite); tokens summed;
  the ``AT_STEP`` metrics (``learning_rate``) are the value of the window's last step."""
  keys = [k for k in rows[0] if k not in ("finite", "tokens")]
  good = [r for r in rows if float(r["finite"]) != 0.0]
  out = {k: float(np.mean([r[k] for r in good])) if good else float("nan") for k in keys}
  out.update({k: float(rows[-1][k]) for k in AT_STEP if k in rows[-1]})
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


def format_duration(seconds: float) -> str:
  """``70 -> '1m10s'``, ``3725 -> '1h02m'``, ``9 -> '9s'`` (whole seconds, rounded)."""
  s = int(round(max(seconds, 0.0)))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s // 3600}h{s % 3600 // 60:02d}m"


def log_line(step: int, total: int, m: Dict[str, float], eta_seconds: Optional[float]) -> str:
  """``step 400/1200 | loss 1.21 | nll 0.98 | acc 0.91 | lr 6.2e-3 | 2,812 tok/s | eta 1m10s``:
  a logged train row in one line (fields the row lacks are left out; no eta when unknown)."""
  parts = [f"step {step}/{total}"]
  for key, name in (("loss", "loss"), ("nll", "nll"), ("accuracy", "acc")):
    if key in m:
      parts.append(f"{name} {m[key]:.3g}" if abs(m[key]) >= 1000 else f"{name} {m[key]:.2f}")
  if "learning_rate" in m:
    parts.append(f"lr {m['learning_rate']:.1e}".replace("e-0", "e-").replace("e+0", "e+"))
  if "tokens_per_second" in m:
    parts.append(f"{m['tokens_per_second']:,.0f} tok/s")
  if m.get("skipped"):
    parts.append(f"{int(m['skipped'])} skipped")
  if eta_seconds is not None:
    parts.append(f"eta {format_duration(eta_seconds)}")
  return " | ".join(parts)


class Eta:
  """Time left: seconds per step times the steps to go. The rate is measured from the first
  logged row on (so compilation does not count), and before it from the start of this process
  (evaluations included); None before any step of this process."""

  def __init__(self, start_step: int):
    self.mark, self.first = (start_step, time.time()), None

  def __call__(self, step: int, total: int) -> Optional[float]:
    now = time.time()
    base_step, base_time = self.first if self.first and step > self.first[0] else self.mark
    if step <= base_step:
      return None
    if self.first is None:
      self.first = (step, now)
    return (now - base_time) / (step - base_step) * max(total - step, 0)
