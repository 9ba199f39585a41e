"""Hugging Face GPT-2 in txf, against transformers' GPT2LMHeadModel as the reference.

A small GPT-2 (n_embd 32, 2 layers, 4 heads, 64 positions) is built here with random weights over
a byte-level BPE trained here with ``tokenizers`` (vocab.json + merges.txt, <|endoftext|> the last
id as in GPT-2, what GPT2TokenizerFast reads), trained briefly in torch so that its outputs end
with <|endoftext|>, and saved with save_pretrained. Then: teacher-forced logits equal torch's (to
1e-5) with no probability on txf's extra ids; greedy continuations of prompts and the beam-2/4
unconditional outputs equal GPT2LMHeadModel.generate's ids; export -> the state dict equals the
original exactly, from_pretrained loads model and tokenizer, and re-importing the export gives the
same parameters; the CLI imports and generates, and the shakespeare_char experiment fine-tunes
from the import (init_from) on a tiny text file; unsupported options are one error line. Skipped
when torch or transformers are absent (pip install '.[hf]').
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
from txf.core.errors import TxfError  # noqa: E402
from txf.inference import load_run  # noqa: E402
from txf import hf  # noqa: E402

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
  bpe.train_from_iterator(lines, vocab_size=300, min_frequency=2)
  bpe.save_model(directory)  # vocab.json + merges.txt
  vocab_path = os.path.join(directory, "vocab.json")
  vocab = json.load(open(vocab_path))
  vocab[EOT] = len(vocab)  # <|endoftext|> the last id, as GPT-2's 50256
  json.dump(vocab, open(vocab_path, "w"))
  tokenizer = transformers.GPT2TokenizerFast.from_pretrained(directory)
  eot = tokenizer.convert_tokens_to_ids(EOT)
  assert eot == len(tokenizer) - 1 and tokenizer.eos_token == EOT
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
  threads = torch.get_num_threads()
  torch.set_num_threads(1)  # tiny matmuls: one thread is ~15x faster on a busy 2-core machine
  model.train()
  for step in range(60):  # outputs end with <|endoftext|>, and are not all alike
    batch = slice((step % 6) * 50, (step % 6) * 50 + 50)
    loss = model(input_ids=ids[batch], labels=labels[batch]).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
  torch.set_num_threads(threads)
  model.eval()
  model.save_pretrained(directory)
  return directory, model, tokenizer


@pytest.fixture(scope="module")
def imported(small, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("runs") / "gpt2")
  hf.import_hf(small[0], workdir)
  return workdir


def eot_id(tokenizer):
  return tokenizer.convert_tokens_to_ids(EOT)


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


PROMPTS = ["the cat", "a big dog sees", "red", "the old house likes the"]


def generate(model, ids, **kw):
  """generate's new ids after the prompt ``ids`` (a list), greedy unless ``kw`` says otherwise."""
  with torch.no_grad():
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         do_sample=False, pad_token_id=model.config.eos_token_id, **kw)
  return out[0, len(ids):].tolist()


def cut_at(ids, end):
  """ids up to the first ``end`` (included)."""
  return ids[:ids.index(end) + 1] if end in ids else ids


def test_greedy_continuations_equal_generate(small, imported):
  """txf's LM decoding of prompts (the generate command's ragged sampler at temperature 0) gives
  generate's greedy ids for <|endoftext|> + prompt, token for token."""
  import jax
  import jax.numpy as jnp
  from txf.data.base import pad_batch
  from txf.decode import compiled_ragged_sampler
  _, model, tokenizer = small
  run = load_run(imported)
  target = run.task.codec.target
  eot = tokenizer.convert_tokens_to_ids(EOT)
  new = 24
  prompts = [run.task.encode_source(p) for p in PROMPTS] + [np.zeros(0, np.int32)]
  width = max(len(p) for p in prompts)
  sampler = compiled_ragged_sampler(run.model_cfg, len(prompts), width, new,
                                    DecodingSpec(temperature=0.0, top_k=0, top_p=1.0))
  ours = np.asarray(sampler(run.params, jnp.asarray(pad_batch(prompts, width)),
                            jnp.asarray([len(p) for p in prompts], jnp.int32),
                            jax.random.split(jax.random.key(0), len(prompts))))
  ended = 0
  for p, row in zip(prompts, ours):
    theirs = cut_at(generate(model, [eot] + target.order[p].tolist(), max_new_tokens=new), eot)
    ended += theirs[-1] == eot
    assert target.order[cut_at(row.tolist(), 2)].tolist() == theirs
  assert ended >= len(prompts) // 2, "the test model should end most continuations"


