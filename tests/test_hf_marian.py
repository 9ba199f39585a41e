"""Hugging Face Marian (OPUS-MT) models in txf, against transformers' MarianMTModel as the reference.

A small Marian model is built here with random weights and a non-zero final_logits_bias, trained
briefly in torch so that it ends its outputs with EOS, and saved with save_pretrained next to
SentencePiece models trained here and a vocab.json (what MarianTokenizer reads). Then:
import -> txf translate (greedy and beam 4) equals MarianMTModel.generate's strings; teacher-forced
logits equal torch's; export -> the state dict equals the original; from_pretrained loads it;
init_from fine-tunes from it; the real opus-mt-en-de shape (d 512, 6+6, swish, 58101 ids) imports
and gives torch's logits. Skipped when torch or transformers are absent (pip install '.[hf]').
"""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from flax.traverse_util import flatten_dict

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[hf]'")
transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")
import sentencepiece as spm  # noqa: E402

from txf.core.errors import TxfError  # noqa: E402
from txf.decode import DecodingSpec  # noqa: E402
from txf.inference import load_run, translate_lines  # noqa: E402
from txf import hf  # noqa: E402

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

EN = "the a cat dog bird fish sees likes eats big small red green old young house tree".split()
DE = "der ein katze hund vogel fisch sieht mag isst gross klein rot gruen alt jung haus baum".split()
WORDS = dict(zip(EN, DE))


def corpus(n, seed):
  rng = np.random.default_rng(seed)
  src = [" ".join(rng.choice(EN, rng.integers(2, 7))) for _ in range(n)]
  return src, [" ".join(WORDS[w] for w in s.split()) for s in src]


def train_spm(lines, size):
  proto = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=proto, vocab_size=size,
                                 model_type="unigram", bos_id=-1, eos_id=1, unk_id=2, pad_id=-1,
                                 eos_piece="</s>", unk_piece="<unk>", hard_vocab_limit=False,
                                 num_threads=1, minloglevel=2)
  return proto.getvalue()


def marian_vocab(*protos):
  """vocab.json as Marian writes it: </s> 0, <unk> 1, every piece of both models, <pad> last."""
  pieces = []
  for proto in protos:
    sp = spm.SentencePieceProcessor(model_proto=proto)
    pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
  vocab = {"</s>": 0, "<unk>": 1}
  for p in pieces:
    vocab.setdefault(p, len(vocab))
  vocab["<pad>"] = len(vocab)
  return vocab


def write_tokenizer(directory, src_proto, tgt_proto, vocab):
  os.makedirs(directory, exist_ok=True)
  for name, proto in (("source.spm", src_proto), ("target.spm", tgt_proto)):
    with open(os.path.join(directory, name), "wb") as f:
      f.write(proto)
  with open(os.path.join(directory, "vocab.json"), "w") as f:
    json.dump(vocab, f)
  return transformers.MarianTokenizer(os.path.join(directory, "source.spm"),
                                      os.path.join(directory, "target.spm"),
                                      os.path.join(directory, "vocab.json"))


def marian_config(vocab_size, **kw):
  base = dict(vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=32, encoder_layers=2,
              decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="swish",
              max_position_embeddings=64, pad_token_id=vocab_size - 1, eos_token_id=0,
              decoder_start_token_id=vocab_size - 1, forced_eos_token_id=0, dropout=0.0,
              attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True,
              share_encoder_decoder_embeddings=True)
  return transformers.MarianConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  """(save_pretrained dir, MarianMTModel, MarianTokenizer, held-out English sentences)."""
  root = tmp_path_factory.mktemp("marian")
  src, tgt = corpus(400, 0)
  src_proto, tgt_proto = train_spm(src, 40), train_spm(tgt, 40)
  vocab = marian_vocab(src_proto, tgt_proto)
  directory = str(root / "hf")
  tokenizer = write_tokenizer(directory, src_proto, tgt_proto, vocab)
  torch.manual_seed(0)
  model = transformers.MarianMTModel(marian_config(len(vocab)))
  with torch.no_grad():  # a non-zero logits bias (a buffer: not trained)
    model.final_logits_bias.copy_(0.3 * torch.randn_like(model.final_logits_bias))
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
  model.eval()
  model.generation_config.bad_words_ids = [[model.config.pad_token_id]]  # as OPUS-MT's
  model.save_pretrained(directory)
  tokenizer.save_pretrained(directory)
  test_src, _ = corpus(24, 1)
  return directory, model, tokenizer, test_src


