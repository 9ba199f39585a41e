"""A sweep beside published numbers: a sweep file's ``reference`` gives, per arm, the published
difference to the published baseline for some of the compared metrics (and the published parameter
count); the report puts each beside the sweep's own mean difference to its baseline, its 95%
interval and Welch p, says whether the direction agrees, and counts each arm's parameters.

  reference = {"_source": "where the numbers come from",
               arm: {"row": "(A) h=1", "eval/bleu": -0.9, "eval/perplexity": 0.37, "params": 65e6}}

Direction (``verdict``), for a published delta r and the sweep's difference d with interval [lo, hi]:

  d = 0 (every seed equal): "no change here" (r != 0)
  r = 0:                 "agrees" if lo <= 0 <= hi, else "differs (published: none)"
  0 outside [lo, hi]:    "agrees" if sign(d) = sign(r), else "disagrees"
  0 inside [lo, hi]:     "same sign, within noise" | "opposite sign, within noise"

Parameters are counted without training: each arm's model is built from its config (as
``txf train`` builds it) and initialised abstractly (``jax.eval_shape``); the vocabulary is the one
a run of the arm recorded (task.json), else ``data.vocab_size`` (what ``txf plan`` assumes).
"""

import csv
import io
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from txf.core import families
from txf.models.build import count_params, init_params, model_config_for
from txf.runtime import workdir as workdir_lib
from txf.sweep.grid import Sweep, build_config
from txf.sweep.stats import CONFIDENCE
from txf.train import viz

REFERENCE_CSV, REFERENCE_PNG = "reference.csv", "reference.png"
CSV_COLUMNS = ("arm", "row", "metric", "published", "n", "diff", "ci_low", "ci_high", "p", "verdict",
               "published_params", "params")


def verdict(published: Optional[float], diff: float, ci_low: float, ci_high: float) -> str:
  """Whether the sweep's difference ``diff`` (interval [ci_low, ci_high]) goes the way of the
  published delta (rules: module doc); '' without a published delta, 'n/a' without an interval."""
  if published is None:
    return ""
  if any(math.isnan(x) for x in (diff, ci_low, ci_high)):
    return "n/a"
  resolved = not ci_low <= 0.0 <= ci_high
  if diff == 0 and published != 0:
    return "no change here"
  if published == 0:
    return "differs (published: none)" if resolved else "agrees"
  same = (diff > 0) == (published > 0) and diff != 0
  if resolved:
    return "agrees" if same else "disagrees"
  return "same sign, within noise" if same else "opposite sign, within noise"


def vocab_of(sweep: Sweep, arm: str) -> Tuple[int, int, int]:
  """(vocab_size, target_vocab_size, num_classes) of ``arm``: from the task.json of its first run
  that has one, else (data.vocab_size, 0, 0) of its config."""
  for run in sweep.runs:
    path = workdir_lib.path_of(run.workdir, workdir_lib.TASK_FILE)
    if run.arm == arm and os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        task = json.load(f)
      return (int(task.get("vocab_size") or 0), int(task.get("target_vocab_size") or 0),
              int(task.get("num_classes") or 0))
  return int(build_config(sweep, arm, sweep.seeds[0]).data.vocab_size), 0, 0


def arm_params(sweep: Sweep, arm: str) -> int:
  """The number of parameters of ``arm``'s model (scalars; the vocabulary unpadded), from its
  config without training: the shapes of an abstract initialisation."""
  config = build_config(sweep, arm, sweep.seeds[0])
  vocab, target_vocab, classes = vocab_of(sweep, arm)
  cfg = model_config_for(config, vocab, target_vocab, classes, vocab_multiple=1)
  example = {"inputs": np.zeros((1, 1), np.int32), "targets": np.zeros((1, 1), np.int32)}
  if families.get(cfg.family).predicts == "label":
    example["label"] = np.zeros((1,), np.int32)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  return count_params(jax.eval_shape(lambda rng: init_params(cfg, rng, example), key))


