"""A sweep's scaling-law fits (``txf sweep ... --fit``): each complete run's model size N, training
tokens D and metric value, the laws of txf.sweep.fit fitted over them with bootstrap intervals, the
compute-optimal allocation of the joint law, and a prediction at a size the user names; written
as fit.md (also printed), fit.json and fit.png under the sweep's root.

  N  the run's parameters other than the vocabulary and position tables (``embedding``,
     ``pos_embedding``, ``token_type_embedding``, an untied ``logits_kernel``), counted in its
     params.msgpack (Kaplan et al.'s non-embedding count)
  D  num_train_steps x batch_size x data.max_target_len of its config.json: the target positions
     trained on (exact for language-model windows, which have no padding)

L(N) is fitted on the runs of the largest D, L(D) on those of the largest N, the joint law on all
of them; a law is fitted when its variable takes at least 3 values (the joint: 3 of each) and it
has more points (runs x seeds) than parameters: a law through every point leaves no residuals to
bootstrap, and its intervals would have no width.
"""

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from txf.core.errors import TxfError
from txf.sweep import fit as fit_lib, ledger as ledger_lib
from txf.sweep.grid import Run, Sweep
from txf.sweep.report import run_value
from txf.train import viz

FIT_MD, FIT_JSON, FIT_PNG = "fit.md", "fit.json", "fit.png"


def run_size(sweep: Sweep, run: Run) -> Tuple[int, int]:
  """(N, D) of a complete run, from its workdir or its ledger record (module doc)."""
  n, config = ledger_lib.size_of(sweep, run)
  if n is None:
    raise TxfError(f"{run.label}: neither its workdir nor a ledger record holds its final "
                   f"parameters and config: the fit needs N and D of every run it uses")
  d = int(config["num_train_steps"]) * int(config["batch_size"]) * int(config["data"]["max_target_len"])
  return n, d


def sweep_points(sweep: Sweep, arms: Optional[Sequence[str]] = None) -> np.ndarray:
  """[n, 3] rows (N, D, value) of the sweep's complete runs (one per run and seed); only those of
  ``arms`` when given."""
  rows = []
  for run in sweep.runs:
    if arms is not None and run.arm not in arms:
      continue
    value, _ = run_value(run, sweep.metric, sweep.mode, ledger_lib.record_of(sweep, run))
    if value is not None and np.isfinite(value):
      rows.append((*run_size(sweep, run), value))
  return np.asarray(rows, np.float64).reshape(-1, 3)


@dataclasses.dataclass
class HeldOut:
  """An arm left out of the fits: its runs' points [k, 3] (N, D, value), the fitted laws'
  prediction of the mean of k runs at its (N, D) (``Fit.predict_runs``) checked against its mean."""
  arm: str
  points: np.ndarray

  @property
  def size(self) -> Dict[str, float]:
    return {"N": float(self.points[0, 0]), "D": float(self.points[0, 1])}

  def predictions(self, laws: Sequence["LawFit"]) -> List[Dict[str, Any]]:
    """Each law that reaches the arm (the joint law always; L(N) when the arm has its D, L(D) its
    N): {law, predicted, lo, hi, observed, inside}."""
    observed = float(self.points[:, 2].mean())
    out = []
    for law in laws:
      fixed = {"N": "D", "D": "N"}.get(law.fit.names[0]) if len(law.fit.names) == 1 else None
      if fixed is not None and law.fixed != self.size[fixed]:
        continue
      value, lo, hi = law.fit.predict_runs([self.size[name] for name in law.fit.names],
                                           len(self.points))
      out.append({"law": law.title, "predicted": value, "lo": lo, "hi": hi, "observed": observed,
                  "inside": bool(lo <= observed <= hi)})
    return out


def check_holdout(sweep: Sweep, arm: str) -> None:
  """Raise the one-line error for a ``--holdout`` that names no arm of ``sweep`` ('' passes)."""
  if arm and arm not in sweep.arms:
    raise TxfError(f"--holdout={arm!r} is not an arm of sweep {sweep.name}: give one of "
                   f"{', '.join(sweep.arms)}")


def held_out(sweep: Sweep, arm: str) -> Tuple[np.ndarray, HeldOut]:
  """(the points of every other arm, the held-out arm ``arm``): a fit's check against a run it has
  not seen (``--holdout ARM``)."""
  check_holdout(sweep, arm)
  held = sweep_points(sweep, [arm])
  if not len(held):
    raise TxfError(f"--holdout={arm!r}: the arm has no complete run to check the fit against; run "
                   f"the sweep to its end first")
  return sweep_points(sweep, [a for a in sweep.arms if a != arm]), HeldOut(arm, held)


