"""Hugging Face BERT models in and out of txf (``txf import-hf`` / ``txf export-hf`` of a
``model_type: bert`` directory; the table ``txf.inference.hf.ARCHITECTURES`` points here).

Import reads a ``save_pretrained`` directory (config.json, model.safetensors or pytorch_model.bin,
tokenizer.json and/or vocab.txt with tokenizer_config.json) and writes a txf workdir:

* a checkpoint with a classifier (``BertForSequenceClassification``), or any BERT checkpoint
  when ``--data_config``'s experiment is a classifier (``sst2``, the default): family
  ``encoder_classifier`` with BERT's pooler; a checkpoint without a classifier (``BertModel``,
  ``BertForMaskedLM``, ``BertForPreTraining`` such as bert-base-uncased) gets a new one,
  N(0, initializer_range^2) weights and zero bias (seed 0), to fine-tune
  (``txf train --config sst2 --config.init_from=W``); one without a pooler a new pooler too.
  ``txf classify``, ``txf eval``, ``txf train --config.init_from`` serve it.
* otherwise (``--data_config ''`` or a non-classifier experiment) a checkpoint with an MLM head
  (``BertForMaskedLM``, ``BertForPreTraining``): family ``encoder_mlm`` (logits per position;
  no txf task trains or evaluates it yet).

The WordPiece tokenizer is the checkpoint's own (``tokenizers``; tokenizer.json, else built from
vocab.txt and tokenizer_config.json as BertTokenizer does); txf's ids are BERT's permuted so that
[PAD] [CLS] [SEP] [UNK] are txf's PAD BOS EOS UNK, and a text becomes [CLS] pieces [SEP], exactly
the ids BertTokenizer gives. Token types are all 0 (one segment). Export writes the inverse:
``BertForSequenceClassification`` or ``BertForMaskedLM`` with safetensors weights, tokenizer.json,
vocab.txt and tokenizer_config.json.
"""

import json
import os
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from txf import config as config_lib
from txf import workdir as workdir_lib
from txf.data import tokenizer as tok
from txf.errors import TxfError
from txf.inference import hf
from txf.models import bert

DEFAULT_DATA_CONFIG = "sst2"
SPECIAL_TOKENS = {"pad": "[PAD]", "cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]", "mask": "[MASK]"}
# tokenizer_config.json's names of the special tokens
_CONFIG_TOKEN_KEYS = {"pad": "pad_token", "cls": "cls_token", "sep": "sep_token",
                      "unk": "unk_token", "mask": "mask_token"}


def _read_json(path: str) -> Dict[str, Any]:
  with open(path) as f:
    return json.load(f)


def _token_name(value: Any, default: str) -> str:
  """A special token of tokenizer_config.json: a string or an AddedToken dict ({"content": ...})."""
  if isinstance(value, dict):
    return str(value.get("content", default))
  return default if value is None else str(value)


def _pipeline_from_vocab(vocab_path: str, tconf: Dict[str, Any], names: Dict[str, str]) -> str:
  """The tokenizers JSON of BertTokenizer's pipeline over vocab.txt (one piece a line, id = line):
  BERT's normalizer (clean text, Chinese characters split, lowercase and accents as
  tokenizer_config.json says), BERT's pre-tokenizer, WordPiece (## continuations, words over 100
  characters -> [UNK]), the [CLS] A [SEP] (B [SEP]) template and the WordPiece decoder."""
  with open(vocab_path, encoding="utf-8") as f:
    pieces = [line.rstrip("\n") for line in f]
  vocab = {p: i for i, p in reversed(list(enumerate(pieces)))}
  missing = [t for t in names.values() if t not in vocab]
  if missing:
    raise TxfError(f"{vocab_path} lacks the special tokens {', '.join(missing)}: give a BERT "
                   f"vocabulary (or its tokenizer.json)")
  lower = bool(tconf.get("do_lower_case", True))
  pipeline = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token=names["unk"],
                                                   max_input_chars_per_word=100))
  pipeline.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=bool(tconf.get("tokenize_chinese_chars", True)),
      strip_accents=tconf.get("strip_accents"), lowercase=lower)
  pipeline.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  pipeline.decoder = decoders.WordPiece(prefix="##")
  cls, sep = names["cls"], names["sep"]
  pipeline.post_processor = processors.TemplateProcessing(
      single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
      special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
  pipeline.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in names.values()])
  return pipeline.to_str()