def rows(sweep: Sweep, by_metric: Dict[str, Sequence[Any]],
         params: Dict[str, int]) -> List[Dict[str, Any]]:
  """One row per arm with a reference entry and per metric it gives (or one row with metric ''
  for an entry of parameters only, e.g. the baseline's): the published delta, the sweep's n,
  Welch difference, its interval, p and the verdict, the published and counted parameters.
  ``by_metric``: metric -> the report's ArmReports (txf.sweep.report.build)."""
  out = []
  for arm in sweep.arms:
    entry = sweep.reference.get(arm)
    if entry is None:
      continue
    metrics = [m for m in sweep.compared if m in entry]
    for metric in metrics or [""]:
      row = {"arm": arm, "row": entry.get("row", ""), "metric": metric,
             "published": entry.get(metric) if metric else None, "n": 0, "diff": math.nan,
             "ci_low": math.nan, "ci_high": math.nan, "p": math.nan,
             "published_params": entry.get("params"), "params": params.get(arm)}
      report = next((a for a in by_metric.get(metric, []) if a.arm == arm), None)
      if report is not None:
        row["n"] = report.summary.n
        if report.test is not None:
          t = report.test
          row.update(diff=t.diff, ci_low=t.ci_low, ci_high=t.ci_high, p=t.p)
      row["verdict"] = ("(baseline)" if arm == sweep.baseline else
                        verdict(row["published"], row["diff"], row["ci_low"], row["ci_high"]))
      out.append(row)
  return out


def _num(x: Optional[float], fmt: str = "{:+.3g}") -> str:
  if x is None:
    return ""
  if isinstance(x, float) and math.isnan(x):
    return "n/a"
  return "0" if x == 0 else fmt.format(x)


def _millions(n: Optional[float]) -> str:
  return "" if n is None else f"{n / 1e6:.3g} M"


def markdown(sweep: Sweep, table: Sequence[Dict[str, Any]]) -> str:
  """The comparison as Markdown: one row per arm, per metric: published delta, the sweep's
  difference with its interval and p, the verdict; parameters published and counted."""
  metrics = [m for m in sweep.compared if any(r["metric"] == m for r in table)]
  source = sweep.reference.get("_source", "")
  pct = f"{CONFIDENCE:.0%}"
  head = ["arm", "published row"]
  for m in metrics:
    short = m.rsplit("/", 1)[-1]
    head += [f"published Δ {short}", f"Δ {short} [{pct} CI]", "p", "direction"]
  head += ["published params", "params"]
  lines = ["", "## Beside the published numbers", "",
           (f"Published: {source}. " if source else "") +
           f"Δ: each arm's difference to the baseline `{sweep.baseline}` (published: to the "
           f"published baseline; here: Welch's mean difference with its {pct} interval and p). "
           "Direction: agrees / disagrees when the interval excludes 0, else within noise. "
           "params: counted from each arm's config (txf.sweep.reference).", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for arm in sweep.arms:
    arm_rows = {r["metric"]: r for r in table if r["arm"] == arm}
    if not arm_rows:
      continue
    first = next(iter(arm_rows.values()))
    cells = [arm, first["row"]]
    for m in metrics:
      r = arm_rows.get(m)
      if r is None or arm == sweep.baseline:
        cells += ["", "(baseline)" if arm == sweep.baseline else "", "", ""]
        continue
      ci = "" if math.isnan(r["ci_low"]) else f" [{_num(r['ci_low'])}, {_num(r['ci_high'])}]"
      cells += [_num(r["published"]), _num(r["diff"]) + ci, _num(r["p"], "{:.3g}"), r["verdict"]]
    cells += [_millions(first["published_params"]), _millions(first["params"])]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def csv_text(table: Sequence[Dict[str, Any]]) -> str:
  """The comparison as CSV (CSV_COLUMNS), full precision, one row per arm and metric."""
  out = io.StringIO()
  writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator="\n")
  writer.writeheader()
  for r in table:
    writer.writerow({k: ("" if r[k] is None else r[k]) for k in CSV_COLUMNS})
  return out.getvalue()


OFF_SCALE = 2.5   # an arm reaching this many times further from 0 than any other is drawn at the edge


