"""Tiny corpora and configs shared by the tests/test_data_*.py files (no tests here)."""

import os
import random

from txf.core.config import base_config

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
_WORDS = ("the a cat dog bird sees chases likes small big red green house tree river over under "
          "near runs jumps sleeps quickly slowly man woman child ball").split()
_GERMAN = {w: w[::-1] + "en" for w in _WORDS}


def sentences(n: int, seed: int = 0, min_words: int = 2, max_words: int = 10):
  """``n`` random English-like sentences and their fake 'German' (reversed words), deterministic."""
  rng = random.Random(seed)
  src, tgt = [], []
  for _ in range(n):
    words = [rng.choice(_WORDS) for _ in range(rng.randint(min_words, max_words))]
    src.append(" ".join(words) + ".")
    tgt.append(" ".join(_GERMAN[w] for w in reversed(words)) + ".")
  return src, tgt


def write_lines(path, lines, end="\n"):
  """Write ``lines`` joined by LF (plus a final LF)."""
  with open(path, "w", encoding="utf-8", newline="") as f:
    f.write("\n".join(lines) + end)


def parallel_dir(root, n_train=240, n_val=40, splits=("train", "val")):
  """A folder with {split}.en / {split}.de files; returns its path."""
  os.makedirs(root, exist_ok=True)
  for i, split in enumerate(splits):
    src, tgt = sentences(n_train if split == "train" else n_val, seed=i)
    write_lines(os.path.join(root, f"{split}.en"), src)
    write_lines(os.path.join(root, f"{split}.de"), tgt)
  return str(root)


def tsv_dir(root, n_train=200, n_val=30):
  """A folder with train.tsv / dev.tsv (sentence<TAB>label, label = 'dog' in the sentence)."""
  os.makedirs(root, exist_ok=True)
  for split, n, seed in (("train", n_train, 0), ("dev", n_val, 1)):
    src, _ = sentences(n, seed)
    write_lines(os.path.join(root, f"{split}.tsv"), [f"{s}\t{int('dog' in s)}" for s in src])
  return str(root)


def plain_dir(root, n_lines=400, speakers=("SPEAKER 0", "SPEAKER 1", "SPEAKER 2")):
  """A folder with one input.txt of dialogue-like lines, each after its speaker's name."""
  os.makedirs(root, exist_ok=True)
  src, _ = sentences(n_lines, 3)
  write_lines(os.path.join(root, "input.txt"),
              [f"{speakers[i % len(speakers)]}:\n{s}\n" for i, s in enumerate(src)])
  return str(root)


def config_for(source, data_dir, family="encoder_decoder", fmt="parallel", **data):
  """A base config pointing at ``source`` with small sizes; extra ``data`` fields override."""
  c = base_config()
  c.model.family = family
  d = c.data
  d.source, d.format, d.data_dir = source, fmt, str(data_dir)
  d.tokenizer, d.vocab_size, d.spm_model_type = "sentencepiece", 320, "bpe"
  d.max_input_len, d.max_target_len = 32, 32
  d.prefetch, d.read_threads = 2, 1
  for k, v in data.items():
    setattr(d, k, v)
  return c
