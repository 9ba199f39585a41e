"""txf's own reader of Hugging Face tokenizer.json files (txf.data.tokjson, txf.hf.tokenizer_json)
against the ``tokenizers`` library that wrote them, and against transformers for the settings of
tokenizer_config.json.

Small tokenizers of every model kind are trained here on generated text (no network, no data
folder): a GPT-2 byte-level BPE, a Llama-3-style byte-level BPE (NFC, a Split regex, a BOS
template), a Llama-2-style SentencePiece BPE with byte fallback (Metaspace, and the older
Prepend + Replace normalizers), a T5-style Unigram with SentencePiece's precompiled character
map, a Unigram with NFKC + Lowercase and byte fallback, a BERT WordPiece and a WordPiece under
NFD + StripAccents + Digits with RoBERTa's processor. Each encodes and decodes a few hundred
varied lines (accents, CJK, emoji, digits, whitespace runs, special tokens inside the text) and
must give the library's ids and strings exactly. The slow tier also compares with transformers 5's
AutoTokenizer on the files it saves for T5 (tokenizer.json + tokenizer_config.json only), Qwen2,
GPT-2 and Llama, and imports a small T5 whose tokenizer is that tokenizer.json alone.
"""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402
import sentencepiece as spm  # noqa: E402

from txf.core.errors import TxfError  # noqa: E402
from txf.data.bpe import clean_up_spaces  # noqa: E402
from txf.hf import tokenizer_json  # noqa: E402

WORDS = ("the a cat dog sees likes big small red old house tree river running quickly don't "
         "it's we'll café naïve résumé Zürich façade jalapeño Ελληνικά Русский текст 東京 日本語 "
         "中文字符 한국어 العربية emoji 🙂 👍🏽 🇩🇪 ﬁle ＡＢＣ ½ ² x² state-of-the-art e-mail "
         "user@example.com https://x.org/a?b=1 C++ #tag $100 3.14 2024 1,000,000 007 ...").split()
SEPS = [" ", " ", " ", "  ", "\t", "\n", " \n ", "   ", ", ", ". ", "! ", "? ", ";", "-"]