def axis_half_width(extents: Sequence[float]) -> Optional[float]:
  """The half-width of a forest plot's x axis that keeps one far arm from squeezing the others:
  ``extents`` are each arm's largest |value| (difference, interval ends, published delta). When
  the largest is more than OFF_SCALE times the next, the axis spans 1.15 x the next (that arm is
  drawn at the edge with its value); otherwise None (the axis fits every arm)."""
  ordered = sorted((e for e in extents if math.isfinite(e)), reverse=True)
  if len(ordered) < 2 or ordered[1] <= 0 or ordered[0] <= OFF_SCALE * ordered[1]:
    return None
  return 1.15 * ordered[1]


def plot(sweep: Sweep, table: Sequence[Dict[str, Any]], path: str) -> str:
  """A forest plot per compared metric with published deltas: each arm's difference to the
  baseline with its 95% interval (bars), the published delta as a red diamond, 0 as a line; an
  arm far beyond all the others (``axis_half_width``) is a triangle at the edge with its value."""
  metrics = [m for m in sweep.compared if any(r["metric"] == m for r in table)]
  arms = [a for a in sweep.arms if a != sweep.baseline and any(r["arm"] == a for r in table)]
  fig = viz.new_figure(5.5 * max(len(metrics), 1), 1.2 + 0.38 * max(len(arms), 1))
  axes = np.atleast_1d(fig.subplots(1, max(len(metrics), 1)))
  for ax, metric in zip(axes, metrics):
    labelled = set()
    found = [next((r for r in table if r["arm"] == arm and r["metric"] == metric), None)
             for arm in arms]
    half = axis_half_width([max(abs(v) for v in (r["diff"], r["ci_low"], r["ci_high"],
                                                 r["published"] or 0.0) if not math.isnan(v))
                            for r in found if r is not None and not math.isnan(r["diff"])])
    for y, r in enumerate(found):
      if r is None:
        continue
      if half is not None and not math.isnan(r["diff"]) and abs(r["diff"]) > half:
        edge = math.copysign(0.96 * half, r["diff"])
        ax.scatter([edge], [y], marker=">" if edge > 0 else "<", color="C0", zorder=3)
        ax.annotate(f"{r['diff']:+.3g} (off scale)", (edge, y), xytext=(0, 6),
                    textcoords="offset points", ha="right" if edge > 0 else "left", fontsize=7)
      elif not math.isnan(r["diff"]):
        err = (None if math.isnan(r["ci_low"]) else
               [[r["diff"] - r["ci_low"]], [r["ci_high"] - r["diff"]]])
        ax.errorbar([r["diff"]], [y], xerr=err, fmt="o", color="C0", capsize=3,
                    label=None if "sweep" in labelled else "this sweep (95% CI)")
        labelled.add("sweep")
      if r["published"] is not None:
        ax.scatter([r["published"]], [y], marker="D", color="C3", zorder=3,
                   label=None if "published" in labelled else "published")
        labelled.add("published")
    ax.axvline(0.0, color="0.5", lw=0.8)
    if half is not None:
      ax.set_xlim(-half, half)
    ax.set_yticks(range(len(arms)))
    ax.set_yticklabels([f"{a} {sweep.reference.get(a, {}).get('row', '')}" for a in arms], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"Δ {metric} vs {sweep.baseline}")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7, loc="best")
  fig.tight_layout()
  return viz.save_figure(fig, path)


def write(sweep: Sweep, by_metric: Dict[str, Sequence[Any]]) -> Tuple[str, Dict[str, str]]:
  """Count the arms' parameters, build the comparison, write reference.csv and reference.png under
  the sweep's root; returns (its Markdown section, {"reference_csv" | "reference_png": path})."""
  params = {arm: arm_params(sweep, arm) for arm in sweep.arms if arm in sweep.reference}
  table = rows(sweep, by_metric, params)
  paths = {"reference_csv": os.path.join(sweep.root, REFERENCE_CSV),
           "reference_png": os.path.join(sweep.root, REFERENCE_PNG)}
  with open(paths["reference_csv"], "w", encoding="utf-8") as f:
    f.write(csv_text(table))
  plot(sweep, table, paths["reference_png"])
  return markdown(sweep, table), paths