@pytest.fixture(scope="module")
def imported(small, tmp_path_factory):
  directory = small[0]
  workdir = str(tmp_path_factory.mktemp("runs") / "opus")
  hf.import_hf(directory, workdir, max_len=32)
  return workdir


def generate(model, tokenizer, sentences, beams, max_new_tokens=40):
  enc = tokenizer(sentences, return_tensors="pt", padding=True)
  with torch.no_grad():
    out = model.generate(**enc, num_beams=beams, length_penalty=1.0, early_stopping=True,
                         max_new_tokens=max_new_tokens, do_sample=False)
  # ended with EOS before the limit (at the limit generate forces EOS: forced_eos_token_id)
  ended = [bool((row[:max_new_tokens] == tokenizer.eos_token_id).any()) for row in out]
  return tokenizer.batch_decode(out, skip_special_tokens=True), ended


@pytest.mark.parametrize("beams", [1, 4])
def test_translations_equal_generate(small, imported, beams):
  _, model, tokenizer, sentences = small
  expected, ended = generate(model, tokenizer, sentences, beams)
  assert sum(ended) >= len(sentences) * 3 // 4, "the test model should end most outputs with EOS"
  run = load_run(imported)
  got = translate_lines(run, sentences, DecodingSpec.from_config(run.config, beam_size=beams,
                                                                 max_extra=40))
  agree = [g == e for g, e, end in zip(got, expected, ended) if end]
  print(f"beam {beams}: {sum(agree)}/{len(agree)} translations ending with EOS agree")
  assert all(agree), [(g, e) for g, e, end in zip(got, expected, ended) if end and g != e]


def test_teacher_forced_logits_equal_torch(small, imported):
  _, model, tokenizer, sentences = small
  run = load_run(imported)
  enc = tokenizer(sentences[:3], text_target=sentences[:3], return_tensors="pt", padding=True)
  labels = enc["labels"]
  start = torch.full((labels.shape[0], 1), model.config.decoder_start_token_id)
  decoder_inputs = torch.cat([start, labels[:, :-1]], 1)
  with torch.no_grad():
    theirs = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                   decoder_input_ids=decoder_inputs).logits.numpy()
  order = run.task.codec.target.order
  to_txf = np.argsort(order)  # Marian id -> txf id
  inputs = to_txf[enc["input_ids"].numpy()] * enc["attention_mask"].numpy()
  targets = to_txf[labels.numpy()]
  from txf.models import build_model
  ours = np.asarray(build_model(run.model_cfg, deterministic=True).apply(
      {"params": run.params}, inputs=inputs, targets=targets))
  real = labels.numpy() != model.config.pad_token_id  # target positions that are not padding
  np.testing.assert_allclose(ours[real], theirs[..., order][real], atol=2e-4, rtol=1e-4)


def test_tokenizer_ids_and_detokenization_match(small, imported):
  _, _, tokenizer, sentences = small
  codec = load_run(imported).task.codec
  for s in sentences[:5] + ["zebra cat!"]:
    theirs = tokenizer(s)["input_ids"]
    ours = codec.encode_source(s, 0)
    np.testing.assert_array_equal(codec.target.order[ours], theirs)
  ids = tokenizer(text_target=sentences[0])["input_ids"]
  txf_ids = np.argsort(codec.target.order)[ids]
  assert codec.decode_target(txf_ids) == tokenizer.decode(ids, skip_special_tokens=True)


def test_export_round_trip(small, imported, tmp_path):
  directory, model, tokenizer, sentences = small
  out = str(tmp_path / "exported")
  hf.export_hf(imported, out)
  from safetensors.numpy import load_file
  exported = load_file(os.path.join(out, "model.safetensors"))
  # the tensors save_pretrained stored: each tied table once, under the names transformers reads
  saved = load_file(os.path.join(directory, "model.safetensors"))
  assert sorted(exported) == sorted(saved)
  assert os.path.getsize(os.path.join(out, "model.safetensors")) <= \
      os.path.getsize(os.path.join(directory, "model.safetensors"))
  original = {k: v.numpy() for k, v in model.state_dict().items()}
  worst = 0.0
  for key in saved:
    worst = max(worst, float(np.abs(exported[key] - original[key]).max()))
  print(f"export round trip: max |difference| = {worst:.3g} over {len(saved)} tensors")
  assert worst <= 1e-6
  again = transformers.MarianMTModel.from_pretrained(out)
  again_tok = transformers.MarianTokenizer.from_pretrained(out)
  for beams in (1, 4):
    assert generate(again, again_tok, sentences, beams) == generate(model, tokenizer, sentences, beams)


