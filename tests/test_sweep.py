"""txf sweep: the sweep file's expansion (arms, grid, seeds, workdirs), the emitted commands and
SLURM script, the statistics (against hand-worked examples and scipy.stats.ttest_ind), the runner
(complete runs skipped, failures reported, the others run on), the report, the command's one-line
errors, one real tiny sweep through the CLI (slow tier), and the Weights & Biases tracker (offline).
"""

import csv
import io
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from scipy import stats as scipy_stats

from tests.conftest import ROOT, run_txf
from txf.core import config as config_lib
from txf.runtime import workdir as workdir_lib
from txf.train.metrics import MetricWriter
from txf.sweep import grid, report, runner, stats
from txf.sweep.grid import SweepError

COPY = os.path.join(ROOT, "experiments", "copy.py")
# a few steps of a tiny copy model: what the runs of the end-to-end sweep train
TINY = {"log_every": 2, "eval_every": 3, "checkpoint_every": 3, "decode_examples": 4, "num_samples": 0,
        "eval_batches": 1, "model.d_model": 32, "model.d_ff": 64}


def write_spec(tmp_path, name="s.json", **fields):
  spec = {"config": COPY, "arms": {"base": {}, "rms": {"model.norm": "rms_norm"}}, "seeds": 2,
          "steps": 6, **fields}
  spec = {k: v for k, v in spec.items() if v is not None}
  path = tmp_path / name
  path.write_text(json.dumps(spec))
  return str(path)


# -- the sweep file -----------------------------------------------------------------------------------

def test_a_grid_is_the_cartesian_product_first_field_slowest_named_by_leaf_and_value():
  arms = grid.grid_arms({"model.d_model": [32, 64], "model.norm": ["layer_norm", "rms_norm"]})
  assert list(arms) == ["d_model=32,norm=layer_norm", "d_model=32,norm=rms_norm",
                        "d_model=64,norm=layer_norm", "d_model=64,norm=rms_norm"]
  assert arms["d_model=64,norm=rms_norm"] == {"model.d_model": 64, "model.norm": "rms_norm"}
  # two fields with the same leaf keep their dotted names; bools as the command line writes them
  assert list(grid.grid_arms({"a.x": [1], "b.x": [True]})) == ["a.x=1,b.x=true"]


def test_runs_are_arms_times_seeds_each_a_workdir_root_arm_seed_k(tmp_path):
  path = write_spec(tmp_path, grid={"model.norm": ["layer_norm", "rms_norm"], "optimizer.label_smoothing": [0.0, 0.1]},
                    arms=None, seeds=[3, 7], baseline="norm=layer_norm,label_smoothing=0.1",
                    overrides={"batch_size": 16})
  sweep = grid.load_sweep(path, str(tmp_path / "root"), grid.parse_sets(["model.d_ff=96"]))
  assert len(sweep.arms) == 4 and len(sweep.runs) == 8 and sweep.name == "s"
  assert [r.index for r in sweep.runs] == list(range(8))
  run = sweep.runs[3]  # the second arm, the second seed
  assert (run.arm, run.seed) == ("norm=layer_norm,label_smoothing=0.1", 7)
  assert run.workdir == os.path.join(str(tmp_path / "root"), run.arm, "seed-7")
  assert run.log == run.workdir + ".log" and run.steps == 6
  args = run.args
  assert args[:5] == ["--config", COPY, "--workdir", run.workdir, "--progress=false"]
  for a in ["--config.batch_size=16", "--config.num_train_steps=6", "--config.model.d_ff=96",
            "--config.model.norm=layer_norm", "--config.optimizer.label_smoothing=0.1",
            "--config.seed=7"]:
    assert a in args
  # the config each run trains with: the experiment, the overrides, the arm, the seed
  config = grid.build_config(sweep, run.arm, run.seed)
  assert (config.batch_size, config.model.d_ff, config.optimizer.label_smoothing, config.seed,
          config.num_train_steps, config.model.d_model) == (16, 96, 0.1, 7, 6, 64)


