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

Hugging Face GPT-2 (``GPT2LMHeadModel``) in and out of txf: the ``gpt2`` entry of
txf.hf's ``ARCHITECTURES`` (``txf import-hf`` / ``txf export-hf``).

Import reads a ``save_pretrained`` directory (config.json, model.safetensors or pytorch_model.bin,
tokenizer.json or vocab.json + merges.txt, tokenizer_config.json) and writes a txf workdir of
family ``decoder_lm`` (txf.data.bpe: the
tokenizer, through the ``tokenizers`` library). ``txf generate``, ``txf eval``, ``txf train
--config.init_from``, ``txf average-checkpoints`` and ``txf plan`` use it like a trained run.

Generation: every txf decoder input starts with ``<|endoftext|>``, so ``txf generate --prompt P``
continues the ids <|endoftext|> + tokens(P), what Hugging Face's
``generate(input_ids=[eos] + tokens(P))`` continues (an empty prompt: ``[eos]``, generate's own
unconditional start). Beam search (``txf.decode.translate_ids`` from the start alone) scores as
the Marian import: ``length_penalty="power"``, alpha 1, early stopping = ``generate(num_beams=K,
length_penalty=1.0, early_stopping=True)``, |y| counting the generated tokens (EOS included).

Export rule (``exports``): a run is GPT-2's when it is a ``decoder_lm`` with
``model.mask_special_logits`` (set by this import only, so: an imported GPT-2, fine-tuned or not);
``export_run`` then checks the rest (a field changed since) and names what stands in the way. txf's
own language models (sinusoidal positions, post-LN, a character tokenizer) are not claimed: they
fall to the Marian export, which refuses them naming their family.
"""

import json
import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from txf.core import config as config_lib
from txf.core.errors import TxfError
from txf.data import bpe
from txf.data import tokenizer as tok
from txf.data.base import EOS_ID
from txf.decode.spec import DecodingSpec
from txf.hf import common
from txf.nn.layers import MASKED_IDS as EXTRA_IDS  # txf's rows with no GPT-2 token
from txf.runtime import workdir as workdir_lib

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


# the experiment whose data fields (Tiny Shakespeare) an imported GPT-2 run gets by default
DEFAULT_DATA_CONFIG = "shakespeare_char"
EOS_TOKEN = "<|endoftext|>"


def _codec(local: str, hf: Dict[str, Any], source: str) -> tok.Codec:
  """The txf codec of a GPT-2 directory's tokenizer files (TxfError when they are missing or do
  not fit the model)."""
  conf_path = os.path.join(local, "tokenizer_config.json")
  conf = common.read_json(conf_path) if os.path.isfile(conf_path) else {}
  eos_token = conf.get("eos_token") or EOS_TOKEN
  if isinstance(eos_token, dict):  # an AddedToken as transformers serialises it
    eos_token = eos_token.get("content", EOS_TOKEN)
  try:
    tokenizer = bpe.tokenizer_from_files(local, eos_token, bool(conf.get("add_prefix_space", False)))
  except TxfError as e:  # no files, or files txf cannot read
    raise TxfError(f"{local}: cannot read GPT-2's tokenizer: {e}") from None
  hf = with_defaults(hf)
  size, eos = int(hf["vocab_size"]), int(hf["eos_token_id"])
  if tokenizer.vocab_size > size:
    raise TxfError(f"{local}: the tokenizer has {tokenizer.vocab_size} tokens, the model's "
                   f"vocab_size is {size}: give the tokenizer saved with this model")
  if tokenizer.token_to_id.get(eos_token) != eos:
    raise TxfError(f"{local}: the tokenizer's {eos_token} is id "
                   f"{tokenizer.token_to_id.get(eos_token)}, config.json's eos_token_id is {eos}: "
                   f"give the tokenizer saved with this model")
  target = bpe.GPT2Tokenizer(tokenizer.text, size, eos,
                             bool(conf.get("clean_up_tokenization_spaces", False)))
  used = (bpe.TOKENIZER_FILE if os.path.isfile(os.path.join(local, bpe.TOKENIZER_FILE))
          else "vocab.json + merges.txt")
  return tok.Codec(target, target, {"tokenizer": "gpt2", "from": source, "tokenizer_file": used})


def import_config(fields: Dict[str, Any], vocab_size: int, name: str, data_config: str,
                  max_len: int, num_beams: int):
  """The txf run config of an imported GPT-2: ``fields`` (``model_fields``), data fields of
  the experiment ``data_config`` ("" = base_config's) but for the tokenizer and the context
  (``data.max_target_len`` = min(max_len, n_positions)), no label smoothing (the masked ids get no
  mass), beam search as generate's (power penalty, alpha 1, early stopping)."""
  c = common.imported_config(name, data_config, fields)
  # the real-data pipeline reads a saved tokenizer under "sentencepiece" (codec kind gpt2 decides)
  c.data.tokenizer, c.data.vocab_size, c.data.joint_vocab = "sentencepiece", vocab_size, True
  c.data.max_input_len, c.data.max_target_len = 0, min(max_len, fields["max_len"])
  c.optimizer.label_smoothing = 0.0
  c.decode_examples = 0
  c.beam_size = num_beams
  c.alpha, c.length_penalty, c.early_stopping = 1.0, "power", True
  return c


def import_run(local: str, hf: Dict[str, Any], workdir: str, name: str, data_config: str,
               max_len: int) -> None:
  """Write the txf workdir of the GPT-2 save_pretrained directory ``local`` (``hf``: its
  config.json) into ``workdir``; TxfError naming any option txf cannot represent."""
  try:
    fields = model_fields(hf)
  except UnsupportedGPT2Config as e:
    raise TxfError(f"{os.path.join(local, 'config.json')}: txf cannot represent {e}") from None
  codec = _codec(local, hf, name)
  gen_path = os.path.join(local, "generation_config.json")
  num_beams = int((common.read_json(gen_path) if os.path.isfile(gen_path) else {}).get("num_beams") or 1)
  config = import_config(fields, codec.target.vocab_size, name, data_config, max_len, num_beams)
  config_lib.validate(config)
  try:
    params = params_from_state_dict(common.read_state_dict(local), fields, codec.target.order)
  except KeyError as e:
    raise TxfError(f"{local}: the weights have no {e} (is it a GPT2LMHeadModel?)") from None
  size = codec.target.vocab_size
  common.write_imported_run(workdir, config, codec, params, {
      "family": "decoder_lm", "vocab_size": size, "target_vocab_size": size, "num_classes": 0,
      "max_input_len": 0, "max_target_len": config.data.max_target_len})


def exports(config) -> bool:
  """Whether ``export-hf`` takes a run as GPT-2: a decoder_lm with ``model.mask_special_logits``,
  i.e. started from an imported GPT-2 (see the module docstring)."""
  return config.model.family == "decoder_lm" and bool(config.model.mask_special_logits)


def export_problems(config, codec: Optional[tok.Codec]) -> list:
  """What keeps a decoder_lm run from being a GPT-2 model (empty when it can be exported)."""
  m, problems = config.model, []
  if m.positional != "learned":
    problems.append(f"model.positional={m.positional!r} (GPT-2: learned)")
  if not m.pre_ln or m.norm != "layer_norm" or m.parallel_block:
    problems.append(f"model.pre_ln={m.pre_ln} / model.norm={m.norm!r} / model.parallel_block="
                    f"{m.parallel_block} (GPT-2: pre-LN, layer_norm, sequential sublayers)")
  if m.activation not in EXPORT_ACTIVATIONS:
    problems.append(f"model.activation={m.activation!r} (GPT-2: gelu_tanh, gelu, relu)")
  if m.embed_scale or m.logits_bias or m.attention != "scaled_dot_product":
    problems.append(f"model.embed_scale={m.embed_scale} / model.logits_bias={m.logits_bias} / "
                    f"model.attention={m.attention!r} (GPT-2: no scale, no logits bias, "
                    f"scaled_dot_product)")
  if (m.num_kv_heads or m.num_heads) != m.num_heads or m.qk_norm != "none":
    problems.append(f"model.num_kv_heads={m.num_kv_heads} / model.qk_norm={m.qk_norm!r} (GPT-2: 0, none)")
  if not m.mask_special_logits or m.decoder_start_id != EOS_ID:
    problems.append(f"model.mask_special_logits={m.mask_special_logits} / "
                    f"model.decoder_start_id={m.decoder_start_id} (GPT-2: True, {EOS_ID})")
  if codec is None or not isinstance(codec.target, bpe.GPT2Tokenizer):
    kind = "none" if codec is None else codec.target.kind
    problems.append(f"its tokenizer ({kind}; GPT-2 needs the byte-level BPE of an imported GPT-2: "
                    f"start from one with config.init_from)")
  return problems


def export_run(workdir: str, config, output: str, params_name: Optional[str],
               say: Callable[[str], None]) -> None:
  """Write ``output`` (config.json, generation_config.json, model.safetensors, tokenizer.json,
  vocab.json, merges.txt, tokenizer_config.json) for GPT2LMHeadModel / GPT2TokenizerFast."""
  codec = tok.load_codec(workdir_lib.path_of(workdir, workdir_lib.TOKENIZER_DIR))
  problems = export_problems(config, codec)
  if problems:
    raise TxfError(f"{workdir} cannot be exported as a GPT-2 model: {'; '.join(problems)}")
  target: bpe.GPT2Tokenizer = codec.target
  m = config.model
  fields = m.to_dict()
  params = workdir_lib.load_params(workdir, params_name)
  sd = state_dict_from_params(params, fields, target.order, target.vocab_size)
  vocab, merges = target.vocab_and_merges()
  eos_token = next((t for t, i in vocab.items() if i == target.eos), EOS_TOKEN)
  hf = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": target.hf_size,
        "n_positions": m.max_len, "n_embd": m.d_model, "n_layer": m.num_decoder_layers,
        "n_head": m.num_heads, "n_inner": m.d_ff,
        "activation_function": EXPORT_ACTIVATIONS[m.activation],
        "resid_pdrop": m.dropout_rate, "embd_pdrop": m.dropout_rate,
        "attn_pdrop": m.attention_dropout_rate, "layer_norm_epsilon": m.layer_norm_eps,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "add_cross_attention": False,
        "bos_token_id": target.eos, "eos_token_id": target.eos,
        "tie_word_embeddings": bool(m.tie_output), "initializer_range": 0.02, "use_cache": True}
  generation = {"bos_token_id": target.eos, "eos_token_id": target.eos,
                **common.generation_settings(DecodingSpec.from_config(config), say)}
  pre = json.loads(target.serialized).get("pre_tokenizer") or {}
  with common.staged_directory(output, ".export-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, "config.json"), hf)
    workdir_lib.write_json(os.path.join(tmp, "generation_config.json"), generation)
    common.safetensors_module().save_file(sd, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, bpe.TOKENIZER_FILE), "w") as f:
      f.write(target.serialized)
    with open(os.path.join(tmp, "vocab.json"), "w") as f:
      json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(tmp, "merges.txt"), "w") as f:
      f.write("#version: 0.2\n" + "".join(line + "\n" for line in merges))
    workdir_lib.write_json(os.path.join(tmp, "tokenizer_config.json"), {
        "tokenizer_class": "GPT2Tokenizer", "bos_token": eos_token, "eos_token": eos_token,
        "unk_token": eos_token, "add_prefix_space": bool(pre.get("add_prefix_space", False)),
        "model_max_length": m.max_len, "clean_up_tokenization_spaces": target.clean_up})