def test_import_refuses_what_txf_cannot_represent(small, tmp_path):
  directory = str(tmp_path / "bad")
  os.makedirs(directory)
  for name in ("source.spm", "target.spm", "vocab.json"):
    with open(os.path.join(small[0], name), "rb") as f, open(os.path.join(directory, name), "wb") as g:
      g.write(f.read())
  config = json.load(open(os.path.join(small[0], "config.json")))
  config["activation_function"] = "gelu_new"
  json.dump(config, open(os.path.join(directory, "config.json"), "w"))
  proc = subprocess.run([sys.executable, "-m", "txf.cli", "import-hf", directory, "--workdir",
                         str(tmp_path / "w")], capture_output=True, text=True)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
  assert "txf: error:" in proc.stderr and "activation_function='gelu_new'" in proc.stderr
  assert not os.path.exists(tmp_path / "w")
  with pytest.raises(TxfError, match="not a directory"):
    hf.common.resolve_source(str(tmp_path / "nothing-here"))


def test_fine_tune_from_imported(small, imported, tmp_path):
  """init_from: the imported parameters and tokenizer start a txf run (lr 1e-30: each Adam step
  moves a parameter by at most ~1e-30, so they stay as they are to 1e-25)."""
  from txf.core.config import base_config
  from txf.train import train
  from txf.runtime.workdir import load_params
  data = tmp_path / "data"
  data.mkdir()
  src, tgt = corpus(40, 2)
  for split in ("train", "val", "test"):
    (data / f"{split}.en").write_text("\n".join(src) + "\n")
    (data / f"{split}.de").write_text("\n".join(tgt) + "\n")
  c = base_config()
  c.init_from = imported
  c.num_train_steps, c.batch_size, c.log_every, c.eval_every = 2, 8, 1, 0
  c.checkpoint_every, c.decode_examples, c.eval_batches = 0, 4, 1
  c.optimizer.schedule, c.optimizer.learning_rate, c.optimizer.warmup_steps = "constant", 1e-30, 1
  c.data.source, c.data.data_dir = f"text:{data}", str(tmp_path / "prepared")
  c.data.max_input_len = c.data.max_target_len = 16
  workdir = str(tmp_path / "ft")
  train(c, workdir)
  run = load_run(workdir)
  assert run.model_cfg.activation == "swish" and run.model_cfg.decoder_start_id == 0
  assert run.task.vocab_size == len(small[2].get_vocab())
  before, after = load_params(imported), load_params(workdir)
  import jax
  for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-25)


def test_txf_default_run_export_names_what_stands_in_the_way(tmp_path):
  from txf.core.config import base_config
  from txf.runtime.workdir import write_json, config_to_dict
  workdir = tmp_path / "run"
  workdir.mkdir()
  write_json(str(workdir / "config.json"), config_to_dict(base_config()))
  with pytest.raises(TxfError) as e:
    hf.export_hf(str(workdir), str(tmp_path / "out"))
  assert "positional encodings sinusoidal/interleaved" in str(e.value)
  assert "layer_norm_eps=1e-06" in str(e.value) and "tokenizer" in str(e.value)
  assert "num_kv_heads" not in str(e.value)  # plain heads: nothing to say about them
  config = base_config()
  config.model.num_kv_heads, config.model.qk_norm = 2, "rms_norm"  # GQA, QK-norm: not Marian's
  write_json(str(workdir / "config.json"), config_to_dict(config))
  with pytest.raises(TxfError, match=r"model.num_kv_heads=2 / model.qk_norm='rms_norm'"):
    hf.export_hf(str(workdir), str(tmp_path / "out"))