def lines(n, seed):
  """``n`` varied lines: words, digits, punctuation and whitespace runs of every kind."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    parts = []
    for _ in range(rng.integers(1, 12)):
      w = str(rng.choice(WORDS))
      r = rng.random()
      if r < 0.1:
        w = w.upper()
      elif r < 0.2:
        w = w.capitalize()
      elif r < 0.27:
        w = str(rng.integers(0, 10 ** int(rng.integers(1, 7))))
      parts += [w, str(rng.choice(SEPS))]
    line = "".join(parts)
    if rng.random() < 0.15:
      line = " " * int(rng.integers(1, 3)) + line
    out.append(line)
  return out + ["", " ", "a", "  \t\n", "🙂🙂🙂", "Ｈｅｌｌｏ　ｗｏｒｌｄ", "ﬀ ﬃ ŉ", "e\u0301 a\u0300"]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = lines(600, 0)
# characters none of the tokenizers was trained on: unknowns, byte fallback
TEST = lines(250, 1) + ["Straße ø Ω ℵ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ", "ß", "Ω-ℵ 4²", "ｶﾀｶﾅ ＃"]


def _save(tok, tmp_path, name, config=None):
  folder = tmp_path / name
  folder.mkdir()
  tok.save(str(folder / "tokenizer.json"))
  if config is not None:
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
  return str(folder)


def gpt2(tmp):
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  tok.train_from_iterator(TRAIN, trainers.BpeTrainer(
      vocab_size=500, special_tokens=["<|endoftext|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  tok.add_tokens([tokenizers.AddedToken("<mask>", lstrip=True, rstrip=True, special=True),
                  tokenizers.AddedToken("dog", single_word=True, normalized=False)])
  return tok, {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3(tmp):
  tok = tokenizers.Tokenizer(models.BPE(ignore_merges=True))
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(LLAMA3_SPLIT), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(TRAIN, trainers.BpeTrainer(
      vocab_size=600, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  bos = tok.token_to_id("<|begin_of_text|>")
  tok.post_processor = processors.TemplateProcessing(
      single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
      special_tokens=[("<|begin_of_text|>", bos)])
  return tok, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}


BYTES = [f"<0x{b:02X}>" for b in range(256)]


def llama2(tmp, legacy=False):
  """SentencePiece-style BPE with byte fallback: Metaspace (or Prepend + Replace), <s> BOS."""
  tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
  if legacy:  # Llama 2's tokenizer.json as transformers 4 wrote it
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
  else:
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
  tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)])
  sample = [t for t in TRAIN if "東" not in t and "🙂" not in t]  # some characters: bytes only
  tok.train_from_iterator(sample, trainers.BpeTrainer(
      vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"] + BYTES, show_progress=False,
      limit_alphabet=120))
  tok.post_processor = processors.TemplateProcessing(
      single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
  return tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def _proto_field(data: bytes, field: int) -> bytes:
  """The first length-delimited ``field`` of a protobuf message (enough to read sentencepiece's
  normalizer_spec.precompiled_charsmap)."""
  i = 0
  while i < len(data):
    key, i = _varint(data, i)
    kind, num = key & 7, key >> 3
    if kind == 0:
      _, i = _varint(data, i)
    elif kind == 1:
      i += 8
    elif kind == 5:
      i += 4
    elif kind == 2:
      size, i = _varint(data, i)
      if num == field:
        return data[i:i + size]
      i += size
  raise KeyError(field)


def _varint(data, i):
  out, shift = 0, 0
  while True:
    b = data[i]
    i += 1
    out |= (b & 0x7F) << shift
    shift += 7
    if not b & 0x80:
      return out, i


def spm_t5(lines_, size=300):
  proto = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines_), model_writer=proto, vocab_size=size, model_type="unigram",
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
      unk_piece="<unk>", hard_vocab_limit=False, num_threads=1, minloglevel=2)
  return proto.getvalue()


def t5(tmp):
  """T5's tokenizer.json as transformers builds it from spiece.model: the SentencePiece pieces and
  scores as a Unigram, its nmt_nfkc charsmap as a Precompiled normalizer, WhitespaceSplit +
  Metaspace, an EOS template and sentinels."""
  proto = spm_t5([t.replace("\n", " ") for t in TRAIN])
  sp = spm.SentencePieceProcessor(model_proto=proto)
  vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
  tok = tokenizers.Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
  charsmap = _proto_field(_proto_field(proto, 3), 2)
  tok.normalizer = normalizers.Precompiled(charsmap)
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(prepend_scheme="always")])
  tok.decoder = decoders.Metaspace(prepend_scheme="always")
  tok.add_special_tokens(["<pad>", "</s>", "<unk>"] + [f"<extra_id_{n}>" for n in range(3)])
  tok.post_processor = processors.TemplateProcessing(
      single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
  return tok, {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def unigram_bytes(tmp):
  tok = tokenizers.Tokenizer(models.Unigram())
  tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(),
                                         normalizers.Replace(tokenizers.Regex(r"\s{2,}"), " ")])
  tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                               pre_tokenizers.Digits(individual_digits=True)])
  tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
  tok.train_from_iterator(TRAIN[:300], trainers.UnigramTrainer(
      vocab_size=300, special_tokens=["<unk>"] + BYTES[:128], unk_token="<unk>",
      byte_fallback=True, show_progress=False))
  tok.add_tokens([tokenizers.AddedToken("Big CAT", normalized=True),
                  tokenizers.AddedToken("½", normalized=True, single_word=True)])
  return tok, None


def bert(tmp):
  tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece()
  tok.train_from_iterator(TRAIN, trainers.WordPieceTrainer(
      vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
      show_progress=False))
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
  return tok, {"cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]",
               "pad_token": "[PAD]", "clean_up_tokenization_spaces": True}


def wordpiece_roberta(tmp):
  tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=12))
  tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(),
                                         normalizers.Strip()])
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
      pre_tokenizers.Digits(individual_digits=False)])
  tok.decoder = decoders.WordPiece(cleanup=False)
  tok.train_from_iterator(TRAIN, trainers.WordPieceTrainer(
      vocab_size=350, special_tokens=["[UNK]", "<s>", "</s>"], show_progress=False))
  tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 1))
  return tok, None


def gpt2_prefix(tmp):
  """GPT-2's BPE with add_prefix_space (a space before every part between added tokens)."""
  tok, config = gpt2(tmp)
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
  return tok, config


KINDS = {"gpt2": gpt2, "gpt2_prefix": gpt2_prefix, "llama3": llama3, "llama2": llama2,
         "llama2_legacy": lambda tmp: llama2(tmp, legacy=True), "t5": t5,
         "unigram_bytes": unigram_bytes, "bert": bert, "wordpiece_roberta": wordpiece_roberta}


