"""txf classify: label<TAB>probability per input line from a trained encoder_classifier run.

A tiny classifier learns 'dog in the sentence' (tests/test_data_fixtures.tsv_dir) once per module;
its predictions through txf.inference.classify_lines are checked against the data's own rule and
against the training loop's evaluation, which batches and pools through a different path.
"""

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from test_data_fixtures import config_for, sentences, tsv_dir, write_lines
from txf import inference
from txf.core.errors import TxfError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
  from txf.train import train
  root = tmp_path_factory.mktemp("classify")
  cfg = config_for(f"text:{tsv_dir(root / 'tsv', n_train=400)}", root / "tfds", "encoder_classifier",
                   "tsv", eval_split="dev", test_split="dev")
  cfg.model.update(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=0,
                   dropout_rate=0.0, max_len=32)
  cfg.optimizer.update(warmup_steps=20, learning_rate_scale=0.2, label_smoothing=0.0)
  cfg.update(num_train_steps=150, batch_size=16, eval_every=0, checkpoint_every=0, eval_batches=0,
             decode_examples=0, num_samples=0)
  workdir = str(root / "run")
  train(cfg, workdir)
  return workdir


def _dev_rows(workdir):
  config = json.load(open(os.path.join(workdir, "config.json")))
  path = os.path.join(config["data"]["source"].split(":", 1)[1], "dev.tsv")
  return [line.split("\t") for line in open(path, encoding="utf-8").read().splitlines()]


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_classify_agrees_with_the_rule_and_with_the_training_loops_evaluation(classifier_run):
  run = inference.load_run(classifier_run)
  held_out, _ = sentences(60, seed=7)
  probs = inference.classify_lines(run, held_out, batch_size=8)
  assert all(p.shape == (2,) and abs(p.sum() - 1.0) < 1e-5 and (p >= 0).all() for p in probs)
  predicted = np.array([int(p.argmax()) for p in probs])
  truth = np.array([int("dog" in s) for s in held_out])
  assert 0 < truth.sum() < len(truth)  # both classes are present
  assert (predicted == truth).mean() >= 0.9, (predicted, truth)
  # The loop's final dev accuracy counts the same predictions, batched by the data pipeline.
  rows = _dev_rows(classifier_run)
  dev = inference.classify_lines(run, [text for text, _ in rows], batch_size=5)
  accuracy = np.mean([int(p.argmax()) == int(label) for p, (_, label) in zip(dev, rows)])
  evals = [json.loads(l) for l in open(os.path.join(classifier_run, "metrics.jsonl")) if '"eval"' in l]
  assert accuracy == pytest.approx(evals[-1]["accuracy"], abs=1e-6)


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_classify_command_keeps_line_count_and_empty_lines(classifier_run, tmp_path):
  lines = ["the dog runs quickly .", "", "a cat sleeps near the river .", "   "]
  path = tmp_path / "in.txt"
  write_lines(path, lines)
  out = tmp_path / "out.tsv"
  r = subprocess.run([sys.executable, "-m", "txf.cli", "classify", f"--workdir={classifier_run}",
                      f"--input={path}", f"--output={out}"], capture_output=True, text=True,
                     cwd=REPO, timeout=300, env={**os.environ, "TXF_MALLOC": "system"})
  assert r.returncode == 0, r.stderr[-2000:]
  got = open(out, encoding="utf-8").read().split("\n")[:len(lines)]
  assert got[1] == "" and got[3] == ""
  label0, p0 = got[0].split("\t")
  label2, p2 = got[2].split("\t")
  assert (label0, label2) == ("1", "0") and 0.5 <= float(p0) <= 1.0 and 0.5 <= float(p2) <= 1.0
  assert "4 lines (2 empty)" in r.stderr


def test_each_family_is_pointed_at_its_own_command():
  classifier = types.SimpleNamespace(family="encoder_classifier", workdir="runs/sst2")
  with pytest.raises(TxfError, match="needs a model.family=encoder_decoder run.*use `txf classify`"):
    inference.require_family(classifier, "encoder_decoder", "translate")
  translator = types.SimpleNamespace(family="encoder_decoder", workdir="runs/m30k")
  with pytest.raises(TxfError, match="needs a model.family=encoder_classifier run.*use `txf translate`"):
    inference.require_family(translator, "encoder_classifier", "classify")
