"""A sweep of several metrics beside published numbers (txf.sweep.reference): the sweep file's
``metrics`` and ``reference`` checked, the direction rules on hand-worked cases, the parameter count
against a hand count of the encoder-decoder, the multi-metric report against scipy's Welch test on
fake runs, one real tiny sweep through the CLI (slow tier) checked against the runs' own
metrics.jsonl and params.msgpack, and the shipped Table 3 sweep (slow tier: 17 arms' configs).
"""

import csv
import json
import math
import os

import numpy as np
import pytest
from scipy import stats as scipy_stats

from tests.conftest import EXPERIMENTS, ROOT, run_txf
from txf.sweep import grid, reference, report
from txf.sweep.grid import SweepError

COPY = os.path.join(ROOT, "experiments", "copy.py")
TINY = {"log_every": 2, "eval_every": 3, "checkpoint_every": 3, "decode_examples": 4, "num_samples": 0,
        "eval_batches": 1, "model.d_model": 32, "model.d_ff": 64}
METRICS = ["eval/loss", "eval/perplexity"]
REFERENCE = {"_source": "a made-up table", "base": {"row": "base", "params": 1000},
             "small": {"row": "(X) d_k 8", "eval/loss": 0.3, "eval/perplexity": 0.5, "params": 900}}


def write_spec(tmp_path, **fields):
  spec = {"config": COPY, "arms": {"base": {}, "small": {"model.head_dim": 8}}, "seeds": 3,
          "steps": 6, "metrics": METRICS, "reference": REFERENCE, **fields}
  spec = {k: v for k, v in spec.items() if v is not None}
  path = tmp_path / "s.json"
  path.write_text(json.dumps(spec))
  return str(path)


def fake_run(workdir, steps, loss, perplexity, vocab=12):
  """A complete `txf train` workdir: metrics.jsonl (eval loss and perplexity at the last step),
  checkpoints/<steps>/, params.msgpack and the task's sizes (task.json)."""
  os.makedirs(os.path.join(workdir, "checkpoints", str(steps)))
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": steps, "split": "eval", "loss": loss, "perplexity": perplexity}) + "\n")
  open(os.path.join(workdir, "params.msgpack"), "wb").close()
  with open(os.path.join(workdir, "task.json"), "w") as f:
    json.dump({"vocab_size": vocab, "target_vocab_size": 0, "num_classes": 0}, f)


def encoder_decoder_params(V, d, ff, h, dk, enc, dec):
  """A hand count of txf's post-LN encoder-decoder with one shared embedding table: attention
  4 d h d_k (no biases), FFN 2 d ff + ff + d, LayerNorms 2 d each (2 per encoder layer, 3 per
  decoder layer), no final norms."""
  attn, ffn, ln = 4 * d * h * dk, 2 * d * ff + ff + d, 2 * d
  return V * d + enc * (attn + ffn + 2 * ln) + dec * (2 * attn + ffn + 3 * ln)


# -- the sweep file ---------------------------------------------------------------------------------------

def test_metrics_and_reference_are_read_and_an_old_sweep_json_still_loads(tmp_path):
  sweep = grid.load_sweep(write_spec(tmp_path), str(tmp_path / "r"))
  assert sweep.metric == "eval/loss" and sweep.compared == METRICS
  assert sweep.reference["small"]["eval/perplexity"] == 0.5
  # metric given too: it comes first
  sweep = grid.load_sweep(write_spec(tmp_path, metric="eval/perplexity"), str(tmp_path / "r"))
  assert sweep.compared == ["eval/perplexity", "eval/loss"]
  # a sweep.json from before metrics and reference existed compares its one metric
  old = {k: v for k, v in sweep.to_dict().items() if k not in ("metrics", "reference")}
  back = grid.Sweep.from_dict(old)
  assert back.compared == ["eval/perplexity"] and back.reference == {}


@pytest.mark.parametrize("fields,message", [
    ({"metrics": "eval/loss"}, "metrics must be a list"),
    ({"metrics": ["eval/loss", "eval/nope"], "reference": {}}, "metric 'eval/nope' is never logged"),
    ({"reference": {"other": {}}}, "reference names arm 'other'"),
    ({"reference": {"small": {"eval/bleu": 1.0}}}, "not a compared metric"),
    ({"reference": {"small": {"eval/loss": "big"}}}, "must be a number or None"),
    ({"reference": {"_source": 3}}, "_source must be a string"),
])
def test_a_bad_metrics_or_reference_is_one_sweep_error(tmp_path, fields, message):
  with pytest.raises(SweepError, match=message):
    grid.load_sweep(write_spec(tmp_path, **fields), str(tmp_path / "r"))


# -- the direction and the parameters --------------------------------------------------------------------

