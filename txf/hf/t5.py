"""T5 checkpoints (``T5ForConditionalGeneration``, v1.0 and v1.1) <-> txf parameters: the config a
T5 model needs, and its weights renamed and reshaped both ways (numpy only; no torch).

A Hugging Face T5 is a pre-LN encoder-decoder with: RMSNorm without mean or bias
(``model.norm="rms_norm"``, eps 1e-6) and a final norm in each stack, attention logits not scaled
by 1/sqrt(d_k) (``model.attention="dot_product"``), heads of width d_kv that need not be
d_model / h (``model.head_dim``), T5's bucketed relative position bias whose table sits in the
first layer of each stack and serves all of its layers (``model.positional="relative"``,
``model.relative_shared=True``; encoder bidirectional, decoder causal, none in cross-attention),
no biases anywhere, no embedding scale, a ReLU FFN (v1.0) or a gated tanh-GELU one (v1.1,
``geglu_tanh``), one shared embedding table, and an output head that is the table itself with the
decoder states scaled by d_model^-0.5 (v1.0: ``model.logits_scale``) or its own ``lm_head`` without
scale (v1.1). Special ids pad 0 (the decoder start), EOS 1, UNK 2, no BOS: the vocabulary is
permuted by ``order`` (``order[txf_id] = t5_id``, txf.data.tokenizer.marian_order) as Marian's is.

Torch ``nn.Linear`` weights are [out, in]; txf kernels are [in, out] split per head:
  query/key/value [d, h, d_kv] = W^T reshaped;  out [h, d_kv, d] = W_o^T reshaped;
  ffn wi [d, d_ff] = wi^T (gated: wi = wi_0^T, the activated one, wi_gate = wi_1^T), wo = wo^T;
  relative_attention_bias [buckets, h] as it is; layer_norm weight = scale.
Every step is a transpose, reshape or row permutation, so the way back is exact.

Hugging Face T5 models (``T5ForConditionalGeneration``, v1.0 and v1.1) in and out of txf: the
``t5`` entry of txf.hf's ``ARCHITECTURES`` (``txf import-hf`` / ``txf export-hf``).

Import reads a ``save_pretrained`` directory (config.json, model.safetensors, spiece.model,
optionally tokenizer_config.json and generation_config.json) and writes a txf workdir whose model
is T5's (txf.hf.t5: pre-LN RMSNorm, unscaled attention, one relative bias table per stack,
head width d_kv, ReLU or gated tanh-GELU FFN, no biases, tied head with the d_model^-0.5 scale or
an untied one) and whose tokenizer is the checkpoint's SentencePiece model with T5's ``extra_ids``
sentinels ``<extra_id_N>`` at the top of the vocabulary (id V_spm + extra_ids - 1 - N; config
vocab_size may exceed that: the extra rows are kept, never produced by the tokenizer), or, for a
checkpoint without spiece.model (transformers 5 saves ``tokenizer.json`` and
``tokenizer_config.json`` only), its tokenizer.json read by txf (txf.data.tokjson). Text is
encoded as it is: a task prefix such as "translate English to German: " is part of the source
line, and the source gets EOS appended as T5's tokenizer does. Export writes the inverse, for
``T5ForConditionalGeneration.from_pretrained`` and ``T5Tokenizer.from_pretrained`` (spiece.model,
or the tokenizer.json the run was imported with).

Decoding settings of an imported run are those of Hugging Face's ``generate(num_beams=K,
length_penalty=1.0, early_stopping=True)`` as for Marian (txf.hf's docstring).
"""

import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import sentencepiece as spm

from txf.core import config as config_lib
from txf.core.errors import TxfError
from txf.data import tokenizer as tok
from txf.data import tokjson_codec
from txf.decode.spec import DecodingSpec
from txf.hf import common
from txf.hf import tokenizer_json
from txf.runtime import workdir as workdir_lib

