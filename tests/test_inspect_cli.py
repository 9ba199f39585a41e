"""``txf inspect`` and ``txf ablate-heads`` on a tiny trained translation run (the end-to-end
tier): the files they write, the baseline they report against ``txf eval``'s, and one error line
for bad input."""

import csv
import json
import os

import numpy as np
import pytest

from conftest import run_txf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("inspect") / "copy")
  result = run_txf("train", "--config=experiments/copy.py", f"--workdir={path}", "--progress=false",
                   "--config.num_train_steps=30", "--config.checkpoint_every=30",
                   "--config.decode_examples=10", timeout=600)
  assert result.returncode == 0, result.stderr
  return path


def test_inspect_lists_and_writes(workdir, tmp_path):
  listed = run_txf("inspect", f"--workdir={workdir}", "--list")
  assert listed.returncode == 0, listed.stderr
  names = dict(line.split("\t", 1) for line in listed.stdout.splitlines())
  assert "decoder/layer_0/cross_attention/weights" in names and "logits" in names
  out = str(tmp_path / "out")
  result = run_txf("inspect", f"--workdir={workdir}", "--input=s1 s2 s3 s4", f"--output={out}")
  assert result.returncode == 0, result.stderr
  for name in ("intermediates.npz", "attention_cross_attention.png", "logit_lens.png",
               "attention_encoder_self_attention.png", "attention_decoder_self_attention.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0
  saved = np.load(os.path.join(out, "intermediates.npz"))
  w = saved["encoder/layer_0/self_attention/weights"]
  assert w.shape[:3] == (1, 2, 5)  # 1 input, 2 heads, 4 symbols + EOS
  np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)


def test_ablate_heads_table_and_baseline(workdir, tmp_path):
  out = str(tmp_path / "abl")
  result = run_txf("ablate-heads", f"--workdir={workdir}", "--split=val", "--max_examples=20",
                   "--batch_size=10", f"--output={out}", timeout=900)
  assert result.returncode == 0, result.stderr
  rows = list(csv.DictReader(open(os.path.join(out, "heads.csv"))))
  assert rows[0]["module"] == "baseline"
  assert len(rows) == 1 + 3 * 2  # encoder self, decoder self, cross: 2 heads each
  assert {"loss", "accuracy", "exact_match", "bleu", "loss_change"} <= set(rows[0])
  for metric in ("loss", "accuracy", "exact_match", "bleu"):
    assert os.path.getsize(os.path.join(out, f"heads_{metric}.png")) > 0
  report = str(tmp_path / "eval.json")
  evaluated = run_txf("eval", f"--workdir={workdir}", "--split=val", "--max_examples=20",
                      f"--output={report}", timeout=900)
  assert evaluated.returncode == 0, evaluated.stderr
  assert float(rows[0]["loss"]) == pytest.approx(json.load(open(report))["loss"], rel=1e-5)


def test_bad_input_is_one_error_line(workdir):
  result = run_txf("inspect", f"--workdir={workdir}")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].startswith("txf: error: txf inspect needs --input")
  result = run_txf("ablate-heads", f"--workdir={workdir}", "--split=nope")
  assert result.returncode == 2 and "split 'nope'" in result.stderr
