"""The Hugging Face page's Llama commands, run as written, in page order, on a local stand-in.

The commands are read from docs/huggingface.md (the "Llama, Qwen2, Mistral" section's ```bash
block, by tests/test_readme_commands.py's parser). They run as `txf` subprocesses of this
interpreter in a folder that holds a small random LlamaForCausalLM (d 32, 2 layers, 4 query heads
over 2 key/value heads, SmolLM2's 49,152 ids and rope_theta, tied) saved by transformers'
save_pretrained at ``HuggingFaceTB/SmolLM2-135M`` (the Hub name read as a relative path: import-hf
takes an existing directory before the Hub). One thing is appended, to the fine-tune only
(``EXTRA``): fewer steps. Checked: each command exits 0 with no traceback; generate prints the
prompt's ids and transformers' greedy continuation; inspect writes the intermediates; eval reports
the fine-tuned run's loss on val; plan sizes a fine-tune of the import; the fine-tune moved the
weights; the export loads in transformers with the fine-tuned run's logits. Needs torch and transformers (`pip
install -e '.[hf]'`).
"""

import os
import shlex
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[hf]'")
transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")

from tests import test_readme_commands as rc  # noqa: E402
from tests import test_readme_opus as opus  # noqa: E402  (the section reader)
from tests.conftest import ROOT  # noqa: E402

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow`

SECTION = "## Llama, Qwen2, Mistral"
HUB_NAME = "HuggingFaceTB/SmolLM2-135M"
TRAIN = "txf train --config shakespeare_char --workdir runs/smollm2-ft"
EXTRA = "--config.num_train_steps=4 --config.eval_batches=1"


def test_the_llama_section_runs_as_written(tmp_path, monkeypatch):
  monkeypatch.setattr(opus, "SECTION", SECTION)
  commands = opus.section_commands()
  assert len(commands) == 8 and commands[0][1] == f"txf import-hf {HUB_NAME} --workdir runs/smollm2"
  assert all(rc.NOT_RUN.get(cmd) == rc.HUB_LLAMA for _, cmd in commands), commands
  clone = tmp_path / "clone"
  hub = clone / HUB_NAME
  hub.mkdir(parents=True)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, rope_theta=100000.0, tie_word_embeddings=True,
      bos_token_id=1, eos_token_id=2, max_position_embeddings=256)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.mul_(10.0)  # logits of several units: decisive greedy choices
  model.save_pretrained(str(hub))
  env = {k: v for k, v in os.environ.items() if not k.startswith("TXF_") and k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", TXF_DATA_DIR=str(tmp_path / "tfds"),
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  prelude = f"set -eo pipefail; txf() {{ {shlex.quote(sys.executable)} -m txf.cli \"$@\"; }}; "
  outputs = []
  for line, cmd in commands:
    full = cmd + (" " + EXTRA if cmd.startswith(TRAIN) else "")
    proc = subprocess.run(["bash", "-c", prelude + full], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (line, cmd, proc.stderr[-3000:])
    outputs.append(proc.stdout)
  prompt = [1, 504, 3458, 282]
  with torch.no_grad():
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 4, dtype=torch.long),
                         do_sample=False, max_new_tokens=20, pad_token_id=2)[0].tolist()
  if 2 in out[4:]:
    out = out[:4 + out[4:].index(2)]
  assert outputs[1].split() == [str(i) for i in out]
  assert (clone / "inspect" / "smollm2" / "intermediates.npz").is_file()
  assert "loss" in outputs[5] and "peak" in outputs[6], (outputs[5][-500:], outputs[6][-500:])
  exported = transformers.AutoModelForCausalLM.from_pretrained(
      str(clone / "exported" / "smollm2-ft")).eval()
  from safetensors.numpy import load_file
  before = load_file(str(hub / "model.safetensors"))
  after = load_file(str(clone / "exported" / "smollm2-ft" / "model.safetensors"))
  assert sorted(before) == sorted(after)
  assert max(float(np.abs(before[k] - after[k]).max()) for k in before) > 0  # fine-tuned
  from txf.inference import load_run
  from txf.models import build_model
  run = load_run(str(clone / "runs" / "smollm2-ft"))
  row = [1, 7, 13, 29, 31, 14, 26]
  with torch.no_grad():
    theirs = exported(input_ids=torch.tensor([row])).logits.numpy()[0]
  target = run.task.codec.target
  ours = np.asarray(build_model(run.model_cfg, deterministic=True).apply(
      {"params": run.params}, targets=target.to_txf(row[1:] + [0])[None]))[0]
  inverse = np.empty(len(target.order), np.int64)
  inverse[target.order] = np.arange(len(target.order))
  ours = ours[:, inverse[:49152]]
  assert np.abs(ours - theirs).max() <= 4e-6 * np.abs(theirs).max()