def test_generate_continues_the_tokenized_prompt_as_transformers(small, imported):
  """``txf generate``'s default on an imported GPT-2 (sample_prompts, start "auto" = "text")
  continues tokenizer(P) itself, as generate(**tokenizer(P, return_tensors="pt")) and the
  text-generation pipeline do: the same text at temperature 0, prompts of several lengths in one
  batch. start="bos" keeps the old start, <|endoftext|> + P."""
  from txf.inference import sample_prompts
  _, model, tokenizer = small
  run = load_run(imported)
  eot = tokenizer.convert_tokens_to_ids(EOT)
  greedy = DecodingSpec(temperature=0.0, top_k=0, top_p=1.0)
  new = 16
  ours = sample_prompts(run, PROMPTS, new, greedy)
  old = sample_prompts(run, PROMPTS, new, greedy, start="bos")
  differ = 0
  for prompt, (text,), (old_text,) in zip(PROMPTS, ours, old):
    with torch.no_grad():
      out = model.generate(**tokenizer(prompt, return_tensors="pt"), do_sample=False,
                           max_new_tokens=new, pad_token_id=eot)
    assert text == tokenizer.decode(out[0], skip_special_tokens=True)
    ids = hf_ids(tokenizer, prompt)
    assert old_text == tokenizer.decode(ids + generate(model, [eot] + ids, max_new_tokens=new),
                                        skip_special_tokens=True)
    differ += text != old_text
  assert differ, "the two starts should give other text for some prompt"


@pytest.mark.parametrize("beams", [2, 4])
def test_unconditional_beam_search_equals_generate(small, imported, beams):
  """Beam search from <|endoftext|> alone (txf.decode.translate_ids, the power penalty with alpha 1
  and early stopping of an imported run) = generate(num_beams, length_penalty=1.0,
  early_stopping=True) from [<|endoftext|>]."""
  from txf.decode import translate_ids
  _, model, tokenizer = small
  run = load_run(imported)
  eot = tokenizer.convert_tokens_to_ids(EOT)
  spec = DecodingSpec.from_config(run.config, beam_size=beams)
  assert (spec.length_penalty, spec.alpha, spec.early_stopping) == ("power", 1.0, True)
  ours = translate_ids(run.model_cfg, run.params, [np.asarray([2], np.int32)], 1, 40, spec,
                       batch_size=1, cut=False)[0]
  theirs = generate(model, [eot], num_beams=beams, length_penalty=1.0, early_stopping=True,
                    max_new_tokens=39)
  assert theirs[-1] == eot, "the test model should end its beam output"
  assert run.task.codec.target.order[ours].tolist() == theirs


def test_tokenizer_ids_and_text_match(small, imported):
  _, _, tokenizer = small
  codec = load_run(imported).task.codec
  for s in PROMPTS + ["zebra café, 42!", " two  spaces", f"a{EOT}b"]:
    ours = codec.encode_source(s, 0, eos=False)
    assert codec.target.order[ours].tolist() == hf_ids(tokenizer, s)
    if EOT not in s:  # (txf's decode_target ends the text at EOS)
      assert codec.decode_target(ours) == tokenizer.decode(hf_ids(tokenizer, s),
                                                           skip_special_tokens=True)


def test_export_round_trip(small, imported, tmp_path):
  """HF -> txf -> HF: every stored tensor equal (max |difference| 0), from_pretrained loads model
  and tokenizer with the same logits and ids, and importing the export gives txf's parameters."""
  import jax
  from safetensors.numpy import load_file
  from txf.runtime.workdir import load_params
  directory, model, tokenizer = small
  out = str(tmp_path / "exported")
  hf.export_hf(imported, out)
  exported = load_file(os.path.join(out, "model.safetensors"))
  saved = load_file(os.path.join(directory, "model.safetensors"))
  assert sorted(exported) == sorted(saved)
  worst = max(float(np.abs(exported[k] - saved[k]).max()) for k in saved)
  print(f"export round trip: max |difference| = {worst:.3g} over {len(saved)} tensors")
  assert worst == 0.0
  again = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
  again_tok = transformers.GPT2TokenizerFast.from_pretrained(out)
  for s in PROMPTS:
    assert again_tok(s)["input_ids"] == hf_ids(tokenizer, s)
  ids = torch.tensor([hf_ids(tokenizer, PROMPTS[3])])
  with torch.no_grad():
    assert torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)
  reimported = str(tmp_path / "again")
  hf.import_hf(out, reimported)  # this time from tokenizer.json
  for a, b in zip(jax.tree_util.tree_leaves(load_params(imported)),
                  jax.tree_util.tree_leaves(load_params(reimported))):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("option", ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
                                    "add_cross_attention", "activation_function"])
def test_import_refuses_what_txf_cannot_represent(small, tmp_path, option):
  directory = tmp_path / "bad"
  directory.mkdir()
  for name in ("vocab.json", "merges.txt", "model.safetensors"):
    (directory / name).write_bytes(open(os.path.join(small[0], name), "rb").read())
  config = json.load(open(os.path.join(small[0], "config.json")))
  config[option] = "silu" if option == "activation_function" else True
  (directory / "config.json").write_text(json.dumps(config))
  with pytest.raises(TxfError, match=option) as e:
    hf.import_hf(str(directory), str(tmp_path / "w"))
  assert "\n" not in str(e.value)
  assert not os.path.exists(tmp_path / "w")


