"""Hugging Face BERT models in txf, against transformers' BertForSequenceClassification and
BertForMaskedLM as the reference.

Small random BERTs (d 32, 2 layers, 4 heads, 64 positions, every weight and bias random) are saved
with save_pretrained beside a WordPiece tokenizer built here (BertTokenizer over a vocab.txt written
here). Then: import -> the token ids equal BertTokenizer's, the classifier's logits (and
txf classify's probabilities) equal BertForSequenceClassification's, the MLM logits and
predictions equal BertForMaskedLM's; export -> from_pretrained loads every tensor with max
|difference| 0; the CLI imports and classifies; init_from fine-tunes from the import on a tsv.
Skipped when torch or transformers are absent (pip install '.[hf]').
"""

import json
import os

import numpy as np
import pytest
from flax.traverse_util import flatten_dict

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[hf]'")
transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")

from tests.conftest import run_txf  # noqa: E402
from txf.core.errors import TxfError  # noqa: E402
from txf.runtime import workdir as workdir_lib  # noqa: E402
from txf.inference import classify_lines, load_run  # noqa: E402
from txf import hf  # noqa: E402

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

WORDS = ("the a movie film was is great good bad awful plot actor acting boring fun not very "
         "really story ending loved hated it , . ! ?").split()
PIECES = ["##s", "##ed", "##ing", "##ly", "##er", "un", "##believ", "##able"]
TEXTS = ["The movie was great!", "a boring, awful plot .", "I loved it",
         "The acting is unbelievable... really", "not very fun, not very good",
         "Films endings: unbelievably BORING", "zzz qqq", "the the the the story",
         "Café NAÏVE, 中文字!", "a " + "x" * 120 + " film"]  # accents, CJK, a word over 100 chars


def write_vocab(path):
  """vocab.txt as BERT's: [PAD] 0, [unused0] 1, [UNK] 2..., here [CLS] [SEP] [MASK] after [UNK]
  at ids that are not txf's (so the permutation matters), then words, pieces and characters."""
  tokens = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  tokens += WORDS + PIECES + [c for c in "abcdefghijklmnopqrstuvwxyz"] + \
      ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
  seen = []
  for t in tokens:
    if t not in seen:
      seen.append(t)
  with open(path, "w") as f:
    f.write("".join(t + "\n" for t in seen))
  return len(seen)


def bert_config(vocab_size, **kw):
  base = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)
  return transformers.BertConfig(**{**base, **kw})