def test_opus_mt_en_de_shape_forward(tmp_path):
  """The real Helsinki-NLP/opus-mt-en-de shape on random weights: import, one forward pass."""
  vocab_size = 58101
  torch.manual_seed(0)
  config = marian_config(vocab_size, d_model=512, encoder_layers=6, decoder_layers=6,
                         encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                         decoder_ffn_dim=2048, max_position_embeddings=512)
  model = transformers.MarianMTModel(config).eval()
  with torch.no_grad():
    model.final_logits_bias.copy_(0.1 * torch.randn_like(model.final_logits_bias))
  directory = str(tmp_path / "opus")
  model.save_pretrained(directory)
  src, _ = corpus(50, 3)
  proto = train_spm(src, 30)
  pieces = marian_vocab(proto)
  vocab = dict(pieces)
  del vocab["<pad>"]
  for i in range(len(vocab), vocab_size - 1):
    vocab[f"x{i}"] = i
  vocab["<pad>"] = vocab_size - 1
  write_tokenizer(directory, proto, proto, vocab)
  workdir = str(tmp_path / "w")
  hf.import_hf(directory, workdir, max_len=16)
  run = load_run(workdir)
  order = run.task.codec.target.order
  marian_in = np.array([[5, 9, 3, 12, 0]])
  marian_dec = np.array([[vocab_size - 1, 7, 4, 11, 58000]])
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(marian_in), decoder_input_ids=torch.tensor(marian_dec)
                   ).logits.numpy()[0]
  to_txf = np.argsort(order)
  targets = np.append(to_txf[marian_dec[0, 1:]], 2)[None]  # shifted right by txf: start, 7, 4, ...
  from txf.models import build_model
  ours = np.asarray(build_model(run.model_cfg, deterministic=True).apply(
      {"params": run.params}, inputs=to_txf[marian_in], targets=targets))[0]
  diff = np.abs(ours - theirs[:, order]).max()
  print(f"opus-mt-en-de shape: max |logit difference| = {diff:.3g} (logits up to "
        f"{np.abs(theirs).max():.2f})")
  np.testing.assert_allclose(ours, theirs[:, order], atol=1e-4, rtol=1e-5)


def test_txf_run_with_marian_options_exports(tmp_path):
  """A txf model with a SentencePiece tokenizer and Marian's options (sin_cos PE, eps 1e-5; no
  attention or logits biases: exported as zeros) loads in MarianMTModel with the same logits."""
  import jax
  from txf.core.config import base_config
  from txf.data import tokenizer as tok
  from txf.models import build_model, init_params
  from txf.nn import TransformerConfig
  from txf.runtime.workdir import config_to_dict, save_params, write_json
  src, tgt = corpus(300, 4)
  sp = tok.train_sentencepiece(src + tgt, 300)
  arch = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
              positional_layout="sin_cos", layer_norm_eps=1e-5, max_len=32, activation="gelu")
  c = base_config()
  for k, v in arch.items():
    c.model[k] = v
  c.data.source, c.data.tokenizer, c.data.vocab_size = "text:somewhere", "sentencepiece", 300
  workdir = tmp_path / "run"
  workdir.mkdir()
  write_json(str(workdir / "config.json"), config_to_dict(c))
  tok.Codec(sp, sp, {}).save(str(workdir / "tokenizer"))
  cfg = TransformerConfig(vocab_size=sp.vocab_size, dropout_rate=0.0, **arch)
  batch = {"inputs": np.ones((1, 8), np.int32), "targets": np.ones((1, 8), np.int32)}
  params = jax.device_get(init_params(cfg, jax.random.key(0), batch))
  save_params(str(workdir), params)
  out = str(tmp_path / "exported")
  said = []
  hf.export_hf(str(workdir), out, say=said.append)
  # base_config decodes greedily: generate's settings say so, and there is nothing to note
  assert json.load(open(os.path.join(out, "generation_config.json")))["num_beams"] == 1 and not said
  model = transformers.MarianMTModel.from_pretrained(out).eval()
  tokenizer = transformers.MarianTokenizer.from_pretrained(out)
  sentence = src[0]
  ids = tokenizer(sentence)["input_ids"]
  np.testing.assert_array_equal(ids, list(sp.encode(sentence)) + [2])  # same pieces, EOS 2
  target = list(sp.encode(tgt[0])) + [2]
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor([ids]),
                   decoder_input_ids=torch.tensor([[1] + target[:-1]])).logits.numpy()
  ours = np.asarray(build_model(cfg, deterministic=True).apply(
      {"params": params}, inputs=np.array([ids]), targets=np.array([target])))
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
  # and back: the import starts the decoder with the run's BOS (decoder_start_token_id 1, not the
  # pad), has txf's parameters (Marian's biases, absent in the run, are zeros) and its logits
  again = str(tmp_path / "again")
  hf.import_hf(out, again)
  run = load_run(again)
  assert run.model_cfg.decoder_start_id == 1
  back = flatten_dict(jax.device_get(run.params), sep="/")
  for k, v in flatten_dict(params, sep="/").items():
    np.testing.assert_array_equal(back[k], v)
  extra = set(back) - set(flatten_dict(params, sep="/"))
  assert extra and all(k.endswith("bias") and not np.any(back[k]) for k in extra)
  logits = np.asarray(build_model(run.model_cfg, deterministic=True).apply(
      {"params": run.params}, inputs=np.array([ids]), targets=np.array([target])))
  np.testing.assert_allclose(logits, ours, atol=1e-5)