def wordpiece_codec(src: str, vocab_size: int) -> Tuple[tok.Codec, Dict[str, Any]]:
  """(the Codec of a BERT tokenizer directory, its tokenizer_config.json as a dict or {})."""
  tconf_path = os.path.join(src, "tokenizer_config.json")
  tconf = _read_json(tconf_path) if os.path.isfile(tconf_path) else {}
  names = {k: _token_name(tconf.get(_CONFIG_TOKEN_KEYS[k]), v) for k, v in SPECIAL_TOKENS.items()}
  json_path, vocab_path = os.path.join(src, "tokenizer.json"), os.path.join(src, "vocab.txt")
  if os.path.isfile(json_path):
    with open(json_path, encoding="utf-8") as f:
      pipeline = f.read()
  elif os.path.isfile(vocab_path):
    pipeline = _pipeline_from_vocab(vocab_path, tconf, names)
  else:
    raise TxfError(f"{src} has no tokenizer.json or vocab.txt: txf imports BERT models with their "
                   f"WordPiece tokenizer (save the tokenizer with save_pretrained beside the model)")
  probe = tokenizers.Tokenizer.from_str(pipeline)
  ids = {k: probe.token_to_id(t) for k, t in names.items()}
  missing = [names[k] for k, i in ids.items() if i is None and k != "mask"]
  if missing:
    raise TxfError(f"{src}: the tokenizer has no {', '.join(missing)} token")
  if probe.get_vocab_size(with_added_tokens=True) > vocab_size:
    raise TxfError(f"{src}: the tokenizer has {probe.get_vocab_size(with_added_tokens=True)} "
                   f"tokens, more than the model's vocab_size={vocab_size}")
  specials = {k: int(i) for k, i in ids.items() if i is not None}
  clean_up = bool(tconf.get("clean_up_tokenization_spaces", False))
  wordpiece = tok.WordPieceTokenizer(pipeline, specials, vocab_size, clean_up=clean_up)
  return tok.Codec(wordpiece, wordpiece, {"tokenizer": "wordpiece"}), tconf


def _head_family(sd: Dict[str, np.ndarray], data_config: str) -> str:
  """encoder_classifier for a checkpoint with a classifier, or when ``data_config``'s experiment
  is a classifier; else encoder_mlm (TxfError without an MLM head)."""
  if "classifier.weight" in sd:
    return bert.CLASSIFIER
  if data_config and config_lib.load_experiment(data_config).model.family == bert.CLASSIFIER:
    return bert.CLASSIFIER
  if "cls.predictions.transform.dense.weight" in sd:
    return bert.MLM
  raise TxfError(f"the checkpoint has neither a classifier nor an MLM head, and --data_config="
                 f"{data_config!r} is no classifier experiment: import it with --data_config sst2 "
                 f"(a new classifier) or give a BertForMaskedLM checkpoint")


def _new_head(sd, hf_config: Dict[str, Any], d: int, say: Callable[[str], None]):
  """A new classifier (and pooler, if the checkpoint has none), N(0, initializer_range^2), zero
  biases, seed 0, under their Hugging Face names; ``say`` hears what was made."""
  rng = np.random.default_rng(0)
  std = float(hf_config.get("initializer_range") or 0.02)
  classes = _num_labels(hf_config)
  head = {"classifier.weight": rng.normal(0, std, (classes, d)).astype(np.float32),
          "classifier.bias": np.zeros(classes, np.float32)}
  made = ["classifier"]
  if not any(k.endswith("pooler.dense.weight") for k in sd):
    head.update({"pooler.dense.weight": rng.normal(0, std, (d, d)).astype(np.float32),
                 "pooler.dense.bias": np.zeros(d, np.float32)})
    made.append("pooler")
  say(f"the checkpoint has no {' or '.join(made)}: a new one ({classes} classes, N(0, {std}^2)) "
      f"starts it; fine-tune it (txf train --config.init_from)")
  return head