@pytest.fixture(scope="module", params=sorted(KINDS))
def pair(request, tmp_path_factory):
  """(kind, the tokenizers library's Tokenizer, txf's TokenizerJson of its saved files, folder)."""
  tmp = tmp_path_factory.mktemp(request.param)
  tok, config = KINDS[request.param](tmp)
  folder = _save(tok, tmp, "tok", config)
  return request.param, tok, tokenizer_json.read(folder), folder


def with_specials(texts, specials):
  """The test lines with special tokens written inside some of them."""
  rng = np.random.default_rng(2)
  out = list(texts)
  for i in range(0, len(out), 7):
    s = str(rng.choice(specials))
    words = out[i].split(" ")
    words.insert(int(rng.integers(0, len(words) + 1)), s)
    out[i] = " ".join(words)
  return out


def test_encode_decode_equal_the_library(pair):
  """Every test line, with added tokens (special or not, lstrip / rstrip / single_word /
  normalized) written inside some, encodes and decodes as the library does."""
  kind, ref, ours, _ = pair
  specials = [t.content for t in ref.get_added_tokens_decoder().values()] or ["x"]
  specials += ["big cat", " dog", "dogs", "x½"]
  texts = with_specials(TEST, specials)
  for text in texts:
    want = ref.encode(text, add_special_tokens=False).ids
    assert ours.encode(text) == want, (kind, text)
    assert ours.encode(text, add_special_tokens=True) == ref.encode(text).ids, (kind, text)
    clean = clean_up_spaces if ours.clean_up else (lambda t: t)
    got = ours.decode(want, skip_special_tokens=False)
    assert got == clean(ref.decode(want, skip_special_tokens=False)), (kind, text, want)
    assert ours.decode(want) == clean(ref.decode(want, skip_special_tokens=True)), (kind, text)


def test_vocabulary_and_special_ids(pair):
  kind, ref, ours, _ = pair
  vocab = ref.get_vocab(with_added_tokens=True)
  assert ours.token_to_id == vocab
  assert ours.vocab_size == max(vocab.values()) + 1
  assert all(ours.id_to_token[i] == t for t, i in vocab.items())
  if kind == "llama2":
    assert (ours.bos_id, ours.eos_id, ours.unk_id, ours.pad_id) == (1, 2, 0, None)
  if kind == "bert":
    assert ours.unk_id == vocab["[UNK]"] and ours.pad_id == vocab["[PAD]"] and ours.bos_id is None


def test_byte_fallback_and_unknowns_are_exercised(pair):
  """The cases that make the pipelines differ do occur in the test lines."""
  kind, ref, ours, _ = pair
  ids = [i for t in TEST for i in ref.encode(t, add_special_tokens=False).ids]
  if kind in ("llama2", "llama2_legacy"):
    assert any(ref.id_to_token(i).startswith("<0x") for i in ids)
  if kind in ("bert", "wordpiece_roberta"):
    assert ref.token_to_id("[UNK]") in ids


def test_save_round_trip(pair, tmp_path):
  kind, ref, ours, _ = pair
  ours.save(str(tmp_path / "again"))
  back = tokenizers.Tokenizer.from_file(str(tmp_path / "again" / "tokenizer.json"))
  for text in TEST[:40]:
    assert back.encode(text).ids == ref.encode(text).ids
  assert tokenizer_json.read(str(tmp_path / "again")).config == ours.config


def test_clean_up_and_template_from_tokenizer_config(tmp_path):
  """tokenizer_config.json's add_bos_token / add_eos_token leave the file's template as it is
  (transformers 5 drops them when there is a tokenizer.json), and clean_up_tokenization_spaces
  applies transformers' clean-up to decode."""
  tok, config = llama2(tmp_path)
  folder = _save(tok, tmp_path, "eos", {**config, "add_bos_token": False, "add_eos_token": True})
  ours = tokenizer_json.read(folder)
  plain = tok.encode("a cat", add_special_tokens=False).ids
  assert ours.encode("a cat", add_special_tokens=True) == [1] + plain  # <s>: the template's
  tok, config = bert(tmp_path)
  ours = tokenizer_json.read(_save(tok, tmp_path, "clean", config))
  ids = tok.encode("it 's big , isn't it ?").ids
  assert ours.decode(ids) == clean_up_spaces(tok.decode(ids)) == "it's big, isn't it?"