def test_txf_eval_scores_what_txf_translate_outputs_for_an_imported_run(small, imported, tmp_path):
  """An imported run decodes as Hugging Face's generate (power penalty, alpha 1, early stopping):
  `txf eval` keeps those settings, so its BLEU is the BLEU of `txf translate`'s output."""
  from txf.inference import bleu as bleu_lib
  _, _, _, sentences = small
  src, tgt = corpus(24, 5)
  data = tmp_path / "multi30k"  # the imported run's data fields are multi30k_en_de's
  data.mkdir()
  for split in ("train", "val", "test_2016_flickr"):  # a text source lists all its splits
    (data / f"{split}.en").write_text("".join(s + "\n" for s in src))
    (data / f"{split}.de").write_text("".join(t + "\n" for t in tgt))
  (tmp_path / "src.txt").write_text("".join(s + "\n" for s in src))
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  report_path = tmp_path / "report.json"
  ev = subprocess.run([sys.executable, "-m", "txf.cli", "eval", "--workdir", imported, "--data_path",
                       str(data), "--output", str(report_path), "--batch_size", "8"],
                      capture_output=True, text=True, env=env, timeout=600)
  assert ev.returncode == 0, ev.stderr
  tr = subprocess.run([sys.executable, "-m", "txf.cli", "translate", "--workdir", imported, "--input",
                       str(tmp_path / "src.txt"), "--batch_size", "8"],
                      capture_output=True, text=True, env=env, timeout=600)
  assert tr.returncode == 0, tr.stderr
  report = json.loads(report_path.read_text())
  run = load_run(imported)
  assert report["decoding"] == DecodingSpec.from_config(run.config).as_dict()
  assert report["decoding"]["length_penalty"] == "power" and report["decoding"]["early_stopping"]
  hyps = tr.stdout.splitlines()
  assert len(hyps) == len(src)
  assert report["bleu"] == bleu_lib.corpus_bleu(hyps, tgt, "sacrebleu", "de")["bleu"]


def test_export_carries_the_decoding_settings_generate_can_express():
  """generation_config.json from a run's decoding spec: beams, the power penalty's alpha, early
  stopping; the GNMT penalty has no counterpart in generate() and is named in one line."""
  said = []
  power = hf.common.generation_settings(DecodingSpec(beam_size=4, alpha=1.0, length_penalty="power",
                                              early_stopping=True), said.append)
  assert power == {"num_beams": 4, "length_penalty": 1.0, "early_stopping": True} and not said
  gnmt = hf.common.generation_settings(DecodingSpec(beam_size=5, alpha=0.6), said.append)
  assert gnmt == {"num_beams": 5, "length_penalty": 1.0, "early_stopping": "never"}
  assert len(said) == 1 and "GNMT" in said[0] and "0.6" in said[0]
  assert hf.common.generation_settings(DecodingSpec(beam_size=1)) == {"num_beams": 1}
  # transformers reads them back as written
  config = transformers.GenerationConfig(**power)
  assert (config.num_beams, config.length_penalty, config.early_stopping) == (4, 1.0, True)
  assert transformers.GenerationConfig(**gnmt).early_stopping == "never"