def _num_labels(hf_config: Dict[str, Any]) -> int:
  labels = hf_config.get("id2label")
  n = len(labels) if labels else int(hf_config.get("num_labels", 2) or 2)
  if n < 2:
    raise TxfError(f"num_labels={n}: txf's classifier needs at least 2 classes (a regression "
                   f"head, problem_type=regression, is not supported)")
  return n


def run_config(fields: Dict[str, Any], name: str, data_config: str, vocab_size: int, max_len: int):
  """The txf run config of an imported BERT: ``fields`` as config.model, the data fields of
  ``data_config``'s experiment ("" = base_config's) but for the tokenizer and the length."""
  c = hf.imported_config(name, data_config, fields,
                         ("tokenizer", "vocab_size", "max_input_len", "max_target_len"))
  if data_config:
    theirs = config_lib.load_experiment(data_config)
    c.best_metric = theirs.best_metric if fields["family"] == bert.CLASSIFIER else ""
  # the run's tokenizer is its tokenizer/ directory (WordPiece); "sentencepiece" marks real text
  c.data.tokenizer, c.data.vocab_size = "sentencepiece", vocab_size
  c.data.max_input_len = c.data.max_target_len = min(max_len, fields["max_len"])
  c.decode_examples = 0
  return c


def import_run(local: str, hf_config: Dict[str, Any], workdir: str, name: str, data_config: str,
               max_len: int, say: Callable[[str], None] = print) -> None:
  """Write the txf workdir of the BERT ``save_pretrained`` directory ``local`` (``hf_config`` its
  config.json) into ``workdir``; TxfError naming any option txf cannot represent."""
  config_path = os.path.join(local, "config.json")
  sd = hf.read_state_dict(local)
  family = _head_family(sd, data_config)
  try:
    fields = bert.model_fields(hf_config, family)
  except bert.UnsupportedBertConfig as e:
    raise TxfError(f"{config_path}: txf cannot represent {e}") from None
  vocab_size = int(hf_config.get("vocab_size") or bert.BERT_DEFAULTS["vocab_size"])
  config = run_config(fields, name, data_config, vocab_size, max_len)
  config_lib.validate(config)
  codec, _ = wordpiece_codec(local, vocab_size)
  head = None
  if family == bert.CLASSIFIER and "classifier.weight" not in sd:
    head = _new_head(sd, hf_config, fields["d_model"], say)
  try:
    params = bert.params_from_state_dict(sd, fields, codec.source.order, head)
  except KeyError as e:
    raise TxfError(f"{local}: {e.args[0]} (is it a BERT checkpoint of this config.json?)") from None
  classes = params["classifier"]["bias"].shape[0] if family == bert.CLASSIFIER else 0
  hf.write_imported_run(workdir, config, codec, params, {
      "family": family, "vocab_size": vocab_size, "target_vocab_size": 0,
      "num_classes": int(classes), "max_input_len": config.data.max_input_len,
      "max_target_len": config.data.max_target_len})


def exports(config) -> bool:
  """Whether ``txf export-hf`` writes this run as BERT: an encoder classifier or MLM."""
  return config.model.family in (bert.CLASSIFIER, bert.MLM)


def export_problems(config, codec: Optional[tok.Codec]) -> list:
  """What keeps an encoder run from being a BERT model (empty when it can be exported)."""
  m, problems = config.model, []
  want = {"positional": "learned", "pre_ln": False, "embed_scale": False, "attention_bias": True,
          "use_bias": True, "embed_norm": True, "norm": "layer_norm", "parallel_block": False,
          "attention": "scaled_dot_product", "num_kv_heads": 0, "qk_norm": "none"}
  for k, v in want.items():
    if m.get(k) != v and not (k == "num_kv_heads" and m.get(k) == m.num_heads):
      problems.append(f"model.{k}={m.get(k)!r} (BERT: {v!r})")
  if m.type_vocab_size < 1:
    problems.append("model.type_vocab_size=0 (BERT has a token-type table)")
  if m.activation not in set(bert.ACTIVATIONS.values()):
    problems.append(f"model.activation={m.activation!r} (BERT's FFN is dense: gelu, gelu_tanh, "
                    f"relu, swish)")
  if m.family == bert.CLASSIFIER and (m.pooling != "first" or not m.pooler):
    problems.append(f"model.pooling={m.pooling!r} / model.pooler={m.pooler} (BERT: first, True)")
  if m.family == bert.MLM and not m.logits_bias:
    problems.append("model.logits_bias=False (BERT's MLM head has an output bias)")
  if codec is None or not isinstance(codec.source, tok.WordPieceTokenizer):
    kind = "none" if codec is None else codec.source.kind
    problems.append(f"its tokenizer ({kind}; BERT needs the WordPiece tokenizer of an imported "
                    f"BERT)")
  return problems