def test_unsupported_component_is_one_error(tmp_path):
  tok, _ = gpt2(tmp_path)
  spec = json.loads(tok.to_str())
  spec["pre_tokenizer"] = {"type": "UnicodeScripts"}
  path = tmp_path / "bad.json"
  path.write_text(json.dumps(spec))
  with pytest.raises(TxfError, match="pre-tokenizer 'UnicodeScripts' is not supported by txf"):
    tokenizer_json.read(str(path))
  with pytest.raises(TxfError, match="does not exist"):
    tokenizer_json.read(str(tmp_path / "nowhere"))
  (tmp_path / "trunc").mkdir()
  (tmp_path / "trunc" / "tokenizer.json").write_text(tok.to_str()[:200])
  with pytest.raises(TxfError, match="not valid JSON"):
    tokenizer_json.read(str(tmp_path / "trunc"))


def test_no_tokenizers_import(pair):
  """The reader runs without the tokenizers library (a fresh interpreter where importing it
  fails) and gives the same ids there."""
  kind, ref, _, folder = pair
  if kind != "llama3":
    pytest.skip("one kind is enough")
  code = ("import sys; sys.modules['tokenizers'] = None; sys.modules['transformers'] = None\n"
          "from txf.data import tokjson\n"
          f"print(tokjson.read({folder!r}).encode({TEST[3]!r}, add_special_tokens=True))\n")
  out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT})
  assert json.loads(out.stdout) == ref.encode(TEST[3]).ids


# ------------------------------------------------------ slow: transformers 5 and a T5 import


@pytest.fixture(scope="module")
def t5_saved(tmp_path_factory):
  """A random small T5 and its tokenizer saved by transformers 5: tokenizer.json +
  tokenizer_config.json, no spiece.model. (folder, model, T5Tokenizer loaded from it)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.set_num_threads(1)
  root = tmp_path_factory.mktemp("t5json")
  (root / "spm").mkdir()
  (root / "spm" / "spiece.model").write_bytes(spm_t5([t.replace("\n", " ") for t in TRAIN]))
  (root / "spm" / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "T5Tokenizer", "extra_ids": 5}))
  out = str(root / "hf")
  transformers.T5Tokenizer.from_pretrained(str(root / "spm")).save_pretrained(out)
  assert sorted(os.listdir(out)) == ["tokenizer.json", "tokenizer_config.json"]
  tokenizer = transformers.T5Tokenizer.from_pretrained(out)
  torch.manual_seed(0)
  config = transformers.T5Config(
      vocab_size=len(tokenizer) + 3, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
      num_decoder_layers=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
      dropout_rate=0.0, decoder_start_token_id=0, feed_forward_proj="relu")
  model = transformers.T5ForConditionalGeneration(config).eval()
  model.save_pretrained(out)
  return out, model, tokenizer


@pytest.mark.slow
def test_t5_saved_by_transformers_encodes_as_transformers(t5_saved):
  """The tokenizer.json transformers 5 writes for T5 (Precompiled nmt_nfkc map, WhitespaceSplit,
  Metaspace, sentinels, EOS template): txf's ids and strings are transformers'."""
  folder, _, tokenizer = t5_saved
  ours = tokenizer_json.read(folder)
  assert (ours.eos_id, ours.pad_id, ours.unk_id, ours.bos_id) == (1, 0, 2, None)
  for text in with_specials(TEST, ["<extra_id_0>", "<extra_id_4>", "</s>"]):
    want = tokenizer(text)["input_ids"]
    assert ours.encode(text, add_special_tokens=True) == want, text
    assert ours.decode(want) == tokenizer.decode(want, skip_special_tokens=True), text


@pytest.mark.slow
def test_llama_template_from_tokenizer_config_as_transformers(tmp_path):
  """add_bos_token / add_eos_token in tokenizer_config.json, with and without a template in
  tokenizer.json: the ids of transformers' AutoTokenizer on the same folder."""
  transformers = pytest.importorskip("transformers")
  tok, config = llama2(tmp_path)
  cases = [(True, False, "LlamaTokenizer"), (True, True, "PreTrainedTokenizerFast"),
           (False, True, "LlamaTokenizer")]
  for i, (bos, eos, cls) in enumerate(cases + cases):
    if i == len(cases):
      tok.post_processor = None
    folder = _save(tok, tmp_path, f"ll{i}", {**config, "add_bos_token": bos, "add_eos_token": eos,
                                             "tokenizer_class": cls})
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = tokenizer_json.read(folder)
    for text in TEST[:60]:
      assert ours.encode(text, add_special_tokens=True) == theirs(text)["input_ids"], text
      assert ours.decode(theirs(text)["input_ids"]) == theirs.decode(
          theirs(text)["input_ids"], skip_special_tokens=True), text