def randomize(model, seed):
  """Every parameter random (LayerNorm gains around 1), so that no weight is left at its init."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      p.copy_(1.0 + 0.2 * noise if "LayerNorm.weight" in name else 0.3 * noise)
  return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """{name: (save_pretrained directory, torch model)} for the classifier and the MLM, the
  tokenizer and its vocab.txt (transformers 5 saves tokenizer.json, not vocab.txt)."""
  root = tmp_path_factory.mktemp("bert")
  vocab_dir = root / "vocab"
  vocab_dir.mkdir()
  size = write_vocab(vocab_dir / "vocab.txt")
  tokenizer = transformers.BertTokenizer(str(vocab_dir / "vocab.txt"), do_lower_case=True)
  out = {"tokenizer": tokenizer, "vocab": str(vocab_dir / "vocab.txt")}
  for name, cls, seed in (("classifier", transformers.BertForSequenceClassification, 0),
                          ("mlm", transformers.BertForMaskedLM, 1)):
    torch.manual_seed(seed)
    model = randomize(cls(bert_config(size + 3)), seed)  # 3 ids the tokenizer never gives
    directory = str(root / name)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    out[name] = (directory, model)
  return out


@pytest.fixture(scope="module")
def imported(saved, tmp_path_factory):
  root = tmp_path_factory.mktemp("runs")
  hf.import_hf(saved["classifier"][0], str(root / "cls"), max_len=32)
  hf.import_hf(saved["mlm"][0], str(root / "mlm"), data_config="", max_len=32)
  return {"classifier": str(root / "cls"), "mlm": str(root / "mlm")}


def txf_inputs(codec, texts, length):
  """[B, length] txf ids as the data pipeline makes them (encode + EOS, 0-padded)."""
  rows = [codec.encode_source(t, length) for t in texts]
  out = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def hf_forward(model, tokenizer, texts):
  enc = tokenizer(texts, return_tensors="pt", padding=True)
  with torch.no_grad():
    return enc, model(**enc).logits.double().numpy()


def test_token_ids_equal_bert_tokenizer(saved, imported):
  run = load_run(imported["classifier"])
  codec, tokenizer = run.task.codec, saved["tokenizer"]
  order = codec.source.order
  for text in TEXTS:
    got = order[codec.encode_source(text, 0)].tolist()  # txf ids -> BERT ids
    assert got == tokenizer(text)["input_ids"], text
  assert order[codec.encode_source("a [MASK] b", 0)].tolist() == tokenizer("a [MASK] b")["input_ids"]
  ids = codec.encode_source("the movie was great", 0)
  assert codec.decode_target(ids) == tokenizer.decode(tokenizer("the movie was great")["input_ids"],
                                                      skip_special_tokens=True)


def test_classifier_logits_equal_torch(saved, imported):
  import jax
  from txf.models import build_model
  directory, model = saved["classifier"]
  enc, expected = hf_forward(model, saved["tokenizer"], TEXTS)
  run = load_run(imported["classifier"])
  assert run.model_cfg.activation == "gelu" and run.model_cfg.pooler
  inputs = txf_inputs(run.task.codec, TEXTS, enc["input_ids"].shape[1])
  np.testing.assert_array_equal(run.task.codec.source.order[inputs] * (inputs != 0),
                                enc["input_ids"].numpy())
  got = build_model(run.model_cfg, deterministic=True).apply({"params": run.params},
                                                             inputs=jax.numpy.asarray(inputs))
  got = np.asarray(got, np.float64)
  print(f"classifier: max |txf - torch| = {np.abs(got - expected).max():.3g}")
  np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
  probs = np.stack(classify_lines(run, TEXTS, batch_size=4))  # what `txf classify` prints
  e = np.exp(expected - expected.max(-1, keepdims=True))
  np.testing.assert_allclose(probs, e / e.sum(-1, keepdims=True), rtol=0, atol=1e-5)


def test_mlm_logits_and_predictions_equal_torch(saved, imported):
  import jax
  from txf.data.tokenizer import load_codec
  from txf.models import build_model, model_config_for
  directory, model = saved["mlm"]
  texts = [t.replace("great", "[MASK]").replace("plot", "[MASK]") for t in TEXTS]
  enc, expected = hf_forward(model, saved["tokenizer"], texts)
  workdir = imported["mlm"]
  config = workdir_lib.load_config(workdir)
  codec = load_codec(os.path.join(workdir, "tokenizer"))
  order = codec.source.order
  cfg = model_config_for(config, codec.source.vocab_size, vocab_multiple=1)
  assert cfg.family == "encoder_mlm" and cfg.logits_bias
  inputs = txf_inputs(codec, texts, enc["input_ids"].shape[1])
  logits = build_model(cfg, deterministic=True).apply(
      {"params": workdir_lib.load_params(workdir)}, inputs=jax.numpy.asarray(inputs))
  got = np.asarray(logits, np.float64)[..., np.argsort(order)]  # columns in BERT's id order
  valid = enc["attention_mask"].numpy().astype(bool)
  print(f"mlm: max |txf - torch| = {np.abs(got - expected)[valid].max():.3g}")
  np.testing.assert_allclose(got[valid], expected[valid], rtol=0, atol=1e-5)
  np.testing.assert_array_equal(got.argmax(-1)[valid], expected.argmax(-1)[valid])


@pytest.mark.parametrize("name,cls", [("classifier", "BertForSequenceClassification"),
                                      ("mlm", "BertForMaskedLM")])
def test_export_round_trip_is_exact(saved, imported, tmp_path, name, cls):
  from safetensors.numpy import load_file
  directory, model = saved[name]
  out = str(tmp_path / "exported")
  hf.export_hf(imported[name], out)
  stored, exported = load_file(os.path.join(directory, "model.safetensors")), \
      load_file(os.path.join(out, "model.safetensors"))
  assert sorted(exported) == sorted(stored)  # each tied table once, as save_pretrained stores
  again = getattr(transformers, cls).from_pretrained(out).eval()
  before, after = model.state_dict(), again.state_dict()
  assert sorted(before) == sorted(after)
  worst = max(float((before[k] - after[k]).abs().max()) for k in before)
  print(f"{name} round trip: max |difference| = {worst} over {len(before)} tensors")
  assert worst == 0.0
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  for text in TEXTS:
    assert tokenizer(text)["input_ids"] == saved["tokenizer"](text)["input_ids"]


def test_import_from_vocab_txt_alone(saved, tmp_path):
  """A checkpoint with vocab.txt and no tokenizer.json: txf builds BertTokenizer's pipeline."""
  directory = tmp_path / "vocab_only"
  directory.mkdir()
  src = saved["classifier"][0]
  for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
    (directory / name).write_bytes(open(os.path.join(src, name), "rb").read())
  (directory / "vocab.txt").write_bytes(open(saved["vocab"], "rb").read())
  hf.import_hf(str(directory), str(tmp_path / "w"), max_len=32)
  codec = load_run(str(tmp_path / "w")).task.codec
  for text in TEXTS:
    assert codec.source.order[codec.encode_source(text, 0)].tolist() == \
        saved["tokenizer"](text)["input_ids"]


