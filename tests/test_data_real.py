"""make_real_task end to end: local text through tfds builders, catalog datasets under
tfds.testing.mock_data, reuse of prepared data and of the run's tokenizer, errors, no TensorFlow."""

import glob
import json
import os
import sys
import tempfile
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

from txf.runtime import workdir as workdir_lib
from txf.data import builders, catalog
from txf.data.base import EOS_ID
from txf.data.real import make_real_task
from txf.data.base import DataError

from test_data_fixtures import (SHARED_DATA, config_for, parallel_dir, plain_dir, tsv_dir,
                                write_lines)


def _array_records(path):
  return {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(path, "*array_record*"))}


def test_preparing_twice_reuses_the_prepared_data(tmp_path):
  data = parallel_dir(tmp_path / "par")
  spec = builders.local_spec(data, "parallel", ["train", "val", "test"], "en", "de", 1000, 0.9)
  first = builders.prepare_local(data, spec, str(tmp_path / "tfds"))
  files = _array_records(first.path)
  assert first.prepared_now and len(files) == 2
  again = builders.prepare_local(data, spec, str(tmp_path / "tfds"))
  assert not again.prepared_now and again.path == first.path
  assert _array_records(again.path) == files                 # not rewritten
  assert len(again.sources["train"]) == len(first.sources["train"]) == 240
  write_lines(os.path.join(data, "val.en"), ["changed"] * 40)  # edited files: a fresh preparation
  changed = builders.prepare_local(data, spec, str(tmp_path / "tfds"))
  assert changed.prepared_now and changed.fingerprint != first.fingerprint


def test_a_copy_of_the_same_files_elsewhere_is_the_same_data_and_an_edit_is_not(tmp_path):
  import shutil
  first_dir = parallel_dir(tmp_path / "a" / "par")
  copy_dir = str(tmp_path / "b" / "par")
  shutil.copytree(first_dir, copy_dir)
  later = time.time() + 3600
  for name in os.listdir(copy_dir):                  # a fresh copy: every file has a new mtime
    os.utime(os.path.join(copy_dir, name), (later, later))
  tfds_dir = str(tmp_path / "tfds")
  fingerprints = {}
  for label, d in (("first", first_dir), ("copy", copy_dir)):
    spec = builders.local_spec(d, "parallel", ["train", "val", "test"], "en", "de", 1000, 0.9)
    fingerprints[label] = builders.prepare_local(d, spec, tfds_dir).fingerprint
    task = make_real_task(config_for(f"text:{d}", tmp_path / "tfds"), str(tmp_path / label))
    fingerprints[label + " task"] = task.fingerprint   # what a checkpoint's data position names
  assert fingerprints["first"] == fingerprints["copy"]
  assert fingerprints["first task"] == fingerprints["copy task"]
  path = os.path.join(copy_dir, "train.de")          # one byte changed, the size and mtime kept
  stat = os.stat(path)
  with open(path, "r+b") as f:
    byte = f.read(1)
    f.seek(0)
    f.write(b"Z" if byte != b"Z" else b"Y")
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  spec = builders.local_spec(copy_dir, "parallel", ["train", "val", "test"], "en", "de", 1000, 0.9)
  # the digest remembered for (path, size, mtime) is that of the old bytes: a file rewritten in
  # place with its mtime restored is the one change not seen, as for make and rsync
  assert builders.prepare_local(copy_dir, spec, tfds_dir).fingerprint == fingerprints["first"]
  os.utime(path)                                     # an ordinary edit moves the mtime
  edited = builders.prepare_local(copy_dir, spec, tfds_dir)
  assert edited.prepared_now and edited.fingerprint != fingerprints["first"]


