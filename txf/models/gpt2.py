"""GPT-2 checkpoints (Hugging Face ``GPT2LMHeadModel``) <-> txf parameters: the config a GPT-2
model needs, and its weights renamed and reshaped both ways (numpy only; no torch).

GPT-2 is txf's ``decoder_lm`` with: learned positions (a table [n_positions, d] from position 0),
no embedding scale, pre-LN with the final LayerNorm ``ln_f`` (txf's ``final_norm``), biases on
every projection, GELU's tanh approximation (``gelu_new`` = txf ``gelu_tanh``), LayerNorm epsilon
``layer_norm_epsilon`` (1e-5) and a tied output. Its vocabulary has one special token,
``<|endoftext|>``; txf's has three more rows (PAD 0, BOS 1, UNK 3: txf.data.bpe.gpt2_order, whose
``order[txf_id] = hf_id`` permutes the tables both ways) whose logits the model masks
(``model.mask_special_logits``), and every decoder input starts with ``<|endoftext|>``
(``model.decoder_start_id`` = EOS 2), as Hugging Face's unconditional generation does.

GPT-2's ``Conv1D`` weights are already [in, out]:
  c_attn [d, 3d] = [W_q | W_k | W_v]: query/key/value [d, h, d_k] = the thirds reshaped;
  c_proj [d, d]: out [h, d_k, d];  mlp.c_fc [d, f] = ffn wi, mlp.c_proj [f, d] = ffn wo;
  ln_1 / ln_2 = norm_1 / norm_3 (txf's decoder layer without cross-attention), ln_f = final_norm.
"""

from typing import Any, Dict, List

import numpy as np

from txf.nn.layers import MASKED_IDS as EXTRA_IDS  # txf's rows with no GPT-2 token

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
               "relu": "relu"}
EXPORT_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}

# GPT2Config's defaults (transformers 5): save_pretrained may leave fields at these out of config.json.
GPT2_DEFAULTS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12,
                 "n_head": 12, "n_inner": None, "activation_function": "gelu_new",
                 "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
                 "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
                 "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
                 "add_cross_attention": False, "bos_token_id": 50256, "eos_token_id": 50256,
                 "tie_word_embeddings": True, "model_type": "gpt2"}


class UnsupportedGPT2Config(ValueError):
  """A GPT-2 config option txf cannot represent; the message names it."""


def with_defaults(hf: Dict[str, Any]) -> Dict[str, Any]:
  """A GPT-2 config.json (dict) over ``GPT2_DEFAULTS``: absent or null fields get the default
  (``n_inner`` null stays null: 4 n_embd)."""
  return {**GPT2_DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k == "n_inner"}}


