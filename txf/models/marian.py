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
"""

from typing import Any, Dict, List

import numpy as np

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
  pad, start = get("pad_token_id"), get("decoder_start_token_id")
  if start != pad:
    problems.append(f"decoder_start_token_id={start} != pad_token_id={pad} (txf maps Marian's pad, "
                    f"its decoder start, to id 0)")
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
