"""Hugging Face Llama-architecture decoders (Llama, Qwen2, Mistral) in txf, against transformers'
LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM as the reference.

Small random models (d 32, 2 layers, 4 query heads over 2 key/value heads, vocabulary 96) are saved
with transformers 5's save_pretrained, with no tokenizer (txf imports the weights with its id
stand-in, txf.data.hf_ids: text is the model's ids in decimal): a Llama with untied output and
rope_scaling llama3, a Llama with a tied output, linear rope_scaling and every bias, a Qwen2 (Q/K/V
biases, tied) and a Mistral whose sliding window is larger than the context. Their weights are
drawn wider than transformers' init (std 0.3) so logits spread over several units. Then:
teacher-forced logits equal torch's to float32 rounding, with no mass on txf's extra rows; greedy
continuations (``txf.inference.sample_prompts`` at temperature 0, the generate command's path)
equal ``generate``'s ids; export writes every tensor exactly, loads in transformers with equal
logits, and importing the export gives the same parameters; a run fine-tuned from an import
(init_from) exports and comes back with the same parameters and logits; unsupported settings,
truncated weights and unknown architectures are one error line. Skipped without torch or
transformers (pip install '.[hf]').
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[hf]'")
transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")

from tests.conftest import run_txf  # noqa: E402
from txf import hf  # noqa: E402
from txf.core.errors import TxfError  # noqa: E402
from txf.decode import DecodingSpec  # noqa: E402
from txf.inference import load_run, sample_prompts  # noqa: E402

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

VOCAB, BOS, EOS = 96, 1, 2
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             bos_token_id=BOS, eos_token_id=EOS, rms_norm_eps=1e-5, rope_theta=500.0)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
KINDS = {
    "llama_llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                     dict(rope_scaling=LLAMA3, tie_word_embeddings=False)),
    "llama_tied_linear_biases": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                                 dict(rope_scaling={"rope_type": "linear", "factor": 2.0},
                                      tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(sliding_window=4096, tie_word_embeddings=False)),
}
ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def make_model(kind, seed=0):
  config_cls, model_cls, extra = KINDS[kind]
  torch.manual_seed(seed)
  model = model_cls(config_cls(**SHAPE, **extra))
  with torch.no_grad():  # wider than the default init: logits of several units, decisive argmaxes
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1 + 0.3 * torch.randn_like(p))
      else:
        p.copy_(0.3 * torch.randn_like(p))
  return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """kind -> (save_pretrained dir, model, txf workdir of its import)."""
  out = {}
  root = tmp_path_factory.mktemp("llama")
  for kind in KINDS:
    model = make_model(kind)
    directory = str(root / kind)
    model.save_pretrained(directory)
    workdir = str(root / f"{kind}-txf")
    hf.import_hf(directory, workdir, max_len=48)
    out[kind] = (directory, model, workdir)
  return out


def hf_view(logits, order):
  """txf logits [..., V_hf + 3] -> the Hugging Face ids' columns [..., V_hf], in Hugging Face's order."""
  inverse = np.empty(len(order), np.int64)
  inverse[order] = np.arange(len(order))
  return logits[..., inverse[:len(order) - 3]]


def txf_logits(run, hf_ids):
  """txf's teacher-forced logits for the Hugging Face ids ``hf_ids`` (a row starting with BOS)."""
  from txf.models import build_model
  codec = run.task.codec.target
  targets = codec.to_txf(hf_ids[1:] + [0])[None]  # txf shifts right from its decoder start (BOS)
  return np.asarray(build_model(run.model_cfg, deterministic=True).apply(
      {"params": run.params}, targets=targets))[0]


ROW = [BOS, 5, 17, 33, 80, 2, 41, 9, 60, 95, 3, 12, 7]


@pytest.mark.parametrize("kind", list(KINDS))
def test_teacher_forced_logits_equal_torch(saved, kind):
  _, model, workdir = saved[kind]
  run = load_run(workdir)
  assert run.model_cfg.decoder_start_id == run.task.codec.target.to_txf([BOS])[0]
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor([ROW])).logits.numpy()[0]
  all_ours = txf_logits(run, ROW)
  ours = hf_view(all_ours, run.task.codec.target.order)
  scale = np.abs(theirs).max()
  diff = np.abs(ours - theirs).max()
  print(f"{kind}: teacher-forced logits max |difference| {diff:.3g} (logits up to {scale:.2f})")
  assert scale > 2.0, "the test model's logits should spread"
  assert diff <= 4e-6 * scale
  assert (all_ours[:, [0, 1, 3]] <= -1e8).all()  # txf's PAD/BOS/UNK rows: never predicted