def model_fields(hf: Dict[str, Any]) -> Dict[str, Any]:
  """``config.model`` fields of txf for a GPT-2 ``config.json`` (a dict, over ``GPT2_DEFAULTS``).

  Raises UnsupportedGPT2Config naming every option txf cannot represent.
  """
  problems: List[str] = []
  hf = with_defaults(hf)
  activation = ACTIVATIONS.get(str(hf["activation_function"]))
  if activation is None:
    problems.append(f"activation_function={hf['activation_function']!r} (txf has gelu_new, "
                    f"gelu_pytorch_tanh, gelu, relu)")
  for name, allowed in (("scale_attn_by_inverse_layer_idx", False), ("reorder_and_upcast_attn", False),
                        ("add_cross_attention", False), ("scale_attn_weights", True)):
    if bool(hf[name]) != allowed:
      problems.append(f"{name}={hf[name]} (txf: {allowed})")
  if hf["embd_pdrop"] != hf["resid_pdrop"]:
    problems.append(f"embd_pdrop={hf['embd_pdrop']} != resid_pdrop={hf['resid_pdrop']} (txf has one "
                    f"dropout rate for embeddings and sublayers)")
  if hf["bos_token_id"] != hf["eos_token_id"]:
    problems.append(f"bos_token_id={hf['bos_token_id']} != eos_token_id={hf['eos_token_id']} (txf "
                    f"maps GPT-2's <|endoftext|>, its BOS and EOS, to one id)")
  if not 0 <= int(hf["eos_token_id"]) < int(hf["vocab_size"]):
    problems.append(f"eos_token_id={hf['eos_token_id']} is not below vocab_size={hf['vocab_size']}")
  if hf["n_embd"] % hf["n_head"]:
    problems.append(f"n_embd={hf['n_embd']} is not a multiple of n_head={hf['n_head']}")
  if hf["model_type"] != "gpt2":
    problems.append(f"model_type={hf['model_type']!r} (this converter reads gpt2)")
  if problems:
    raise UnsupportedGPT2Config("; ".join(problems))
  d = int(hf["n_embd"])
  return {"family": "decoder_lm", "d_model": d, "num_heads": int(hf["n_head"]),
          "d_ff": int(hf["n_inner"] or 4 * d), "num_encoder_layers": 0,
          "num_decoder_layers": int(hf["n_layer"]), "dropout_rate": float(hf["resid_pdrop"]),
          "attention_dropout_rate": float(hf["attn_pdrop"]), "pre_ln": True,
          "tie_output": bool(hf["tie_word_embeddings"]), "positional": "learned",
          "max_len": int(hf["n_positions"]), "layer_norm_eps": float(hf["layer_norm_epsilon"]),
          "activation": activation, "embed_scale": False, "attention_bias": True,
          "use_bias": True, "logits_bias": False, "decoder_start_id": 2,
          "mask_special_logits": True}