@pytest.mark.parametrize("published,diff,lo,hi,expected", [
    (-0.9, -1.5, -2.0, -1.0, "agrees"),                       # interval below 0, paper down
    (-0.9, 1.5, 1.0, 2.0, "disagrees"),                       # interval above 0, paper down
    (0.4, 0.2, -0.3, 0.7, "same sign, within noise"),
    (0.4, -0.2, -0.7, 0.3, "opposite sign, within noise"),
    (0.0, 0.1, -0.5, 0.7, "agrees"),                          # the paper saw no change, nor do we
    (0.0, 1.1, 0.5, 1.7, "differs (published: none)"),
    (None, 1.0, 0.5, 1.5, ""),
    (-0.7, 0.0, 0.0, 0.0, "no change here"),                 # every seed scored the same
    (0.3, 1.0, math.nan, math.nan, "n/a"),                    # one seed: no interval
])
def test_the_verdict_on_hand_worked_cases(published, diff, lo, hi, expected):
  assert reference.verdict(published, diff, lo, hi) == expected


def test_one_far_arm_is_drawn_at_the_edge_and_the_axis_fits_the_others():
  # Table 3's doubled dropout: |-28.7| against the next arm's 11.0 (> 2.5x): the axis spans 1.15 x 11.0
  assert reference.axis_half_width([2.7, 11.0, 31.2, 4.1]) == pytest.approx(1.15 * 11.0)
  assert reference.axis_half_width([2.7, 11.0, 27.0, 4.1]) is None   # 2.45x: every arm fits
  assert reference.axis_half_width([5.0]) is None and reference.axis_half_width([9.0, 0.0]) is None
  assert reference.axis_half_width([float("nan"), 1.0, 30.0]) == pytest.approx(1.15)


def test_parameters_counted_from_the_config_match_a_hand_count(tmp_path):
  spec = write_spec(tmp_path, overrides={"model.d_model": 32, "model.d_ff": 48},
                    arms={"base": {}, "small": {"model.head_dim": 8}, "deep": {"model.num_encoder_layers": 3}})
  sweep = grid.load_sweep(spec, str(tmp_path / "r"), )
  fake_run(sweep.runs[0].workdir, 6, 1.0, 2.0, vocab=13)  # base: the vocabulary its run recorded
  # copy.py: 2 heads, 1 + 1 layers; no run of the others: data.vocab_size (8000), as txf plan
  assert reference.arm_params(sweep, "base") == encoder_decoder_params(13, 32, 48, 2, 16, 1, 1)
  assert reference.arm_params(sweep, "small") == encoder_decoder_params(8000, 32, 48, 2, 8, 1, 1)
  assert reference.arm_params(sweep, "deep") == encoder_decoder_params(8000, 32, 48, 2, 16, 3, 1)


# -- the report -------------------------------------------------------------------------------------------

