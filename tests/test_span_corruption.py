"""model.family span_corruption end to end on a small text file written here: a 20-step CLI train
whose loss falls, its exact resume (10 steps, then on to 20 on a fresh copy of its data, equal to
the 20-step run bit for bit),
``txf generate`` filling a sentinel, and the one-line error for a tokenizer without sentinels."""

import json
import os
import re
import shutil

import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from tests.conftest import run_txf
from tests.test_checkpoint_resume import _assert_same_run
from txf.runtime import workdir as workdir_lib

pytestmark = pytest.mark.slow

WORDS = ("a man woman dog child rides walks runs on the street beach bike red blue small big "
         "with near two people are playing in park water ball").split()


def _text(n, seed):
  """``n`` short sentences of WORDS, a fixed pseudo-random sequence (no global RNG)."""
  lines, x = [], seed
  for _ in range(n):
    words = []
    for _ in range(6 + x % 5):
      x = (x * 1103515245 + 12345) % 2 ** 31
      words.append(WORDS[x % len(WORDS)])
    lines.append(" ".join(words) + " .")
  return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("span_data")
  os.makedirs(root / "tiny")
  (root / "tiny" / "train.txt").write_text(_text(1500, 1))
  (root / "tiny" / "val.txt").write_text(_text(60, 2))
  return root


def _args(data, workdir, steps, *extra):
  return ["train", "--config", "experiments/default.py", "--workdir", str(workdir),
          "--progress=false", "--config.model.family=span_corruption",
          f"--config.data.source=text:{data}/tiny", "--config.data.format=plain",
          "--config.data.tokenizer=sentencepiece", "--config.data.vocab_size=300",
          "--config.pretrain.num_sentinels=16", f"--config.data.data_dir={data}/tfds",
          "--config.data.max_input_len=24", "--config.model.d_model=32", "--config.model.d_ff=64",
          "--config.model.num_heads=2", "--config.model.num_encoder_layers=1",
          "--config.model.num_decoder_layers=1", "--config.model.max_len=32",
          "--config.model.dropout_rate=0.1", "--config.batch_size=8", "--config.log_every=5",
          "--config.eval_every=10", "--config.checkpoint_every=10", "--config.eval_batches=1",
          "--config.decode_examples=0", "--config.num_samples=0",
          "--config.optimizer.warmup_steps=10", f"--config.num_train_steps={steps}", *extra]


def _train(*args, env=None):
  proc = run_txf(*args, env=env)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  return proc


def _train_losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r["loss"] for r in map(json.loads, f) if r["split"] == "train"]


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("span_run") / "run"
  _train(*_args(data, workdir, 20))
  return workdir


def test_loss_falls(run):
  losses = _train_losses(run)
  assert len(losses) == 4 and losses[-1] < losses[0] - 0.3, losses


def test_a_run_resumes_on_a_fresh_copy_of_its_data(data, run, tmp_path):
  """The data root copied elsewhere (new mtimes, a new path; the config names the dataset under
  TXF_DATA) holds the same data: the run resumes on it and equals the uninterrupted one."""
  first, copy = tmp_path / "first", tmp_path / "copy"
  shutil.copytree(data / "tiny", first / "tiny", copy_function=shutil.copy2)
  shutil.copytree(data / "tiny", copy / "tiny", copy_function=shutil.copy)   # new mtimes
  workdir = tmp_path / "resumed"
  args = lambda steps: [a.replace(f"text:{data}/tiny", "text:tiny").replace(
      f"data_dir={data}/tfds", f"data_dir={tmp_path}/tfds") for a in _args(data, workdir, steps)]
  _train(*args(10), env={"TXF_DATA": str(first)})
  proc = _train(*args(20), env={"TXF_DATA": str(copy)})
  assert "resumed from the checkpoint at step 10" in proc.stdout
  _assert_same_run(str(workdir), str(run))


def test_generate_fills_the_sentinel(run):
  proc = run_txf("generate", "--workdir", str(run), "--prompt", "a man <extra_id_0> the beach .")
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout.strip().splitlines()[-1]
  # <extra_id_0> is always the targets' first token: even 20 steps learn it, so it is replaced
  assert "<extra_id_0>" not in out and re.fullmatch(r"a man .*the beach \.", out), out


def test_tokenizer_without_sentinels_is_one_error(data, tmp_path):
  proc = run_txf(*_args(data, tmp_path / "char", 2, "--config.data.tokenizer=char"))
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith("txf: error: model.family='span_corruption'")


def test_too_small_a_vocabulary_for_the_sentinels_is_one_error(data, tmp_path):
  proc = run_txf(*_args(data, tmp_path / "small", 2, "--config.pretrain.num_sentinels=100"))
  assert proc.returncode == 2
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("txf: error: data.vocab_size=300 leaves 200 sentencepiece pieces"), last


def test_fine_tune_into_translation(data, run, tmp_path):
  """init_from a span_corruption run into an encoder_decoder on parallel text: every parameter is
  loaded (the same module), none new or dropped; the run translates with the span run's tokenizer
  (sentinels included), and a learning rate of 1e-30 leaves the parameters where they were."""
  pairs = tmp_path / "pairs"
  pairs.mkdir()
  for split, seed in (("train", 3), ("val", 4)):
    (pairs / f"{split}.en").write_text(_text(40, seed))
    (pairs / f"{split}.de").write_text(_text(40, seed + 10))
  workdir = tmp_path / "translate"
  proc = _train("train", "--config", "experiments/default.py", "--workdir", str(workdir),
                "--progress=false", f"--config.init_from={run}", f"--config.data.source=text:{pairs}",
                "--config.data.format=parallel", f"--config.data.data_dir={tmp_path}/tfds",
                "--config.data.max_input_len=24", "--config.data.max_target_len=24",
                "--config.data.truncate=True",
                "--config.batch_size=8", "--config.num_train_steps=2", "--config.eval_every=0",
                "--config.checkpoint_every=0", "--config.decode_examples=0",
                "--config.num_samples=0", "--config.optimizer.schedule=constant",
                "--config.optimizer.learning_rate=1e-30", "--config.optimizer.warmup_steps=1")
  report = json.loads((workdir / "init_from.json").read_text())
  source = {"/".join(k): v for k, v in flatten_dict(workdir_lib.load_params(str(run))).items()}
  tuned = {"/".join(k): v for k, v in flatten_dict(workdir_lib.load_params(str(workdir))).items()}
  assert report["new"] == [] and report["dropped"] == [] and report["loaded"] == sorted(source)
  assert f"{len(source)} parameters loaded, 0 new (-), 0 dropped (-)" in proc.stdout
  assert workdir_lib.load_config(str(workdir)).model.family == "encoder_decoder"
  for key in source:
    np.testing.assert_allclose(tuned[key], source[key], rtol=0, atol=1e-25)