def _strip(sd: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """The state dict without its ``transformer.`` prefix (GPT2LMHeadModel's; the Hub's gpt2 has
  none), float32."""
  return {(k[len("transformer."):] if k.startswith("transformer.") else k): np.asarray(v, np.float32)
          for k, v in sd.items()}


def _norm(sd, prefix):
  return {"scale": sd[f"{prefix}.weight"], "bias": sd[f"{prefix}.bias"]}


def params_from_state_dict(sd: Dict[str, np.ndarray], fields: Dict[str, Any],
                           order: np.ndarray) -> Dict[str, Any]:
  """txf parameters (nested dict of float32 numpy arrays) of a GPT-2 state dict.

  ``fields``: ``model_fields`` of its config; ``order`` int [V_txf]: the Hugging Face id of each
  txf id (``txf.data.bpe.gpt2_order``; ids >= V_hf are txf's extra rows, zeros here). Embedding
  rows (and an untied head's columns) are permuted: txf row t = Hugging Face row order[t].
  """
  sd = _strip(sd)
  d, h = fields["d_model"], fields["num_heads"]
  wte = sd["wte.weight"]
  hf_size = wte.shape[0]

  def rows(table):  # [V_hf, d] -> [V_txf, d], extra rows 0
    padded = np.concatenate([table, np.zeros((len(EXTRA_IDS), table.shape[1]), np.float32)])
    return padded[order]

  decoder: Dict[str, Any] = {"positions": {"pos_embedding": sd["wpe.weight"]}}
  for i in range(fields["num_decoder_layers"]):
    p = f"h.{i}"
    qkv, qkv_b = sd[f"{p}.attn.c_attn.weight"], sd[f"{p}.attn.c_attn.bias"]
    attention = {}
    for j, name in enumerate(("query", "key", "value")):
      attention[name] = qkv[:, j * d:(j + 1) * d].reshape(d, h, d // h)
      attention[f"{name}_bias"] = qkv_b[j * d:(j + 1) * d].reshape(h, d // h)
    attention["out"] = sd[f"{p}.attn.c_proj.weight"].reshape(h, d // h, d)
    attention["out_bias"] = sd[f"{p}.attn.c_proj.bias"]
    decoder[f"layer_{i}"] = {
        "norm_1": _norm(sd, f"{p}.ln_1"), "self_attention": attention,
        "norm_3": _norm(sd, f"{p}.ln_2"),
        "ffn": {"wi": sd[f"{p}.mlp.c_fc.weight"], "bi": sd[f"{p}.mlp.c_fc.bias"],
                "wo": sd[f"{p}.mlp.c_proj.weight"], "bo": sd[f"{p}.mlp.c_proj.bias"]}}
  decoder["final_norm"] = _norm(sd, "ln_f")
  if not fields["tie_output"]:
    if "lm_head.weight" not in sd:
      raise KeyError("tie_word_embeddings=False but the state dict has no lm_head.weight")
    decoder["logits_kernel"] = rows(sd["lm_head.weight"]).T
  if len(order) != hf_size + len(EXTRA_IDS):
    raise ValueError(f"order has {len(order)} ids for a {hf_size}-row wte (+{len(EXTRA_IDS)})")
  return {"embed": {"embedding": rows(wte)}, "decoder": decoder}


def state_dict_from_params(params: Dict[str, Any], fields: Dict[str, Any], order: np.ndarray,
                           vocab_size: int) -> Dict[str, np.ndarray]:
  """The GPT2LMHeadModel state dict (float32 numpy, Hugging Face names, each tied table once) of
  txf parameters: the inverse of ``params_from_state_dict``. ``vocab_size``: the txf vocabulary
  (rows beyond it, padding for tensor parallelism, are dropped); txf's extra rows are dropped.
  Missing biases (a txf model trained without them) are written as zeros."""
  hf_size = vocab_size - len(EXTRA_IDS)
  inverse = np.empty(len(order), np.int64)
  inverse[order] = np.arange(len(order))
  keep = inverse[:hf_size]  # the txf id of each Hugging Face id

  def hf_rows(table):
    return np.asarray(table, np.float32)[:vocab_size][keep]

  d = fields["d_model"]
  dec = params["decoder"]
  sd = {"transformer.wte.weight": hf_rows(params["embed"]["embedding"]),
        "transformer.wpe.weight": dec["positions"]["pos_embedding"]}
  zeros = lambda n: np.zeros(n, np.float32)
  for i in range(fields["num_decoder_layers"]):
    layer, p = dec[f"layer_{i}"], f"transformer.h.{i}"
    att = layer["self_attention"]
    sd[f"{p}.attn.c_attn.weight"] = np.concatenate(
        [np.asarray(att[n]).reshape(d, d) for n in ("query", "key", "value")], axis=1)
    sd[f"{p}.attn.c_attn.bias"] = np.concatenate(
        [np.asarray(att[f"{n}_bias"]).reshape(-1) if f"{n}_bias" in att else zeros(d)
         for n in ("query", "key", "value")])
    sd[f"{p}.attn.c_proj.weight"] = np.asarray(att["out"]).reshape(d, d)
    sd[f"{p}.attn.c_proj.bias"] = att.get("out_bias", zeros(d))
    ffn = layer["ffn"]
    sd[f"{p}.mlp.c_fc.weight"], sd[f"{p}.mlp.c_proj.weight"] = ffn["wi"], ffn["wo"]
    sd[f"{p}.mlp.c_fc.bias"] = ffn.get("bi", zeros(np.shape(ffn["wi"])[1]))
    sd[f"{p}.mlp.c_proj.bias"] = ffn.get("bo", zeros(d))
    for txf_name, hf_name in (("norm_1", "ln_1"), ("norm_3", "ln_2")):
      sd[f"{p}.{hf_name}.weight"] = layer[txf_name]["scale"]
      sd[f"{p}.{hf_name}.bias"] = layer[txf_name]["bias"]
  sd["transformer.ln_f.weight"] = dec["final_norm"]["scale"]
  sd["transformer.ln_f.bias"] = dec["final_norm"]["bias"]
  if not fields["tie_output"]:
    sd["lm_head.weight"] = hf_rows(np.asarray(dec["logits_kernel"]).T)
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in sd.items()}