@pytest.mark.slow  # two figures and an abstract model build: a few seconds
def test_the_report_of_two_metrics_beside_the_reference_matches_scipy_welch(tmp_path):
  sweep = grid.load_sweep(write_spec(tmp_path), str(tmp_path / "r"))
  loss = {"base": [2.0, 2.2, 2.1], "small": [2.5, 2.6, 2.45]}
  ppl = {"base": [7.0, 7.5, 7.2], "small": [6.9, 7.6, 7.0]}
  for run in sweep.runs:
    fake_run(run.workdir, 6, loss[run.arm][run.seed], ppl[run.arm][run.seed])
  text, paths = report.write_report(sweep)
  ref_loss = scipy_stats.ttest_ind(loss["small"], loss["base"], equal_var=False)
  ref_ppl = scipy_stats.ttest_ind(ppl["small"], ppl["base"], equal_var=False)
  # one table per metric: the primary as before, then a section for perplexity
  assert "## eval/perplexity (at the last step)" in text
  perplexity_part = text.split("## eval/perplexity")[1].split("## Beside")[0]
  line = next(l for l in perplexity_part.splitlines() if l.startswith("| small |"))
  row = [c.strip() for c in line.split("|")[1:-1]]
  assert row[0] == "small" and row[7] == f"{ref_ppl.pvalue:.3g}"
  assert row[5] == f"{np.mean(ppl['small']) - np.mean(ppl['base']):.4g}"
  # every metric in one CSV
  table = list(csv.DictReader(open(paths["metrics_csv"])))
  assert [(t["metric"], t["arm"]) for t in table] == [(m, a) for m in METRICS for a in ("base", "small")]
  assert float(table[1]["p"]) == pytest.approx(ref_loss.pvalue, rel=1e-9)
  assert float(table[3]["p"]) == pytest.approx(ref_ppl.pvalue, rel=1e-9)
  # beside the reference: the published delta, the Welch difference, its interval, p, direction
  rows = {(r["arm"], r["metric"]): r for r in csv.DictReader(open(paths["reference_csv"]))}
  r = rows[("small", "eval/loss")]
  dof = ref_loss.df  # scipy >= 1.11 gives the Welch-Satterthwaite dof
  se = (np.mean(loss["small"]) - np.mean(loss["base"])) / ref_loss.statistic
  half = scipy_stats.t.ppf(0.975, dof) * se
  assert float(r["published"]) == 0.3 and float(r["p"]) == pytest.approx(ref_loss.pvalue, rel=1e-9)
  assert float(r["ci_low"]) == pytest.approx(float(r["diff"]) - half, rel=1e-9)
  assert float(r["ci_high"]) == pytest.approx(float(r["diff"]) + half, rel=1e-9)
  assert float(r["ci_low"]) > 0 and r["verdict"] == "agrees"   # loss: 0.42 higher, clearly
  p = rows[("small", "eval/perplexity")]
  # perplexity: 0.067 lower here, within noise, the published delta +0.5
  assert float(p["published"]) == 0.5 and p["verdict"] == "opposite sign, within noise"
  base = rows[("base", "")]
  assert int(base["published_params"]) == 1000
  assert int(base["params"]) == encoder_decoder_params(12, 64, 128, 2, 32, 1, 1)
  assert "| small | (X) d_k 8 | +0.3 |" in text and "a made-up table" in text
  with open(paths["reference_png"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_tiny_two_metric_sweep_with_a_reference_end_to_end_through_the_cli(tmp_path):
  path = write_spec(tmp_path, overrides=TINY, seeds=2,
                    metrics=["eval/bleu", "eval/perplexity"],
                    reference={"small": {"row": "(B)", "eval/bleu": -0.7, "eval/perplexity": 0.24}})
  root = str(tmp_path / "root")
  r = run_txf("sweep", path, "--root", root, "--parallel", "2", timeout=600)
  assert r.returncode == 0, r.stdout + r.stderr
  values = {}
  for arm in ("base", "small"):
    for seed in (0, 1):
      rows = [json.loads(line) for line in open(os.path.join(root, arm, f"seed-{seed}", "metrics.jsonl"))]
      last = [row for row in rows if row["split"] == "eval" and row["step"] == 6][-1]
      values.setdefault(arm, []).append((last["bleu"], last["perplexity"], math.exp(last["nll"])))
  for arm in values:  # perplexity is exp of the unsmoothed NLL
    assert all(v[1] == pytest.approx(v[2], rel=1e-9) for v in values[arm])
  rows = {(r["arm"], r["metric"]): r for r in csv.DictReader(open(os.path.join(root, "reference.csv")))}
  for i, metric in enumerate(["eval/bleu", "eval/perplexity"]):
    a = [v[i] for v in values["small"]]
    b = [v[i] for v in values["base"]]
    got = rows[("small", metric)]
    assert float(got["diff"]) == pytest.approx(np.mean(a) - np.mean(b), rel=1e-9, abs=1e-12)
    if np.var(a) + np.var(b) > 0:
      ref = scipy_stats.ttest_ind(a, b, equal_var=False)
      assert float(got["p"]) == pytest.approx(ref.pvalue, rel=1e-9)
  # the counted parameters are those the run trained
  from flax import serialization  # pylint: disable=import-outside-toplevel
  with open(os.path.join(root, "small", "seed-0", "params.msgpack"), "rb") as f:
    trained = serialization.msgpack_restore(f.read())
  import jax  # pylint: disable=import-outside-toplevel
  assert int(rows[("small", "eval/bleu")]["params"]) == sum(
      int(np.size(x)) for x in jax.tree_util.tree_leaves(trained))
  text = open(os.path.join(root, "report.md")).read()
  assert "## eval/perplexity" in text and "## Beside the published numbers" in text
  assert os.path.getsize(os.path.join(root, "reference.png")) > 1000


@pytest.mark.slow  # 17 arms' configs built and checked
def test_the_table3_sweep_expands_to_51_runs_with_the_papers_deltas(tmp_path):
  sweep = grid.load_sweep(os.path.join(EXPERIMENTS, "sweeps", "table3.py"), str(tmp_path / "r"))
  assert len(sweep.arms) == 17 and len(sweep.runs) == 51 and sweep.baseline == "base"
  assert sweep.compared == ["eval/bleu", "eval/perplexity"]
  config = grid.build_config(sweep, "A_h8", 0)
  assert (config.beam_size, config.alpha, config.length_penalty, config.decode_examples) == (4, 0.6, "gnmt", 1014)
  assert config.eval_every == config.num_train_steps and config.model.num_heads == 8
  # the paper's (A) h=1 row: 24.9 BLEU, 5.29 PPL against the base's 25.8 and 4.92
  assert sweep.reference["A_h1"]["eval/bleu"] == pytest.approx(-0.9)
  assert sweep.reference["A_h1"]["eval/perplexity"] == pytest.approx(0.37)
  assert sweep.reference["C_d256"]["params"] == 168_000_000