def test_import_refuses_what_txf_cannot_represent(saved, tmp_path):
  directory = tmp_path / "bad"
  directory.mkdir()
  src = saved["classifier"][0]
  for name in os.listdir(src):
    (directory / name).write_bytes(open(os.path.join(src, name), "rb").read())
  config = json.load(open(directory / "config.json"))
  config["position_embedding_type"] = "relative_key"
  (directory / "config.json").write_text(json.dumps(config))
  proc = run_txf("import-hf", str(directory), "--workdir", str(tmp_path / "w"))
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
  assert "txf: error:" in proc.stderr and "position_embedding_type='relative_key'" in proc.stderr
  assert not os.path.exists(tmp_path / "w")
  with pytest.raises(TxfError, match="hidden_act='quick_gelu'"):
    config["position_embedding_type"], config["hidden_act"] = "absolute", "quick_gelu"
    (directory / "config.json").write_text(json.dumps(config))
    hf.import_hf(str(directory), str(tmp_path / "w2"))
  config["hidden_act"] = "gelu"
  (directory / "config.json").write_text(json.dumps(config))
  os.remove(directory / "tokenizer.json")
  with pytest.raises(TxfError, match="no tokenizer.json or vocab.txt"):
    hf.import_hf(str(directory), str(tmp_path / "w3"))
  assert not os.path.exists(tmp_path / "w2") and not os.path.exists(tmp_path / "w3")