def test_translation_task_end_to_end(tmp_path):
  data = parallel_dir(tmp_path / "par")
  workdir = str(tmp_path / "run")
  task = make_real_task(config_for(f"text:{data}", tmp_path / "tfds"), workdir)
  assert task.family == "encoder_decoder" and task.target_vocab_size == 0
  assert 260 < task.vocab_size <= 320
  assert not os.path.exists(workdir)   # the data layer writes nothing into a run: save_task does
  workdir_lib.save_task(workdir, task)
  assert os.path.isfile(os.path.join(workdir, workdir_lib.TOKENIZER_DIR, "tokenizer.json"))
  batches = task.eval_batches("val", 16)
  assert [b["inputs"].shape for b in batches] == [(16, 32)] * 3
  assert sum(int((b["targets"] != 0).any(1).sum()) for b in batches) == 40   # the whole split
  with open(os.path.join(data, "val.de")) as f:
    refs = f.read().split("\n")
  examples = task.examples("eval", 3)
  assert [e.reference for e in examples] == refs[:3]
  assert task.decode_target(batches[0]["targets"][0]) == refs[0]
  ids = task.encode_source(examples[0].source)
  assert ids[-1] == EOS_ID and np.array_equal(ids, examples[0].source_ids)


def test_the_runs_tokenizer_is_rebuilt_from_the_workdir(tmp_path):
  data = parallel_dir(tmp_path / "par")
  workdir = str(tmp_path / "run")
  first = make_real_task(config_for(f"text:{data}", tmp_path / "tfds"), workdir)
  workdir_lib.save_task(workdir, first)
  # another data_dir (no tokenizer cache) and another vocab size: the run's tokenizer still wins
  second = make_real_task(config_for(f"text:{data}", tmp_path / "tfds2", vocab_size=400), workdir)
  assert second.vocab_size == first.vocab_size
  text = "the big dog runs over the green house."
  np.testing.assert_array_equal(first.encode_source(text), second.encode_source(text))
  fresh = make_real_task(config_for(f"text:{data}", tmp_path / "tfds2", vocab_size=400), "")
  assert fresh.vocab_size != first.vocab_size


def test_separate_vocabularies(tmp_path):
  data = parallel_dir(tmp_path / "par")
  task = make_real_task(config_for(f"text:{data}", tmp_path / "tfds", joint_vocab=False), "")
  assert task.target_vocab_size > 0 and not task.codec.joint
  batch = next(task.train_iterator(4, 0))
  assert batch["targets"].max() < task.target_vocab_size


def test_classification_task(tmp_path):
  cfg = config_for(f"text:{tsv_dir(tmp_path / 'tsv')}", tmp_path / "tfds", "encoder_classifier",
                   "tsv", eval_split="dev")
  task = make_real_task(cfg, "")
  assert task.num_classes == 2 and task.max_target_len == 0
  batch = next(task.train_iterator(8, 0))
  assert set(batch) == {"inputs", "label"} and batch["label"].shape == (8,)
  batches = task.eval_batches("dev", 8)
  labels = np.concatenate([b["label"][(b["inputs"] != 0).any(1)] for b in batches])
  assert len(labels) == 30 and labels.tolist() == [e.label for e in task.examples("dev", 30)]
  cfg.data.packing = True
  with pytest.raises(DataError, match="data.packing=True with model.family='encoder_classifier'"):
    make_real_task(cfg, "")


def test_char_language_model_on_plain_text(tmp_path):
  data = plain_dir(tmp_path / "plain")
  cfg = config_for(f"text:{data}", tmp_path / "tfds", "decoder_lm", "plain", tokenizer="char",
                   max_target_len=64)
  task = make_real_task(cfg, "")
  with open(os.path.join(data, "input.txt")) as f:
    content = f.read()
  cut = int(len(content) * 0.9)
  assert task.vocab_size == 4 + len(set(content[:cut]))
  batch = next(task.train_iterator(8, 0))
  assert set(batch) == {"targets"} and batch["targets"].shape == (8, 64)
  assert (batch["targets"] != 0).all()
  windows = [w for b in task.eval_batches("val", 8) for w in b["targets"]]
  assert "".join(task.decode_target(w) for w in windows) == content[cut:]   # the exact tail
  assert len(task.examples("val", 4)[0].source_ids) == 16


