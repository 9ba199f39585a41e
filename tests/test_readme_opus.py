"""The Hugging Face page's OPUS-MT commands, run as written, in page order, on a local Marian stand-in.

The commands are read from docs/huggingface.md itself (the section's ```bash block, by
tests/test_readme_commands.py's parser), so an edit that breaks one fails here. They run as `txf`
subprocesses (this interpreter's txf, as after `pip install -e .`) in a folder laid out like a fresh
clone: the cwd holds a small random Marian model written by ``save_pretrained`` at
``Helsinki-NLP/opus-mt-en-de`` (the Hub name read as a relative path: import-hf takes an existing
directory before trying the Hub, so no word of a command is changed), and ``../shared/data/multi30k``
is a tiny Multi30k-shaped folder (train / val / test_2016_flickr, sentences of the stand-in's
vocabulary). Every other word is the page's: runs/opus-mt-en-de, runs/opus-ft, the relative
``--config.init_from=runs/opus-mt-en-de``, ``--config.num_train_steps=300``,
exported/opus-ft-en-de. One thing is appended, to the fine-tuning only (``EXTRA``):
``--config.num_train_steps=10 --config.data.tokens_per_batch=1024`` after the page's
``--config.num_train_steps=300`` (the later value wins), since 300 steps of 4,096 tokens take
minutes on CI's 2 cores; the page's 300 is still passed and parsed.

Checked: each command exits 0 with no traceback; its output holds no library log line, and its
stderr no absl-format line at all (txf's own included: the "dropped N of M examples" line is INFO,
not shown) nor a warning; the fine-tuned run's init_from is the page's relative path and its
exported weights moved from the stand-in's, by less than 0.01 (fine-tuned from them, not from a
fresh initialisation); the export's model.safetensors is no larger than the stand-in's;
generation_config.json carries the fine-tuned run's beam settings (its config.json);
transformers loads the export.
Needs torch and transformers (`pip install -e '.[hf]'`).
"""

import json
import os
import re
import shlex
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[hf]'")
transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")

from tests import test_hf_marian as hfm  # noqa: E402  (the stand-in's builders)
from tests import test_readme_commands as rc  # noqa: E402  (the documents' parser and quiet check)
from tests.conftest import ROOT  # noqa: E402

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (docs/layout.md, Tests)

PAGE = "docs/huggingface.md"
SECTION = "## OPUS-MT / Hugging Face Marian"
HUB_NAME = "Helsinki-NLP/opus-mt-en-de"
# arguments appended to a command's txf call, only where the page's command would take too long here
EXTRA = {"TXF_DATA=../shared/data txf train --config multi30k_en_de --workdir runs/opus-ft "
         "--config.init_from=runs/opus-mt-en-de --config.num_train_steps=300":
         "--config.num_train_steps=10 --config.data.tokens_per_batch=1024"}
# a Python warning (UserWarning: ..., warnings.warn's file:line: line) or a logger's WARNING
WARNING = re.compile(r"Warning\b|\bWARNING\b|^\S+\.py:\d+: ")


def section_commands():
  """[(line, command)] of the page's OPUS-MT section (up to its next heading: the BERT and GPT-2
  sections are tests/test_hf_bert.py's and tests/test_hf_gpt2.py's), in page order."""
  with open(os.path.join(ROOT, PAGE), encoding="utf-8") as f:
    lines = f.read().splitlines()
  start = lines.index(SECTION) + 1
  fenced, end = False, len(lines)
  for i in range(start, len(lines)):
    fenced ^= lines[i].startswith("```")
    if not fenced and re.match(r"#{1,6} ", lines[i]):  # a heading (a "# comment" in a block is not)
      end = i + 1
      break
  return [(line, cmd) for line, cmd in rc.shell_commands(os.path.join(ROOT, PAGE))
          if start < line < end]


def stand_in(directory):
  """A small random Marian model (d 32, 2+2 layers, swish, shared vocabulary) and its tokenizer,
  saved as save_pretrained does, with OPUS-MT's generation settings (beam 4, pad never generated).
  Returns the English and German sentences its SentencePiece models were trained on."""
  src, tgt = hfm.corpus(400, 0)
  src_proto, tgt_proto = hfm.train_spm(src, 40), hfm.train_spm(tgt, 40)
  vocab = hfm.marian_vocab(src_proto, tgt_proto)
  tokenizer = hfm.write_tokenizer(directory, src_proto, tgt_proto, vocab)
  torch.manual_seed(0)
  model = transformers.MarianMTModel(hfm.marian_config(len(vocab)))
  model.generation_config.num_beams = 4
  model.generation_config.bad_words_ids = [[model.config.pad_token_id]]
  model.save_pretrained(directory)
  tokenizer.save_pretrained(directory)
  return src, tgt


