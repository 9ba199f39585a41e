"""BERT checkpoints <-> txf parameters: the config a BERT model needs, and its weights renamed and
reshaped both ways (numpy only; no torch).

A Hugging Face ``BertModel`` is a post-LN encoder with: learned positions from 0 (``model.positional
= "learned"``, no embedding scale), a token-type table (``model.type_vocab_size``; txf's inputs are
one segment, type 0), a LayerNorm on the summed embeddings (``model.embed_norm``), biases on every
attention projection, a GELU FFN (exact erf; ``gelu_new`` is txf's ``gelu_tanh``) and one LayerNorm
epsilon (1e-12). Its heads: ``BertForSequenceClassification`` = the pooler tanh(W h + b) of the
``[CLS]`` position's output h (``model.pooler`` with ``pooling="first"``) and a linear classifier
(family ``encoder_classifier``); ``BertForMaskedLM`` = dense, activation, LayerNorm, the tied output
and its bias (family ``encoder_mlm``). txf keeps PAD 0 / BOS 1 / EOS 2 / UNK 3 inside: the
vocabulary is permuted by ``order`` (``order[txf_id] = bert_id``: ``[PAD]``, ``[CLS]``, ``[SEP]``,
``[UNK]`` first) on the way in and back on the way out, and the imported WordPiece tokenizer gives
txf ids, so the models compute the same function of the same text.

Torch ``nn.Linear`` weights are [out, in]; txf kernels are [in, out] (attention split per head):
  query/key/value [d, h, d_k] = W^T reshaped;  out [h, d_k, d] = W_o^T reshaped;
  ffn wi [d, d_ff] = intermediate^T, wo [d_ff, d] = output^T;  Dense kernels = W^T.

Hugging Face BERT models in and out of txf (``txf import-hf`` / ``txf export-hf`` of a ``model_type:
bert`` directory; an entry of txf.hf's ``ARCHITECTURES``).

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

The WordPiece tokenizer is the checkpoint's own (txf.hf.wordpiece: tokenizer.json, else
built from vocab.txt and tokenizer_config.json as BertTokenizer does); txf's ids are BERT's
permuted so that ``[PAD]`` ``[CLS]`` ``[SEP]`` ``[UNK]`` are txf's PAD BOS EOS UNK, and a text becomes ``[CLS]``
pieces ``[SEP]``, exactly the ids BertTokenizer gives. Token types are all 0 (one segment). Export
writes the inverse: ``BertForSequenceClassification`` or ``BertForMaskedLM`` with safetensors
weights, tokenizer.json, vocab.txt and tokenizer_config.json.
"""

import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from txf.core import config as config_lib
from txf.core.errors import TxfError
from txf.data import tokenizer as tok
from txf.hf import common
from txf.hf import wordpiece as wordpiece_lib
from txf.runtime import workdir as workdir_lib

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "relu": "relu", "silu": "swish", "swish": "swish"}
CLASSIFIER, MLM = "encoder_classifier", "encoder_mlm"

# BertConfig's defaults (transformers 5): save_pretrained leaves fields at these out of config.json.
BERT_DEFAULTS = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
                 "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
                 "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                 "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
                 "layer_norm_eps": 1e-12, "pad_token_id": 0, "tie_word_embeddings": True,
                 "model_type": "bert"}

_ATTENTION = {"query": "attention.self.query", "key": "attention.self.key",
              "value": "attention.self.value"}


class UnsupportedBertConfig(ValueError):
  """A BERT config option txf cannot represent; the message names it."""