# Hugging Face's activation name (T5Config.dense_act_fn) -> txf's, dense and gated
_ACTIVATIONS = {"relu": ("relu", "reglu"), "gelu": ("gelu", "geglu"),
                "gelu_python": ("gelu", "geglu"), "gelu_new": ("gelu_tanh", "geglu_tanh"),
                "gelu_pytorch_tanh": ("gelu_tanh", "geglu_tanh"),
                "silu": ("swish", "swiglu"), "swish": ("swish", "swiglu")}
# txf's activation -> T5Config.feed_forward_proj
FEED_FORWARD_PROJ = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "swish": "silu",
                     "reglu": "gated-relu", "geglu": "gated-gelu_python",
                     "geglu_tanh": "gated-gelu", "swiglu": "gated-silu"}

# T5Config's defaults (transformers 5): save_pretrained leaves fields at these out of config.json.
T5_DEFAULTS = {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6,
               "num_decoder_layers": None, "num_heads": 8, "relative_attention_num_buckets": 32,
               "relative_attention_max_distance": 128, "dropout_rate": 0.1,
               "layer_norm_epsilon": 1e-6, "feed_forward_proj": "relu",
               "is_encoder_decoder": True, "pad_token_id": 0, "eos_token_id": 1,
               "model_type": "t5"}

_ATTENTION = {"query": "q", "key": "k", "value": "v"}


class UnsupportedT5Config(ValueError):
  """A T5 config option txf cannot represent; the message names it."""


def _activation(proj: str):
  """(txf activation or None) of T5Config.feed_forward_proj ("relu", "gated-gelu", ...)."""
  parts = str(proj).split("-")
  gated = len(parts) == 2 and parts[0] == "gated"
  if len(parts) > 2 or (len(parts) == 2 and not gated):
    return None
  name = "gelu_new" if proj == "gated-gelu" else parts[-1]  # T5 v1.1's "gated-gelu" is gelu_new
  names = _ACTIVATIONS.get(name)
  return None if names is None else names[int(gated)]


def scales_output(hf: Dict[str, Any]) -> bool:
  """Whether the model multiplies the final decoder states by d_model^-0.5 before the head: the
  config's ``scale_decoder_outputs`` (transformers 5), else ``tie_word_embeddings`` not False
  (v1.0 True, v1.1 False)."""
  if hf.get("scale_decoder_outputs") is not None:
    return bool(hf["scale_decoder_outputs"])
  return hf.get("tie_word_embeddings", True) is not False