def test_seed_counts_python_and_toml_files_and_the_shipped_example(tmp_path):
  py = tmp_path / "s.py"
  py.write_text(f"def get_sweep():\n  return {{'config': {COPY!r}, 'arms': {{'a': {{}}, "
                f"'b': {{'model.pre_ln': True}}}}, 'seeds': 3, 'metric': 'eval/accuracy', 'mode': 'max'}}\n")
  sweep = grid.load_sweep(str(py), str(tmp_path / "r"))
  assert sweep.seeds == [0, 1, 2] and sweep.baseline == "a" and sweep.mode == "max"
  assert "--config.model.pre_ln=true" in sweep.runs[3].args
  toml = tmp_path / "t.toml"
  toml.write_text(f'config = "{COPY}"\nseeds = [1]\n[grid]\n"model.d_model" = [32, 64]\n')
  assert [r.workdir for r in grid.load_sweep(str(toml), "R").runs] == ["R/d_model=32/seed-1",
                                                                       "R/d_model=64/seed-1"]
  example = grid.load_sweep(os.path.join(ROOT, "experiments", "sweeps", "copy_norm.py"), "R")
  assert list(example.arms) == ["layer_norm", "rms_norm"] and len(example.runs) == 6


@pytest.mark.parametrize("fields,sets,message", [
    ({"arms": {"a": {"model.d_modle": 8}}}, [], "unknown config field 'model.d_modle' in arm 'a': "
                                                "did you mean model.d_model?"),
    ({"baseline": "nope"}, [], "unknown baseline arm 'nope': the arms are base, rms"),
    ({"metric": "eval/blue"}, [], "metric 'eval/blue' is never logged"),
    ({"metric": "loss"}, [], "write SPLIT/KEY"),
    ({"mode": "best"}, [], "mode='best' is not one of final, min, max"),
    ({"seeds": 0}, [], "seeds must be a count >= 1"),
    ({"grid": {"model.d_model": [8]}}, [], "give either arms"),
    ({"arms": {"a": {"seed": 3}}}, [], "the sweep's seeds give each run its seed"),
    ({"arms": {"a/b": {}}}, [], "arm name 'a/b'"),
    ({"arms": {"a": {"model.norm": "rms_nrom"}}}, [], "arm 'a': invalid config"),
    ({"arms": {"a": {"model.d_model": "big"}}}, [], "model.d_model='big' does not fit the field"),
    ({"colour": 1}, [], "unknown sweep field(s) colour"),
    ({}, ["model.d_ff=x"], "--set model.d_ff=x: not a int"),
    ({}, ["model.num_head=2"], "unknown config field 'model.num_head' in --set"),
])
def test_a_bad_sweep_file_or_set_is_one_sweep_error(tmp_path, fields, sets, message):
  with pytest.raises(SweepError) as e:
    grid.load_sweep(write_spec(tmp_path, **fields), "R", grid.parse_sets(sets))
  assert message in str(e.value)


def test_a_missing_sweep_file_and_a_root_without_a_sweep(tmp_path):
  with pytest.raises(SweepError, match="no sweep file"):
    grid.load_sweep(str(tmp_path / "nope.py"))
  with pytest.raises(SweepError, match="holds no sweep"):
    grid.read_sweep(str(tmp_path))


# -- emitted for a scheduler ---------------------------------------------------------------------------

def test_a_sweep_folder_is_read_where_it_is_after_a_move_or_from_another_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  sweep = grid.load_sweep(write_spec(tmp_path, seeds=1), os.path.join("runs", "s"))
  grid.write_sweep(sweep)
  os.rename(tmp_path / "runs" / "s", tmp_path / "moved")
  read = grid.read_sweep(str(tmp_path / "moved"))
  assert read.root == str(tmp_path / "moved")
  assert [r.workdir for r in read.runs] == [str(tmp_path / "moved" / r.arm / "seed-0") for r in sweep.runs]
  assert [r.log for r in read.runs] == [str(tmp_path / "moved" / r.arm / "seed-0.log") for r in sweep.runs]
  monkeypatch.chdir(tmp_path / "moved")
  assert [r.workdir for r in grid.read_sweep(".").runs] == [os.path.join(r.arm, "seed-0") for r in sweep.runs]


def test_emitted_commands_are_one_txf_train_per_run_that_a_shell_splits_back(tmp_path):
  sweep = grid.load_sweep(write_spec(tmp_path, overrides={"name": "two words"}), str(tmp_path / "r"))
  lines = runner.emit_commands(sweep).splitlines()
  assert len(lines) == 4
  for line, run in zip(lines, sweep.runs):
    assert shlex.split(line) == ["txf", "train", *run.args]
  assert "'--config.name=two words'" in lines[0]


