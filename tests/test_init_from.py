"""config.init_from: a run starts from another run's parameters and tokenizer.

The new run's task reads the source run's tokenizer/ and the run saves it into its own workdir
once (``workdir.save_task``); the first step starts from the source's parameters.
"""

import filecmp
import os

import jax
import numpy as np
import pytest

from txf.runtime import workdir as workdir_lib
from txf.core.config import base_config
from txf.train import train

SRC = ["a cat sees a dog", "the big dog eats", "a small bird sings", "the red fish swims"] * 6
TGT = ["eine katze sieht einen hund", "der grosse hund isst", "ein kleiner vogel singt",
       "der rote fisch schwimmt"] * 6


def small_run_config(tmp_path):
  data = tmp_path / "data"
  data.mkdir(exist_ok=True)
  for split in ("train", "val", "test"):
    (data / f"{split}.en").write_text("\n".join(SRC) + "\n")
    (data / f"{split}.de").write_text("\n".join(TGT) + "\n")
  c = base_config()
  c.num_train_steps, c.batch_size, c.log_every, c.eval_every = 2, 8, 1, 0
  c.checkpoint_every, c.decode_examples, c.eval_batches, c.num_samples = 0, 0, 1, 0
  c.model.d_model, c.model.num_heads, c.model.d_ff = 16, 2, 32
  c.model.num_encoder_layers = c.model.num_decoder_layers = 1
  c.model.dtype = "float32"
  c.data.source, c.data.data_dir = f"text:{data}", str(tmp_path / "prepared")
  c.data.tokenizer = "char"
  c.data.max_input_len = c.data.max_target_len = 32
  return c


@pytest.mark.slow  # two small trainings: the end-to-end tier
def test_init_from_reads_the_source_tokenizer_and_saves_it_once(tmp_path, monkeypatch):
  source = str(tmp_path / "source")
  train(small_run_config(tmp_path), source)

  saves = []
  original = workdir_lib.save_task

  def counted(workdir, task):
    # nothing has put a tokenizer into the new run before the one save
    saves.append(os.path.exists(workdir_lib.path_of(workdir, workdir_lib.TOKENIZER_DIR)))
    original(workdir, task)

  monkeypatch.setattr(workdir_lib, "save_task", counted)
  c = small_run_config(tmp_path)
  monkeypatch.chdir(tmp_path)
  c.init_from = "source"  # relative, as the README's commands give it
  c.optimizer.schedule, c.optimizer.learning_rate, c.optimizer.warmup_steps = "constant", 1e-30, 1
  target = str(tmp_path / "target")
  train(c, target)

  assert saves == [False]
  src_tok, dst_tok = (workdir_lib.path_of(d, workdir_lib.TOKENIZER_DIR) for d in (source, target))
  names = sorted(os.listdir(src_tok))
  assert names and sorted(os.listdir(dst_tok)) == names
  _, mismatch, errors = filecmp.cmpfiles(src_tok, dst_tok, names, shallow=False)
  assert not mismatch and not errors
  # lr 1e-30: two Adam steps move each parameter by at most ~1e-30
  before, after = workdir_lib.load_params(source), workdir_lib.load_params(target)
  for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-25)
