"""The "A Hugging Face architecture" recipe of docs/extending.md, from a plugin file.

The plugin registers ``tiny_gpt``: a GPT-2 whose config.json names four of its sizes differently,
read and written through txf/hf/gpt2.py's functions. The quick test checks where ``txf.hf.register``
puts an architecture and what it refuses; the end-to-end test builds a small random GPT-2 with
transformers, saves it as ``tiny_gpt`` into the recipe's folder (the files the page names), then
``txf import-hf --plugins`` it, generates with ``txf generate`` (against transformers' greedy
``generate`` on the original model, id for id) and ``txf export-hf``s it back (every tensor equal,
the renamed fields restored). Without the plugin the import is one error line.
"""

import json
import os

import numpy as np
import pytest

from tests.test_recipes import mine, page_files, write, written  # noqa: F401  (the fixture)
from txf import hf
from txf.core.errors import TxfError

HF_PLUGIN = '''
    # my_hf_arch.py: "tiny_gpt", a GPT-2 whose config.json names four of its sizes differently
    import json
    import os
    from txf import hf
    from txf.core import families
    from txf.hf import gpt2

    RENAMED = {"hidden_size": "n_embd", "num_layers": "n_layer", "num_heads": "n_head",
               "max_positions": "n_positions"}        # tiny_gpt's name -> GPT-2's
    DEFAULT_DATA_CONFIG = gpt2.DEFAULT_DATA_CONFIG

    def import_run(local, config, workdir, name, data_config, max_len):
      as_gpt2 = {RENAMED.get(k, k): v for k, v in config.items()}
      gpt2.import_run(local, {**as_gpt2, "model_type": "gpt2"}, workdir, name, data_config, max_len)

    def exports(config):      # the runs whose config.plugins names this file
      return __file__ in families.plugin_list(config.plugins)

    def export_run(workdir, config, output, params_name, say):
      gpt2.export_run(workdir, config, output, params_name, say)
      path = os.path.join(output, "config.json")
      with open(path) as f:
        written = json.load(f)
      back = {theirs: ours for ours, theirs in RENAMED.items()}
      written = {back.get(k, k): v for k, v in written.items()}
      with open(path, "w") as f:
        json.dump({**written, "model_type": "tiny_gpt"}, f, indent=2)

    hf.register("tiny_gpt", hf.Architecture(module=__name__, model_class="GPT2LMHeadModel",
                                             families=("decoder_lm",),
                                             tokenizer="vocab.json + merges.txt (byte-level BPE)"))
'''
HEADING = "A Hugging Face architecture"
RENAMED = {"hidden_size": "n_embd", "num_layers": "n_layer", "num_heads": "n_head",
           "max_positions": "n_positions"}
EOT = "<|endoftext|>"


def test_register_puts_a_plugin_architecture_before_txfs_own_and_refuses_clashes():
  own = list(hf.ARCHITECTURES)
  arch = hf.Architecture("some.module", "SomeModel", ("decoder_lm",), "tokenizer.json")
  assert hf.register("toy", arch) is arch
  try:
    assert list(hf.ARCHITECTURES) == ["toy"] + own   # export asks it first; Marian stays last
    with pytest.raises(TxfError, match="'toy' is already registered"):
      hf.register("toy", arch)
    with pytest.raises(TxfError, match="'gpt2' is already registered"):
      hf.register("gpt2", arch)
    with pytest.raises(TxfError, match="model_class must be a non-empty string"):
      hf.register("other", hf.Architecture("m", "", ("decoder_lm",), "t"))
    with pytest.raises(TxfError, match="one of txf's own"):
      hf.unregister("marian")
  finally:
    hf.unregister("toy")
  assert list(hf.ARCHITECTURES) == own