def parse_predict(text: str) -> Dict[str, float]:
  """"N=1e7,D=2e9" -> {"N": 1e7, "D": 2e9} (either or both); '' -> {}."""
  out: Dict[str, float] = {}
  for part in filter(None, (p.strip() for p in (text or "").split(","))):
    name, _, value = part.partition("=")
    try:
      out[name.strip()] = float(value)
    except ValueError:
      out[name.strip()] = float("nan")
    if name.strip() not in ("N", "D") or not out[name.strip()] > 0:
      raise TxfError(f"--predict={text!r}: give N=SIZE and/or D=TOKENS, positive numbers, "
                     f"e.g. --predict N=2e6,D=5e6")
  return out


@dataclasses.dataclass
class LawFit:
  """One fitted law: its title, the fit (txf.sweep.fit.Fit) and, for L(N) and L(D), the value of
  the variable held fixed (D and N)."""
  title: str
  fit: fit_lib.Fit
  fixed: Optional[float] = None


def fit_laws(points: np.ndarray, draws: int = fit_lib.BOOTSTRAP_DRAWS, seed: int = 0) -> List[LawFit]:
  """L(N) at the largest D, L(D) at the largest N and the joint law over ``points`` [n, 3] (N, D,
  value), each when its variables take >= 3 values among the points it is fitted on (a ladder with
  an arm held out may have only 2 at its largest N) and it has more points than parameters."""
  out = []
  n_values, d_values = np.unique(points[:, 0]), np.unique(points[:, 1])
  rows = points[points[:, 1] == d_values[-1]] if len(d_values) else points
  if len(np.unique(rows[:, 0])) >= 3 and len(rows) > 3:
    out.append(LawFit(f"L(N) = E + A N^-alpha (D = {d_values[-1]:.3g})",
                      fit_lib.bootstrap_fit(rows[:, :1], rows[:, 2], ("N",), draws, seed),
                      float(d_values[-1])))
  rows = points[points[:, 0] == n_values[-1]] if len(n_values) else points
  if len(np.unique(rows[:, 1])) >= 3 and len(rows) > 3:
    out.append(LawFit(f"L(D) = E + B D^-beta (N = {n_values[-1]:.3g})",
                      fit_lib.bootstrap_fit(rows[:, 1:2], rows[:, 2], ("D",), draws, seed),
                      float(n_values[-1])))
  if len(n_values) >= 3 and len(d_values) >= 3 and len(points) > 5:
    out.append(LawFit("L(N, D) = E + A N^-alpha + B D^-beta",
                      fit_lib.bootstrap_fit(points[:, :2], points[:, 2], ("N", "D"), draws, seed)))
  return out


def _g(x: float) -> str:
  return "n/a" if x is None or not np.isfinite(x) else f"{x:.4g}"


def markdown(sweep: Sweep, points: np.ndarray, laws: Sequence[LawFit],
             predict: Dict[str, float], draws: int, held: Optional[HeldOut] = None) -> str:
  """The fits as Markdown: the points, each law's parameters with 90% intervals, the joint law's
  compute-optimal exponents, the prediction at ``predict``, and the held-out arm's check."""
  pct = f"{fit_lib.LEVEL:.0%}"
  lines = [f"# Scaling-law fits of sweep {sweep.name}: {sweep.metric} ({sweep.mode})", "",
           f"{len(points)} runs; N = non-embedding parameters, D = training tokens; {pct} intervals "
           f"from {draws} residual-bootstrap draws over seeds and runs (txf/sweep/fit.py).", ""]
  if not laws:
    return "\n".join(lines + ["No law fitted: N or D needs at least 3 distinct values, and a "
                              "law more points than parameters (add seeds)."]) + "\n"
  for law in laws:
    lines += [f"## {law.title}", "", f"| parameter | estimate | {pct} interval |", "|---|---|---|"]
    for name, (point, lo, hi) in law.fit.parameter_table().items():
      lines.append(f"| {name} | {_g(point)} | [{_g(lo)}, {_g(hi)}] |")
    if law.fit.names == ("N", "D"):
      table = fit_lib.compute_optimal(law.fit.params, 1.0)
      boot = fit_lib.compute_optimal(law.fit.draws, 1.0)
      for key, label in (("a", "a in N_opt ~ C^a"), ("b", "b in D_opt ~ C^b")):
        lo_hi = fit_lib.percentile_interval(boot[key]) or (np.nan, np.nan)
        lines.append(f"| {label} | {_g(float(table[key]))} | [{_g(lo_hi[0])}, {_g(lo_hi[1])}] |")
    wanted = tuple(name for name in law.fit.names if name in predict)
    if wanted == law.fit.names:
      at = [predict[name] for name in law.fit.names]
      value, lo, hi = law.fit.predict(at)
      where = ", ".join(f"{n}={predict[n]:.4g}" for n in law.fit.names)
      lines += ["", f"Prediction at {where}: **{_g(value)}**, {pct} interval [{_g(lo)}, {_g(hi)}]"]
      if law.fit.names == ("N", "D"):
        compute = 6.0 * predict["N"] * predict["D"]
        best = fit_lib.compute_optimal(law.fit.params, compute)
        boot = fit_lib.compute_optimal(law.fit.draws, compute)
        n_int = fit_lib.percentile_interval(boot["N"]) or (np.nan, np.nan)
        lines.append(f"; at its compute C = 6ND = {compute:.3g} the law's optimum is N = "
                     f"{_g(float(best['N']))} [{_g(n_int[0])}, {_g(n_int[1])}], D = "
                     f"{_g(float(best['D']))}, L = {_g(float(best['L']))}")
    lines.append("")
  if held is not None:
    lines += _held_out_lines(held, laws, pct)
  return "\n".join(lines) + "\n"