def test_cli_import_classify_and_fine_tune(saved, tmp_path):
  """`txf import-hf` of a BertModel (no classifier: a new one) -> `txf classify` runs; `txf train
  --config sst2 --config.init_from` fine-tunes it on a tiny tsv for two steps; `txf eval` scores
  the fine-tuned run."""
  bare = tmp_path / "bare"
  torch.manual_seed(2)
  randomize(transformers.BertModel(bert_config(len(saved["tokenizer"].get_vocab()) + 3,
                                               num_labels=2)), 2
            ).save_pretrained(str(bare))
  saved["tokenizer"].save_pretrained(str(bare))
  workdir = tmp_path / "runs" / "bert"
  proc = run_txf("import-hf", str(bare), "--workdir", str(workdir), "--max_len", "32")
  assert proc.returncode == 0, proc.stderr
  assert "new one" in proc.stdout
  (tmp_path / "lines.txt").write_text("".join(t + "\n" for t in TEXTS))
  proc = run_txf("classify", "--workdir", str(workdir), "--input", str(tmp_path / "lines.txt"))
  assert proc.returncode == 0, proc.stderr
  assert len(proc.stdout.strip().splitlines()) == len(TEXTS)
  data = tmp_path / "data" / "sst2"
  data.mkdir(parents=True)
  rows = "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(TEXTS * 3))
  for split in ("train", "dev", "test"):
    (data / f"{split}.tsv").write_text(rows)
  proc = run_txf("train", "--config", "sst2", "--workdir", str(tmp_path / "runs" / "ft"),
                 f"--config.init_from={workdir}", "--config.num_train_steps=2",
                 "--config.batch_size=8", "--config.eval_every=0", "--config.checkpoint_every=0",
                 "--config.optimizer.warmup_steps=1", "--config.optimizer.cooldown_steps=0",
                 "--config.data.bucketing=False", "--config.data.max_input_len=32",
                 f"--config.data.data_dir={tmp_path / 'prepared'}", env={"TXF_DATA": str(tmp_path / "data")})
  assert proc.returncode == 0, proc.stderr[-3000:]
  run = load_run(str(tmp_path / "runs" / "ft"))
  assert run.model_cfg.pooler and run.model_cfg.embed_norm and run.task.num_classes == 2
  proc = run_txf("eval", "--workdir", str(tmp_path / "runs" / "ft"), "--split", "dev",
                 "--output", str(tmp_path / "eval.json"), env={"TXF_DATA": str(tmp_path / "data")})
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads((tmp_path / "eval.json").read_text())
  assert report["num_examples"] == len(TEXTS) * 3 and 0.0 <= report["accuracy"] <= 1.0
  # the run trained here exports as BERT, transformers gives its logits, and it comes back exactly
  import jax
  from txf.models import build_model
  out, again = str(tmp_path / "exported"), str(tmp_path / "runs" / "again")
  hf.export_hf(str(tmp_path / "runs" / "ft"), out)
  hf.import_hf(out, again, max_len=32)
  back = load_run(again)
  for a, b in zip(jax.tree_util.tree_leaves(jax.device_get(run.params)),
                  jax.tree_util.tree_leaves(jax.device_get(back.params))):
    np.testing.assert_array_equal(a, b)
  exported = transformers.BertForSequenceClassification.from_pretrained(out).eval()
  enc, expected = hf_forward(exported, saved["tokenizer"], TEXTS)
  inputs = txf_inputs(back.task.codec, TEXTS, enc["input_ids"].shape[1])
  got = build_model(back.model_cfg, deterministic=True).apply({"params": back.params},
                                                              inputs=jax.numpy.asarray(inputs))
  np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=0, atol=1e-5)


