"""Hugging Face T5 (v1.0 and v1.1) in txf, against transformers' T5ForConditionalGeneration as the
reference.

Two small T5 models are built here: v1.0's shape (ReLU FFN, tied head over d_model^-0.5 h, d_kv =
d_model / h) and v1.1's (gated tanh-GELU FFN, its own lm_head without scale, 6 heads of d_kv 8 on
d_model 32: inner width 48), with a SentencePiece model trained here (pad 0, EOS 1, UNK 2, no BOS)
and extra_ids sentinels, vocab_size above the tokenizer's size; each is trained briefly in torch
on a prefixed copy/translate task so that it ends its outputs with EOS, and saved with
save_pretrained. Then: teacher-forced logits equal torch's; import -> txf translate (greedy and
beam 4) equals generate's strings; export -> the weights equal the original exactly and
from_pretrained loads them; bad configs are one error line. Skipped without torch/transformers.
"""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[hf]'")
transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")
import sentencepiece as spm  # noqa: E402

from txf.decode import DecodingSpec  # noqa: E402
from txf.inference import load_run, translate_lines  # noqa: E402
from txf import hf  # noqa: E402

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

EN = "the a cat dog bird fish sees likes eats big small red green old young house tree".split()
DE = "der ein katze hund vogel fisch sieht mag isst gross klein rot gruen alt jung haus baum".split()
WORDS = dict(zip(EN, DE))
PREFIX = "translate English to German: "
EXTRA_IDS = 10


def corpus(n, seed):
  rng = np.random.default_rng(seed)
  src = [" ".join(rng.choice(EN, rng.integers(2, 7))) for _ in range(n)]
  return [PREFIX + s for s in src], [" ".join(WORDS[w] for w in s.split()) for s in src]


def train_spm(lines, size):
  """T5's special ids: pad 0, EOS 1, UNK 2, no BOS."""
  proto = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=proto, vocab_size=size,
                                 model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                 pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
                                 hard_vocab_limit=False, num_threads=1, minloglevel=2)
  return proto.getvalue()


SHAPES = {
    "v1.0": dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, feed_forward_proj="relu"),
    "v1.1": dict(d_model=32, d_kv=8, num_heads=6, d_ff=48, feed_forward_proj="gated-gelu",
                 tie_word_embeddings=False)}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def small(request, tmp_path_factory):
  """(version, save_pretrained dir, T5ForConditionalGeneration loaded from it, T5Tokenizer,
  held-out sentences)."""
  version = request.param
  torch.set_num_threads(1)  # tiny matrices: threads only contend for CI's 2 cores
  root = tmp_path_factory.mktemp("t5")
  src, tgt = corpus(400, 0)
  proto = train_spm(src + tgt, 48)
  pieces = spm.SentencePieceProcessor(model_proto=proto).get_piece_size()
  directory = str(root / "hf")
  os.makedirs(directory)
  with open(os.path.join(directory, "spiece.model"), "wb") as f:
    f.write(proto)
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "T5Tokenizer", "extra_ids": EXTRA_IDS}, f)
  tokenizer = transformers.T5Tokenizer.from_pretrained(directory)
  torch.manual_seed(0)
  config = transformers.T5Config(
      vocab_size=pieces + EXTRA_IDS + 3, num_layers=2, num_decoder_layers=2,
      relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
      decoder_start_token_id=0, **SHAPES[version])
  model = transformers.T5ForConditionalGeneration(config)
  if version == "v1.1":  # its own output layer (as the v1.1 checkpoints have)
    model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone()
                                              + 0.5 * torch.randn_like(model.shared.weight))
  batch = tokenizer(src, text_target=tgt, return_tensors="pt", padding=True)
  batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
  optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
  model.train()
  for step in range(120):  # a few passes: outputs end with EOS, translations are not yet perfect
    rows = slice((step % 8) * 50, (step % 8) * 50 + 50)
    loss = model(**{k: v[rows] for k, v in batch.items()}).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
  model.save_pretrained(directory)
  from safetensors.torch import load_file, save_file
  path = os.path.join(directory, "model.safetensors")
  saved = load_file(path)
  if version == "v1.1" and "lm_head.weight" not in saved:
    saved["lm_head.weight"] = model.lm_head.weight.detach().clone()
    save_file(saved, path, metadata={"format": "pt"})
  reference = transformers.T5ForConditionalGeneration.from_pretrained(directory).eval()
  if version == "v1.1":
    assert not torch.equal(reference.lm_head.weight, reference.shared.weight)
  assert reference.config.scale_decoder_outputs == (version == "v1.0")
  test_src, _ = corpus(16, 1)
  return version, directory, reference, tokenizer, test_src


