"""End to end through `txf train`: a tiny model learns the copy task; runs are never overwritten."""

import json
import os

import pytest

from tests.conftest import EXPERIMENTS, run_txf

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

COPY = os.path.join(EXPERIMENTS, "copy.py")


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("e2e") / "copy"
  r = run_txf("train", "--config", COPY, "--workdir", str(workdir), "--progress=false", timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
  return workdir, r


def _rows(workdir):
  with open(workdir / "metrics.jsonl") as f:
    return [json.loads(line) for line in f]


def test_tiny_model_learns_copy(copy_run):
  workdir, r = copy_run
  rows = _rows(workdir)
  evals = [x for x in rows if x["split"] == "eval"]
  assert evals and evals[-1]["exact_match"] >= 0.9, evals
  train = [x for x in rows if x["split"] == "train"]
  assert train[-1]["loss"] < train[0]["loss"] / 5
  assert {"step", "split", "loss", "accuracy", "learning_rate", "tokens_per_second"} <= set(train[0])
  assert "src:" in r.stdout and "hyp:" in r.stdout  # samples printed side by side


def test_workdir_contents(copy_run):
  workdir, _ = copy_run
  config = json.loads((workdir / "config.json").read_text())
  assert config["data"]["source"] == "synthetic:copy" and config["model"]["d_model"] == 64
  assert (workdir / "params.msgpack").stat().st_size > 0
  assert any(name.startswith("events.out.tfevents") for name in os.listdir(workdir / "tensorboard"))
  assert (workdir / "tokenizer" / "vocab.txt").exists()


def test_different_run_in_workdir_is_refused(copy_run):
  workdir, _ = copy_run
  before = (workdir / "metrics.jsonl").read_bytes()
  r = run_txf("train", "--config", COPY, "--workdir", str(workdir), "--config.model.d_model=32",
              "--config.model.num_heads=2", "--progress=false")
  assert r.returncode == 2
  assert "holds a different run" in r.stderr and "model.d_model: 64" in r.stderr
  assert (workdir / "metrics.jsonl").read_bytes() == before


def test_unknown_command_and_help():
  r = run_txf("nonsense")
  assert r.returncode == 2 and "unknown command" in r.stderr
  r = run_txf("--help")
  assert r.returncode == 0 and "train" in r.stdout


def test_time_limit_ends_training_as_a_finished_run_and_resumes(tmp_path):
  workdir = tmp_path / "limited"
  args = ("train", "--config", COPY, "--workdir", str(workdir), "--progress=false",
          "--config.num_train_steps=500", "--config.time_limit_minutes=1e-6",
          "--config.decode_examples=8")
  r = run_txf(*args, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "time limit of 1e-06 min reached: training ended after step 1 of 500" in r.stdout
  rows = _rows(workdir)
  assert [(x["step"], x["split"]) for x in rows] == [(1, "train"), (1, "eval")]
  assert (workdir / "params.msgpack").stat().st_size > 0 and (workdir / "checkpoints").is_dir()
  r = run_txf(*args, timeout=300)  # the budget counts across restarts: it is spent, nothing trains
  assert r.returncode == 0, r.stderr[-3000:]
  assert "its whole time limit of 1e-06 min (step 1 of 500)" in r.stdout
  assert "raise time_limit_minutes to train on" in r.stdout
  assert [(x["step"], x["split"]) for x in _rows(workdir)] == [(1, "train"), (1, "eval")]
  longer = args[:-3] + ("--config.num_train_steps=2", "--config.time_limit_minutes=0",
                        "--config.decode_examples=8")  # no limit: goes on from step 1 to the end
  r = run_txf(*longer, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "resumed from the checkpoint at step 1" in r.stdout
  assert [x["step"] for x in _rows(workdir) if x["split"] == "train"] == [1, 2]