def generate(model, ids, new):
  with torch.no_grad():
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         do_sample=False, max_new_tokens=new, pad_token_id=EOS)
  return out[0, len(ids):].tolist()


PROMPTS = [[BOS, 5, 17], [BOS, 80, 41, 9, 60, 95, 12], [BOS], [7, 7, 7, 30]]


@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_continuations_equal_generate(saved, kind):
  """sample_prompts at temperature 0 (``txf generate``'s path, prompts of several lengths in one
  batch, each continuing its own ids as generate(input_ids) does) = generate's greedy ids."""
  _, model, workdir = saved[kind]
  run = load_run(workdir)
  new = 12
  texts = sample_prompts(run, [" ".join(map(str, p)) for p in PROMPTS], new,
                         DecodingSpec(temperature=0.0, top_k=0, top_p=1.0))
  for prompt, (text,) in zip(PROMPTS, texts):
    theirs = generate(model, prompt, new)
    if EOS in theirs:
      theirs = theirs[:theirs.index(EOS)]
    # the text is the prompt's ids and the new ones, the model's EOS ending it
    assert text.split() == [str(i) for i in prompt + theirs], (prompt, text, theirs)


@pytest.mark.parametrize("kind,beams", [("llama_llama3", 2), ("qwen2", 4)])
def test_beam_search_from_bos_equals_generate(saved, kind, beams):
  """Beam search from the decoder start alone (txf.decode.translate_ids with an imported run's
  settings: power penalty, alpha 1, early stopping) = generate(num_beams, length_penalty=1.0,
  early_stopping=True) from [BOS]."""
  from txf.decode import translate_ids
  _, model, workdir = saved[kind]
  run = load_run(workdir)
  spec = DecodingSpec.from_config(run.config, beam_size=beams)
  assert (spec.length_penalty, spec.alpha, spec.early_stopping) == ("power", 1.0, True)
  ours = translate_ids(run.model_cfg, run.params, [np.asarray([2], np.int32)], 1, 15, spec,
                       batch_size=1, cut=False)[0]
  with torch.no_grad():
    theirs = model.generate(torch.tensor([[BOS]]), attention_mask=torch.ones(1, 1, dtype=torch.long),
                            do_sample=False, num_beams=beams, length_penalty=1.0,
                            early_stopping=True, max_new_tokens=15, pad_token_id=EOS)[0, 1:].tolist()
  ours = run.task.codec.target.order[ours].tolist()
  if EOS in ours:
    ours = ours[:ours.index(EOS) + 1]
  while theirs and theirs[-1] == EOS and theirs.count(EOS) > 1:  # generate pads with EOS
    theirs = theirs[:-1]
  assert ours == theirs


@pytest.mark.parametrize("kind", list(KINDS))
def test_export_round_trip(saved, kind, tmp_path):
  """HF -> txf -> HF: every tensor equal, from_pretrained gives the same logits, and importing the
  export gives txf's parameters exactly."""
  import jax
  from safetensors.numpy import load_file
  from txf.runtime.workdir import load_params
  directory, model, workdir = saved[kind]
  out = str(tmp_path / "exported")
  said = []
  hf.export_hf(workdir, out, say=said.append)
  exported = load_file(os.path.join(out, "model.safetensors"))
  original = load_file(os.path.join(directory, "model.safetensors"))
  assert sorted(exported) == sorted(original)
  assert all(np.array_equal(exported[k], original[k]) for k in original)
  assert any("no tokenizer" in line for line in said)
  again = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert type(again) is type(model)
  ids = torch.tensor([ROW])
  with torch.no_grad():
    assert torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)
  reimported = str(tmp_path / "again")
  hf.import_hf(out, reimported, max_len=48)
  a, b = load_params(workdir), load_params(reimported)
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_fine_tuned_run_exports_and_comes_back(saved, tmp_path):
  """A run trained here from an import (init_from, 3 steps on lines of ids) exports as a Llama:
  transformers' logits equal txf's for the trained parameters, and re-importing gives them back."""
  import jax
  from txf.core.config import load_experiment
  from txf.runtime.workdir import load_params
  from txf.train import train
  _, _, workdir = saved["llama_llama3"]
  data = tmp_path / "data" / "ids"
  data.mkdir(parents=True)
  rng = np.random.default_rng(0)
  (data / "input.txt").write_text("\n".join(" ".join(map(str, rng.integers(4, VOCAB, 10)))
                                            for _ in range(60)) + "\n")
  c = load_experiment("shakespeare_char")
  c.init_from = workdir
  c.data.source, c.data.path = "text:ids", str(tmp_path / "data")
  c.data.data_dir = str(tmp_path / "prepared")
  c.data.max_target_len = 16
  c.num_train_steps, c.batch_size, c.log_every, c.eval_every, c.eval_batches = 3, 4, 1, 3, 1
  c.checkpoint_every, c.num_samples, c.time_limit_minutes, c.decode_examples = 0, 0, 0.0, 0
  c.optimizer.warmup_steps, c.optimizer.cooldown_steps = 1, 0
  c.optimizer.label_smoothing = 0.0
  ft = str(tmp_path / "ft")
  train(c, ft)
  before, after = load_params(workdir), load_params(ft)
  moved = max(float(np.abs(x - y).max()) for x, y in zip(jax.tree_util.tree_leaves(before),
                                                         jax.tree_util.tree_leaves(after)))
  assert moved > 0, "fine-tuning should change the parameters"
  out = str(tmp_path / "exported")
  hf.export_hf(ft, out)
  model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor([ROW])).logits.numpy()[0]
  run = load_run(ft)
  ours = hf_view(txf_logits(run, ROW), run.task.codec.target.order)
  assert np.abs(ours - theirs).max() <= 4e-6 * np.abs(theirs).max()
  again = str(tmp_path / "again")
  hf.import_hf(out, again, max_len=48)
  for x, y in zip(jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(load_params(again))):
    np.testing.assert_array_equal(x, y)