@pytest.fixture(scope="module")
def imported(small, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("runs") / "t5")
  hf.import_hf(small[1], workdir, max_len=48)
  return workdir


def generate(model, tokenizer, sentences, beams, max_new_tokens=30):
  enc = tokenizer(sentences, return_tensors="pt", padding=True)
  with torch.no_grad():
    out = model.generate(**enc, num_beams=beams, length_penalty=1.0, early_stopping=True,
                         max_new_tokens=max_new_tokens, do_sample=False)
  ended = [bool((row[1:] == tokenizer.eos_token_id).any()) for row in out]
  return tokenizer.batch_decode(out, skip_special_tokens=True), ended


def test_teacher_forced_logits_equal_torch(small, imported):
  version, _, model, tokenizer, sentences = small
  run = load_run(imported)
  assert (run.model_cfg.head_dim * run.model_cfg.num_heads != run.model_cfg.d_model) == (
      version == "v1.1")
  enc = tokenizer(sentences[:4], text_target=[s[len(PREFIX):] for s in sentences[:4]],
                  return_tensors="pt", padding=True)
  labels = enc["labels"]
  start = torch.zeros((labels.shape[0], 1), dtype=labels.dtype)
  decoder_inputs = torch.cat([start, labels[:, :-1]], 1)
  with torch.no_grad():
    theirs = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                   decoder_input_ids=decoder_inputs).logits.numpy()
  order = run.task.codec.target.order
  to_txf = np.argsort(order)  # T5 id -> txf id
  inputs = to_txf[enc["input_ids"].numpy()] * enc["attention_mask"].numpy()
  targets = to_txf[labels.numpy()]
  from txf.models import build_model
  ours = np.asarray(build_model(run.model_cfg, deterministic=True).apply(
      {"params": run.params}, inputs=inputs, targets=targets))
  real = labels.numpy() != 0  # target positions that are not padding
  worst = float(np.abs(ours[real] - theirs[..., order][real]).max())
  print(f"{version}: teacher-forced logits max |difference| = {worst:.3g}")
  # float32: within 1e-5 + 1e-5 |logit| (summation orders differ; logits reach ~10 here)
  np.testing.assert_allclose(ours[real], theirs[..., order][real], atol=1e-5, rtol=1e-5)


def test_tokenizer_ids_and_detokenization_match(small, imported):
  _, _, _, tokenizer, sentences = small
  codec = load_run(imported).task.codec
  for s in sentences[:5] + ["zebra cat!", "the <extra_id_0> sees <extra_id_9>", "<extra_id_3>a"]:
    np.testing.assert_array_equal(codec.target.order[codec.encode_source(s, 0)],
                                  tokenizer(s)["input_ids"], err_msg=s)
  for n in (0, EXTRA_IDS - 1):
    assert tokenizer.convert_tokens_to_ids(f"<extra_id_{n}>") == codec.target.vocab[f"<extra_id_{n}>"]
  ids = tokenizer(text_target=sentences[0])["input_ids"]
  ids = ids[:3] + tokenizer.convert_tokens_to_ids(["<extra_id_2>"]) + ids[3:]  # sentinels dropped
  assert codec.decode_target(np.argsort(codec.target.order)[ids]) == tokenizer.decode(
      ids, skip_special_tokens=True)


@pytest.mark.parametrize("beams", [1, 4])
def test_translations_equal_generate(small, imported, beams):
  version, _, model, tokenizer, sentences = small
  expected, ended = generate(model, tokenizer, sentences, beams)
  assert sum(ended) >= len(sentences) * 3 // 4, "the test model should end most outputs with EOS"
  run = load_run(imported)
  got = translate_lines(run, sentences, DecodingSpec.from_config(run.config, beam_size=beams,
                                                                 max_extra=30))
  agree = [g == e for g, e, end in zip(got, expected, ended) if end]
  print(f"{version} beam {beams}: {sum(agree)}/{len(agree)} translations ending with EOS agree")
  assert all(agree), [(g, e) for g, e, end in zip(got, expected, ended) if end and g != e]