def test_config_mistakes_are_clear_errors(tmp_path):
  data = parallel_dir(tmp_path / "par")
  with pytest.raises(DataError, match="model.family='decoder_lm' cannot use: set "
                                      "model.family='encoder_decoder'"):
    make_real_task(config_for(f"text:{data}", tmp_path / "tfds", "decoder_lm"), "")
  with pytest.raises(DataError, match="data.tokenizer='word' is for synthetic tasks"):
    make_real_task(config_for(f"text:{data}", tmp_path / "tfds", tokenizer="word"), "")
  cfg = config_for("text:multi30k", tmp_path / "tfds", path=str(tmp_path / "nowhere"))
  with pytest.raises(DataError, match="nowhere/multi30k' does not exist .*from data.path"):
    make_real_task(cfg, "")


def test_bad_data_surfaces_through_the_builder(tmp_path):
  data = parallel_dir(tmp_path / "par")
  write_lines(os.path.join(data, "train.de"), ["nur eine Zeile"])
  with pytest.raises(DataError, match=r"train\.en has 240 lines but .*train\.de has 1"):
    make_real_task(config_for(f"text:{data}", tmp_path / "tfds"), "")


CATALOG_CASES = [("wmt14_translate/de-en", "encoder_decoder", {}),
                 ("ted_hrlr_translate/pt_to_en", "encoder_decoder",
                  {"src_lang": "pt", "tgt_lang": "en"}),
                 ("glue/sst2", "encoder_classifier", {}),
                 ("imdb_reviews", "encoder_classifier", {"eval_split": "test"}),
                 ("lm1b", "decoder_lm", {"eval_split": "test", "packing": True}),
                 # the pretraining objectives read a catalog text split as they read a local file
                 ("lm1b", "encoder_mlm", {"eval_split": "test"}),
                 ("lm1b", "span_corruption", {"eval_split": "test", "vocab_size": 420})]


@pytest.mark.parametrize("name,family,extra", CATALOG_CASES, ids=[c[0] for c in CATALOG_CASES])
def test_catalog_datasets_run_the_whole_pipeline_without_tensorflow(tmp_path, monkeypatch, name,
                                                                    family, extra):
  monkeypatch.setattr(catalog, "hosts_reachable", lambda hosts, timeout=0: True)
  scratch = tmp_path / "tmp"  # the process's temporary folder: nothing is left in it
  scratch.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))
  data = {"eval_split": "validation", "test_split": "test", "max_input_len": 24,
          "max_target_len": 24, "truncate": True, **extra}
  cfg = config_for(f"tfds:{name}", tmp_path / "tfds", family, **data)
  with tfds.testing.mock_data(num_examples=40):
    task = make_real_task(cfg, str(tmp_path / "run"))
    it = task.train_iterator(8, seed=1)
    for _ in range(3):
      next(it)
    state = json.loads(json.dumps(it.get_state()))
    want = next(it)
    restored = task.train_iterator(8, seed=1)
    restored.set_state(state)
    got = next(restored)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    assert task.eval_batches(data["eval_split"], 8, max_examples=16)
    pretraining = family in ("encoder_mlm", "span_corruption")  # no labelled examples to show
    assert len(task.examples(data["eval_split"], 2)) == (0 if pretraining else 2)
  if pretraining:  # full windows of the text; the loss masks or corrupts them
    assert want["inputs"].shape == (8, 24) and (want["inputs"] != 0).all()
    # span corruption: zero targets of the corrupted length (24 -> 4 noise tokens in 1 span: 6)
    assert set(want) == ({"inputs", "targets"} if family == "span_corruption" else {"inputs"})
    if family == "span_corruption":
      assert want["targets"].shape == (8, 6) and not want["targets"].any()
  if family == "decoder_lm":
    assert "targets_segmentation" in want and set(want) == {"targets", "targets_segmentation",
                                                            "targets_position"}
  assert "tensorflow" not in sys.modules
  assert not os.listdir(scratch)