def test_the_slurm_script_is_an_array_with_one_case_per_run(tmp_path):
  sweep = grid.load_sweep(write_spec(tmp_path), str(tmp_path / "r"))
  script = runner.emit_slurm(sweep, ["--gres=gpu:1", "--time=1:00:00"])
  assert "#SBATCH --array=0-3\n" in script and "#SBATCH --gres=gpu:1\n" in script
  assert script.index("#SBATCH --time=1:00:00") < script.index("set -euo pipefail")  # before code
  path = tmp_path / "job.sh"
  path.write_text(script)
  assert subprocess.run(["bash", "-n", str(path)]).returncode == 0  # it parses
  # run it as array task 2 with a `txf` that prints its arguments: the third run's command
  fake = tmp_path / "bin"
  fake.mkdir()
  (fake / "txf").write_text("#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\n")
  (fake / "txf").chmod(0o755)
  env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", SLURM_ARRAY_TASK_ID="2")
  out = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  assert out.stdout.splitlines() == ["train", *sweep.runs[2].args]
  env["SLURM_ARRAY_TASK_ID"] = "4"
  assert subprocess.run(["bash", str(path)], env=env, capture_output=True).returncode == 2


# -- statistics ----------------------------------------------------------------------------------------

def test_summary_and_welch_on_a_hand_worked_example():
  # a = 1, 2, 3: mean 2, squared deviations 1 + 0 + 1 = 2, s^2 = 2 / (3 - 1) = 1
  # b = 4, 6, 8: mean 6, squared deviations 4 + 0 + 4 = 8, s^2 = 8 / 2 = 4
  s = stats.summarize([1.0, 2.0, 3.0])
  assert (s.n, s.mean, s.std) == (3, 2.0, 1.0)
  # 95% CI: 2 -/+ t_{0.975, 2} * 1 / sqrt(3), t_{0.975, 2} = 4.303 (a printed t table)
  assert s.ci_high - 2.0 == pytest.approx(4.303 / math.sqrt(3), rel=1e-3)
  assert s.ci_low == pytest.approx(4.0 - s.ci_high)
  w = stats.welch([1.0, 2.0, 3.0], [4.0, 6.0, 8.0])
  # diff = 2 - 6 = -4; se^2 = 1/3 + 4/3 = 5/3; t = -4 / sqrt(5/3)
  assert w.diff == -4.0 and w.se == pytest.approx(math.sqrt(5 / 3), rel=1e-12)
  assert w.t == pytest.approx(-4 / math.sqrt(5 / 3), rel=1e-12)
  # dof = (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 2) = (25/9) / (17/18) = 50/17
  assert w.dof == pytest.approx(50 / 17, rel=1e-12)
  # with equal variances and n = 2 each the dof is 2, where Student's t has a closed form:
  # a = 1, 3 and b = 5, 7: s^2 = 2 each, se = sqrt(2/2 + 2/2) = sqrt(2), t = -4 / sqrt(2) = -2 sqrt(2)
  # P(|T_2| > t) = 1 - t / sqrt(2 + t^2) = 1 - 2 sqrt(2) / sqrt(10) = 1 - sqrt(0.8)
  w = stats.welch([1.0, 3.0], [5.0, 7.0])
  assert w.dof == pytest.approx(2.0, rel=1e-12) and w.t == pytest.approx(-2 * math.sqrt(2), rel=1e-12)
  assert w.p == pytest.approx(1 - math.sqrt(0.8), rel=1e-9)
  # and its 95% CI of the difference: -4 -/+ t_{0.975, 2} sqrt(2), t_{0.975, 2} = 4.303
  assert w.ci_high == pytest.approx(-4 + 4.303 * math.sqrt(2), rel=1e-3)


