"""Hugging Face GPT-2 in txf, against transformers' GPT2LMHeadModel as the reference.

A small GPT-2 (n_embd 32, 2 layers, 4 heads, 64 positions) is built here with random weights over
a byte-level BPE trained here with ``tokenizers`` (vocab.json + merges.txt, what GPT2TokenizerFast
reads), trained briefly in torch so that its outputs end with <|endoftext|>, and saved with
save_pretrained. Then: teacher-forced logits equal torch's (to 1e-5) with no probability on txf's
extra ids; greedy continuations of prompts and the beam-4 unconditional output equal
GPT2LMHeadModel.generate's ids; export -> the state dict equals the original exactly, from_pretrained
loads model and tokenizer, and re-importing the export gives the same parameters; the CLI imports,
generates, and a Tiny-Shakespeare-style init_from fine-tune runs; unsupported options are one error
line. Skipped when torch or transformers are absent (pip install '.[hf]').
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[hf]'")
transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")
tokenizers = pytest.importorskip("tokenizers")

from txf.decode import DecodingSpec  # noqa: E402
from txf.errors import TxfError  # noqa: E402
from txf.inference import hf, load_run  # noqa: E402

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

WORDS = "the a cat dog bird sees likes eats big small red old house tree".split()
EOT = "<|endoftext|>"
ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def corpus(n, seed):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, rng.integers(2, 7))) for _ in range(n)]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  """(save_pretrained dir, GPT2LMHeadModel, GPT2TokenizerFast)."""
  directory = str(tmp_path_factory.mktemp("gpt2") / "hf")
  os.makedirs(directory)
  lines = corpus(300, 0)
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(lines, vocab_size=300, min_frequency=2, special_tokens=[EOT])
  bpe.save_model(directory)  # vocab.json + merges.txt
  tokenizer = transformers.GPT2TokenizerFast.from_pretrained(directory)
  eot = tokenizer.convert_tokens_to_ids(EOT)
  config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4,
                                   n_positions=64, bos_token_id=eot, eos_token_id=eot,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(config)
  rows = [[eot] + tokenizer(s)["input_ids"] + [eot] for s in lines]
  width = max(map(len, rows))
  ids = torch.tensor([r + [eot] * (width - len(r)) for r in rows])
  labels = torch.tensor([r + [-100] * (width - len(r)) for r in rows])
  optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
  model.train()
  for step in range(60):  # outputs end with <|endoftext|>, and are not all alike
    batch = slice((step % 6) * 50, (step % 6) * 50 + 50)
    loss = model(input_ids=ids[batch], labels=labels[batch]).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
  model.eval()
  model.save_pretrained(directory)
  return directory, model, tokenizer


@pytest.fixture(scope="module")
def imported(small, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("runs") / "gpt2")
  hf.import_hf(small[0], workdir)
  return workdir


def hf_ids(tokenizer, text):
  return tokenizer(text)["input_ids"]


def test_teacher_forced_logits_equal_torch(small, imported):
  from txf.models import build_model
  _, model, tokenizer = small
  run = load_run(imported)
  order = run.task.codec.target.order
  eot = tokenizer.convert_tokens_to_ids(EOT)
  row = [eot] + hf_ids(tokenizer, "the big cat sees a red tree") + [eot]
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor([row[:-1]])).logits.numpy()[0]
  targets = run.task.codec.target.to_txf(row[1:])[None]  # txf shifts right from <|endoftext|>
  ours = np.asarray(build_model(run.model_cfg, deterministic=True).apply(
      {"params": run.params}, targets=targets))[0]
  real = order < len(tokenizer)  # txf ids with a Hugging Face token
  diff = np.abs(ours[:, real] - theirs[:, order[real]]).max()
  print(f"teacher-forced logits: max |difference| {diff:.3g} (logits up to {np.abs(theirs).max():.2f})")
  assert diff <= 1e-5
  assert (ours[:, ~real] <= -1e8).all()  # txf's PAD/BOS/UNK rows: never predicted
  log_p = ours - np.log(np.exp(ours - ours.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - ours.max(-1, keepdims=True)
  torch_log_p = torch.log_softmax(torch.tensor(theirs, dtype=torch.float64), -1).numpy()
  np.testing.assert_allclose(log_p[:, real], torch_log_p[:, order[real]], atol=1e-5)