def _held_out_lines(held: HeldOut, laws: Sequence[LawFit], pct: str) -> List[str]:
  size = held.size
  lines = [f"## Held out: {held.arm}", "",
           f"The laws above were fitted without arm `{held.arm}` ({len(held.points)} runs at "
           f"N = {size['N']:.4g}, D = {size['D']:.4g}, mean {_g(float(held.points[:, 2].mean()))}); "
           f"their prediction for it:", ""]
  rows = held.predictions(laws)
  if not rows:
    return lines + ["No fitted law reaches this arm's (N, D).", ""]
  lines += [f"| law | predicted | {pct} interval of a {len(held.points)}-run mean | observed mean | "
            f"inside |", "|---|---|---|---|---|"]
  for row in rows:
    lines.append(f"| {row['law']} | {_g(row['predicted'])} | [{_g(row['lo'])}, {_g(row['hi'])}] | "
                 f"{_g(row['observed'])} | {'yes' if row['inside'] else 'no'} |")
  return lines + [""]


def plot(points: np.ndarray, laws: Sequence[LawFit], path: str, held: Optional[HeldOut] = None) -> str:
  """Each law's points (value against N or D, log axis) with its fitted curve and 90% band, and the
  held-out arm's points where the law reaches them."""
  singles = [law for law in laws if len(law.fit.names) == 1]
  fig = viz.new_figure(5 * max(len(singles), 1), 4)
  axes = np.atleast_1d(fig.subplots(1, max(len(singles), 1)))
  for ax, law in zip(axes, singles):
    name = law.fit.names[0]
    xs = np.geomspace(law.fit.x.min() / 1.5, law.fit.x.max() * 4, 60)[:, None]
    curves = fit_lib.law(law.fit.draws, xs)
    lo, hi = np.nanpercentile(curves, [50 * (1 - fit_lib.LEVEL), 50 * (1 + fit_lib.LEVEL)], axis=0)
    ax.fill_between(xs[:, 0], lo, hi, alpha=0.25, label=f"{fit_lib.LEVEL:.0%} band")
    ax.plot(xs[:, 0], fit_lib.law(law.fit.params, xs), label="fit")
    ax.scatter(law.fit.x[:, 0], law.fit.y, s=14, color="k", label="runs")
    other = {"N": "D", "D": "N"}[name]
    if held is not None and held.size[other] == law.fixed:
      ax.scatter(held.points[:, 0 if name == "N" else 1], held.points[:, 2], s=24, marker="x",
                 color="tab:red", label=f"held out ({held.arm})")
    ax.set_xscale("log")
    ax.set_xlabel(name)
    ax.set_ylabel("value")
    ax.set_title(law.title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  return viz.save_figure(fig, path)


def write_fit_report(sweep: Sweep, predict: Optional[Dict[str, float]] = None,
                     draws: int = fit_lib.BOOTSTRAP_DRAWS,
                     holdout: str = "") -> Tuple[str, Dict[str, str]]:
  """Fit the sweep's laws and write fit.md, fit.json and fit.png under its root; returns (the
  Markdown, {"md" | "json" | "png": path}). ``holdout``: an arm left out of the fits, whose mean
  value is checked against their prediction (``held_out``)."""
  if holdout:
    points, held = held_out(sweep, holdout)
  else:
    points, held = sweep_points(sweep), None
  laws = fit_laws(points, draws)
  text = markdown(sweep, points, laws, predict or {}, draws, held)
  paths = {kind: os.path.join(sweep.root, name)
           for kind, name in (("md", FIT_MD), ("json", FIT_JSON), ("png", FIT_PNG))}
  with open(paths["md"], "w", encoding="utf-8") as f:
    f.write(text)
  with open(paths["json"], "w", encoding="utf-8") as f:
    json.dump({"points": points.tolist(),
               "laws": [{"title": law.title, "names": law.fit.names,
                         "parameters": law.fit.parameter_table()} for law in laws],
               "held_out": None if held is None else {
                   "arm": held.arm, "points": held.points.tolist(),
                   "predictions": held.predictions(laws)}}, f, indent=1)
  plot(points, laws, paths["png"], held)
  return text, paths
