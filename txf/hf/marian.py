"""Marian (OPUS-MT) checkpoints <-> txf parameters: the config a Marian model needs, and its weights
renamed and reshaped both ways (numpy only; no torch).

A Hugging Face ``MarianMTModel`` is the paper's post-LN encoder-decoder with: biases on every
attention projection (``model.attention_bias``), an FFN activation (``model.activation``, swish for
OPUS-MT), sines-then-cosines positional encodings (``model.positional_layout = "sin_cos"``), a
final logits bias (``model.logits_bias``), LayerNorm epsilon 1e-5, and its own special ids (pad =
the last id = decoder start, EOS 0, no BOS). txf keeps PAD 0 / EOS 2 / UNK 3 inside: the vocabulary
is permuted by ``order`` (``order[txf_id] = marian_id``, txf.data.tokenizer.marian_order) on the
way in and back on the way out, so the two models compute the same function of the same text.

Torch ``nn.Linear`` weights are [out, in]; txf kernels are [in, out] split per head:
  query/key/value [d, h, d_k] = W^T reshaped;  out [h, d_k, d] = W_o^T reshaped;
  ffn wi [d, d_ff] = fc1^T, wo [d_ff, d] = fc2^T;  LayerNorm weight/bias = scale/bias.

Import and export (``txf import-hf`` / ``txf export-hf``, the ``marian`` entry of txf.hf's table):
import reads a ``save_pretrained`` directory (config.json, model.safetensors or pytorch_model.bin,
source.spm, target.spm, vocab.json) and writes a complete txf workdir that ``txf translate``, ``txf
eval``, ``txf train --config.init_from`` and ``txf.inference.load_run`` use like any trained run;
export writes the inverse, a directory ``MarianMTModel.from_pretrained`` and
``MarianTokenizer.from_pretrained`` load.

Decoding conventions of an imported run (its config.json): ``beam_size`` = the model's num_beams,
``length_penalty="power"`` with ``alpha=1.0`` and ``early_stopping=True``, i.e. Hugging Face's
``generate(num_beams=K, length_penalty=1.0, early_stopping=True)``: a finished hypothesis scores
log p(y) / |y| (|y| counts the generated tokens, EOS included, not the decoder start), a row
stops at K finished hypotheses. txf bounds each output by its source length + ``--max_extra``
tokens (HF: ``max_new_tokens``); the two agree on every output that ends with EOS before both.
"""

import json
import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from txf.core import config as config_lib
from txf.core.errors import TxfError
from txf.data import tokenizer as tok
from txf.data.base import BOS_ID, EOS_ID, PAD_ID
from txf.decode.spec import DecodingSpec
from txf.hf import common
from txf.runtime import workdir as workdir_lib

# the experiment whose data fields (Multi30k en-de) an imported Marian run gets by default
DEFAULT_DATA_CONFIG = "multi30k_en_de"
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")

# Marian's LayerNorm epsilon (torch.nn.LayerNorm's default, which MarianMTModel keeps).
MARIAN_LAYER_NORM_EPS = 1e-5
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}

_ATTENTION = {"query": "q_proj", "key": "k_proj", "value": "v_proj"}

# MarianConfig's defaults (transformers 5): save_pretrained leaves fields at these out of config.json.
MARIAN_DEFAULTS = {"vocab_size": 58101, "decoder_vocab_size": None, "max_position_embeddings": 1024,
                   "encoder_layers": 12, "encoder_ffn_dim": 4096, "encoder_attention_heads": 16,
                   "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
                   "activation_function": "gelu", "d_model": 1024, "dropout": 0.1,
                   "attention_dropout": 0.0, "activation_dropout": 0.0,
                   "decoder_start_token_id": 58100, "scale_embedding": False, "pad_token_id": 58100,
                   "eos_token_id": 0, "share_encoder_decoder_embeddings": True,
                   "tie_word_embeddings": True, "model_type": "marian"}


class UnsupportedMarianConfig(ValueError):
  """A Marian config option txf cannot represent; the message names it."""