def _copy_with_config(saved_dir, target, **changes):
  os.makedirs(target)
  os.symlink(os.path.join(saved_dir, "model.safetensors"), os.path.join(target, "model.safetensors"))
  config = json.load(open(os.path.join(saved_dir, "config.json")))
  for k, v in changes.items():
    if v is None:
      config.pop(k, None)
    else:
      config[k] = v
  with open(os.path.join(target, "config.json"), "w") as f:
    json.dump(config, f)
  return target


@pytest.mark.parametrize("changes,words", [
    ({"sliding_window": 16}, "sliding_window=16 is smaller than the context 48"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0}},
     "rope_scaling kind 'yarn'"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"eos_token_id": None}, "eos_token_id is missing")])
def test_import_refuses_what_txf_cannot_represent(saved, tmp_path, changes, words):
  directory = saved["mistral"][0]
  bad = _copy_with_config(directory, str(tmp_path / "bad"), **changes)
  with pytest.raises(TxfError, match=words) as e:
    hf.import_hf(bad, str(tmp_path / "w"), max_len=48)
  assert "\n" not in str(e.value)
  assert not os.path.exists(tmp_path / "w")


def test_mistral_window_caps_the_model_length(saved, tmp_path):
  """A window at least the context imports; txf's model.max_len is then at most the window."""
  ok = _copy_with_config(saved["mistral"][0], str(tmp_path / "ok"), sliding_window=48)
  hf.import_hf(ok, str(tmp_path / "w"), max_len=48)
  assert load_run(str(tmp_path / "w")).model_cfg.max_len == 48