def model_fields(hf: Dict[str, Any], family: str) -> Dict[str, Any]:
  """``config.model`` fields of txf for a BERT ``config.json`` (a dict, over ``BERT_DEFAULTS``)
  with the head of ``family`` (``CLASSIFIER`` or ``MLM``).

  Raises UnsupportedBertConfig naming every option txf cannot represent."""
  problems: List[str] = []
  hf = {**BERT_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
  activation = ACTIVATIONS.get(str(hf["hidden_act"]))
  if activation is None:
    problems.append(f"hidden_act={hf['hidden_act']!r} (txf has {', '.join(ACTIVATIONS)})")
  if hf.get("position_embedding_type", "absolute") != "absolute":
    problems.append(f"position_embedding_type={hf['position_embedding_type']!r} (txf has BERT's "
                    f"absolute learned positions only)")
  if hf.get("is_decoder") or hf.get("add_cross_attention"):
    problems.append("is_decoder / add_cross_attention=True (txf imports BERT as an encoder)")
  if int(hf["hidden_size"]) % int(hf["num_attention_heads"]):
    problems.append(f"hidden_size={hf['hidden_size']} is not divisible by num_attention_heads="
                    f"{hf['num_attention_heads']}")
  if int(hf["type_vocab_size"]) < 1:
    problems.append(f"type_vocab_size={hf['type_vocab_size']} (BERT adds row 0 of its token-type "
                    f"table: at least 1)")
  if hf.get("model_type") != "bert":
    problems.append(f"model_type={hf.get('model_type')!r} (this converter reads bert models)")
  if problems:
    raise UnsupportedBertConfig("; ".join(problems))
  fields = {"family": family, "d_model": int(hf["hidden_size"]),
            "num_heads": int(hf["num_attention_heads"]), "d_ff": int(hf["intermediate_size"]),
            "num_encoder_layers": int(hf["num_hidden_layers"]), "num_decoder_layers": 0,
            "dropout_rate": float(hf["hidden_dropout_prob"]),
            "attention_dropout_rate": float(hf["attention_probs_dropout_prob"]),
            "pre_ln": False, "positional": "learned", "max_len": int(hf["max_position_embeddings"]),
            "layer_norm_eps": float(hf["layer_norm_eps"]), "activation": activation,
            "embed_scale": False, "attention_bias": True, "use_bias": True,
            "type_vocab_size": int(hf["type_vocab_size"]), "embed_norm": True,
            "share_embeddings": True, "tie_output": True, "logits_bias": False}
  if family == CLASSIFIER:
    fields.update(pooling="first", pooler=True)
  else:
    fields.update(tie_output=bool(hf["tie_word_embeddings"]), logits_bias=True)
  return fields


def _get(sd, name: str) -> np.ndarray:
  """A LayerNorm's weight/bias also under the old names gamma/beta."""
  if name in sd:
    return sd[name]
  old = {".weight": ".gamma", ".bias": ".beta"}
  for new, was in old.items():
    if name.endswith(new) and name[:-len(new)] + was in sd:
      return sd[name[:-len(new)] + was]
  raise KeyError(f"the state dict has no {name}")


def _dense_in(sd, prefix: str) -> Dict[str, np.ndarray]:
  return {"kernel": _get(sd, f"{prefix}.weight").T, "bias": _get(sd, f"{prefix}.bias")}


def _norm_in(sd, prefix: str) -> Dict[str, np.ndarray]:
  return {"scale": _get(sd, f"{prefix}.weight"), "bias": _get(sd, f"{prefix}.bias")}


def bert_prefix(sd: Dict[str, np.ndarray]) -> str:
  """"bert." when the encoder's tensors are under ``bert.`` (a model with a head), else ""."""
  return "bert." if any(k.startswith("bert.embeddings.") for k in sd) else ""


def _layer_in(sd, p: str, h: int) -> Dict[str, Any]:
  d = _get(sd, f"{p}.attention.self.query.weight").shape[1]
  attention = {}
  for name, hf_name in _ATTENTION.items():
    attention[name] = _get(sd, f"{p}.{hf_name}.weight").T.reshape(d, h, d // h)
    attention[f"{name}_bias"] = _get(sd, f"{p}.{hf_name}.bias").reshape(h, d // h)
  attention["out"] = _get(sd, f"{p}.attention.output.dense.weight").T.reshape(h, d // h, d)
  attention["out_bias"] = _get(sd, f"{p}.attention.output.dense.bias")
  ffn = {"wi": _get(sd, f"{p}.intermediate.dense.weight").T,
         "bi": _get(sd, f"{p}.intermediate.dense.bias"),
         "wo": _get(sd, f"{p}.output.dense.weight").T, "bo": _get(sd, f"{p}.output.dense.bias")}
  return {"self_attention": attention, "norm_1": _norm_in(sd, f"{p}.attention.output.LayerNorm"),
          "ffn": ffn, "norm_2": _norm_in(sd, f"{p}.output.LayerNorm")}


def params_from_state_dict(sd: Dict[str, np.ndarray], fields: Dict[str, Any], order: np.ndarray,
                           head: Dict[str, np.ndarray] = None) -> Dict[str, Any]:
  """txf parameters (nested dict of float32 numpy arrays) of a BERT state dict (BertModel's names,
  or a head model's with ``bert.`` before them).

  ``fields``: ``model_fields`` of its config; ``order`` int [V]: the BERT id of each txf id.
  ``head``: tensors to use where the state dict has none (``pooler.dense.*``, ``classifier.*``
  under their Hugging Face names: a new classifier for a checkpoint without one). Embedding rows
  and the MLM bias are permuted (txf row t = BERT row order[t])."""
  sd = {k: np.asarray(v, np.float32) for k, v in {**(head or {}), **sd}.items()}
  b, h = bert_prefix(sd), fields["num_heads"]
  e = f"{b}embeddings"
  encoder: Dict[str, Any] = {"positions": {
      "pos_embedding": _get(sd, f"{e}.position_embeddings.weight"),
      "token_type_embedding": _get(sd, f"{e}.token_type_embeddings.weight"),
      "embed_norm": _norm_in(sd, f"{e}.LayerNorm")}}
  for i in range(fields["num_encoder_layers"]):
    encoder[f"layer_{i}"] = _layer_in(sd, f"{b}encoder.layer.{i}", h)
  params: Dict[str, Any] = {"embed": {"embedding": _get(sd, f"{e}.word_embeddings.weight")[order]},
                            "encoder": encoder}
  if fields["family"] == CLASSIFIER:
    pooler = f"{b}pooler.dense" if f"{b}pooler.dense.weight" in sd else "pooler.dense"
    params["pooler"] = _dense_in(sd, pooler)
    params["classifier"] = _dense_in(sd, "classifier")
    return params
  t = "cls.predictions"
  params["mlm_dense"] = _dense_in(sd, f"{t}.transform.dense")
  params["mlm_norm"] = _norm_in(sd, f"{t}.transform.LayerNorm")
  bias = sd.get(f"{t}.bias", sd.get(f"{t}.decoder.bias"))
  params["logits_bias"] = bias[order]
  if not fields["tie_output"]:
    params["logits_kernel"] = _get(sd, f"{t}.decoder.weight")[order].T
  return params


def _attention_out(p, prefix: str) -> Dict[str, np.ndarray]:
  h, dk, d = p["out"].shape
  out = {}
  for name, hf_name in _ATTENTION.items():
    out[f"{prefix}.{hf_name}.weight"] = np.asarray(p[name]).reshape(d, h * dk).T
    out[f"{prefix}.{hf_name}.bias"] = np.asarray(p[f"{name}_bias"]).reshape(-1)
  out[f"{prefix}.attention.output.dense.weight"] = np.asarray(p["out"]).reshape(h * dk, d).T
  out[f"{prefix}.attention.output.dense.bias"] = p["out_bias"]
  return out


def state_dict_from_params(params: Dict[str, Any], fields: Dict[str, Any], order: np.ndarray,
                           vocab_size: int) -> Dict[str, np.ndarray]:
  """The state dict (float32 numpy, Hugging Face names) of txf parameters: the inverse of
  ``params_from_state_dict``, named as ``BertForSequenceClassification`` (family
  ``encoder_classifier``) or ``BertForMaskedLM`` (``encoder_mlm``) store them: each tied table once
  (the MLM's decoder weight and bias are tied to the word embeddings and ``cls.predictions.bias``
  on load). Embedding rows beyond ``vocab_size`` (padding for tensor parallelism) are dropped."""
  inverse = np.empty_like(order)
  inverse[order] = np.arange(len(order))

  def unpermute(rows):  # txf rows [>= V, ...] -> BERT rows [V, ...]
    return np.asarray(rows[:vocab_size], np.float32)[inverse]

  enc = params["encoder"]
  pos = enc["positions"]
  sd: Dict[str, np.ndarray] = {
      "bert.embeddings.word_embeddings.weight": unpermute(params["embed"]["embedding"]),
      "bert.embeddings.position_embeddings.weight": pos["pos_embedding"],
      "bert.embeddings.token_type_embeddings.weight": pos["token_type_embedding"],
      "bert.embeddings.LayerNorm.weight": pos["embed_norm"]["scale"],
      "bert.embeddings.LayerNorm.bias": pos["embed_norm"]["bias"]}
  for i in range(fields["num_encoder_layers"]):
    layer, pre = enc[f"layer_{i}"], f"bert.encoder.layer.{i}"
    sd.update(_attention_out(layer["self_attention"], pre))
    ffn = layer["ffn"]
    sd.update({f"{pre}.intermediate.dense.weight": np.asarray(ffn["wi"]).T,
               f"{pre}.intermediate.dense.bias": ffn["bi"],
               f"{pre}.output.dense.weight": np.asarray(ffn["wo"]).T,
               f"{pre}.output.dense.bias": ffn["bo"],
               f"{pre}.attention.output.LayerNorm.weight": layer["norm_1"]["scale"],
               f"{pre}.attention.output.LayerNorm.bias": layer["norm_1"]["bias"],
               f"{pre}.output.LayerNorm.weight": layer["norm_2"]["scale"],
               f"{pre}.output.LayerNorm.bias": layer["norm_2"]["bias"]})
  if fields["family"] == CLASSIFIER:
    for name, hf_name in (("pooler", "bert.pooler.dense"), ("classifier", "classifier")):
      sd[f"{hf_name}.weight"] = np.asarray(params[name]["kernel"]).T
      sd[f"{hf_name}.bias"] = params[name]["bias"]
  else:
    t = "cls.predictions"
    sd[f"{t}.transform.dense.weight"] = np.asarray(params["mlm_dense"]["kernel"]).T
    sd[f"{t}.transform.dense.bias"] = params["mlm_dense"]["bias"]
    sd[f"{t}.transform.LayerNorm.weight"] = params["mlm_norm"]["scale"]
    sd[f"{t}.transform.LayerNorm.bias"] = params["mlm_norm"]["bias"]
    sd[f"{t}.bias"] = unpermute(params["logits_bias"])
    if not fields["tie_output"]:
      sd[f"{t}.decoder.weight"] = unpermute(np.asarray(params["logits_kernel"]).T)
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in sd.items()}


DEFAULT_DATA_CONFIG = "sst2"
def _head_family(sd: Dict[str, np.ndarray], data_config: str) -> str:
  """encoder_classifier for a checkpoint with a classifier, or when ``data_config``'s experiment
  is a classifier; else encoder_mlm (TxfError without an MLM head)."""
  if "classifier.weight" in sd:
    return CLASSIFIER
  if data_config and config_lib.load_experiment(data_config).model.family == CLASSIFIER:
    return CLASSIFIER
  if "cls.predictions.transform.dense.weight" in sd:
    return MLM
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
  c = common.imported_config(name, data_config, fields,
                         ("tokenizer", "vocab_size", "max_input_len", "max_target_len"))
  if data_config:
    theirs = config_lib.load_experiment(data_config)
    c.best_metric = theirs.best_metric if fields["family"] == CLASSIFIER else ""
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
  sd = common.read_state_dict(local)
  family = _head_family(sd, data_config)
  try:
    fields = model_fields(hf_config, family)
  except UnsupportedBertConfig as e:
    raise TxfError(f"{config_path}: txf cannot represent {e}") from None
  vocab_size = int(hf_config.get("vocab_size") or BERT_DEFAULTS["vocab_size"])
  config = run_config(fields, name, data_config, vocab_size, max_len)
  config_lib.validate(config)
  codec, _ = wordpiece_lib.wordpiece_codec(local, vocab_size)
  head = None
  if family == CLASSIFIER and "classifier.weight" not in sd:
    head = _new_head(sd, hf_config, fields["d_model"], say)
  try:
    params = params_from_state_dict(sd, fields, codec.source.order, head)
  except KeyError as e:
    raise TxfError(f"{local}: {e.args[0]} (is it a BERT checkpoint of this config.json?)") from None
  classes = params["classifier"]["bias"].shape[0] if family == CLASSIFIER else 0
  common.write_imported_run(workdir, config, codec, params, {
      "family": family, "vocab_size": vocab_size, "target_vocab_size": 0,
      "num_classes": int(classes), "max_input_len": config.data.max_input_len,
      "max_target_len": config.data.max_target_len})


def exports(config) -> bool:
  """Whether ``txf export-hf`` writes this run as BERT: an encoder classifier or MLM."""
  return config.model.family in (CLASSIFIER, MLM)


def export_problems(config, codec: Optional[tok.Codec]) -> list:
  """What keeps an encoder run from being a BERT model (empty when it can be exported)."""
  m, problems = config.model, []
  want = {"positional": "learned", "pre_ln": False, "embed_scale": False, "attention_bias": True,
          "use_bias": True, "embed_norm": True, "norm": "layer_norm", "parallel_block": False,
          "attention": "scaled_dot_product", "num_kv_heads": 0, "qk_norm": "none"}
  for k, v in want.items():
    if m[k] != v and not (k == "num_kv_heads" and m[k] == m.num_heads):
      problems.append(f"model.{k}={m[k]!r} (BERT: {v!r})")
  if m.type_vocab_size < 1:
    problems.append("model.type_vocab_size=0 (BERT has a token-type table)")
  if m.activation not in set(ACTIVATIONS.values()):
    problems.append(f"model.activation={m.activation!r} (BERT's FFN is dense: gelu, gelu_tanh, "
                    f"relu, swish)")
  if m.family == CLASSIFIER and (m.pooling != "first" or not m.pooler):
    problems.append(f"model.pooling={m.pooling!r} / model.pooler={m.pooler} (BERT: first, True)")
  if m.family == MLM and not m.logits_bias:
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
  sd = state_dict_from_params(params, fields, wordpiece.order, size)
  classifier = m.family == CLASSIFIER
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
  pieces, tconf = wordpiece_lib.vocab_and_tokenizer_config(wordpiece, m.max_len)
  with common.staged_directory(output, ".export-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, "config.json"), hf_config)
    common.safetensors_module().save_file(sd, os.path.join(tmp, "model.safetensors"),
                                metadata={"format": "pt"})
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
      f.write(wordpiece.pipeline_json)
    with open(os.path.join(tmp, "vocab.txt"), "w", encoding="utf-8") as f:
      f.write("".join(f"{piece}\n" for piece in pieces))
    workdir_lib.write_json(os.path.join(tmp, "tokenizer_config.json"), tconf)