def model_fields(hf: Dict[str, Any]) -> Dict[str, Any]:
  """``config.model`` fields of txf for a Marian ``config.json`` (a dict, over ``MARIAN_DEFAULTS``;
  ``bad_words_ids`` from generation_config.json may be merged in).

  Raises UnsupportedMarianConfig naming every option txf cannot represent.
  """
  problems: List[str] = []
  hf = {**MARIAN_DEFAULTS, **hf}
  get = lambda k, default=None: hf.get(k, default) if hf.get(k) is not None else default
  activation = ACTIVATIONS.get(str(get("activation_function")))
  if activation is None:
    problems.append(f"activation_function={get('activation_function')!r} (txf has relu, gelu, swish)")
  for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
               ("encoder_ffn_dim", "decoder_ffn_dim")):
    if get(a) != get(b):
      problems.append(f"{a}={get(a)} != {b}={get(b)} (txf uses one value for both stacks)")
  if get("normalize_before", False):
    problems.append("normalize_before=True (txf's pre_ln adds a final LayerNorm Marian has not)")
  if get("normalize_embedding", False) or get("layernorm_embedding", False):
    problems.append("normalize_embedding=True (a LayerNorm on the embeddings)")
  if get("static_position_embeddings", True) is False:
    problems.append("static_position_embeddings=False (learned positions)")
  if get("activation_dropout", 0.0):
    problems.append(f"activation_dropout={get('activation_dropout')} (txf has no dropout inside the FFN)")
  vocab, decoder_vocab = get("vocab_size"), get("decoder_vocab_size") or get("vocab_size")
  if decoder_vocab != vocab:
    problems.append(f"decoder_vocab_size={decoder_vocab} != vocab_size={vocab} (separate "
                    f"source/target vocabularies)")
  if get("model_type") != "marian":
    problems.append(f"model_type={get('model_type')!r} (txf imports marian models)")
  pad = get("pad_token_id")
  if problems:
    raise UnsupportedMarianConfig("; ".join(problems))
  return {"family": "encoder_decoder", "d_model": int(get("d_model")),
          "num_heads": int(get("encoder_attention_heads")), "d_ff": int(get("encoder_ffn_dim")),
          "num_encoder_layers": int(get("encoder_layers")),
          "num_decoder_layers": int(get("decoder_layers")),
          "dropout_rate": float(get("dropout")),
          "attention_dropout_rate": float(get("attention_dropout")),
          "pre_ln": False, "share_embeddings": bool(get("share_encoder_decoder_embeddings")),
          "tie_output": bool(get("tie_word_embeddings")), "positional": "sinusoidal",
          "max_len": int(get("max_position_embeddings")),
          "layer_norm_eps": MARIAN_LAYER_NORM_EPS, "activation": activation,
          "positional_layout": "sin_cos", "position_offset": 0,
          "embed_scale": bool(get("scale_embedding")), "attention_bias": True,
          "logits_bias": True, "decoder_start_id": 0,
          # generate() never produces pad when the model says so (OPUS-MT: bad_words_ids [[pad]])
          "forbid_pad": [pad] in (get("bad_words_ids") or [])}


