"""A sweep's report: each run's value of the metric, the per-arm statistics and the tests against
the baseline (txf.sweep.stats), as a Markdown table (printed and written to report.md), a CSV
(report.csv), each arm's curves averaged over its seeds with their intervals (report_curves.csv)
and a figure (report.png: per-arm values with their intervals, every run's curves and each arm's
mean curve with its band, coloured by arm). A run that is not complete, or that never logged the metric, is counted as
missing and named under the table.
"""

import csv
import dataclasses
import io
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from txf.runtime import machine
from txf.train import viz
from txf.sweep import ledger as ledger_lib, reference
from txf.sweep.grid import Run, Sweep
from txf.sweep.ledger import read_rows
from txf.sweep.runner import is_complete
from txf.sweep.stats import CONFIDENCE, Summary, Welch, summarize, welch

REPORT_MD, REPORT_CSV, REPORT_PNG = "report.md", "report.csv", "report.png"
REPORT_METRICS_CSV = "report_metrics.csv"   # a sweep of several metrics: all of them, one CSV
REPORT_CURVES_CSV = "report_curves.csv"     # each arm's mean curve with its interval, per step
CSV_COLUMNS = ("arm", "n", "mean", "std", "ci_low", "ci_high", "diff", "diff_ci_low", "diff_ci_high",
               "t", "dof", "p", "missing", "values")


def series(rows: Sequence[Dict], metric: str) -> Tuple[np.ndarray, np.ndarray]:
  """(steps, values) of ``metric`` = SPLIT/KEY over ``rows``, sorted by step; a step logged twice
  (a resumed run re-logs the steps after its checkpoint) keeps its last value."""
  split, _, key = metric.partition("/")
  points = {}
  for r in rows:
    value = r.get(key)
    if r.get("split") == split and isinstance(value, (int, float)) and not isinstance(value, bool):
      points[int(r["step"])] = float(value)
  steps = np.array(sorted(points), dtype=np.int64)
  return steps, np.array([points[s] for s in steps], dtype=np.float64)


def run_rows(sweep: Sweep, run: Run) -> List[Dict]:
  """The metric rows of ``run``: its workdir's when it is complete there or has no ledger record,
  else its record's (txf.sweep.ledger)."""
  record = ledger_lib.record_of(sweep, run)
  if record is None or is_complete(run.workdir, run.steps):
    return read_rows(run.workdir)
  return list(record["rows"])


def run_value(run: Run, metric: str, mode: str,
              record: Optional[Dict] = None) -> Tuple[Optional[float], str]:
  """(value, '') of a complete run: the metric at its last step (mode final) or its min / max over
  the run; (None, why) for a run that is not complete or never logged the metric at its end. A run
  that is not complete on disk but has a ledger ``record`` (txf.sweep.ledger) is read from it."""
  complete = is_complete(run.workdir, run.steps)
  if not complete and record is None:
    if run.log and os.path.isfile(run.log):  # it was started: failed, or stopped before its end
      return None, f"not complete (log: {run.log})"
    return None, "not complete" if os.path.isdir(run.workdir) else "not run"
  steps, values = series(read_rows(run.workdir) if complete else record["rows"], metric)
  keep = steps <= run.steps
  steps, values = steps[keep], values[keep]
  if mode == "final":
    if not steps.size or steps[-1] != run.steps:
      return None, f"no {metric} at step {run.steps}"
    return float(values[-1]), ""
  if not steps.size:
    return None, f"no {metric} logged"
  return float(values.min() if mode == "min" else values.max()), ""


@dataclasses.dataclass
class ArmReport:
  """One arm: its runs' values (by seed), the missing runs (seed -> why), its summary and its test
  against the baseline (None for the baseline itself)."""
  arm: str
  values: Dict[int, float]
  missing: Dict[int, str]
  summary: Summary
  test: Optional[Welch]