@pytest.mark.parametrize("n_a,n_b,shift", [(3, 3, 0.5), (5, 8, 0.1), (2, 6, -1.0), (10, 4, 0.0)])
def test_welch_matches_scipy_ttest_ind_unequal_variances(n_a, n_b, shift):
  rng = np.random.default_rng(n_a * 100 + n_b)
  a = rng.normal(1.0 + shift, 0.3, n_a)
  b = rng.normal(1.0, 0.7, n_b)
  w = stats.welch(a, b)
  ref = scipy_stats.ttest_ind(a, b, equal_var=False)
  assert w.t == pytest.approx(float(ref.statistic), rel=1e-10)
  assert w.p == pytest.approx(float(ref.pvalue), rel=1e-9)
  assert w.dof == pytest.approx(float(ref.df), rel=1e-10)
  lo, hi = ref.confidence_interval(0.95)
  assert (w.ci_low, w.ci_high) == (pytest.approx(float(lo), rel=1e-9), pytest.approx(float(hi), rel=1e-9))
  s = stats.summarize(a)
  assert s.mean == pytest.approx(np.mean(a), rel=1e-12) and s.std == pytest.approx(np.std(a, ddof=1), rel=1e-12)
  lo, hi = scipy_stats.t.interval(0.95, n_a - 1, loc=np.mean(a), scale=scipy_stats.sem(a))
  assert (s.ci_low, s.ci_high) == (pytest.approx(lo, rel=1e-10), pytest.approx(hi, rel=1e-10))


def test_too_few_values_give_nan_not_an_error():
  assert math.isnan(stats.summarize([1.0]).std) and stats.summarize([1.0]).mean == 1.0
  assert stats.summarize([]).n == 0
  assert math.isnan(stats.welch([1.0], [1.0, 2.0]).p)
  assert stats.welch([1.0, 1.0], [2.0, 2.0]).p == 0.0  # no spread at all: any difference is certain


# -- the runner: complete runs skipped, failures reported ---------------------------------------------

def fake_run(workdir, steps, rows, complete=True, checkpoint=None):
  """A workdir as `txf train` leaves it: metrics.jsonl, checkpoints/<step>/, params.msgpack."""
  os.makedirs(os.path.join(workdir, "checkpoints", str(checkpoint or steps)))
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"num_train_steps": steps}, f)
  if complete:
    open(os.path.join(workdir, "params.msgpack"), "wb").close()


def rows_of(values, split="eval"):
  return [{"step": s, "split": split, "loss": v} for s, v in values]


def test_completion_is_a_checkpoint_at_the_last_step_and_the_final_params(tmp_path):
  fake_run(str(tmp_path / "a"), 6, [])
  fake_run(str(tmp_path / "b"), 6, [], complete=False, checkpoint=3)  # interrupted: resumes
  fake_run(str(tmp_path / "c"), 6, [], checkpoint=3)  # a time limit ended it at step 3
  assert runner.is_complete(str(tmp_path / "a"), 6) and not runner.is_complete(str(tmp_path / "a"), 9)
  assert not runner.is_complete(str(tmp_path / "b"), 6) and not runner.is_complete(str(tmp_path / "c"), 6)
  assert not runner.is_complete(str(tmp_path / "none"), 6)


def test_run_local_skips_complete_runs_reports_failures_and_runs_the_rest(tmp_path):
  sweep = grid.load_sweep(write_spec(tmp_path, seeds=3), str(tmp_path / "r"))
  done = sweep.runs[0]
  fake_run(done.workdir, done.steps, rows_of([(6, 1.0)]))

  def command(run):  # seed 1 fails with a user error; the others finish as `txf train` would
    code = (f"import os, sys\nif {run.seed} == 1:\n  print('txf: error: bad luck'); sys.exit(2)\n"
            f"os.makedirs({os.path.join(run.workdir, 'checkpoints', '6')!r})\n"
            f"open({os.path.join(run.workdir, 'params.msgpack')!r}, 'wb').close()\n")
    return [sys.executable, "-c", code]

  lines = []
  outcomes = runner.run_local(sweep.runs, parallel=2, say=lines.append, command=command)
  assert [o.status for o in outcomes] == ["complete", "failed", "done", "done", "failed", "done"]
  assert outcomes[1].code == 2 and outcomes[1].reason == "txf: error: bad luck"
  assert len(lines) == 6 and lines[0] == "[1/6] base/seed-0: complete, skipped"
  failed = [l for l in lines if "base/seed-1: FAILED (exit 2) after " in l]
  assert len(failed) == 1 and failed[0].endswith(f" s: txf: error: bad luck (log: {sweep.runs[1].log})")
  with open(sweep.runs[1].log) as f:  # the log has the command line and the run's output
    assert f.readline().startswith("=== ") and "txf: error: bad luck" in f.read()
  again = runner.run_local(sweep.runs, parallel=2, say=lines.append, command=command)
  assert [o.status for o in again] == ["complete", "failed", "complete", "complete", "failed", "complete"]
  # the report names the failed runs as missing, with their logs
  assert report.run_value(sweep.runs[1], "eval/loss", "final") == (
      None, f"not complete (log: {sweep.runs[1].log})")