def _attention_in(sd, prefix: str, h: int) -> Dict[str, np.ndarray]:
  d = sd[f"{prefix}.q_proj.weight"].shape[1]
  out = {}
  for name, hf_name in _ATTENTION.items():
    out[name] = sd[f"{prefix}.{hf_name}.weight"].T.reshape(d, h, d // h)
    out[f"{name}_bias"] = sd[f"{prefix}.{hf_name}.bias"].reshape(h, d // h)
  out["out"] = sd[f"{prefix}.out_proj.weight"].T.reshape(h, d // h, d)
  out["out_bias"] = sd[f"{prefix}.out_proj.bias"]
  return out


def _attention_out(p, prefix: str) -> Dict[str, np.ndarray]:
  h, dk, d = p["out"].shape
  out = {}
  for name, hf_name in _ATTENTION.items():
    out[f"{prefix}.{hf_name}.weight"] = p[name].reshape(d, h * dk).T
    bias = p.get(f"{name}_bias")
    out[f"{prefix}.{hf_name}.bias"] = np.zeros(h * dk, np.float32) if bias is None else bias.reshape(-1)
  out[f"{prefix}.out_proj.weight"] = p["out"].reshape(h * dk, d).T
  bias = p.get("out_bias")
  out[f"{prefix}.out_proj.bias"] = np.zeros(d, np.float32) if bias is None else bias
  return out


def _norm_in(sd, prefix):
  return {"scale": sd[f"{prefix}.weight"], "bias": sd[f"{prefix}.bias"]}


def _ffn_in(sd, prefix):
  return {"wi": sd[f"{prefix}.fc1.weight"].T, "bi": sd[f"{prefix}.fc1.bias"],
          "wo": sd[f"{prefix}.fc2.weight"].T, "bo": sd[f"{prefix}.fc2.bias"]}


def _embeddings(sd) -> Dict[str, np.ndarray]:
  """The encoder, decoder and output tables of a state dict (whichever names it stored)."""
  shared = sd.get("model.shared.weight")
  enc = sd.get("model.encoder.embed_tokens.weight", shared)
  dec = sd.get("model.decoder.embed_tokens.weight", shared)
  if enc is None or dec is None:
    raise KeyError("the state dict has no token embeddings (model.shared.weight or "
                   "model.{encoder,decoder}.embed_tokens.weight)")
  return {"encoder": enc, "decoder": dec, "lm_head": sd.get("lm_head.weight", dec)}


def params_from_state_dict(sd: Dict[str, np.ndarray], fields: Dict[str, Any],
                           order: np.ndarray) -> Dict[str, Any]:
  """txf parameters (nested dict of float32 numpy arrays) of a Marian state dict.

  ``fields``: ``model_fields`` of its config; ``order`` int [V]: the Marian id of each txf id.
  Embedding rows, the logits bias and output columns are permuted: txf row t = Marian row order[t].
  """
  sd = {k: np.asarray(v, np.float32) for k, v in sd.items()}
  h = fields["num_heads"]
  tables = _embeddings(sd)
  params: Dict[str, Any] = {}
  if fields["share_embeddings"]:
    params["embed"] = {"embedding": tables["decoder"][order]}
  else:
    params["source_embed"] = {"embedding": tables["encoder"][order]}
    params["target_embed"] = {"embedding": tables["decoder"][order]}
  encoder = {}
  for i in range(fields["num_encoder_layers"]):
    p = f"model.encoder.layers.{i}"
    encoder[f"layer_{i}"] = {"self_attention": _attention_in(sd, f"{p}.self_attn", h),
                             "norm_1": _norm_in(sd, f"{p}.self_attn_layer_norm"),
                             "ffn": _ffn_in(sd, p), "norm_2": _norm_in(sd, f"{p}.final_layer_norm")}
  decoder: Dict[str, Any] = {}
  for i in range(fields["num_decoder_layers"]):
    p = f"model.decoder.layers.{i}"
    decoder[f"layer_{i}"] = {"self_attention": _attention_in(sd, f"{p}.self_attn", h),
                             "norm_1": _norm_in(sd, f"{p}.self_attn_layer_norm"),
                             "cross_attention": _attention_in(sd, f"{p}.encoder_attn", h),
                             "norm_2": _norm_in(sd, f"{p}.encoder_attn_layer_norm"),
                             "ffn": _ffn_in(sd, p), "norm_3": _norm_in(sd, f"{p}.final_layer_norm")}
  if not fields["tie_output"]:
    decoder["logits_kernel"] = tables["lm_head"][order].T
  bias = sd.get("final_logits_bias")
  vocab = len(order)
  decoder["logits_bias"] = (np.zeros(vocab, np.float32) if bias is None
                            else bias.reshape(-1)[order])
  params["encoder"], params["decoder"] = encoder, decoder
  return params


def stored_once(sd: Dict[str, np.ndarray], fields: Dict[str, Any]) -> Dict[str, np.ndarray]:
  """The tensors of a Marian state dict as ``save_pretrained`` stores them: each tied table once.
  Shared embeddings are stored as ``model.shared.weight`` only (the encoder's and decoder's
  ``embed_tokens`` are tied to it on load); a tied output drops ``lm_head.weight`` (tied to the
  decoder's embedding on load)."""
  out = dict(sd)
  if fields["share_embeddings"]:
    out.pop("model.encoder.embed_tokens.weight", None)
    out.pop("model.decoder.embed_tokens.weight", None)
  if fields["tie_output"]:
    out.pop("lm_head.weight", None)
  return out


def state_dict_from_params(params: Dict[str, Any], fields: Dict[str, Any], order: np.ndarray,
                           vocab_size: int) -> Dict[str, np.ndarray]:
  """The Marian state dict (float32 numpy, Hugging Face names) of txf parameters: the inverse of
  ``params_from_state_dict``. Embedding rows beyond ``vocab_size`` (padding for tensor
  parallelism) are dropped; missing biases (txf models trained without them) are written as zeros.
  Tied tables are written under every name Hugging Face reads them from."""
  p = {k: v for k, v in params.items()}
  inverse = np.empty_like(order)
  inverse[order] = np.arange(len(order))

  def unpermute(rows):  # txf rows [>= V, ...] -> Marian rows [V, ...]
    return np.asarray(rows[:vocab_size], np.float32)[inverse]

  if fields["share_embeddings"]:
    enc = dec = unpermute(p["embed"]["embedding"])
  else:
    enc, dec = unpermute(p["source_embed"]["embedding"]), unpermute(p["target_embed"]["embedding"])
  sd: Dict[str, np.ndarray] = {"model.encoder.embed_tokens.weight": enc,
                               "model.decoder.embed_tokens.weight": dec}
  if fields["share_embeddings"]:
    sd["model.shared.weight"] = enc
  decoder = p["decoder"]
  sd["lm_head.weight"] = (dec if fields["tie_output"]
                          else unpermute(np.asarray(decoder["logits_kernel"]).T))
  bias = decoder.get("logits_bias")
  sd["final_logits_bias"] = (np.zeros((1, vocab_size), np.float32) if bias is None
                             else unpermute(np.asarray(bias))[None, :])
  for i in range(fields["num_encoder_layers"]):
    layer, pre = p["encoder"][f"layer_{i}"], f"model.encoder.layers.{i}"
    sd.update(_attention_out(layer["self_attention"], f"{pre}.self_attn"))
    sd.update(_layer_rest(layer, pre, {"norm_1": "self_attn_layer_norm", "norm_2": "final_layer_norm"}))
  for i in range(fields["num_decoder_layers"]):
    layer, pre = decoder[f"layer_{i}"], f"model.decoder.layers.{i}"
    sd.update(_attention_out(layer["self_attention"], f"{pre}.self_attn"))
    sd.update(_attention_out(layer["cross_attention"], f"{pre}.encoder_attn"))
    sd.update(_layer_rest(layer, pre, {"norm_1": "self_attn_layer_norm",
                                       "norm_2": "encoder_attn_layer_norm",
                                       "norm_3": "final_layer_norm"}))
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in sd.items()}


def _layer_rest(layer, pre: str, norms: Dict[str, str]) -> Dict[str, np.ndarray]:
  ffn = layer["ffn"]
  out = {f"{pre}.fc1.weight": np.asarray(ffn["wi"]).T, f"{pre}.fc1.bias": ffn["bi"],
         f"{pre}.fc2.weight": np.asarray(ffn["wo"]).T, f"{pre}.fc2.bias": ffn["bo"]}
  for txf_name, hf_name in norms.items():
    out[f"{pre}.{hf_name}.weight"] = layer[txf_name]["scale"]
    out[f"{pre}.{hf_name}.bias"] = layer[txf_name]["bias"]
  return out


def marian_codec(src: str, hf: Dict[str, Any], settings: Dict[str, Any]) -> tok.Codec:
  """The Codec of a Marian tokenizer directory: source.spm for sources, target.spm for targets,
  one vocab.json, special ids from the model config (pad, eos) and the vocabulary (``<unk>``)."""
  missing = [f for f in TOKENIZER_FILES if not os.path.isfile(os.path.join(src, f))]
  if missing:
    raise TxfError(f"{src} has no {', '.join(missing)}: txf imports Marian models with their "
                   f"SentencePiece tokenizer (source.spm, target.spm, vocab.json)")
  tconf_path = os.path.join(src, "tokenizer_config.json")
  tconf = common.read_json(tconf_path) if os.path.isfile(tconf_path) else {}
  if tconf.get("separate_vocabs"):
    raise TxfError(f"{tconf_path}: separate_vocabs=True (two vocabularies) is not supported")
  clean_up = bool(tconf.get("clean_up_tokenization_spaces", False))
  vocab = common.read_json(os.path.join(src, "vocab.json"))
  size = int(hf["vocab_size"])
  specials = {"pad": int(hf["pad_token_id"]), "eos": int(hf["eos_token_id"]),
              "unk": int(vocab.get("<unk>", 1))}
  protos = []
  for name in ("source.spm", "target.spm"):
    with open(os.path.join(src, name), "rb") as f:
      protos.append(f.read())
  # MarianTokenizer detokenizes targets with the source model when the vocabulary is shared
  source = tok.MarianTokenizer(protos[0], vocab, specials, size, clean_up=clean_up)
  target = tok.MarianTokenizer(protos[1], vocab, specials, size, decode_proto=protos[0],
                               clean_up=clean_up)
  return tok.Codec(source, target, {**settings, "tokenizer_file": " + ".join(TOKENIZER_FILES)})


def import_run(local: str, hf: Dict[str, Any], workdir: str, name: str, data_config: str,
               max_len: int) -> None:
  """Write the txf workdir of the Marian ``save_pretrained`` directory ``local`` (``hf``: its
  config.json) into ``workdir``: an ``encoder_decoder`` run whose data fields are those of the
  experiment ``data_config`` but for the tokenizer and lengths."""
  config_path = os.path.join(local, "config.json")
  hf = {**MARIAN_DEFAULTS, **hf}
  gen_path = os.path.join(local, "generation_config.json")
  if os.path.isfile(gen_path):  # generate()'s settings: beams, never-generated ids
    hf = {**hf, **{k: v for k, v in common.read_json(gen_path).items()
                   if k in ("num_beams", "bad_words_ids") and v is not None}}
  try:
    fields = model_fields(hf)
  except UnsupportedMarianConfig as e:
    raise TxfError(f"{config_path}: txf cannot represent {e}") from None
  config = common.import_config(hf, fields, name, data_config, max_len)
  config_lib.validate(config)
  codec = marian_codec(local, hf, {"tokenizer": "marian", "from": name})
  # the decoder starts with Marian's pad (txf 0), or another id (a txf-trained run's BOS): its txf id
  start = hf.get("decoder_start_token_id")
  if start is not None and start != hf["pad_token_id"]:
    if not 0 <= int(start) < len(codec.target.order):
      raise TxfError(f"{config_path}: decoder_start_token_id={start} is not below vocab_size="
                     f"{len(codec.target.order)}")
    fields["decoder_start_id"] = int(np.flatnonzero(codec.target.order == int(start))[0])
    config.model.decoder_start_id = fields["decoder_start_id"]
  params = params_from_state_dict(common.read_state_dict(local), fields, codec.target.order)
  common.write_imported_run(workdir, config, codec, params, common.translation_task(config, codec))


def exports(config) -> bool:
  """Marian is the export of last resort: every run the other architectures do not claim comes
  here, and ``export_run`` names what keeps it from being a Marian model."""
  del config
  return True


def export_run(workdir: str, config, output: str, params_name: Optional[str],
               say: Callable[[str], None]) -> None:
  """Write ``output`` (config.json, generation_config.json, model.safetensors, source.spm,
  target.spm, vocab.json, tokenizer_config.json) for ``MarianMTModel.from_pretrained`` and
  ``MarianTokenizer.from_pretrained``; TxfError naming what keeps the run from being Marian's."""
  codec = tok.load_codec(workdir_lib.path_of(workdir, workdir_lib.TOKENIZER_DIR))
  problems = export_problems(config, codec)
  if problems:
    raise TxfError(f"{workdir} cannot be exported as a Marian model: {'; '.join(problems)}")
  vocab, order, ids, protos = _vocab_and_specials(codec)
  size = codec.target.vocab_size
  m = config.model
  ids["start"] = int(order[m.decoder_start_id])  # the id the decoder starts with, Marian-numbered
  fields = m.to_dict()
  params = workdir_lib.load_params(workdir, params_name)
  sd = state_dict_from_params(params, fields, order, size)
  activation = {"swish": "swish", "relu": "relu", "gelu": "gelu"}[m.activation]
  hf = {"architectures": ["MarianMTModel"], "model_type": "marian", "vocab_size": size,
        "decoder_vocab_size": size, "d_model": m.d_model, "encoder_layers": m.num_encoder_layers,
        "decoder_layers": m.num_decoder_layers, "encoder_attention_heads": m.num_heads,
        "decoder_attention_heads": m.num_heads, "encoder_ffn_dim": m.d_ff, "decoder_ffn_dim": m.d_ff,
        "activation_function": activation, "dropout": m.dropout_rate,
        "attention_dropout": m.attention_dropout_rate, "activation_dropout": 0.0,
        "max_position_embeddings": m.max_len, "scale_embedding": bool(m.embed_scale),
        "share_encoder_decoder_embeddings": bool(m.share_embeddings),
        "tie_word_embeddings": bool(m.tie_output), "pad_token_id": ids["pad"],
        "eos_token_id": ids["eos"], "decoder_start_token_id": ids["start"],
        "forced_eos_token_id": ids["eos"], "is_encoder_decoder": True, "init_std": 0.02,
        "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "use_cache": True}
  generation = {"decoder_start_token_id": ids["start"], "eos_token_id": ids["eos"],
                "pad_token_id": ids["pad"], "forced_eos_token_id": ids["eos"],
                "max_length": m.max_len, **common.generation_settings(DecodingSpec.from_config(config), say)}
  if m.forbid_pad:
    generation["bad_words_ids"] = [[ids["pad"]]]
  with common.staged_directory(output, ".export-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, "config.json"), hf)
    workdir_lib.write_json(os.path.join(tmp, "generation_config.json"), generation)
    common.safetensors_module().save_file(stored_once(sd, fields), os.path.join(tmp, "model.safetensors"),
                             metadata={"format": "pt"})
    for name, proto in zip(("source.spm", "target.spm"), protos):
      with open(os.path.join(tmp, name), "wb") as f:
        f.write(proto)
    with open(os.path.join(tmp, "vocab.json"), "w") as f:
      json.dump(vocab, f, ensure_ascii=False, indent=1)
    workdir_lib.write_json(os.path.join(tmp, "tokenizer_config.json"), {
        "tokenizer_class": "MarianTokenizer", "source_lang": config.data.src_lang,
        "target_lang": config.data.tgt_lang, "separate_vocabs": False,
        "model_max_length": m.max_len, "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": "<pad>",
        "clean_up_tokenization_spaces": bool(getattr(codec.target, "clean_up", False))})
  return output


def export_problems(config, codec: Optional[tok.Codec]) -> list:
  """What keeps a run from being a Marian model (empty when it can be exported)."""
  m, problems = config.model, []
  if m.family != "encoder_decoder":
    problems.append(f"model.family={m.family!r} (Marian is a translation model; a decoder_lm "
                    f"exports as GPT-2 only when it starts from an imported GPT-2)")
  if m.positional != "sinusoidal" or m.positional_layout != "sin_cos" or m.position_offset:
    problems.append(f"positional encodings {m.positional}/{m.positional_layout}/offset "
                    f"{m.position_offset} (Marian: sinusoidal, sin_cos, offset 0)")
  if abs(m.layer_norm_eps - MARIAN_LAYER_NORM_EPS) > 1e-12:
    problems.append(f"model.layer_norm_eps={m.layer_norm_eps} (Marian: 1e-5)")
  if m.pre_ln:
    problems.append("model.pre_ln=True (Marian is post-LN)")
  if m.norm != "layer_norm" or m.attention != "scaled_dot_product":
    problems.append(f"model.norm={m.norm!r} / model.attention={m.attention!r} (Marian: "
                    f"layer_norm, scaled_dot_product)")
  if m.activation not in ("relu", "gelu", "swish"):
    problems.append(f"model.activation={m.activation!r} (Marian's FFN is dense: relu, gelu, swish)")
  if not m.use_bias or m.parallel_block:
    problems.append(f"model.use_bias={m.use_bias} / model.parallel_block={m.parallel_block} "
                    f"(Marian: FFN biases, sequential sublayers)")
  if (m.num_kv_heads or m.num_heads) != m.num_heads or m.qk_norm != "none":
    problems.append(f"model.num_kv_heads={m.num_kv_heads} / model.qk_norm={m.qk_norm!r} "
                    f"(Marian: as many key/value heads as query heads "
                    f"(0), no QK-norm)")
  if codec is None or not isinstance(codec.target, (tok.SentencePieceTokenizer, tok.MarianTokenizer)):
    kind = "none" if codec is None else codec.target.kind
    problems.append(f"its tokenizer ({kind}; Marian needs SentencePiece)")
  elif not isinstance(codec.target, tok.MarianTokenizer) and not codec.joint:
    problems.append("separate source/target vocabularies (export needs one vocab.json)")
  return problems


def _vocab_and_specials(codec: tok.Codec):
  """(vocab.json dict, order, special ids in the exported model's numbering, spm protos)."""
  if isinstance(codec.target, tok.MarianTokenizer):
    t = codec.target
    s = t.specials
    return (t.vocab, t.order, {"pad": s["pad"], "eos": s["eos"], "start": s["pad"]},
            (codec.source.model_proto, t.model_proto))
  sp = codec.target  # a txf SentencePiece model: Marian ids = txf ids, BOS starts the decoder
  proc = sp._sp
  vocab = {proc.id_to_piece(i): i for i in range(proc.get_piece_size())}
  order = np.arange(sp.vocab_size)
  return vocab, order, {"pad": PAD_ID, "eos": EOS_ID, "start": BOS_ID}, (sp.model_proto,) * 2