def build(sweep: Sweep, metric: Optional[str] = None) -> List[ArmReport]:
  """Each arm's values of ``metric`` (default: the sweep's metric), summary and Welch test against
  ``sweep.baseline``, in the sweep's order."""
  metric = metric or sweep.metric
  values: Dict[str, Dict[int, float]] = {arm: {} for arm in sweep.arms}
  missing: Dict[str, Dict[int, str]] = {arm: {} for arm in sweep.arms}
  for run in sweep.runs:
    value, why = run_value(run, metric, sweep.mode, ledger_lib.record_of(sweep, run))
    if value is None or not math.isfinite(value):
      missing[run.arm][run.seed] = why or f"{metric} is {value}"
    else:
      values[run.arm][run.seed] = value
  base = list(values[sweep.baseline].values())
  return [ArmReport(arm, values[arm], missing[arm], summarize(list(values[arm].values())),
                    None if arm == sweep.baseline else welch(list(values[arm].values()), base))
          for arm in sweep.arms]


def _num(x: float, digits: int = 4) -> str:
  return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def _interval(lo: float, hi: float) -> str:
  return "n/a" if math.isnan(lo) else f"[{_num(lo)}, {_num(hi)}]"


WHAT = {"final": "at the last step", "min": "minimum over the run", "max": "maximum over the run"}


def markdown(sweep: Sweep, arms: Sequence[ArmReport]) -> str:
  """The report as Markdown: a heading, the table (one row per arm) and the missing runs."""
  pct = f"{CONFIDENCE:.0%}"
  lines = [f"# Sweep {sweep.name}: {sweep.metric} ({WHAT[sweep.mode]})", "",
           f"{len(sweep.arms)} arm(s) x {len(sweep.seeds)} seed(s) ({', '.join(map(str, sweep.seeds))}); "
           f"baseline `{sweep.baseline}`. std: sample (ddof=1); {pct} CI: Student t, n-1 dof; "
           f"diff and p: Welch's t-test against the baseline (two-sided).", ""]
  lines += table_lines(arms)
  gaps = [f"- {a.arm}/seed-{seed}: {why}" for a in arms for seed, why in sorted(a.missing.items())]
  if gaps:
    lines += ["", f"Missing ({len(gaps)} of {len(sweep.runs)} runs, left out of the statistics):"] + gaps
  return "\n".join(lines + against_ledger(sweep)) + "\n"


def against_ledger(sweep: Sweep) -> List[str]:
  """Lines on the runs both on disk and in the sweep's ledger: how many end with the final
  parameters their records name, and which do not (with the CPU of each); [] if there are none."""
  pairs = ledger_lib.compared(sweep)
  if not pairs:
    return []
  same = sum(equal for _, _, equal in pairs)
  here = machine.usable_cores()
  lines = ["", f"Against the ledger ({sweep.ledger}): {same} of {len(pairs)} runs both on disk and "
               f"recorded end with the final parameters their records name (sha256), bit for bit."]
  lines += [f"- {run.label}: its final parameters differ from those recorded on {record.get('cpu')}"
            f"{_cores(record)} at {record.get('commit')}" for run, record, equal in pairs if not equal]
  if any(record.get("cores") not in (None, here) for _, record, equal in pairs if not equal):
    lines.append(f"  (this machine's processes see {here} cores: XLA:CPU sums in another order on "
                 f"another number of cores)")
  return lines


def _cores(record: Dict) -> str:
  return f" with {record['cores']} cores" if record.get("cores") else ""


def table_lines(arms: Sequence[ArmReport]) -> List[str]:
  """The Markdown table of one metric: one row per arm (n, mean, std, CI, Welch diff, its CI, p)."""
  pct = f"{CONFIDENCE:.0%}"
  lines = [f"| arm | n | mean | std | {pct} CI | diff vs baseline | {pct} CI of diff | p |",
           "|---|---|---|---|---|---|---|---|"]
  for a in arms:
    s = a.summary
    if a.test is None:
      diff, diff_ci, p = "(baseline)", "", ""
    else:
      diff, diff_ci, p = (_num(a.test.diff), _interval(a.test.ci_low, a.test.ci_high),
                          _num(a.test.p, 3))
    lines.append(f"| {a.arm} | {s.n} | {_num(s.mean)} | {_num(s.std)} | "
                 f"{_interval(s.ci_low, s.ci_high)} | {diff} | {diff_ci} | {p} |")
  return lines