def test_an_interrupted_sweep_passes_one_sigterm_to_its_runs_and_waits_for_them(tmp_path):
  import signal
  import threading
  sweep = grid.load_sweep(write_spec(tmp_path, seeds=1), str(tmp_path / "r"))
  ready = [str(tmp_path / f"ready-{r.index}") for r in sweep.runs]

  def command(run):  # a run that, on SIGTERM, "writes its checkpoint" (a file) and exits 0
    code = ("import os, signal, sys, time\n"
            f"def stop(*_):\n  open({str(tmp_path / 'stopped-')!r} + '{run.index}', 'w').close(); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            f"open({ready[run.index]!r}, 'w').close()\n"
            "time.sleep(60)\n")
    return [sys.executable, "-c", code]

  def interrupt():  # once both runs are up: what a scheduler's SIGTERM to the sweep does
    while not all(os.path.exists(p) for p in ready):
      threading.Event().wait(0.05)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=interrupt, daemon=True).start()
  lines = []
  with pytest.raises(KeyboardInterrupt):
    runner.run_local(sweep.runs, parallel=2, say=lines.append, command=command)
  assert all((tmp_path / f"stopped-{r.index}").exists() for r in sweep.runs)
  assert lines == ["txf: interrupted: stopping 2 run(s) at a checkpoint; run the same command to resume"]
  assert signal.getsignal(signal.SIGTERM) is not runner._raise_interrupt  # the handler is put back


# -- the report ---------------------------------------------------------------------------------------

def test_run_values_final_min_max_and_a_relogged_step_keeps_its_last_value(tmp_path):
  run = grid.Run(0, "a", 0, str(tmp_path / "w"), "", 6, [])
  # a resumed run re-logs step 6 after its checkpoint at 3: the last row counts
  fake_run(run.workdir, 6, rows_of([(3, 2.0), (6, 9.0), (6, 1.5)]) + rows_of([(6, 0.1)], "train"))
  assert report.run_value(run, "eval/loss", "final") == (1.5, "")
  assert report.run_value(run, "eval/loss", "max") == (2.0, "")
  assert report.run_value(run, "train/loss", "min") == (0.1, "")
  assert report.run_value(run, "eval/bleu", "final") == (None, "no eval/bleu at step 6")
  missing = grid.Run(0, "a", 0, str(tmp_path / "x"), "", 6, [])
  assert report.run_value(missing, "eval/loss", "final") == (None, "not run")


