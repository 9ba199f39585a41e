"""Masked-LM pretraining end to end (model.family=encoder_mlm): a tiny encoder trained by the CLI
on a plain text file written here (the loss falls, metrics rows hold loss and accuracy), a run
stopped at step 10 and trained on to 20 equal to one uninterrupted 20-step run (metrics and
parameters, bit for bit: the masks come from the step rng), ``txf generate`` filling a mask, a
labelled TSV's text read as unlabelled text, and the tokenizer: a <mask> piece for MLM runs only."""

import os
import random

import numpy as np
import pytest

from tests.conftest import run_txf
from tests.test_checkpoint_resume import _assert_same_run, _rows
from tests.test_data_fixtures import config_for, sentences, tsv_dir
from txf.data import real, tokenizer, vocab
from txf.data.base import DataError

pytestmark = pytest.mark.slow

ADJ = ("good", "bad", "great", "dull", "funny", "sad")
NOUN = ("movie", "film", "story", "plot", "actor", "scene")


def _text_dir(root):
  rng = random.Random(0)
  os.makedirs(root, exist_ok=True)
  lines = [f"the {rng.choice(NOUN)} was very {rng.choice(ADJ)} and the {rng.choice(NOUN)} was "
           f"{rng.choice(ADJ)} ." for _ in range(500)]
  with open(os.path.join(root, "input.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
  return str(root)


def _args(data, data_dir, workdir, steps):
  return ["train", "--workdir", str(workdir), "--progress=false",
          "--config.model.family=encoder_mlm", f"--config.data.source=text:{data}",
          "--config.data.format=plain", f"--config.data.data_dir={data_dir}",
          "--config.data.tokenizer=sentencepiece", "--config.data.vocab_size=300",
          "--config.data.spm_model_type=bpe", "--config.data.max_input_len=32",
          "--config.data.max_target_len=32", "--config.model.d_model=32", "--config.model.d_ff=64",
          "--config.model.num_heads=2", "--config.model.num_encoder_layers=1",
          "--config.model.num_decoder_layers=0", "--config.model.max_len=32",
          "--config.model.dropout_rate=0.1", f"--config.num_train_steps={steps}",
          "--config.batch_size=16", "--config.log_every=5", "--config.eval_every=10",
          "--config.checkpoint_every=10", "--config.decode_examples=0", "--config.num_samples=0",
          "--config.eval_batches=2", "--config.optimizer.warmup_steps=10"]


def _train(*args):
  out = run_txf(*args)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """An uninterrupted 20-step run: (text dir, prepared-data dir, workdir)."""
  root = tmp_path_factory.mktemp("mlm")
  data, data_dir = _text_dir(root / "text"), str(root / "tfds")
  workdir = str(root / "run")
  _train(*_args(data, data_dir, workdir, 20))
  return data, data_dir, workdir


def test_training_lowers_the_masked_loss(trained):
  rows = _rows(trained[2])
  train = [r for r in rows if r["split"] == "train"]
  evals = [r for r in rows if r["split"] == "eval"]
  assert [r["step"] for r in train] == [5, 10, 15, 20] and [r["step"] for r in evals] == [10, 20]
  for r in rows:
    assert np.isfinite(r["loss"]) and 0.0 <= r["accuracy"] <= 1.0
  assert train[-1]["loss"] < train[0]["loss"] - 0.5, train
  assert evals[-1]["loss"] < train[0]["loss"]
  assert evals[-1]["perplexity"] < 300  # below the uniform guess over the 300 ids


def test_stopped_and_resumed_run_equals_the_uninterrupted_one(trained, tmp_path):
  data, data_dir, reference = trained
  workdir = str(tmp_path / "run")
  _train(*_args(data, data_dir, workdir, 10))
  out = _train(*_args(data, data_dir, workdir, 20))
  assert "resumed from the checkpoint at step 10" in out.stdout
  _assert_same_run(workdir, reference)


def test_generate_fills_the_mask(trained):
  out = run_txf("generate", "--workdir", trained[2], "--prompt", "the <mask> was very good .",
                "--prompt", "no mask here", "--top_k", "3")
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  assert len(lines) == 2 and lines[1] == "no mask here"
  text, candidates = lines[0].split("\t")
  assert "<mask>" not in text
  assert candidates.startswith("[1] ") and candidates.count("[") == 1
  pairs = [c.rsplit(" ", 1) for c in candidates[4:].split(", ")]
  probs = [float(p) for _, p in pairs]
  assert len(pairs) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-6
  rest = " was very good ."  # the argmax fills the mask, the rest is unchanged
  assert text.startswith("the") and text.endswith(rest), text
  assert text[len("the"):-len(rest)].strip() == pairs[0][0]


def test_a_labelled_tsv_is_unlabelled_text(tmp_path):
  data = tsv_dir(tmp_path / "tsv", n_train=120, n_val=20)
  cfg = config_for(f"text:{data}", tmp_path / "tfds", "encoder_mlm", "tsv", max_input_len=16,
                   eval_split="dev")
  task = real.make_real_task(cfg)
  assert isinstance(task, real.StreamMLMTask)
  texts, _ = sentences(120, 0)
  expected = [i for t in texts for i in task.codec.source.encode(t)]  # no labels, in order
  np.testing.assert_array_equal(task.stream("train"), expected)
  batch = next(task.train_iterator(4, seed=0))
  assert sorted(batch) == ["inputs"] and batch["inputs"].shape == (4, 16)
  assert task.mask_id == task.codec.source.encode("<mask>")[-1]
  assert task.mask_id not in expected
  # the tokenizer's settings (its cache key, tokenizer.json) say it has the mask, and nothing else
  assert task.codec.settings["mask_token"] == vocab.MASK_PIECE and "sentinels" not in task.codec.settings


def test_only_mlm_runs_get_a_mask_piece(tmp_path):
  data = tsv_dir(tmp_path / "tsv", n_train=120, n_val=20)
  cfg = config_for(f"text:{data}", tmp_path / "tfds", "encoder_classifier", "tsv", eval_split="dev")
  task = real.make_real_task(cfg)
  texts, _ = sentences(120, 0)
  plain = tokenizer.train_sentencepiece(texts, 320, "bpe", 1)  # the tokenizer as before
  assert task.codec.source.model_proto == plain.model_proto
  assert "mask_token" not in task.codec.settings
  with pytest.raises(DataError, match="no mask token"):
    vocab.mask_token_id(task.codec.source)


def test_a_tokenizer_without_a_mask_is_one_error(tmp_path):
  data = _text_dir(tmp_path / "text")
  args = _args(data, str(tmp_path / "tfds"), str(tmp_path / "run"), 5)
  out = run_txf(*args, "--config.data.tokenizer=char")
  assert out.returncode == 2
  errors = [line for line in out.stderr.splitlines() if line.startswith("txf: error:")]
  assert len(errors) == 1 and "no mask token" in errors[0], out.stderr[-2000:]
  assert "Traceback" not in out.stderr


def test_whole_word_batches_mask_every_piece_of_a_word(tmp_path):
  import jax
  from txf.models import model_config_from
  from txf.models.encoder_mlm import mask_batch
  data = tsv_dir(tmp_path / "tsv", n_train=120, n_val=20)
  cfg = config_for(f"text:{data}", tmp_path / "tfds", "encoder_mlm", "tsv", max_input_len=24,
                   eval_split="dev")
  cfg.pretrain.whole_word, cfg.pretrain.mask_rate = True, 0.3
  task = real.make_real_task(cfg)
  batch = next(task.train_iterator(8, seed=0))
  sp = task.codec.source._sp
  pieces = [[sp.id_to_piece(int(i)) for i in row] for row in batch["inputs"]]
  starts = np.asarray([[p.startswith("\u2581") for p in row] for row in pieces])
  np.testing.assert_array_equal(batch["word_starts"] != 0, starts)
  masked = mask_batch(model_config_from(cfg, task, vocab_multiple=1), batch, jax.random.key(0))
  chosen = np.asarray(masked["targets"]) != 0
  np.testing.assert_array_equal(np.asarray(masked["targets"])[chosen], batch["inputs"][chosen])
  for b in range(8):
    # a word: a piece starting with \u2581 and the pieces after it up to the next such piece (the
    # window's first pieces, before any start, form a word of their own)
    bounds = [0] + [t for t in range(1, 24) if starts[b, t]] + [24]
    words = [list(range(s, e)) for s, e in zip(bounds, bounds[1:])]
    assert all(chosen[b, w].all() or not chosen[b, w].any() for w in words), pieces[b]
    assert chosen[b].any()
