"""Scaling-law fits (txf/sweep/fit.py, scaling.py, `txf sweep report ROOT --fit`): exact recovery
without noise, the compute-optimal allocation against a brute-force minimum, the report from fake
runs through the CLI, and (slow) the intervals' coverage on 200 synthetic ladders drawn from a
known law with the seed spread of a real Tiny Shakespeare sweep."""

import json
import os

import numpy as np
import pytest
from flax import serialization

from tests.conftest import ROOT, run_txf
from txf.core.errors import TxfError
from txf.sweep import fit, grid, scaling

# the ladder of experiments/sweeps/ladder.py: N = 12 L d^2 (L = 2 layers) for d = 32, 64, 128, 256,
# D = steps x 32 rows x 128 tokens for 250, 500, 1000 steps; 3 seeds each
N = 24.0 * np.array([32, 64, 128, 256]) ** 2
D = 4096.0 * np.array([250, 500, 1000])
TRUE = np.array([1.0, 40.0, 0.34, 60.0, 0.28])    # E, A, alpha, B, beta
CELLS = np.array([(n, d) for n in N for d in D])
X = np.repeat(CELLS, 3, 0)
# at least the seed spread of that ladder (docs/sweeps.md: pooled std 0.011 over its 12 cells,
# 0.002-0.019 by cell)
SIGMA = 0.015


def test_noise_free_losses_give_the_law_back():
  params = fit.fit(X, fit.law(TRUE, X))
  np.testing.assert_allclose(params, TRUE, rtol=1e-4)
  one = np.array([2.0, 30.0, 0.5])
  np.testing.assert_allclose(fit.fit(N[:, None], fit.law(one, N[:, None])), one, rtol=1e-4)


def test_the_compute_optimal_allocation_is_the_minimum_along_6ND_equals_C():
  compute = 6 * 2e6 * 5e7
  got = fit.compute_optimal(TRUE, compute)
  sizes = np.geomspace(1e3, 1e10, 200001)                      # brute force along the isoFLOP
  losses = fit.law(TRUE, np.stack([sizes, compute / (6 * sizes)], 1))
  best = sizes[np.argmin(losses)]
  assert got["N"] == pytest.approx(best, rel=1e-3)
  assert got["D"] == pytest.approx(compute / (6 * best), rel=1e-3)
  assert got["a"] == pytest.approx(0.28 / 0.62) and got["b"] == pytest.approx(0.34 / 0.62)
  assert got["L"] == pytest.approx(losses.min(), rel=1e-9)


@pytest.mark.slow
def test_intervals_cover_the_true_exponents_on_200_synthetic_ladders():
  """200 ladders with Gaussian seed noise; 100 bootstrap draws each (the 5% / 95% percentiles are
  then the 5th and 95th order statistics: enough for the coverage, whose check needs only whether
  the truth falls inside)."""
  rng = np.random.default_rng(0)
  ys = fit.law(TRUE, X)[None] + SIGMA * rng.standard_normal((200, len(X)))
  fits = fit.bootstrap_many(X, ys, 100, rng)
  estimates = np.array([f.params for f in fits])
  for index, name in ((2, "alpha"), (4, "beta")):
    assert abs(estimates[:, index].mean() - TRUE[index]) < 0.03, name
    covered = np.mean([f.interval(f.draws[:, index])[0] <= TRUE[index] <= f.interval(f.draws[:, index])[1]
                       for f in fits])
    assert covered >= 0.85, (name, covered)


@pytest.mark.slow
def test_the_interval_of_a_held_out_cell_covers_its_new_runs_on_200_synthetic_ladders():
  """The largest cell left out of each of 200 synthetic ladders: the joint law fitted on the other
  11 cells predicts the mean of the cell's 3 runs (drawn with the same noise) inside its 90%
  interval (Fit.predict_runs) in at least 80% of the ladders (85.5% here: an extrapolation the
  percentile bootstrap covers a little below its level; the interval of the law's mean alone,
  without the runs' noise, covers 67.5%)."""
  rng = np.random.default_rng(1)
  largest = np.all(X == CELLS[-1], axis=1)
  ys = fit.law(TRUE, X)[None] + SIGMA * rng.standard_normal((200, len(X)))
  fits = fit.bootstrap_many(X[~largest], ys[:, ~largest], 100, rng)
  covered = []
  for f, y in zip(fits, ys):
    _, lo, hi = f.predict_runs(CELLS[-1], int(largest.sum()))
    covered.append(lo <= y[largest].mean() <= hi)
  assert np.mean(covered) >= 0.80, np.mean(covered)


def _fake_ladder_run(workdir, d_model, steps, value):
  """A complete run of the ladder: params.msgpack with a 2-layer FFN-sized tree, config.json,
  metrics.jsonl with eval/loss at its last step, a checkpoint."""
  os.makedirs(os.path.join(workdir, "checkpoints", str(steps)))
  params = {"embed": {"embedding": np.zeros((69, d_model), np.float32)},
            "decoder": {f"layer_{i}": {"ffn": {"wi": np.zeros((d_model, 6 * d_model), np.float32),
                                               "wo": np.zeros((6 * d_model, d_model), np.float32)}}
                        for i in range(2)}}
  with open(os.path.join(workdir, "params.msgpack"), "wb") as f:
    f.write(serialization.msgpack_serialize(params))
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"num_train_steps": steps, "batch_size": 32, "data": {"max_target_len": 128}}, f)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": steps, "split": "eval", "loss": value}) + "\n")