def more_metrics(sweep: Sweep, by_metric: Dict[str, Sequence[ArmReport]]) -> str:
  """The tables of the sweep's other compared metrics (``metrics`` after the first), one section
  each; '' for a sweep of one metric."""
  out = []
  for metric in sweep.compared[1:]:
    out += ["", f"## {metric} ({WHAT[sweep.mode]})", ""] + table_lines(by_metric[metric])
  return "\n".join(out) + "\n" if out else ""


def metrics_csv_text(by_metric: Dict[str, Sequence[ArmReport]]) -> str:
  """Every compared metric's report as one CSV: a ``metric`` column, then CSV_COLUMNS."""
  out = io.StringIO()
  for i, (metric, arms) in enumerate(by_metric.items()):
    rows = list(csv.reader(io.StringIO(csv_text(arms))))
    writer = csv.writer(out, lineterminator="\n")
    for j, row in enumerate(rows):
      if j or not i:
        writer.writerow(["metric" if not j else metric, *row])
  return out.getvalue()


def csv_text(arms: Sequence[ArmReport]) -> str:
  """The report as CSV (CSV_COLUMNS), one row per arm; values as 'seed:value' joined by ';'."""
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(CSV_COLUMNS)
  for a in arms:
    s, t = a.summary, a.test
    test = ([t.diff, t.ci_low, t.ci_high, t.t, t.dof, t.p] if t is not None else [""] * 6)
    writer.writerow([a.arm, s.n, s.mean, s.std, s.ci_low, s.ci_high, *test,
                     ";".join(f"{seed}:{why}" for seed, why in sorted(a.missing.items())),
                     ";".join(f"{seed}:{v!r}" for seed, v in sorted(a.values.items()))])
  return out.getvalue()


@dataclasses.dataclass
class Band:
  """An arm's curve of one metric over its seeds: at each step the seeds that logged it reach, their
  ``Summary`` (n, mean, std and the 95% Student-t interval of the mean)."""
  arm: str
  steps: np.ndarray
  summaries: List[Summary]

  def column(self, name: str) -> np.ndarray:
    return np.array([getattr(s, name) for s in self.summaries], np.float64)


def curve_bands(sweep: Sweep, metric: str) -> List[Band]:
  """Each arm's ``metric`` curve [steps] averaged over its runs, step by step, with its interval
  (``summarize``: m -/+ t_{0.975, n-1} s / sqrt(n) over the n runs that logged that step)."""
  out = []
  for arm in sweep.arms:
    by_step: Dict[int, List[float]] = {}
    for run in sweep.runs:
      if run.arm == arm:
        for step, value in zip(*series(run_rows(sweep, run), metric)):
          by_step.setdefault(int(step), []).append(float(value))
    steps = np.array(sorted(by_step), np.int64)
    out.append(Band(arm, steps, [summarize(by_step[int(s)]) for s in steps]))
  return out


def curves_csv_text(sweep: Sweep, metrics: Sequence[str]) -> str:
  """report_curves.csv: metric, arm, step, n, mean, ci_low, ci_high (``curve_bands``)."""
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(["metric", "arm", "step", "n", "mean", "ci_low", "ci_high"])
  for metric in metrics:
    for band in curve_bands(sweep, metric):
      for step, s in zip(band.steps, band.summaries):
        w.writerow([metric, band.arm, int(step), s.n, repr(s.mean), repr(s.ci_low), repr(s.ci_high)])
  return buf.getvalue()