@pytest.mark.slow
def test_t5_import_with_tokenizer_json_only(t5_saved, tmp_path):
  """`txf import-hf` of a T5 with tokenizer.json alone: it says which file it used; the codec's
  ids are transformers' (through the run's order), teacher-forced logits equal torch's, and
  export -> from_pretrained gives the same tokenizer and weights."""
  import torch
  import transformers
  from txf.inference import load_run
  from txf.models import build_model
  from txf import hf
  folder, model, tokenizer = t5_saved
  workdir = str(tmp_path / "w")
  proc = subprocess.run([sys.executable, "-m", "txf.cli", "import-hf", folder, "--workdir", workdir],
                        capture_output=True, text=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip().splitlines() == [
      f"imported {folder} -> {workdir} (tokenizer: tokenizer.json; txf translate --workdir "
      f"{workdir})"]
  run = load_run(workdir)
  codec, order = run.task.codec, run.task.codec.target.order
  for text in TEST[:80] + ["the <extra_id_0> sees <extra_id_4>"]:
    assert order[codec.encode_source(text, 0)].tolist() == tokenizer(text)["input_ids"], text
  ids = tokenizer(TEST[5])["input_ids"]
  assert codec.decode_target(np.argsort(order)[ids]) == tokenizer.decode(ids, skip_special_tokens=True)
  enc = tokenizer(TEST[:4], text_target=TEST[4:8], return_tensors="pt", padding=True)
  labels = enc["labels"]
  start = torch.zeros((labels.shape[0], 1), dtype=labels.dtype)
  with torch.no_grad():
    theirs = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                   decoder_input_ids=torch.cat([start, labels[:, :-1]], 1)).logits.numpy()
  to_txf = np.argsort(order)
  ours = np.asarray(build_model(run.model_cfg, deterministic=True).apply(
      {"params": run.params}, inputs=to_txf[enc["input_ids"].numpy()] * enc["attention_mask"].numpy(),
      targets=to_txf[labels.numpy()]))
  real = labels.numpy() != 0
  np.testing.assert_allclose(ours[real], theirs[..., order][real], atol=1e-5, rtol=1e-5)
  out = str(tmp_path / "exported")
  hf.export_hf(workdir, out)
  again = transformers.T5Tokenizer.from_pretrained(out)
  assert again.get_vocab() == tokenizer.get_vocab()
  assert all(again(t)["input_ids"] == tokenizer(t)["input_ids"] for t in TEST[:40])
  back = transformers.T5ForConditionalGeneration.from_pretrained(out).state_dict()
  assert all(torch.equal(v, back[k]) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_t5_import_without_any_tokenizer_is_one_error(t5_saved, tmp_path):
  folder, _, _ = t5_saved
  bare = tmp_path / "bare"
  bare.mkdir()
  for name in ("config.json", "model.safetensors"):
    (bare / name).write_bytes(open(os.path.join(folder, name), "rb").read())
  proc = subprocess.run([sys.executable, "-m", "txf.cli", "import-hf", str(bare), "--workdir",
                         str(tmp_path / "w")], capture_output=True, text=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT})
  assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
  assert "has no spiece.model and no tokenizer.json" in proc.stderr