def test_unprepared_catalog_dataset_offline_fails_fast_with_instructions(tmp_path, monkeypatch):
  monkeypatch.setattr(catalog, "hosts_reachable", lambda hosts, timeout=0: False)
  cfg = config_for("tfds:wmt14_translate/de-en", tmp_path / "tfds", eval_split="validation")
  start = time.time()
  with pytest.raises(DataError) as e:
    make_real_task(cfg, "")
  assert time.time() - start < 10
  assert "txf prepare-data wmt14_translate/de-en" in str(e.value)
  assert "www.statmt.org" in str(e.value)


def test_reachability_probe_is_bounded():
  start = time.time()
  assert not catalog.hosts_reachable(["txf-no-such-host.invalid"], timeout=1.0)
  assert time.time() - start < 5


def test_lm1b_prepares_without_tensorflow_through_a_glob_shim(tmp_path):
  catalog.import_builder("lm1b")
  module = sys.modules[catalog.CATALOG["lm1b"][0]]
  shard = tmp_path / module._TOP_LEVEL_DIR / "training-monolingual.tokenized.shuffled"
  shard.mkdir(parents=True)
  (shard / "news.en-00001-of-00100").write_text("a sentence\n")
  with catalog._without_tensorflow_patches("lm1b"):
    assert module._train_data_filenames(str(tmp_path)) == [str(shard / "news.en-00001-of-00100")]
  assert "tensorflow" not in sys.modules


@pytest.mark.skipif(not os.path.isdir(SHARED_DATA), reason="../shared/data is absent (real data)")
def test_tinyshakespeare_char_vocabulary(tmp_path, monkeypatch):
  monkeypatch.setenv("TXF_DATA", SHARED_DATA)
  cfg = config_for("text:tinyshakespeare", tmp_path / "tfds", "decoder_lm", "plain",
                   tokenizer="char", max_target_len=256)
  task = make_real_task(cfg, "")
  assert task.vocab_size == 65 + 4
  assert task.stream("train").shape == (int(1115394 * 0.9),)
  assert next(task.train_iterator(4, 0))["targets"].shape == (4, 256)


@pytest.mark.slow  # two processes that each import tfds
def test_two_processes_preparing_the_same_new_data_at_once_take_turns(tmp_path):
  """A sweep's runs start together on a dataset no run has prepared yet: one prepares it, the
  other waits for the lock and opens it (without the lock both prepare and one fails to rename
  its copy into place)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  data = parallel_dir(tmp_path / "par")
  spec = builders.local_spec(data, "parallel", ["train", "val", "test"], "en", "de", 1000, 0.9)
  go = tmp_path / "go"   # both processes import everything, then start preparing together
  code = ("import json, os, sys, time\nfrom txf.data import builders\n"
          "open(sys.argv[2], 'w').close()\n"
          f"while not os.path.exists({str(go)!r}):\n  time.sleep(0.01)\n"
          f"p = builders.prepare_local({data!r}, json.loads(sys.argv[1]), {str(tmp_path / 'tfds')!r})\n"
          "print(int(p.prepared_now), len(p.sources['train']))\n")
  ready = [str(tmp_path / f"ready-{i}") for i in range(2)]
  procs = [subprocess.Popen([sys.executable, "-c", code, json.dumps(spec), ready[i]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  deadline = time.time() + 240
  while not all(os.path.exists(r) for r in ready) and time.time() < deadline:
    time.sleep(0.05)
  go.touch()
  outs = [p.communicate(timeout=300) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
  assert sorted(out.split() for out, _ in outs) == [["0", "240"], ["1", "240"]]