def plot(sweep: Sweep, arms: Sequence[ArmReport], path: str) -> str:
  """The figure: each arm's values (dots, one per seed) with its mean and 95% interval (bar), and
  the train loss against step, then the metric's curve when it is not that loss: every run thin,
  each arm's mean curve with its 95% band (``curve_bands``), one colour per arm."""
  curves = ["train/loss"] + ([sweep.metric] if sweep.metric != "train/loss" else [])
  fig = viz.new_figure(5 + 5 * len(curves), 4.2)
  axes = fig.subplots(1, 1 + len(curves))
  colours = {a.arm: f"C{i % 10}" for i, a in enumerate(arms)}
  ax = axes[0]
  for i, a in enumerate(arms):
    xs = i - 0.1 + np.linspace(-0.1, 0.1, max(len(a.values), 1))[:len(a.values)]
    ax.scatter(xs, list(a.values.values()), color=colours[a.arm], s=18, alpha=0.7)
    s = a.summary
    if s.n:
      err = None if math.isnan(s.ci_low) else [[s.mean - s.ci_low], [s.ci_high - s.mean]]
      ax.errorbar([i + 0.15], [s.mean], yerr=err, fmt="o", color=colours[a.arm], capsize=4)
  ax.set_xticks(range(len(arms)))
  ax.set_xticklabels([a.arm for a in arms], rotation=20, ha="right", fontsize=8)
  ax.set_ylabel(f"{sweep.metric} ({sweep.mode})")
  ax.set_title(f"per arm: seeds and mean with {CONFIDENCE:.0%} CI", fontsize=10)
  ax.grid(alpha=0.3)
  for ax, metric in zip(axes[1:], curves):
    labelled = set()
    for run in sweep.runs:
      steps, values = series(run_rows(sweep, run), metric)
      if steps.size:
        ax.plot(steps, values, color=colours[run.arm], alpha=0.3, linewidth=0.8,
                **({"marker": "o", "markersize": 2} if metric.startswith("eval/") else {}))
    for band in curve_bands(sweep, metric):
      if band.steps.size and band.arm in colours:
        labelled.add(band.arm)
        ax.plot(band.steps, band.column("mean"), color=colours[band.arm], label=band.arm,
                **({"marker": "o", "markersize": 3} if metric.startswith("eval/") else {}))
        ax.fill_between(band.steps, band.column("ci_low"), band.column("ci_high"),
                        color=colours[band.arm], alpha=0.2, linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: every run, each arm's mean and {CONFIDENCE:.0%} CI", fontsize=10)
    ax.grid(alpha=0.3)
    if labelled:
      ax.legend(fontsize=7)
  fig.tight_layout()
  return viz.save_figure(fig, path)


def write_report(sweep: Sweep) -> Tuple[str, Dict[str, str]]:
  """Build the report of ``sweep`` and write report.md, report.csv and report.png under its root;
  returns (the Markdown, {"md" | "csv" | "png": path}). A sweep of several metrics adds a table
  per further metric to report.md and writes report_metrics.csv (every metric); a sweep with a
  ``reference`` adds the comparison with it and its figure (txf.sweep.reference)."""
  by_metric = {metric: build(sweep, metric) for metric in sweep.compared}
  arms = by_metric[sweep.metric]
  text = markdown(sweep, arms) + more_metrics(sweep, by_metric)
  paths = {kind: os.path.join(sweep.root, name)
           for kind, name in (("md", REPORT_MD), ("csv", REPORT_CSV), ("png", REPORT_PNG))}
  if len(by_metric) > 1:
    paths["metrics_csv"] = os.path.join(sweep.root, REPORT_METRICS_CSV)
    with open(paths["metrics_csv"], "w", encoding="utf-8") as f:
      f.write(metrics_csv_text(by_metric))
  if sweep.reference:
    ref_text, ref_paths = reference.write(sweep, by_metric)
    text += ref_text
    paths.update(ref_paths)
  with open(paths["md"], "w", encoding="utf-8") as f:
    f.write(text)
  with open(paths["csv"], "w", encoding="utf-8") as f:
    f.write(csv_text(arms))
  paths["curves_csv"] = os.path.join(sweep.root, REPORT_CURVES_CSV)
  with open(paths["curves_csv"], "w", encoding="utf-8") as f:
    f.write(curves_csv_text(sweep, ["train/loss"] + list(sweep.compared)))
  plot(sweep, arms, paths["png"])
  return text, paths