def _activation_name(activation: str) -> str:
  return {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "swish": "silu"}[activation]


def export_run(workdir: str, config, output: str, params_name: Optional[str],
               say: Callable[[str], None] = lambda line: None) -> None:
  """Write ``output``: config.json, model.safetensors, tokenizer.json, vocab.txt and
  tokenizer_config.json of the BERT run in ``workdir`` (TxfError naming what cannot be exported)."""
  codec = tok.load_codec(workdir_lib.path_of(workdir, workdir_lib.TOKENIZER_DIR))
  problems = export_problems(config, codec)
  if problems:
    raise TxfError(f"{workdir} cannot be exported as a BERT model: {'; '.join(problems)}")
  m, wordpiece = config.model, codec.source
  fields = m.to_dict()
  size = wordpiece.vocab_size
  params = workdir_lib.load_params(workdir, params_name)
  sd = bert.state_dict_from_params(params, fields, wordpiece.order, size)
  classifier = m.family == bert.CLASSIFIER
  hf_config = {"architectures": ["BertForSequenceClassification" if classifier
                                 else "BertForMaskedLM"],
               "model_type": "bert", "vocab_size": size, "hidden_size": m.d_model,
               "num_hidden_layers": m.num_encoder_layers, "num_attention_heads": m.num_heads,
               "intermediate_size": m.d_ff, "hidden_act": _activation_name(m.activation),
               "hidden_dropout_prob": m.dropout_rate,
               "attention_probs_dropout_prob": m.attention_dropout_rate,
               "max_position_embeddings": m.max_len, "type_vocab_size": m.type_vocab_size,
               "layer_norm_eps": m.layer_norm_eps, "pad_token_id": wordpiece.specials["pad"],
               "tie_word_embeddings": bool(m.tie_output) if not classifier else True,
               "initializer_range": 0.02, "is_decoder": False, "add_cross_attention": False}
  if classifier:
    classes = int(np.shape(params["classifier"]["bias"])[0])
    hf_config["id2label"] = {str(i): f"LABEL_{i}" for i in range(classes)}
    hf_config["label2id"] = {f"LABEL_{i}": i for i in range(classes)}
  pipeline = tokenizers.Tokenizer.from_str(wordpiece.pipeline_json)
  vocab = sorted(pipeline.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
  names = {k: pipeline.id_to_token(i) for k, i in wordpiece.specials.items()}
  tconf = {"tokenizer_class": "BertTokenizer", "model_max_length": m.max_len,
           "clean_up_tokenization_spaces": wordpiece.clean_up,
           **{_CONFIG_TOKEN_KEYS[k]: t for k, t in names.items()}}
  normalizer = json.loads(wordpiece.pipeline_json).get("normalizer") or {}
  if normalizer.get("type") == "BertNormalizer":
    tconf.update(do_lower_case=bool(normalizer.get("lowercase", True)),
                 strip_accents=normalizer.get("strip_accents"),
                 tokenize_chinese_chars=bool(normalizer.get("handle_chinese_chars", True)))
  with hf.staged_directory(output, ".export-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, "config.json"), hf_config)
    hf._safetensors().save_file(sd, os.path.join(tmp, "model.safetensors"),
                                metadata={"format": "pt"})
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
      f.write(wordpiece.pipeline_json)
    with open(os.path.join(tmp, "vocab.txt"), "w", encoding="utf-8") as f:
      f.write("".join(f"{piece}\n" for piece, _ in vocab))
    workdir_lib.write_json(os.path.join(tmp, "tokenizer_config.json"), tconf)