def test_each_arms_curve_is_the_mean_of_its_runs_at_each_step_with_a_student_t_band(tmp_path):
  """curve_bands / report_curves.csv against scipy's t interval; a step only some seeds reached
  (a run cut short) has their n; an arm with one run has its mean and no band."""
  sweep = grid.load_sweep(write_spec(tmp_path, seeds=3), str(tmp_path / "r"))
  curves = {("base", 0): [(2, 3.0), (4, 2.0), (6, 1.5)], ("base", 1): [(2, 3.4), (4, 2.6), (6, 1.9)],
            ("base", 2): [(2, 2.9), (4, 2.3)], ("rms", 0): [(2, 3.1), (4, 2.2), (6, 1.2)]}
  for run in sweep.runs:
    if (run.arm, run.seed) in curves:
      fake_run(run.workdir, 6, rows_of(curves[(run.arm, run.seed)]))
  base, rms = report.curve_bands(sweep, "eval/loss")
  assert base.arm == "base" and list(base.steps) == [2, 4, 6] and list(rms.steps) == [2, 4, 6]
  for i, step in enumerate((2, 4, 6)):
    values = [v for seed in range(3) for s, v in curves.get(("base", seed), []) if s == step]
    lo, hi = scipy_stats.t.interval(0.95, len(values) - 1, loc=np.mean(values),
                                    scale=scipy_stats.sem(values))
    assert base.summaries[i].n == len(values) == (3 if step < 6 else 2)
    assert base.column("mean")[i] == pytest.approx(np.mean(values), rel=1e-12)
    assert (base.column("ci_low")[i], base.column("ci_high")[i]) == pytest.approx((lo, hi), rel=1e-9)
  assert list(rms.column("mean")) == [3.1, 2.2, 1.2] and np.isnan(rms.column("ci_low")).all()
  table = list(csv.DictReader(io.StringIO(report.curves_csv_text(sweep, ["eval/loss"]))))
  assert len(table) == 6 and table[2]["arm"] == "base" and table[2]["step"] == "6"
  assert table[2]["n"] == "2" and float(table[2]["mean"]) == pytest.approx(1.7)


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_the_report_table_csv_and_figure_from_fake_runs(tmp_path):
  sweep = grid.load_sweep(write_spec(tmp_path, seeds=3), str(tmp_path / "r"))
  values = {("base", 0): 2.0, ("base", 1): 2.2, ("base", 2): 2.1, ("rms", 0): 1.8, ("rms", 1): 1.95}
  for run in sweep.runs:
    if (run.arm, run.seed) in values:
      v = values[(run.arm, run.seed)]
      fake_run(run.workdir, 6, rows_of([(3, v + 1), (6, v)]) + rows_of([(2, v + 2), (6, v + 0.5)], "train"))
  grid.write_sweep(sweep)
  r = run_txf("sweep", "report", sweep.root)
  assert r.returncode == 0, r.stderr
  text = open(os.path.join(sweep.root, "report.md")).read()
  assert text in r.stdout
  base, rms = [2.0, 2.2, 2.1], [1.8, 1.95]
  rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
          for line in text.splitlines() if line.startswith("| ") and "---" not in line}
  assert rows["base"][:3] == ["3", f"{np.mean(base):.4g}", f"{np.std(base, ddof=1):.4g}"]
  assert rows["rms"][:3] == ["2", f"{np.mean(rms):.4g}", f"{np.std(rms, ddof=1):.4g}"]
  ref = scipy_stats.ttest_ind(rms, base, equal_var=False)
  assert rows["rms"][4] == f"{np.mean(rms) - np.mean(base):.4g}" and rows["rms"][6] == f"{ref.pvalue:.3g}"
  assert "- rms/seed-2: not run" in text
  table = list(csv.DictReader(io.StringIO(open(os.path.join(sweep.root, "report.csv")).read())))
  assert [t["arm"] for t in table] == ["base", "rms"]
  assert float(table[1]["p"]) == pytest.approx(ref.pvalue, rel=1e-9)
  assert table[1]["missing"] == "2:not run" and table[0]["values"] == "0:2.0;1:2.2;2:2.1"
  with open(os.path.join(sweep.root, "report.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


# -- the command ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields,message", [
    (None, "no sweep file"),
    ({"arms": {"a": {"model.d_modle": 8}}}, "unknown config field 'model.d_modle' in arm 'a'"),
    ({"baseline": "nope"}, "unknown baseline arm 'nope'"),
])
@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_the_command_refuses_a_bad_sweep_with_one_line_and_exit_2(tmp_path, fields, message):
  path = str(tmp_path / "missing.json") if fields is None else write_spec(tmp_path, **fields)
  r = run_txf("sweep", path, "--root", str(tmp_path / "r"))
  assert r.returncode == 2, r.stderr
  lines = [line for line in r.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("txf: error: ") and message in lines[0], r.stderr
  assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_tiny_sweep_end_to_end_through_the_cli(tmp_path):
  path = write_spec(tmp_path, overrides=TINY)
  root = str(tmp_path / "root")
  ledger = str(tmp_path / "ledger.jsonl")
  r = run_txf("sweep", path, "--root", root, "--parallel", "2", "--ledger", ledger, timeout=600)
  assert r.returncode == 0, r.stdout + r.stderr
  assert sum("done in" in line for line in r.stdout.splitlines()) == 4
  assert len(open(ledger).readlines()) == 4   # each run recorded as it finished
  for arm in ("base", "rms"):
    for seed in (0, 1):
      workdir = os.path.join(root, arm, f"seed-{seed}")
      config = json.load(open(os.path.join(workdir, workdir_lib.CONFIG_FILE)))
      assert config["seed"] == seed and config["num_train_steps"] == 6
      assert config["model"]["norm"] == ("rms_norm" if arm == "rms" else "layer_norm")
      assert os.path.isfile(os.path.join(workdir, "params.msgpack"))
  text = open(os.path.join(root, "report.md")).read()
  assert "| base | 2 |" in text and "| rms | 2 |" in text and "Missing" not in text
  assert len(list(csv.DictReader(open(os.path.join(root, "report.csv"))))) == 2
  assert os.path.getsize(os.path.join(root, "report.png")) > 1000
  again = run_txf("sweep", path, "--root", root, "--parallel", "2")  # everything is complete
  assert again.returncode == 0 and again.stdout.count("complete, skipped") == 4, again.stderr
  # the workdirs gone (another machine): the ledger gives the same report, and nothing is trained
  shutil.rmtree(root)
  from_ledger = run_txf("sweep", path, "--root", root, "--ledger", ledger)
  assert from_ledger.returncode == 0 and from_ledger.stdout.count("recorded in") == 4, from_ledger.stderr
  # the first report checked the runs on disk against their records; this one has only records
  against = (f"\nAgainst the ledger ({ledger}): 4 of 4 runs both on disk and recorded end with the "
             f"final parameters their records name (sha256), bit for bit.\n")
  assert text.endswith(against)
  assert open(os.path.join(root, "report.md")).read() == text[:-len(against)]


# -- Weights & Biases ------------------------------------------------------------------------------------

@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_tracker_wandb_without_the_package_is_one_error_naming_the_extra(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails, find_spec finds nothing
  config = config_lib.load_experiment(COPY)
  config.tracker = "wandb"
  with pytest.raises(config_lib.ConfigError, match=r"pip install 'txf\[wandb\]'"):
    config_lib.validate(config)
  code = ("import sys; sys.modules['wandb'] = None\nfrom txf import cli\n"
          f"cli.main(['txf', 'train', '--config', {COPY!r}, '--workdir', {str(tmp_path / 'w')!r}, "
          "'--config.tracker=wandb'])\n")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert r.returncode == 2, r.stderr
  lines = [line for line in r.stderr.splitlines() if line.strip()]
  assert lines == ["txf: error: tracker='wandb' needs the wandb package, which is not installed: "
                   "pip install 'txf[wandb]' (or set tracker=none)"]


def test_wandb_offline_logs_the_metric_rows_and_a_resumed_run_keeps_its_id(tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
  monkeypatch.setenv("WANDB_SILENT", "true")
  (tmp_path / "wandb-dir").mkdir()
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  writer = MetricWriter(workdir, tensorboard=False, tracker="wandb",
                        run_config={"model": {"d_model": 32}, "seed": 0})
  writer.write(2, "train", {"loss": 2.5})
  writer.write(2, "eval", {"loss": 2.75, "bleu": 1.0})
  writer.close()
  run_id = json.load(open(os.path.join(workdir, workdir_lib.WANDB_RUN_FILE)))["id"]
  runs = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
  assert len(runs) == 1 and runs[0].name.endswith("-" + run_id)
  keys = (b"train/loss", b"eval/loss", b"eval/bleu", b"d_model")
  deadline = time.time() + 30  # wandb's service process may still be writing the records file
  while True:
    data = (runs[0] / f"run-{run_id}.wandb").read_bytes()
    if all(key in data for key in keys) or time.time() > deadline:
      break
    time.sleep(0.2)
  for key in keys:
    assert key in data  # the rows' keys and the config are in the offline run's records
  # the same rows went to metrics.jsonl
  assert [json.loads(l)["split"] for l in open(os.path.join(workdir, "metrics.jsonl"))] == ["train", "eval"]
  resumed = MetricWriter(workdir, tensorboard=False, tracker="wandb", run_config={})
  resumed.write(4, "train", {"loss": 2.0})
  resumed.close()
  runs = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
  assert len(runs) == 2 and all(r.name.endswith("-" + run_id) for r in runs)
  assert not MetricWriter(str(tmp_path / "other"), enabled=False, tracker="wandb")._wandb  # process != 0


def test_wandb_online_without_a_login_is_one_user_error(tmp_path):
  pytest.importorskip("wandb")
  # a fresh process (wandb keeps its settings per process); no key, no ~/.netrc
  env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_API_KEY")}
  env.update(HOME=str(tmp_path), WANDB_DIR=str(tmp_path), PYTHONPATH=ROOT)
  code = ("from txf.core.errors import TxfError\nfrom txf.train.metrics import MetricWriter\ntry:\n"
          f"  MetricWriter({str(tmp_path)!r}, tensorboard=False, tracker='wandb')\n"
          "except TxfError as e:\n  print(e)\n")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                     cwd=str(tmp_path), timeout=120)
  assert r.returncode == 0, r.stderr
  assert "tracker='wandb': wandb.init failed: " in r.stdout and "WANDB_MODE=offline" in r.stdout


@pytest.mark.slow
def test_a_training_with_tracker_wandb_logs_offline_and_its_resumption_continues_the_run(tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  from tests.conftest import apply_overrides
  from txf.train import train
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.delenv("WANDB_DIR", raising=False)  # default: the workdir
  config = apply_overrides(config_lib.load_experiment(COPY), {**TINY, "num_train_steps": 3,
                                                              "tracker": "wandb"})
  workdir = str(tmp_path / "run")
  train(config, workdir)
  run_id = json.load(open(os.path.join(workdir, workdir_lib.WANDB_RUN_FILE)))["id"]
  first = sorted((tmp_path / "run" / "wandb").glob("offline-run-*"))
  assert len(first) == 1 and first[0].name.endswith("-" + run_id)
  data = (first[0] / f"run-{run_id}.wandb").read_bytes()
  assert b"train/loss" in data and b"eval/loss" in data and b"eval/bleu" in data
  config.num_train_steps = 6  # train on: the same workdir resumes from step 3
  train(config, workdir)
  runs = sorted((tmp_path / "run" / "wandb").glob("offline-run-*"))
  assert len(runs) == 2 and all(r.name.endswith("-" + run_id) for r in runs)
  assert json.load(open(os.path.join(workdir, workdir_lib.WANDB_RUN_FILE)))["id"] == run_id


def test_cpu_shares_split_the_cores_evenly_and_refuse_more_runs_than_cores():
  assert runner.cpu_shares(2, [0, 1]) == ["0", "1"]
  assert runner.cpu_shares(2, [3, 0, 2, 1, 4]) == ["0,1", "2,3"]   # the odd core left out
  assert runner.cpu_shares(1, [0, 1, 2]) == ["0,1,2"]
  with pytest.raises(grid.SweepError, match=r"--parallel=3: this process may run on 2 CPUs"):
    runner.cpu_shares(3, [0, 1])


def test_run_local_gives_each_running_run_a_share_no_other_running_run_holds(tmp_path):
  sweep = grid.load_sweep(write_spec(tmp_path, seeds=3), str(tmp_path / "r"))
  spans = os.path.join(tmp_path, "spans")

  def command(run):  # writes (share, start, end) and finishes as `txf train` would
    code = (f"import os, time\nstart = time.time(); time.sleep(0.3)\n"
            f"open({spans!r}, 'a').write(f\"{{os.environ['TXF_CPUS']}} {{start}} {{time.time()}}\\n\")\n"
            f"os.makedirs({os.path.join(run.workdir, 'checkpoints', '6')!r})\n"
            f"open({os.path.join(run.workdir, 'params.msgpack')!r}, 'wb').close()\n")
    return [sys.executable, "-c", code]

  outcomes = runner.run_local(sweep.runs, parallel=2, say=lambda _: None, command=command,
                              cpus=["0", "1"])
  assert [o.status for o in outcomes] == ["done"] * 6
  rows = [line.split() for line in open(spans).read().splitlines()]
  assert len(rows) == 6 and {share for share, _, _ in rows} == {"0", "1"}
  for i, (share, start, end) in enumerate(rows):   # two runs that overlap hold different shares
    for other, o_start, o_end in rows[i + 1:]:
      if float(start) < float(o_end) and float(o_start) < float(end):
        assert share != other, rows