def test_export_round_trip_is_exact(small, imported, tmp_path):
  version, directory, model, tokenizer, sentences = small
  out = str(tmp_path / "exported")
  hf.export_hf(imported, out)
  from safetensors.numpy import load_file
  exported = load_file(os.path.join(out, "model.safetensors"))
  saved = load_file(os.path.join(directory, "model.safetensors"))
  for key, value in saved.items():  # every stored tensor back bit for bit
    assert np.array_equal(exported[key], value), key
  again = transformers.T5ForConditionalGeneration.from_pretrained(out).eval()
  theirs = model.state_dict()
  worst = max(float((v - theirs[k]).abs().max()) for k, v in again.state_dict().items())
  print(f"{version}: export round trip max |difference| = {worst}")
  assert worst == 0.0 and sorted(again.state_dict()) == sorted(theirs)
  assert again.config.scale_decoder_outputs == model.config.scale_decoder_outputs
  again_tok = transformers.T5Tokenizer.from_pretrained(out)
  assert again_tok.get_vocab() == tokenizer.get_vocab()
  assert generate(again, again_tok, sentences[:6], 1) == generate(model, tokenizer, sentences[:6], 1)


def test_cli_import_then_translate(small, tmp_path):
  if small[0] != "v1.0":
    pytest.skip("one CLI run is enough")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  workdir = str(tmp_path / "cli")
  proc = subprocess.run([sys.executable, "-m", "txf.cli", "import-hf", small[1], "--workdir",
                         workdir], capture_output=True, text=True, env=env)
  assert proc.returncode == 0, proc.stderr
  expected, ended = generate(small[2], small[3], small[4][:4], 1)
  proc = subprocess.run([sys.executable, "-m", "txf.cli", "translate", "--workdir", workdir,
                         "--beam", "1", "--max_extra", "30"], input="\n".join(small[4][:4]) + "\n",
                        capture_output=True, text=True, env=env)
  assert proc.returncode == 0, proc.stderr
  got = proc.stdout.strip().splitlines()[-4:]
  assert any(ended) and all(g == e for g, e, end in zip(got, expected, ended) if end), (got, expected)


def test_import_refuses_what_txf_cannot_represent(small, tmp_path):
  if small[0] != "v1.0":
    pytest.skip("the config checks are the same for both")
  directory = str(tmp_path / "bad")
  os.makedirs(directory)
  for name in ("spiece.model", "model.safetensors"):
    with open(os.path.join(small[1], name), "rb") as f, open(os.path.join(directory, name), "wb") as g:
      g.write(f.read())
  config = json.load(open(os.path.join(small[1], "config.json")))
  config["feed_forward_proj"] = "gated-tanh"
  json.dump(config, open(os.path.join(directory, "config.json"), "w"))
  proc = subprocess.run([sys.executable, "-m", "txf.cli", "import-hf", directory, "--workdir",
                         str(tmp_path / "w")], capture_output=True, text=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
  assert "txf: error:" in proc.stderr and "feed_forward_proj='gated-tanh'" in proc.stderr
  assert not os.path.exists(tmp_path / "w")


def test_fine_tune_from_imported(small, imported, tmp_path):
  """init_from: the imported T5 parameters, options and tokenizer start a txf run (lr 1e-30: the
  parameters stay as they are to 1e-25), whose model is T5's."""
  if small[0] != "v1.1":
    pytest.skip("one fine-tuning run is enough (v1.1: head_dim, gated FFN, untied head)")
  from txf.core.config import base_config
  from txf.train import train
  from txf.runtime.workdir import load_params
  import jax
  data = tmp_path / "data"
  data.mkdir()
  src, tgt = corpus(40, 2)
  for split in ("train", "val", "test"):
    (data / f"{split}.en").write_text("\n".join(src) + "\n")
    (data / f"{split}.de").write_text("\n".join(tgt) + "\n")
  c = base_config()
  c.init_from = imported
  c.num_train_steps, c.batch_size, c.log_every, c.eval_every = 2, 8, 1, 0
  c.checkpoint_every, c.decode_examples, c.eval_batches = 0, 2, 1
  c.optimizer.schedule, c.optimizer.learning_rate, c.optimizer.warmup_steps = "constant", 1e-30, 1
  c.data.source, c.data.data_dir = f"text:{data}", str(tmp_path / "prepared")
  c.data.max_input_len = c.data.max_target_len = 40
  workdir = str(tmp_path / "ft")
  train(c, workdir)
  run = load_run(workdir)
  m = run.model_cfg
  assert (m.attention, m.relative_shared, m.head_dim, m.activation, m.tie_output,
          m.decoder_start_id) == ("dot_product", True, 8, "geglu_tanh", False, 0)
  for a, b in zip(jax.tree_util.tree_leaves(load_params(imported)),
                  jax.tree_util.tree_leaves(load_params(workdir))):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-25)