def multi30k(root):
  """../shared/data/multi30k in miniature: {train,val,test_2016_flickr}.{en,de}."""
  os.makedirs(root)
  for split, n, seed in (("train", 120, 2), ("val", 16, 3), ("test_2016_flickr", 16, 4)):
    src, tgt = hfm.corpus(n, seed)
    for lang, text in (("en", src), ("de", tgt)):
      with open(os.path.join(root, f"{split}.{lang}"), "w", encoding="utf-8") as f:
        f.write("\n".join(text) + "\n")


def safetensors_arrays(path):
  from safetensors.numpy import load_file
  return load_file(path)


def test_the_opus_mt_section_runs_as_written(tmp_path):
  commands = section_commands()
  assert len(commands) >= 5 and commands[0][1].startswith(f"txf import-hf {HUB_NAME} "), commands
  # test_readme_commands.py lists each of them as run here
  assert all(rc.NOT_RUN.get(cmd) == rc.OPUS for _, cmd in commands), commands
  clone = tmp_path / "clone"
  hub = clone / HUB_NAME
  hub.mkdir(parents=True)
  stand_in(str(hub))
  multi30k(str(tmp_path / "shared" / "data" / "multi30k"))
  env = {k: v for k, v in os.environ.items() if not k.startswith("TXF_") and k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", TXF_DATA_DIR=str(tmp_path / "tfds"), TXF_MALLOC="system",
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  prelude = f"set -eo pipefail; txf() {{ {shlex.quote(sys.executable)} -m txf.cli \"$@\"; }}; "
  timings = []
  for line, cmd in commands:
    script = rc.shortened(cmd, EXTRA.get(cmd, ""))
    assert script.startswith(cmd), script  # the page's words, at most with arguments appended
    t0 = time.perf_counter()
    r = subprocess.run(["bash", "-c", prelude + script], cwd=clone, env=env, capture_output=True,
                       text=True, timeout=600)
    timings.append((round(time.perf_counter() - t0, 1), cmd))
    where = f"{PAGE}:{line}: `{script}`"
    assert r.returncode == 0, f"{where} failed ({r.returncode}):\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, f"{where}:\n{r.stderr[-3000:]}"
    rc.check_quiet(cmd, r)
    noise = [l for l in r.stderr.splitlines() if rc.ABSL_LINE.match(l) or WARNING.search(l)]
    assert not noise, f"{where}: log or warning lines on stderr:\n" + "\n".join(noise)
    if "txf translate" in cmd:
      assert len(r.stdout.splitlines()) == 1, r.stdout  # one line in, one translation out
  print(timings)
  assert set(EXTRA) <= {cmd for _, cmd in commands}, "EXTRA names a command the page no longer has"
  with open(clone / "runs" / "opus-ft" / "config.json", encoding="utf-8") as f:
    run = json.load(f)
  assert run["init_from"] == "runs/opus-mt-en-de" and run["num_train_steps"] == 10, run

  # the fine-tuned run started from the stand-in's weights (a relative init_from) and moved them
  original = safetensors_arrays(str(hub / "model.safetensors"))
  exported_dir = clone / "exported" / "opus-ft-en-de"
  exported = safetensors_arrays(str(exported_dir / "model.safetensors"))
  assert set(exported) <= set(original), sorted(set(exported) - set(original))
  assert all(exported[k].shape == original[k].shape for k in exported)
  moved = max(float(np.abs(exported[k] - original[k]).max()) for k in exported)
  # fine-tuned from the stand-in: 10 Adam steps at warmup learning rates (< 1e-4, an update at most a
  # few times that) move no weight by 0.01; a fresh initialisation would differ by far more
  assert 0 < moved < 0.01, moved
  # each tied table once: no larger than the original
  size = os.path.getsize(exported_dir / "model.safetensors")
  assert size <= os.path.getsize(hub / "model.safetensors"), size
  # generation_config.json: the fine-tuned run's beam settings, as the run recorded them
  with open(exported_dir / "generation_config.json", encoding="utf-8") as f:
    gen = json.load(f)
  assert gen["num_beams"] == run["beam_size"], (gen, run["beam_size"])
  if run["beam_size"] > 1 and run["length_penalty"] == "power":
    assert gen["length_penalty"] == run["alpha"], (gen, run)
  # and transformers reads the export
  model = transformers.MarianMTModel.from_pretrained(str(exported_dir))
  assert model.generation_config.num_beams == run["beam_size"]
  transformers.MarianTokenizer.from_pretrained(str(exported_dir))