def test_export_claims_only_runs_from_an_imported_gpt2(imported, tmp_path):
  """txf's own LM (shakespeare_char) is not taken as GPT-2: the Marian export refuses it naming
  its family; an imported run with a changed field is refused naming the field."""
  from txf.core.config import load_experiment
  from txf.runtime.workdir import config_to_dict, load_config, write_json
  workdir = tmp_path / "run"
  workdir.mkdir()
  write_json(str(workdir / "config.json"), config_to_dict(load_experiment("shakespeare_char")))
  with pytest.raises(TxfError) as e:
    hf.export_hf(str(workdir), str(tmp_path / "out"))
  assert "model.family='decoder_lm'" in str(e.value) and "imported GPT-2" in str(e.value)
  changed = tmp_path / "changed"
  changed.mkdir()
  for name in os.listdir(imported):
    if name != "config.json":
      os.symlink(os.path.join(imported, name), changed / name)
  config = load_config(imported)
  config.model.positional = "sinusoidal"
  write_json(str(changed / "config.json"), config_to_dict(config))
  with pytest.raises(TxfError, match=r"as a GPT-2 model: model.positional='sinusoidal'"):
    hf.export_hf(str(changed), str(tmp_path / "out"))


def test_cli_import_generate_and_fine_tune(small, tmp_path):
  """`txf import-hf DIR --workdir W`, `txf generate --workdir W` (generate's greedy text for
  tokenizer(P)), then the shakespeare_char
  experiment fine-tuned from W (init_from) a few steps on a tiny text file, with W's tokenizer."""
  from txf.core.config import load_experiment
  from txf.train import train
  from txf.runtime.workdir import load_params
  workdir = str(tmp_path / "gpt2")
  cli = [sys.executable, "-m", "txf.cli"]
  imp = subprocess.run(cli + ["import-hf", small[0], "--workdir", workdir], capture_output=True,
                       text=True, env=ENV, timeout=300)
  assert imp.returncode == 0, imp.stderr
  gen = subprocess.run(cli + ["generate", "--workdir", workdir, "--prompt", "the big",
                              "--max_new_tokens", "12", "--temperature", "0"],
                       capture_output=True, text=True, env=ENV, timeout=300)
  assert gen.returncode == 0, gen.stderr
  _, model, tokenizer = small
  prompt = hf_ids(tokenizer, "the big")
  greedy = generate(model, prompt, max_new_tokens=12)  # tokenizer(P) continued, as transformers
  assert gen.stdout == tokenizer.decode(prompt + greedy, skip_special_tokens=True) + "\n"
  data = tmp_path / "data" / "tiny"
  data.mkdir(parents=True)
  (data / "input.txt").write_text("\n".join(corpus(200, 3)) + "\n")
  c = load_experiment("shakespeare_char")
  c.init_from = workdir
  c.data.source, c.data.path = "text:tiny", str(tmp_path / "data")
  c.data.data_dir = str(tmp_path / "prepared")
  c.data.max_target_len = 32
  c.num_train_steps, c.batch_size, c.log_every, c.eval_every, c.eval_batches = 3, 4, 1, 3, 1
  c.checkpoint_every, c.num_samples, c.time_limit_minutes = 0, 1, 0.0  # one in-loop sample
  c.optimizer.warmup_steps, c.optimizer.cooldown_steps = 1, 0
  ft = str(tmp_path / "ft")
  train(c, ft)
  run = load_run(ft)
  assert run.model_cfg.positional == "learned" and run.model_cfg.mask_special_logits
  assert run.task.vocab_size == len(small[2]) + 3
  assert run.task.codec.target.kind == "gpt2"
  rows = [json.loads(line) for line in open(os.path.join(ft, "metrics.jsonl"))]
  losses = [r["loss"] for r in rows if "loss" in r]
  assert losses and all(np.isfinite(losses))
  before, after = load_params(workdir), load_params(ft)
  assert not np.array_equal(before["decoder"]["final_norm"]["scale"],
                            after["decoder"]["final_norm"]["scale"])
  # the run trained here exports, loads in transformers with its logits, and comes back exactly
  import jax
  from txf.models import build_model
  out, again = str(tmp_path / "exported"), str(tmp_path / "again")
  hf.export_hf(ft, out)
  hf.import_hf(out, again)
  for a, b in zip(jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(load_params(again))):
    np.testing.assert_array_equal(a, b)
  exported = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
  row = hf_ids(tokenizer, "the big cat sees a red tree")
  with torch.no_grad():
    theirs = exported(input_ids=torch.tensor([[eot_id(tokenizer)] + row[:-1]])).logits.numpy()[0]
  order = run.task.codec.target.order
  ours = np.asarray(build_model(run.model_cfg, deterministic=True).apply(
      {"params": run.params}, targets=run.task.codec.target.to_txf(row)[None]))[0]
  real = order < len(tokenizer)
  np.testing.assert_allclose(ours[:, real], theirs[:, order[real]], atol=1e-5)