def model_fields(hf: Dict[str, Any], tied: bool) -> Dict[str, Any]:
  """``config.model`` fields of txf for a T5 ``config.json`` (a dict, over ``T5_DEFAULTS``);
  ``tied``: whether the checkpoint's head is the shared table (no distinct ``lm_head.weight``).

  Raises UnsupportedT5Config naming every option txf cannot represent.
  """
  problems: List[str] = []
  hf = {**T5_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
  activation = _activation(hf["feed_forward_proj"])
  if activation is None:
    problems.append(f"feed_forward_proj={hf['feed_forward_proj']!r} (txf has relu, gelu, gelu_new, "
                    f"silu, dense or gated-)")
  if hf.get("model_type") != "t5":
    problems.append(f"model_type={hf.get('model_type')!r} (this importer reads t5 models)")
  architectures = hf.get("architectures") or ["T5ForConditionalGeneration"]
  if "T5ForConditionalGeneration" not in architectures:
    problems.append(f"architectures={architectures} (txf imports T5ForConditionalGeneration, "
                    f"the encoder-decoder with its LM head)")
  if not hf.get("is_encoder_decoder", True) or hf.get("is_decoder", False):
    problems.append("is_encoder_decoder=False (txf imports the encoder-decoder)")
  buckets, distance = hf["relative_attention_num_buckets"], hf["relative_attention_max_distance"]
  if not isinstance(buckets, int) or buckets < 4 or buckets % 2:
    problems.append(f"relative_attention_num_buckets={buckets} (txf needs an even number >= 4)")
  elif not isinstance(distance, int) or distance <= buckets // 2:
    problems.append(f"relative_attention_max_distance={distance} (txf needs more than "
                    f"num_buckets / 2 = {buckets // 2})")
  pad = hf["pad_token_id"]
  start = hf.get("decoder_start_token_id", pad)
  if start is not None and start != pad:
    problems.append(f"decoder_start_token_id={start} != pad_token_id={pad} (txf maps T5's pad, its "
                    f"decoder start, to id 0)")
  if problems:
    raise UnsupportedT5Config("; ".join(problems))
  d = int(hf["d_model"])
  layers = int(hf["num_layers"])
  return {"family": "encoder_decoder", "d_model": d, "num_heads": int(hf["num_heads"]),
          "head_dim": int(hf["d_kv"]), "d_ff": int(hf["d_ff"]),
          "num_encoder_layers": layers,
          "num_decoder_layers": int(hf.get("num_decoder_layers") or layers),
          # T5's dropout_rate also drops attention weights (and FFN hiddens: txf has no such dropout)
          "dropout_rate": float(hf["dropout_rate"]),
          "attention_dropout_rate": float(hf["dropout_rate"]),
          "pre_ln": True, "norm": "rms_norm", "layer_norm_eps": float(hf["layer_norm_epsilon"]),
          "attention": "dot_product", "positional": "relative", "relative_shared": True,
          "relative_buckets": buckets, "relative_max_distance": distance,
          "activation": activation, "ffn_match_params": False, "use_bias": False,
          "attention_bias": False, "logits_bias": False, "embed_scale": False,
          "share_embeddings": True, "tie_output": bool(tied),
          "logits_scale": d ** -0.5 if scales_output(hf) else 1.0,
          "decoder_start_id": 0, "forbid_pad": False, "max_len": 512}


def _attention_in(sd, prefix: str, h: int) -> Dict[str, np.ndarray]:
  w = sd[f"{prefix}.q.weight"]
  inner, d = w.shape
  out = {name: sd[f"{prefix}.{hf_name}.weight"].T.reshape(d, h, inner // h)
         for name, hf_name in _ATTENTION.items()}
  out["out"] = sd[f"{prefix}.o.weight"].T.reshape(h, inner // h, d)
  return out


def _attention_out(p, prefix: str) -> Dict[str, np.ndarray]:
  h, dk, d = np.shape(p["out"])
  out = {f"{prefix}.{hf_name}.weight": np.asarray(p[name]).reshape(d, h * dk).T
         for name, hf_name in _ATTENTION.items()}
  out[f"{prefix}.o.weight"] = np.asarray(p["out"]).reshape(h * dk, d).T
  return out


def _ffn_in(sd, prefix: str, gated: bool) -> Dict[str, np.ndarray]:
  if gated:
    return {"wi": sd[f"{prefix}.wi_0.weight"].T, "wi_gate": sd[f"{prefix}.wi_1.weight"].T,
            "wo": sd[f"{prefix}.wo.weight"].T}
  return {"wi": sd[f"{prefix}.wi.weight"].T, "wo": sd[f"{prefix}.wo.weight"].T}


def _ffn_out(p, prefix: str) -> Dict[str, np.ndarray]:
  out = {f"{prefix}.wo.weight": np.asarray(p["wo"]).T}
  if "wi_gate" in p:
    out[f"{prefix}.wi_0.weight"] = np.asarray(p["wi"]).T
    out[f"{prefix}.wi_1.weight"] = np.asarray(p["wi_gate"]).T
  else:
    out[f"{prefix}.wi.weight"] = np.asarray(p["wi"]).T
  return out


def shared_table(sd: Dict[str, np.ndarray]) -> np.ndarray:
  """The shared embedding table [V, d] of a T5 state dict (whichever name it was stored under)."""
  for name in ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
    if name in sd:
      return sd[name]
  raise KeyError("the state dict has no token embeddings (shared.weight)")


def head_is_tied(sd: Dict[str, np.ndarray]) -> bool:
  """Whether the checkpoint's output layer is the shared table: no ``lm_head.weight``, or one
  equal to it."""
  head = sd.get("lm_head.weight")
  return head is None or np.array_equal(head, shared_table(sd))


def params_from_state_dict(sd: Dict[str, np.ndarray], fields: Dict[str, Any],
                           order: np.ndarray) -> Dict[str, Any]:
  """txf parameters (nested dict of float32 numpy arrays) of a T5 state dict.

  ``fields``: ``model_fields`` of its config; ``order`` int [V]: the T5 id of each txf id.
  Embedding rows and output columns are permuted: txf row t = T5 row order[t].
  """
  sd = {k: np.asarray(v, np.float32) for k, v in sd.items()}
  h, gated = fields["num_heads"], FEED_FORWARD_PROJ[fields["activation"]].startswith("gated")
  table = shared_table(sd)
  encoder: Dict[str, Any] = {
      "relative_bias": sd["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
      "final_norm": {"scale": sd["encoder.final_layer_norm.weight"]}}
  for i in range(fields["num_encoder_layers"]):
    p = f"encoder.block.{i}.layer"
    encoder[f"layer_{i}"] = {"self_attention": _attention_in(sd, f"{p}.0.SelfAttention", h),
                             "norm_1": {"scale": sd[f"{p}.0.layer_norm.weight"]},
                             "ffn": _ffn_in(sd, f"{p}.1.DenseReluDense", gated),
                             "norm_2": {"scale": sd[f"{p}.1.layer_norm.weight"]}}
  decoder: Dict[str, Any] = {
      "relative_bias": sd["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
      "final_norm": {"scale": sd["decoder.final_layer_norm.weight"]}}
  for i in range(fields["num_decoder_layers"]):
    p = f"decoder.block.{i}.layer"
    decoder[f"layer_{i}"] = {"self_attention": _attention_in(sd, f"{p}.0.SelfAttention", h),
                             "norm_1": {"scale": sd[f"{p}.0.layer_norm.weight"]},
                             "cross_attention": _attention_in(sd, f"{p}.1.EncDecAttention", h),
                             "norm_2": {"scale": sd[f"{p}.1.layer_norm.weight"]},
                             "ffn": _ffn_in(sd, f"{p}.2.DenseReluDense", gated),
                             "norm_3": {"scale": sd[f"{p}.2.layer_norm.weight"]}}
  if not fields["tie_output"]:
    decoder["logits_kernel"] = sd["lm_head.weight"][order].T
  return {"embed": {"embedding": table[order]}, "encoder": encoder, "decoder": decoder}


def state_dict_from_params(params: Dict[str, Any], fields: Dict[str, Any], order: np.ndarray,
                           vocab_size: int) -> Dict[str, np.ndarray]:
  """The T5 state dict (float32 numpy, Hugging Face names, each tensor once: ``shared.weight``
  for the embeddings) of txf parameters: the inverse of ``params_from_state_dict``. Embedding rows
  beyond ``vocab_size`` (padding for tensor parallelism) are dropped. ``lm_head.weight`` is
  written for an untied head, and for a tied one without the d_model^-0.5 scale (v1.1's layout:
  libraries that read ``tie_word_embeddings=False`` then find the table there too)."""
  inverse = np.empty_like(order)
  inverse[order] = np.arange(len(order))

  def unpermute(rows):  # txf rows [>= V, ...] -> T5 rows [V, ...]
    return np.asarray(rows[:vocab_size], np.float32)[inverse]

  table = unpermute(params["embed"]["embedding"])
  sd: Dict[str, np.ndarray] = {"shared.weight": table}
  decoder, encoder = params["decoder"], params["encoder"]
  if not fields["tie_output"]:
    sd["lm_head.weight"] = unpermute(np.asarray(decoder["logits_kernel"]).T)
  elif fields.get("logits_scale", 1.0) == 1.0:
    sd["lm_head.weight"] = table
  sd["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = encoder["relative_bias"]
  sd["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = decoder["relative_bias"]
  sd["encoder.final_layer_norm.weight"] = encoder["final_norm"]["scale"]
  sd["decoder.final_layer_norm.weight"] = decoder["final_norm"]["scale"]
  for i in range(fields["num_encoder_layers"]):
    layer, p = encoder[f"layer_{i}"], f"encoder.block.{i}.layer"
    sd.update(_attention_out(layer["self_attention"], f"{p}.0.SelfAttention"))
    sd[f"{p}.0.layer_norm.weight"] = layer["norm_1"]["scale"]
    sd.update(_ffn_out(layer["ffn"], f"{p}.1.DenseReluDense"))
    sd[f"{p}.1.layer_norm.weight"] = layer["norm_2"]["scale"]
  for i in range(fields["num_decoder_layers"]):
    layer, p = decoder[f"layer_{i}"], f"decoder.block.{i}.layer"
    sd.update(_attention_out(layer["self_attention"], f"{p}.0.SelfAttention"))
    sd[f"{p}.0.layer_norm.weight"] = layer["norm_1"]["scale"]
    sd.update(_attention_out(layer["cross_attention"], f"{p}.1.EncDecAttention"))
    sd[f"{p}.1.layer_norm.weight"] = layer["norm_2"]["scale"]
    sd.update(_ffn_out(layer["ffn"], f"{p}.2.DenseReluDense"))
    sd[f"{p}.2.layer_norm.weight"] = layer["norm_3"]["scale"]
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in sd.items()}


DEFAULT_DATA_CONFIG = "multi30k_en_de"
SPM_FILE = "spiece.model"


def _extra_ids(tconf: Dict[str, Any]) -> int:
  """The number of ``<extra_id_N>`` sentinels tokenizer_config.json declares (T5's default 100)."""
  listed = [t for t in tconf.get("additional_special_tokens") or [] if "<extra_id_" in str(t)]
  return int(tconf.get("extra_ids") or len(listed) or (0 if "extra_ids" in tconf else 100))


def t5_codec(src: str, hf: Dict[str, Any], settings: Dict[str, Any]) -> tok.Codec:
  """The Codec of a T5 directory: spiece.model for both sides (one vocabulary), its pieces at
  their SentencePiece ids and the sentinels ``<extra_id_N>`` at V_spm + extra_ids - 1 - N, special
  ids pad and EOS from the model config, UNK from the SentencePiece model; without spiece.model,
  its tokenizer.json (``json_codec``). ``settings["tokenizer_file"]`` names the file used."""
  path = os.path.join(src, SPM_FILE)
  if not os.path.isfile(path):
    if os.path.isfile(os.path.join(src, tokenizer_json.TOKENIZER_FILE)):
      return json_codec(src, hf, settings)
    raise TxfError(f"{src} has no {SPM_FILE} and no {tokenizer_json.TOKENIZER_FILE}: txf imports "
                   f"T5 models with their tokenizer (save the tokenizer with save_pretrained next "
                   f"to the model)")
  with open(path, "rb") as f:
    proto = f.read()
  tconf_path = os.path.join(src, "tokenizer_config.json")
  tconf = common.read_json(tconf_path) if os.path.isfile(tconf_path) else {}
  extra = _extra_ids(tconf)
  sp = spm.SentencePieceProcessor(model_proto=proto)
  pieces = sp.get_piece_size()
  size = int(hf["vocab_size"])
  if pieces + extra > size:
    raise TxfError(f"{path} has {pieces} pieces and {extra} extra_ids, more than the model's "
                   f"vocab_size={size}: give the tokenizer saved with this model")
  vocab = {sp.id_to_piece(i): i for i in range(pieces)}
  vocab.update({f"<extra_id_{n}>": pieces + extra - 1 - n for n in range(extra)})
  specials = {"pad": int(hf["pad_token_id"]), "eos": int(hf["eos_token_id"]),
              "unk": int(sp.unk_id())}
  side = tok.T5Tokenizer(proto, vocab, specials, size,
                         clean_up=bool(tconf.get("clean_up_tokenization_spaces", False)))
  return tok.Codec(side, side, {**settings, "extra_ids": extra, "tokenizer_file": SPM_FILE})


def json_codec(src: str, hf: Dict[str, Any], settings: Dict[str, Any]) -> tok.Codec:
  """The Codec of a T5 directory's tokenizer.json (and tokenizer_config.json): ids as
  ``t5_codec``'s (pad and EOS from the model config, UNK the tokenizer's; the sentinels where the
  file puts them)."""
  tokenizer = tokenizer_json.read(src)
  specials = {"pad": int(hf["pad_token_id"]), "eos": int(hf["eos_token_id"]),
              "unk": tokenizer.unk_id}
  try:
    side = tokjson_codec.JsonTokenizer(tokenizer, int(hf["vocab_size"]), specials)
  except TxfError as e:
    raise TxfError(f"{src}: {e}") from None
  return tok.Codec(side, side, {**settings, "tokenizer_file": tokenizer_json.TOKENIZER_FILE})


def import_run(local: str, hf: Dict[str, Any], workdir: str, name: str, data_config: str,
               max_len: int) -> None:
  """Write the txf workdir of the T5 save_pretrained directory ``local`` (``hf``: its
  config.json) into ``workdir``; TxfError naming any option txf cannot represent."""
  config_path = os.path.join(local, "config.json")
  hf = {**T5_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
  gen_path = os.path.join(local, "generation_config.json")
  if os.path.isfile(gen_path):  # generate()'s settings: beams, decoder start
    hf = {**hf, **{k: v for k, v in common.read_json(gen_path).items()
                   if k in ("num_beams", "decoder_start_token_id") and v is not None}}
  sd = common.read_state_dict(local)
  try:
    fields = model_fields(hf, head_is_tied(sd))
  except UnsupportedT5Config as e:
    raise TxfError(f"{config_path}: txf cannot represent {e}") from None
  except KeyError as e:
    raise TxfError(f"{local}/model.safetensors lacks {e}: give a directory written by "
                   f"T5ForConditionalGeneration.save_pretrained") from None
  config = common.import_config(hf, fields, name, data_config, max_len)
  config_lib.validate(config)
  codec = t5_codec(local, hf, {"tokenizer": "t5", "from": name})
  try:
    params = params_from_state_dict(sd, fields, codec.target.order)
  except KeyError as e:
    raise TxfError(f"{local}/model.safetensors lacks {e}: give a directory written by "
                   f"T5ForConditionalGeneration.save_pretrained") from None
  rows = params["embed"]["embedding"].shape[0]
  if rows != codec.target.vocab_size:
    raise TxfError(f"{config_path}: vocab_size={codec.target.vocab_size} but the embedding table "
                   f"has {rows} rows")
  common.write_imported_run(workdir, config, codec, params, common.translation_task(config, codec))


def exports(config) -> bool:
  """Whether a run has T5's layout (one relative bias table per stack and unscaled attention):
  export-hf then writes a T5 model (or names what else stands in the way)."""
  m = config.model
  return m.positional == "relative" and bool(m.relative_shared) and m.attention == "dot_product"


def export_problems(config, codec: Optional[tok.Codec]) -> list:
  """What keeps a run from being a T5 model (empty when it can be exported)."""
  m, problems = config.model, []
  if m.family != "encoder_decoder":
    problems.append(f"model.family={m.family!r} (T5ForConditionalGeneration is an encoder-decoder)")
  if not m.pre_ln or m.norm != "rms_norm" or m.parallel_block:
    problems.append(f"model.pre_ln={m.pre_ln} / model.norm={m.norm!r} / model.parallel_block="
                    f"{m.parallel_block} (T5: pre-LN, rms_norm, sequential sublayers)")
  if m.use_bias or m.attention_bias or m.logits_bias or m.embed_scale:
    problems.append(f"model.use_bias={m.use_bias} / attention_bias={m.attention_bias} / "
                    f"logits_bias={m.logits_bias} / embed_scale={m.embed_scale} (T5: all False)")
  if not m.share_embeddings:
    problems.append("model.share_embeddings=False (T5 has one table for both stacks)")
  if (m.num_kv_heads or m.num_heads) != m.num_heads or m.qk_norm != "none":
    problems.append(f"model.num_kv_heads={m.num_kv_heads} / model.qk_norm={m.qk_norm!r} (T5: 0, none)")
  if m.activation not in FEED_FORWARD_PROJ or m.ffn_match_params:
    problems.append(f"model.activation={m.activation!r} / ffn_match_params={m.ffn_match_params} "
                    f"(T5: one of {sorted(FEED_FORWARD_PROJ)}, hidden size d_ff)")
  scale, rsqrt = float(m.logits_scale), m.d_model ** -0.5
  if scale not in (1.0, rsqrt) or (scale == rsqrt and not m.tie_output):
    problems.append(f"model.logits_scale={scale} with tie_output={m.tie_output} (T5: a tied head "
                    f"with d_model^-0.5 = {rsqrt}, or 1.0)")
  if m.decoder_start_id != 0 or m.forbid_pad:
    problems.append(f"model.decoder_start_id={m.decoder_start_id} / forbid_pad={m.forbid_pad} "
                    f"(T5 starts with its pad, id 0, and may generate it)")
  if (codec is None or not isinstance(codec.target, (tok.T5Tokenizer, tokjson_codec.JsonTokenizer))
      or codec.settings.get("tokenizer") != "t5"):
    kind = "none" if codec is None else codec.target.kind
    problems.append(f"its tokenizer ({kind}): export-hf writes the spiece.model of a T5 model "
                    f"imported with txf import-hf")
  return problems


def export_run(workdir: str, config, output: str, params_name: Optional[str],
               say: Callable[[str], None] = lambda line: None) -> str:
  """Write ``output`` (config.json, generation_config.json, model.safetensors, spiece.model,
  tokenizer_config.json) for ``T5ForConditionalGeneration.from_pretrained`` and
  ``T5Tokenizer.from_pretrained``; TxfError naming what cannot be exported."""
  codec = tok.load_codec(workdir_lib.path_of(workdir, workdir_lib.TOKENIZER_DIR))
  problems = export_problems(config, codec)
  if problems:
    raise TxfError(f"{workdir} cannot be exported as a T5 model: {'; '.join(problems)}")
  target = codec.target
  size, order, specials = target.vocab_size, target.order, target.specials
  m = config.model
  fields = m.to_dict()
  params = workdir_lib.load_params(workdir, params_name)
  sd = state_dict_from_params(params, fields, order, size)
  scaled = float(m.logits_scale) != 1.0
  hf = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": size,
        "d_model": m.d_model, "d_kv": m.head_dim or m.d_model // m.num_heads, "d_ff": m.d_ff,
        "num_layers": m.num_encoder_layers, "num_decoder_layers": m.num_decoder_layers,
        "num_heads": m.num_heads, "relative_attention_num_buckets": m.relative_buckets,
        "relative_attention_max_distance": m.relative_max_distance,
        "dropout_rate": m.dropout_rate, "layer_norm_epsilon": m.layer_norm_eps,
        "initializer_factor": 1.0, "feed_forward_proj": FEED_FORWARD_PROJ[m.activation],
        "is_encoder_decoder": True, "use_cache": True, "pad_token_id": specials["pad"],
        "eos_token_id": specials["eos"], "decoder_start_token_id": specials["pad"],
        # v1.0: tied head over d_model^-0.5 h; v1.1: no scale (transformers 5 reads the second)
        "tie_word_embeddings": scaled, "scale_decoder_outputs": scaled}
  generation = {"decoder_start_token_id": specials["pad"], "eos_token_id": specials["eos"],
                "pad_token_id": specials["pad"], "max_length": m.max_len,
                **common.generation_settings(DecodingSpec.from_config(config), say)}
  with common.staged_directory(output, ".export-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, "config.json"), hf)
    workdir_lib.write_json(os.path.join(tmp, "generation_config.json"), generation)
    common.safetensors_module().save_file(sd, os.path.join(tmp, "model.safetensors"),
                                    metadata={"format": "pt"})
    if isinstance(target, tokjson_codec.JsonTokenizer):  # imported from tokenizer.json: as read
      target.tokenizer.save(tmp)
      return output
    with open(os.path.join(tmp, SPM_FILE), "wb") as f:
      f.write(target.model_proto)
    workdir_lib.write_json(os.path.join(tmp, "tokenizer_config.json"), {
        "tokenizer_class": "T5Tokenizer", "extra_ids": int(codec.settings.get("extra_ids", 0)),
        "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "model_max_length": m.max_len,
        "clean_up_tokenization_spaces": bool(getattr(target, "clean_up", False))})
  return output