def test_gpt2_and_bert_files_without_tokenizer_json(tmp_path):
  """vocab.json + merges.txt (GPT-2) and vocab.txt (BERT) become tokenizer.json text without the
  tokenizers library; the library reads that text and agrees with its own construction."""
  from txf.data import bpe
  from txf.hf import wordpiece as hf_wordpiece
  tok, _ = gpt2(tmp_path)
  tok.model.save(str(tmp_path))  # vocab.json + merges.txt
  ours = bpe.tokenizer_from_files(str(tmp_path), "<|endoftext|>")
  vocab, merges = models.BPE.read_file(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
  ref = tokenizers.Tokenizer(models.BPE(vocab, merges))
  ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  ref.decoder = decoders.ByteLevel()
  ref.add_special_tokens([tokenizers.AddedToken("<|endoftext|>", special=True, normalized=False)])
  again = tokenizers.Tokenizer.from_str(ours.text)
  for text in with_specials(TEST[:80], ["<|endoftext|>"]):
    want = ref.encode(text).ids
    assert ours.encode(text) == again.encode(text).ids == want, text
    assert ours.decode(want) == ref.decode(want)
  tok, _ = bert(tmp_path)
  words = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
  (tmp_path / "vocab.txt").write_text("".join(w + "\n" for w, _ in words))
  names = dict(hf_wordpiece.SPECIAL_TOKENS)
  text_json = hf_wordpiece.pipeline_from_vocab(str(tmp_path / "vocab.txt"), {}, names)
  ours, again = tokenizer_json.TokenizerJson(text_json), tokenizers.Tokenizer.from_str(text_json)
  for text in TEST[:80]:
    assert ours.encode(text, add_special_tokens=True) == again.encode(text).ids == tok.encode(text).ids


def test_special_order_hand_worked():
  from txf.data.tokenizer import marian_order
  from txf.data.tokjson_codec import special_order
  # Llama-like: no pad; txf PAD gets a row of its own after the 7 ids
  got = special_order(7, {"pad": None, "bos": 1, "eos": 2, "unk": 0}, extra_rows=True)
  np.testing.assert_array_equal(got, [7, 1, 2, 0, 3, 4, 5, 6])
  # T5-like: no bos; a regular id moves to txf's BOS, as Marian's order does
  np.testing.assert_array_equal(
      special_order(7, {"pad": 0, "eos": 1, "unk": 2, "bos": None}, extra_rows=False),
      marian_order(7, pad=0, eos=1, unk=2))
  with pytest.raises(TxfError, match="distinct"):
    special_order(7, {"pad": 1, "eos": 1}, extra_rows=False)


def test_codec_of_a_tokenizer_json_saves_and_loads(pair, tmp_path):
  """A run's codec holding a tokenizer.json (txf ids: the checkpoint's permuted) is saved with
  Codec.save and comes back with load_codec, encoding and decoding the same."""
  from txf.data import tokenizer as tok
  from txf.data.tokjson_codec import JsonTokenizer
  kind, ref, ours, _ = pair
  if kind not in ("t5", "llama2"):
    pytest.skip("two layouts are enough")
  specials = {"pad": ours.pad_id, "bos": ours.bos_id, "eos": ours.eos_id, "unk": ours.unk_id}
  side = JsonTokenizer(ours, ours.vocab_size + 2, specials, extra_rows=kind == "llama2")
  tok.Codec(side, side, {"tokenizer": kind}).save(str(tmp_path / "codec"))
  back = tok.load_codec(str(tmp_path / "codec"))
  assert back.settings == {"tokenizer": kind} and back.joint
  assert back.source.vocab_size == ours.vocab_size + 2 + (1 if kind == "llama2" else 0)
  for text in TEST[:30]:
    ids = back.source.encode(text)
    assert [int(back.source.order[i]) for i in ids] == ref.encode(text, add_special_tokens=False).ids
    assert back.decode_target(ids) == ref.decode(ref.encode(text, add_special_tokens=False).ids)


@pytest.mark.slow
@pytest.mark.parametrize("cls", ["Qwen2Tokenizer", "GPT2Tokenizer", "LlamaTokenizer"])
def test_tokenizers_as_transformers_5_writes_them(cls, tmp_path):
  """The tokenizer.json + tokenizer_config.json transformers 5 saves for Qwen2 (NFC, Split regex,
  byte-level BPE), GPT-2 and Llama (Metaspace BPE with byte fallback), over vocabularies trained
  here: txf's ids and strings are those of AutoTokenizer on the saved folder."""
  transformers = pytest.importorskip("transformers")
  tok, _ = llama2(tmp_path) if cls == "LlamaTokenizer" else llama3(tmp_path)
  spec = json.loads(tok.to_str())
  vocab = spec["model"]["vocab"]
  merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["model"]["merges"]]
  if cls == "LlamaTokenizer":
    made, specials = transformers.LlamaTokenizer(vocab=vocab, merges=merges), ["<s>", "</s>"]
  else:
    made = getattr(transformers, cls)(vocab=vocab, merges=merges, bos_token=None,
                                      eos_token="<|end_of_text|>", pad_token="<|end_of_text|>",
                                      unk_token=None if cls == "Qwen2Tokenizer" else "<|end_of_text|>")
    specials = ["<|end_of_text|>"]
  made.save_pretrained(str(tmp_path / "saved"))
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
  assert type(theirs).__name__ == cls
  ours = tokenizer_json.read(str(tmp_path / "saved"))
  for text in with_specials(TEST, specials):
    want = theirs(text)["input_ids"]
    assert ours.encode(text, add_special_tokens=True) == want, text
    assert ours.decode(want) == theirs.decode(want, skip_special_tokens=True), text