def test_pretraining_checkpoint_with_old_layer_norm_names(saved, tmp_path):
  """A BertForPreTraining checkpoint (bert-base-uncased's kind) whose LayerNorms are stored under
  the old names gamma/beta: as a classifier (the default, sst2) its encoder and pooler are the
  checkpoint's (txf's pooled vector = torch's pooler_output); with --data_config '' its MLM head
  gives BertForPreTraining's prediction logits."""
  import jax
  from safetensors.numpy import load_file, save_file
  from txf.data.tokenizer import load_codec
  from txf.models import build_model, model_config_for
  tokenizer = saved["tokenizer"]
  directory = tmp_path / "pretraining"
  torch.manual_seed(3)
  model = randomize(transformers.BertForPreTraining(bert_config(len(tokenizer.get_vocab()) + 3)), 3)
  model.save_pretrained(str(directory))
  tokenizer.save_pretrained(str(directory))
  path = str(directory / "model.safetensors")
  renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in load_file(path).items()}
  assert any(k.endswith("LayerNorm.gamma") for k in renamed)
  save_file(renamed, path, metadata={"format": "pt"})
  enc = tokenizer(TEXTS, return_tensors="pt", padding=True)
  with torch.no_grad():
    out = model(**enc)
  length = enc["input_ids"].shape[1]
  hf.import_hf(str(directory), str(tmp_path / "cls"), max_len=32)
  run = load_run(str(tmp_path / "cls"))
  inputs = jax.numpy.asarray(txf_inputs(run.task.codec, TEXTS, length))
  pooled = []

  def record(next_fun, args, kwargs, context):  # the pooler Dense's output
    y = next_fun(*args, **kwargs)
    if context.module.name == "pooler":
      pooled.append(np.tanh(np.asarray(y, np.float64)))
    return y

  import flax.linen as nn
  with nn.intercept_methods(record):
    build_model(run.model_cfg, deterministic=True).apply({"params": run.params}, inputs=inputs)
  expected = model.bert(**enc).pooler_output.detach().double().numpy()
  np.testing.assert_allclose(pooled[0], expected, rtol=0, atol=1e-5)
  hf.import_hf(str(directory), str(tmp_path / "mlm"), data_config="", max_len=32)
  workdir = str(tmp_path / "mlm")
  codec = load_codec(os.path.join(workdir, "tokenizer"))
  cfg = model_config_for(workdir_lib.load_config(workdir), codec.source.vocab_size, vocab_multiple=1)
  logits = build_model(cfg, deterministic=True).apply({"params": workdir_lib.load_params(workdir)},
                                                      inputs=inputs)
  got = np.asarray(logits, np.float64)[..., np.argsort(codec.source.order)]
  valid = enc["attention_mask"].numpy().astype(bool)
  np.testing.assert_allclose(got[valid], out.prediction_logits.double().numpy()[valid], rtol=0,
                             atol=1e-5)


def test_fine_tune_across_objectives_mlm_into_the_classifier(saved, imported, tmp_path):
  """`txf train --config sst2 --config.init_from=MLM`: the run stays a classifier; its embeddings
  and encoder are the MLM run's, the classifier head is new, the MLM head is dropped (the line and
  init_from.json say so); a learning rate of 1e-30 leaves the loaded parameters where they were."""
  data = tmp_path / "data" / "sst2"
  data.mkdir(parents=True)
  rows = "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(TEXTS * 3))
  for split in ("train", "dev", "test"):
    (data / f"{split}.tsv").write_text(rows)
  run = tmp_path / "runs" / "ft"
  proc = run_txf("train", "--config", "sst2", "--workdir", str(run),
                 f"--config.init_from={imported['mlm']}", "--config.num_train_steps=2",
                 "--config.batch_size=8", "--config.eval_every=0", "--config.checkpoint_every=0",
                 "--config.optimizer.warmup_steps=1", "--config.optimizer.cooldown_steps=0",
                 "--config.optimizer.schedule=constant", "--config.optimizer.learning_rate=1e-30",
                 "--config.data.bucketing=False", "--config.data.max_input_len=32",
                 f"--config.data.data_dir={tmp_path / 'prepared'}",
                 env={"TXF_DATA": str(tmp_path / "data")})
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads((run / "init_from.json").read_text())
  source = {"/".join(k): v for k, v in flatten_dict(workdir_lib.load_params(imported["mlm"])).items()}
  tuned = {"/".join(k): v for k, v in flatten_dict(load_run(str(run)).params).items()}
  assert {k.split("/")[0] for k in report["loaded"]} == {"embed", "encoder"}
  assert {k.split("/")[0] for k in report["new"]} == {"classifier"}
  assert {k.split("/")[0] for k in report["dropped"]} == {"mlm_dense", "mlm_norm", "logits_bias"}
  assert sorted(report["loaded"] + report["new"]) == sorted(tuned)
  assert sorted(report["loaded"] + report["dropped"]) == sorted(source)
  assert (f"{len(report['loaded'])} parameters loaded, {len(report['new'])} new (classifier)"
          in proc.stdout)
  for key in report["loaded"]:
    np.testing.assert_allclose(tuned[key], source[key], rtol=0, atol=1e-25)
  assert load_run(str(run)).family == "encoder_classifier"
