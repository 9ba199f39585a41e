"""Local data that would train silently wrong is refused by ``txf train`` (exit 2, one line naming
the file and line), and a vocabulary smaller than data.vocab_size is said in the log."""

import os

import pytest

from tests.conftest import run_txf
from test_data_fixtures import parallel_dir, sentences, tsv_dir, write_lines


def classifier_flags(data, tmp_path, *extra):
  return ["train", "--workdir", str(tmp_path / "w"), "--progress=false",
          "--config.model.family=encoder_classifier", f"--config.data.source=text:{data}",
          "--config.data.format=tsv", "--config.data.tokenizer=char",
          f"--config.data.data_dir={tmp_path / 'tfds'}", "--config.data.eval_split=dev", *extra]


def refused(r):
  assert r.returncode == 2, r.stdout + r.stderr
  assert "Traceback" not in r.stderr, r.stderr
  lines = [line for line in r.stderr.splitlines() if line.startswith("txf: error: ")]
  assert len(lines) == 1, r.stderr
  return lines[0]


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_absurd_training_label_names_its_line(tmp_path):
  data = tsv_dir(tmp_path / "d")
  path = os.path.join(data, "train.tsv")
  lines = open(path).read().splitlines()
  lines[56] = lines[56].rpartition("\t")[0] + "\t1000000"
  write_lines(path, lines)
  line = refused(run_txf(*classifier_flags(data, tmp_path)))
  assert f"{path}:57: label 1000000 would make a 1,000,001-class model" in line
  assert "3 distinct labels (0, 1, 1000000)" in line
  assert not (tmp_path / "w" / "checkpoints").exists()


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_dev_label_missing_from_training_names_its_line(tmp_path):
  data = tsv_dir(tmp_path / "d")
  path = os.path.join(data, "dev.tsv")
  lines = open(path).read().splitlines()
  lines[4] = lines[4].rpartition("\t")[0] + "\t2"
  write_lines(path, lines)
  line = refused(run_txf(*classifier_flags(data, tmp_path)))
  assert f"{path}:5: label 2 of the dev split never occurs in the training data" in line


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
@pytest.mark.parametrize("content", ["", "\n\n   \n\t\n"])
def test_empty_or_blank_training_file_is_refused(tmp_path, content):
  data = parallel_dir(tmp_path / "d")
  for side in ("en", "de"):
    with open(os.path.join(data, f"train.{side}"), "w") as f:
      f.write(content)
  line = refused(run_txf("train", "--workdir", str(tmp_path / "w"), "--progress=false",
                         f"--config.data.source=text:{data}", "--config.data.tokenizer=char",
                         f"--config.data.data_dir={tmp_path / 'tfds'}"))
  assert f"{data}/train.en / {data}/train.de: the train split has no usable lines" in line


def test_labels_that_fit_pass_the_check(tmp_path):
  # classes 0..2 with 2 unused in dev: fine (the check is about the training labels)
  from txf.data import builders
  data = tsv_dir(tmp_path / "d")
  path = os.path.join(data, "train.tsv")
  src, _ = sentences(20, seed=5)
  with open(path, "a") as f:
    f.write("\n".join(f"{s}\t2" for s in src) + "\n")
  spec = builders.local_spec(data, "tsv", ["train", "dev", "test"], "en", "de", 1000, 0.9)
  prepared = builders.prepare_local(data, spec, str(tmp_path / "tfds"))
  assert prepared.metadata["num_classes"] == 3


@pytest.mark.slow
def test_vocab_size_beyond_the_data_is_said_in_the_log(tmp_path):
  data = parallel_dir(tmp_path / "d", n_train=120, n_val=8)
  r = run_txf("train", "--workdir", str(tmp_path / "w"), "--progress=false",
              f"--config.data.source=text:{data}", "--config.data.tokenizer=sentencepiece",
              "--config.data.vocab_size=8000", f"--config.data.data_dir={tmp_path / 'tfds'}",
              "--config.num_train_steps=1", "--config.batch_size=8", "--config.decode_examples=2",
              "--config.num_samples=0", "--config.model.d_model=16", "--config.model.num_heads=2",
              "--config.model.d_ff=16", "--config.model.num_encoder_layers=1",
              "--config.model.num_decoder_layers=1")
  assert r.returncode == 0, r.stdout + r.stderr
  log = r.stdout + r.stderr
  assert "data.vocab_size=8,000 is more than the training data supports: the vocabulary has" in log
  import json
  task = json.load(open(tmp_path / "w" / "task.json"))
  used = [v for k, v in task.items() if "vocab" in k and isinstance(v, int) and v > 0]
  assert used and max(used) < 8000
  assert f"has {max(used):,} pieces" in log