def _fake_ladder(tmp_path):
  spec = tmp_path / "ladder.json"
  spec.write_text(json.dumps({
      "config": os.path.join(ROOT, "experiments", "copy.py"), "seeds": 2,
      "grid": {"model.d_model": [32, 64, 96, 128], "num_train_steps": [100, 200, 400]}}))
  sweep = grid.load_sweep(str(spec), str(tmp_path / "r"))
  rng = np.random.default_rng(1)
  for run in sweep.runs:
    d_model, steps = (int(part.split("=")[1]) for part in run.arm.split(","))
    n, d = 24.0 * d_model ** 2, 4096.0 * steps
    value = float(fit.law(TRUE, np.array([[n, d]]))[0]) + 0.002 * rng.standard_normal()
    _fake_ladder_run(run.workdir, d_model, steps, value)
  grid.write_sweep(sweep)
  return sweep


def _check_fit_report(root, text):
  saved = json.load(open(os.path.join(root, "fit.json")))
  assert len(saved["points"]) == 24 and [law["names"] for law in saved["laws"]] == [["N"], ["D"], ["N", "D"]]
  assert sorted({p[0] for p in saved["points"]}) == [24.0 * d ** 2 for d in (32, 64, 96, 128)]
  joint = saved["laws"][2]["parameters"]
  for name, truth in (("alpha", 0.34), ("beta", 0.28)):
    point, lo, hi = joint[name]
    assert lo <= truth <= hi and abs(point - truth) < 0.03, (name, joint[name])
  truth = float(fit.law(TRUE, np.array([[1e6, 4e6]]))[0])
  line = [l for l in text.splitlines() if l.startswith("Prediction at N=1e+06, D=4e+06")][0]
  lo, hi = (float(v) for v in line.split("[")[1].split("]")[0].split(","))
  assert lo <= truth <= hi
  assert os.path.isfile(os.path.join(root, "fit.png"))


def test_the_fit_report_from_fake_runs(tmp_path):
  sweep = _fake_ladder(tmp_path)
  text, paths = scaling.write_fit_report(sweep, scaling.parse_predict("N=1e6,D=4e6"), 200)
  assert open(paths["md"]).read() == text
  _check_fit_report(sweep.root, text)
  # one seed: L(D) at the largest N would pass through its 3 points (no residuals): left out
  one_seed = np.array(json.load(open(paths["json"]))["points"])[::2]
  assert [law.fit.names for law in scaling.fit_laws(one_seed, 50)] == [("N",), ("N", "D")]
  with pytest.raises(TxfError, match="give N=SIZE and/or D=TOKENS"):
    scaling.parse_predict("N=big")


def test_the_laws_fitted_without_the_largest_arm_predict_it(tmp_path):
  """--holdout: the largest cell's two runs are left out of every fit; L(D) at the largest N then
  has 2 token budgets and is left out; L(N) and the joint law predict the cell, and their intervals
  hold the true law's value there (the intervals' coverage of new runs: the slow test below)."""
  sweep = _fake_ladder(tmp_path)
  largest = list(sweep.arms)[-1]
  text, paths = scaling.write_fit_report(sweep, None, 200, holdout=largest)
  saved = json.load(open(paths["json"]))
  assert len(saved["points"]) == 22 and len(saved["held_out"]["points"]) == 2
  assert [law["names"] for law in saved["laws"]] == [["N"], ["N", "D"]]
  n, d = 24.0 * 128 ** 2, 4096.0 * 400
  truth = float(fit.law(TRUE, np.array([[n, d]]))[0])
  observed = np.mean([p[2] for p in saved["held_out"]["points"]])
  rows = saved["held_out"]["predictions"]
  assert len(rows) == 2
  for row in rows:
    assert row["lo"] <= truth <= row["hi"] and row["observed"] == pytest.approx(observed)
    assert row["inside"] == (row["lo"] <= observed <= row["hi"])
    assert abs(row["predicted"] - truth) < 0.01, row
  assert f"## Held out: {largest}" in text
  assert [line.rsplit("|", 2)[1].strip() for line in text.splitlines() if line.startswith("| L(")][-2:] == \
      ["yes" if row["inside"] else "no" for row in rows]
  with pytest.raises(TxfError, match="is not an arm of sweep"):
    scaling.write_fit_report(sweep, None, 50, holdout="d_model=1000")


@pytest.mark.slow
def test_txf_sweep_report_fit_through_the_command_line(tmp_path):
  sweep = _fake_ladder(tmp_path)
  r = run_txf("sweep", "report", sweep.root, "--fit", "--bootstrap=200", "--predict=N=1e6,D=4e6")
  assert r.returncode == 0, r.stderr
  text = open(os.path.join(sweep.root, "fit.md")).read()
  assert text in r.stdout
  _check_fit_report(sweep.root, text)
  bad = run_txf("sweep", "report", sweep.root, "--fit", "--predict=N=big")
  assert bad.returncode == 2 and bad.stderr.strip().startswith("txf: error: --predict='N=big'")
  bad = run_txf("sweep", "report", sweep.root, "--fit", "--holdout=nothing")
  assert bad.returncode == 2 and bad.stderr.strip().startswith("txf: error: --holdout='nothing' is "
                                                               "not an arm")
  bad = run_txf("sweep", "report", sweep.root, "--holdout", list(sweep.arms)[-1])
  assert bad.returncode == 2 and "--holdout needs --fit" in bad.stderr