def test_cli_faults_are_one_error_line(saved, tmp_path):
  """Truncated weights, missing weights and an unknown model_type: one TxfError line each (the
  last names every architecture txf reads); the CLI prints it as one `txf: error:` line, exit 2."""
  directory = saved["llama_llama3"][0]
  cases = {}
  truncated = tmp_path / "truncated"
  truncated.mkdir()
  (truncated / "config.json").write_text(open(os.path.join(directory, "config.json")).read())
  blob = open(os.path.join(directory, "model.safetensors"), "rb").read()
  (truncated / "model.safetensors").write_bytes(blob[:len(blob) // 2])
  cases["truncated"] = str(truncated)
  missing = tmp_path / "missing"
  missing.mkdir()
  (missing / "config.json").write_text(open(os.path.join(directory, "config.json")).read())
  cases["missing"] = str(missing)
  unknown = tmp_path / "unknown"
  unknown.mkdir()
  (unknown / "config.json").write_text(json.dumps({"model_type": "falcon"}))
  cases["unknown"] = str(unknown)
  lines = []
  for case, src in cases.items():  # in this process: one TxfError line each
    with pytest.raises(TxfError) as e:
      hf.import_hf(src, src + "-w")
    assert "\n" not in str(e.value) and not os.path.exists(src + "-w"), case
    lines += [str(e.value), ""]
  proc = run_txf("import-hf", cases["truncated"], "--workdir", str(tmp_path / "w"))  # the CLI's
  assert proc.returncode == 2 and proc.stderr == f"txf: error: {lines[0]}\n", proc.stderr
  assert "truncated or damaged" in lines[0] and "no model.safetensors" in lines[2]
  for name in ("bert", "gpt2", "t5", "marian", "llama", "qwen2", "mistral"):
    assert name in lines[4]


def test_cli_import_and_generate(saved, tmp_path):
  """`txf import-hf` names the missing tokenizer in one note; `txf generate --temperature 0` on
  a prompt of ids prints generate's greedy continuation."""
  directory, model, _ = saved["qwen2"]
  workdir = str(tmp_path / "w")
  cli = [sys.executable, "-m", "txf.cli"]
  imp = subprocess.run(cli + ["import-hf", directory, "--workdir", workdir], capture_output=True,
                       text=True, env=ENV, timeout=300)
  assert imp.returncode == 0, imp.stderr
  assert [line for line in imp.stderr.splitlines() if line.startswith("txf: note:")] == [
      line for line in imp.stderr.splitlines() if "tokenizer" in line]
  assert "no tokenizer.json" in imp.stderr
  gen = subprocess.run(cli + ["generate", "--workdir", workdir, "--prompt", "1 5 17",
                              "--max_new_tokens", "8", "--temperature", "0"],
                       capture_output=True, text=True, env=ENV, timeout=300)
  assert gen.returncode == 0, gen.stderr
  theirs = generate(model, [1, 5, 17], 8)
  if EOS in theirs:
    theirs = theirs[:theirs.index(EOS)]
  assert gen.stdout.split() == [str(i) for i in [1, 5, 17] + theirs]


def _llama_with_tokenizer(root):
  """A small Llama whose tokenizer (a Llama-2-style SentencePiece BPE with byte fallback and a
  <s> template, trained here) is saved beside it by transformers 5, as a Hub checkpoint is."""
  from tests.test_hf_tokenizer_json import llama2
  tok, names = llama2(root)
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **names)
  shape = dict(SHAPE, vocab_size=tok.get_vocab_size(), bos_token_id=tok.token_to_id("<s>"),
               eos_token_id=tok.token_to_id("</s>"))
  torch.manual_seed(3)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_((1 + 0.3 * torch.randn_like(p)) if "norm" in name else 0.3 * torch.randn_like(p))
  directory = str(root / "llama-tok")
  model.eval().save_pretrained(directory)
  fast.save_pretrained(directory)
  return directory, model, transformers.AutoTokenizer.from_pretrained(directory)


def test_a_llama_with_its_tokenizer_json_generates_text_as_transformers(tmp_path):
  """A Llama saved with its tokenizer.json: ``txf import-hf`` reads the tokenizer (and says which
  file), ``txf generate --prompt P --temperature 0`` prints transformers'
  ``decode(generate(**tokenizer(P)))`` (the tokenizer adds <s>, so txf starts with it), and the
  export writes the tokenizer back, which transformers loads with the same ids."""
  directory, model, tokenizer = _llama_with_tokenizer(tmp_path)
  assert tokenizer("the cat")["input_ids"][0] == tokenizer.bos_token_id  # the template adds <s>
  workdir, cli = str(tmp_path / "w"), [sys.executable, "-m", "txf.cli"]
  imp = subprocess.run(cli + ["import-hf", directory, "--workdir", workdir], capture_output=True,
                       text=True, env=ENV, timeout=300)
  assert imp.returncode == 0 and "tokenizer: tokenizer.json" in imp.stdout, imp.stderr
  run = load_run(workdir)
  from txf.inference import sample_prompts
  prompts = ["the cat sat", "A small house, by the river."]
  greedy = DecodingSpec(temperature=0.0, top_k=0, top_p=1.0)
  ours = sample_prompts(run, prompts, 12, greedy)
  for prompt, (text,) in zip(prompts, ours):
    with torch.no_grad():
      out = model.generate(**tokenizer(prompt, return_tensors="pt"), do_sample=False,
                           max_new_tokens=12, pad_token_id=tokenizer.eos_token_id)
    assert text == tokenizer.decode(out[0], skip_special_tokens=True)
  gen = subprocess.run(cli + ["generate", "--workdir", workdir, "--prompt", prompts[0],
                              "--max_new_tokens", "12", "--temperature", "0"],
                       capture_output=True, text=True, env=ENV, timeout=300)
  assert gen.returncode == 0 and gen.stdout.strip() == ours[0][0].strip(), gen.stderr
  out = str(tmp_path / "exported")
  hf.export_hf(workdir, out)
  again = transformers.AutoTokenizer.from_pretrained(out)
  for prompt in prompts:
    assert again(prompt)["input_ids"] == tokenizer(prompt)["input_ids"]