@pytest.fixture
def tiny_gpt(mine):
  """The recipe's folder: my_hf_arch.py and a small random GPT-2 saved as ``tiny_gpt`` in
  tiny-gpt/; yields (plugin path, checkpoint folder, GPT2LMHeadModel, GPT2TokenizerFast)."""
  torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[hf]'")
  transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")
  tokenizers = pytest.importorskip("tokenizers")
  plugin = write(mine, "my_hf_arch.py", HF_PLUGIN)
  directory = str(mine / "tiny-gpt")
  os.makedirs(directory)
  rng = np.random.default_rng(0)
  words = "the a cat dog bird sees likes big small red old house tree".split()
  lines = [" ".join(rng.choice(words, rng.integers(2, 7))) for _ in range(200)]
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(lines, vocab_size=280, min_frequency=2)
  bpe.save_model(directory)  # vocab.json + merges.txt
  vocab_path = os.path.join(directory, "vocab.json")
  vocab = json.load(open(vocab_path))
  vocab[EOT] = len(vocab)    # <|endoftext|> the last id, as GPT-2's
  json.dump(vocab, open(vocab_path, "w"))
  tokenizer = transformers.GPT2TokenizerFast.from_pretrained(directory)
  eot = tokenizer.convert_tokens_to_ids(EOT)
  config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4,
                                   n_positions=64, bos_token_id=eot, eos_token_id=eot,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(config).eval()
  model.save_pretrained(directory)
  path = os.path.join(directory, "config.json")   # the same model, as tiny_gpt names it
  saved = json.load(open(path))
  back = {theirs: ours for ours, theirs in RENAMED.items()}
  json.dump({**{back.get(k, k): v for k, v in saved.items()}, "model_type": "tiny_gpt"},
            open(path, "w"), indent=2)
  assert written(mine) == page_files(HEADING)
  yield plugin, directory, model, tokenizer
  if "tiny_gpt" in hf.ARCHITECTURES:
    hf.unregister("tiny_gpt")


@pytest.mark.slow
def test_recipe_hf_architecture_imports_generates_and_exports(tmp_path, txf_cli, tiny_gpt):
  import torch  # pylint: disable=import-outside-toplevel
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  plugin, directory, model, tokenizer = tiny_gpt
  workdir, out = str(tmp_path / "runs" / "tiny-gpt"), str(tmp_path / "exported")
  refused = txf_cli("import-hf", directory, "--workdir", str(tmp_path / "refused"))
  assert refused.returncode == 2 and refused.stderr.count("\n") == 1
  assert "model_type 'tiny_gpt' is not an architecture txf imports" in refused.stderr
  assert "--plugins FILE" in refused.stderr

  imported = txf_cli("import-hf", directory, "--workdir", workdir, "--plugins", plugin)
  assert imported.returncode == 0, imported.stderr[-3000:]
  stored = json.load(open(os.path.join(workdir, "config.json")))
  assert stored["plugins"] == os.path.abspath(plugin) and stored["model"]["num_decoder_layers"] == 2

  # the serving command, from the run's config.plugins: greedy ids equal transformers' generate
  new = 8
  generated = txf_cli("generate", "--workdir", workdir, "--prompt", "the big cat",
                      "--max_new_tokens", str(new), "--temperature", "0")
  assert generated.returncode == 0, generated.stderr[-3000:]
  eot = tokenizer.convert_tokens_to_ids(EOT)
  prompt = tokenizer("the big cat")["input_ids"]
  with torch.no_grad():
    ids = model.generate(torch.tensor([[eot] + prompt]), attention_mask=torch.ones(1, len(prompt) + 1,
                         dtype=torch.long), do_sample=False, max_new_tokens=new, pad_token_id=eot)
  greedy = ids[0, len(prompt) + 1:].tolist()
  greedy = greedy[:greedy.index(eot)] if eot in greedy else greedy
  assert generated.stdout == tokenizer.decode(prompt + greedy, skip_special_tokens=True) + "\n"

  exported = txf_cli("export-hf", "--workdir", workdir, "--output", out)
  assert exported.returncode == 0, exported.stderr[-3000:]
  config = json.load(open(os.path.join(out, "config.json")))
  original = json.load(open(os.path.join(directory, "config.json")))
  assert config["model_type"] == "tiny_gpt"
  assert {k: config[k] for k in RENAMED} == {k: original[k] for k in RENAMED}
  assert not set(RENAMED.values()) & set(config)
  theirs, ours = load_file(os.path.join(directory, "model.safetensors")), load_file(
      os.path.join(out, "model.safetensors"))
  assert sorted(ours) == sorted(theirs)
  assert all(np.array_equal(ours[k], theirs[k]) for k in theirs)
