"""Llama-architecture decoders (Hugging Face ``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
``MistralForCausalLM``) <-> txf: the ``llama``, ``qwen2`` and ``mistral`` entries of txf.hf's
``ARCHITECTURES`` (``txf import-hf`` / ``txf export-hf``).

The three are txf's ``decoder_lm`` with: pre-norm RMSNorm (``model.norm="rms_norm"``, eps
``rms_norm_eps``) and a final norm, no embedding scale, no position table, RoPE inside
self-attention in Hugging Face's half-split layout (``model.rope_layout="half"``: column i pairs
with column i + d_k/2, ``rotate_half``) with base ``rope_theta`` and the ``rope_scaling`` kinds
linear and llama3 (``model.rope_scaling``), a SwiGLU FFN of width ``intermediate_size``
(down(silu(gate(x)) * up(x)): txf's ``swiglu`` with W1 = gate, V = up, W2 = down), grouped-query
attention (``num_key_value_heads``: query head i reads key/value head i // (h / h_kv), as
``repeat_kv``), head width ``head_dim``, a tied or untied output head. Biases: Llama's
``attention_bias`` puts them on Q, K, V and O, ``mlp_bias`` on the three FFN matrices; Qwen2 always
has Q, K, V biases and no O bias (``model.attention_out_bias=False``). Mistral is Llama's layout;
its ``sliding_window`` is accepted when it is at least the context txf runs (``--max_len``), and
``model.max_len`` is then capped at the window, so that txf never attends beyond it.

Torch ``nn.Linear`` weights are [out, in]; txf kernels are [in, out] split per head:
  q_proj [h d_k, d] -> query [d, h, d_k];  k_proj, v_proj [h_kv d_k, d] -> key, value [d, h_kv, d_k];
  o_proj [d, h d_k] -> out [h, d_k, d];  gate_proj -> ffn wi, up_proj -> ffn wi_gate, down_proj -> wo;
  input_layernorm -> norm_1, post_attention_layernorm -> norm_3, model.norm -> final_norm.

Vocabulary: txf keeps PAD 0, BOS 1, EOS 2, UNK 3 inside; as for GPT-2 (txf.data.bpe.gpt2_order,
``order[txf_id] = hf_id``) the checkpoint's EOS becomes txf 2, txf 0, 1, 3 are rows of their own
whose logits the model masks (``model.mask_special_logits``), and every other id keeps its order
from txf 4 on. The checkpoint's BOS (when it has one) is an ordinary token for txf, and every txf
decoder input starts with it (``model.decoder_start_id``); without a BOS the decoder starts with
EOS as GPT-2's.

Tokenizer: ``read_tokenizer`` (tokenizer.json, read by txf: txf.hf.tokenizer_json). When
the checkpoint has no tokenizer txf can read, the weights are imported with txf.data.hf_ids's
stand-in (text is the model's ids in decimal: ``txf generate --prompt "1 15 7"`` continues those
ids and prints ids) and ``import_run`` says so in one ``txf: note:`` line.
"""

import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from txf.core import config as config_lib
from txf.core.errors import TxfError
from txf.data import bpe
from txf.data import tokenizer as tok
from txf.data.hf_ids import HFIdsTokenizer
from txf.data.tokjson_codec import JsonTokenizer
from txf.decode.spec import DecodingSpec
from txf.hf import common, tokenizer_json
from txf.nn.layers import MASKED_IDS as EXTRA_IDS  # txf's rows with no Hugging Face token
from txf.runtime import workdir as workdir_lib

MODEL_TYPES = ("llama", "qwen2", "mistral")
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
# the fields every config.json of these architectures may leave out, at transformers 5's defaults
DEFAULTS = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
            "max_position_embeddings": 2048, "rope_theta": 10000.0, "head_dim": None,
            "num_key_value_heads": None, "bos_token_id": None, "eos_token_id": None,
            "sliding_window": None, "use_sliding_window": None}
ROPE_KINDS = ("default", "linear", "llama3")


class UnsupportedLlamaConfig(ValueError):
  """A config option txf cannot represent; the message names it."""


def rope_settings(hf: Dict[str, Any]) -> Dict[str, Any]:
  """RoPE's base and scaling of a config.json: transformers 5's ``rope_parameters`` (rope_type,
  rope_theta, factor, ...) or the older ``rope_theta`` + ``rope_scaling`` (type or rope_type).
  Returns {"rope_type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
  "original_max_position_embeddings"} (absent ones None)."""
  params = dict(hf.get("rope_parameters") or {})
  scaling = dict(hf.get("rope_scaling") or {})
  merged = {**scaling, **params}
  kind = merged.get("rope_type") or merged.get("type") or "default"
  theta = merged.get("rope_theta", hf.get("rope_theta", DEFAULTS["rope_theta"]))
  out = {"rope_type": kind, "rope_theta": float(theta)}
  for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
    out[key] = merged.get(key)
  return out


def _first(value):
  """An id field that may be a list (Llama 3.1's several EOS): its first id; None stays None."""
  if isinstance(value, (list, tuple)):
    return int(value[0]) if value else None
  return None if value is None else int(value)


def model_fields(hf: Dict[str, Any], context: int) -> Dict[str, Any]:
  """``config.model`` fields of txf for a Llama / Qwen2 / Mistral ``config.json`` (a dict) run with
  a context of ``context`` tokens. Raises UnsupportedLlamaConfig naming every option txf cannot
  represent (another activation, a rope_scaling kind txf lacks, a sliding window below the
  context, no eos_token_id)."""
  model_type = hf.get("model_type")
  hf = {**DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
  problems: List[str] = []
  if model_type not in MODEL_TYPES:
    problems.append(f"model_type={model_type!r} (this converter reads {', '.join(MODEL_TYPES)})")
  if hf["hidden_act"] not in ("silu", "swish"):
    problems.append(f"hidden_act={hf['hidden_act']!r} (txf's gated FFN here is SwiGLU: silu)")
  d, h = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  kv = int(hf["num_key_value_heads"] or h)
  head_dim = int(hf["head_dim"] or d // h)
  if h % kv:
    problems.append(f"num_attention_heads={h} is not a multiple of num_key_value_heads={kv}")
  rope = rope_settings(hf)
  scaling = {"rope_scaling": "none"}
  if rope["rope_type"] == "linear":
    scaling = {"rope_scaling": "linear", "rope_scaling_factor": float(rope["factor"] or 1.0)}
  elif rope["rope_type"] == "llama3":
    scaling = {"rope_scaling": "llama3", "rope_scaling_factor": float(rope["factor"]),
               "rope_low_freq_factor": float(rope["low_freq_factor"]),
               "rope_high_freq_factor": float(rope["high_freq_factor"]),
               "rope_original_max_len": int(rope["original_max_position_embeddings"])}
  elif rope["rope_type"] != "default":
    problems.append(f"rope_scaling kind {rope['rope_type']!r} (txf has {', '.join(ROPE_KINDS)})")
  max_len = int(hf["max_position_embeddings"])
  window = hf["sliding_window"]
  windowed = window is not None and (model_type == "mistral" or hf["use_sliding_window"])
  if windowed:
    if int(window) < context:
      problems.append(f"sliding_window={window} is smaller than the context {context} (txf attends "
                      f"to every earlier token: import with --max_len {window} or less)")
    max_len = min(max_len, int(window))
  if _first(hf["eos_token_id"]) is None:
    problems.append("eos_token_id is missing (txf needs the model's end-of-sequence id)")
  if problems:
    raise UnsupportedLlamaConfig("; ".join(problems))
  qkv_bias = model_type == "qwen2" or bool(hf["attention_bias"])
  return {"family": "decoder_lm", "d_model": d, "num_heads": h,
          "head_dim": head_dim if head_dim * h != d else 0,
          "num_kv_heads": kv if kv != h else 0, "d_ff": int(hf["intermediate_size"]),
          "num_encoder_layers": 0, "num_decoder_layers": int(hf["num_hidden_layers"]),
          "dropout_rate": 0.0, "attention_dropout_rate": float(hf["attention_dropout"]),
          "pre_ln": True, "norm": "rms_norm", "layer_norm_eps": float(hf["rms_norm_eps"]),
          "tie_output": bool(hf["tie_word_embeddings"]), "positional": "rope",
          "rope_base": rope["rope_theta"], "rope_layout": "half", **scaling, "max_len": max_len,
          "activation": "swiglu", "ffn_match_params": False, "embed_scale": False,
          "attention_bias": qkv_bias,
          "attention_out_bias": model_type != "qwen2" and bool(hf["attention_bias"]),
          "use_bias": bool(hf["mlp_bias"]), "logits_bias": False, "mask_special_logits": True}


def vocab_order(hf_size: int, eos: int) -> np.ndarray:
  """``order[txf_id] = hf_id`` for a vocabulary of ``hf_size`` ids whose EOS is ``eos``
  (txf.data.bpe.gpt2_order: EOS at txf 2, txf's PAD/BOS/UNK rows past the Hugging Face ids)."""
  return bpe.gpt2_order(hf_size, eos)


def _linear_t(w):  # torch [out, in] -> [in, out]
  return np.asarray(w, np.float32).T


def params_from_state_dict(sd: Dict[str, np.ndarray], fields: Dict[str, Any],
                           order: np.ndarray) -> Dict[str, Any]:
  """txf parameters (nested dict of float32 numpy arrays) of a LlamaForCausalLM-layout state dict
  (``model.`` prefix optional); ``fields``: ``model_fields``; ``order`` int [V_hf + 3]
  (``vocab_order``). Embedding rows and an untied head's columns are permuted by ``order``."""
  sd = {(k[len("model."):] if k.startswith("model.") else k): np.asarray(v, np.float32)
        for k, v in sd.items()}
  d, h = fields["d_model"], fields["num_heads"]
  hk = fields["num_kv_heads"] or h
  dk = fields["head_dim"] or d // h
  wte = sd["embed_tokens.weight"]
  if len(order) != wte.shape[0] + len(EXTRA_IDS):
    raise ValueError(f"order has {len(order)} ids for a {wte.shape[0]}-row embedding (+3)")

  def rows(table):  # [V_hf, d] -> [V_txf, d], txf's extra rows 0
    return np.concatenate([table, np.zeros((len(EXTRA_IDS), table.shape[1]), np.float32)])[order]

  decoder: Dict[str, Any] = {}
  for i in range(fields["num_decoder_layers"]):
    p = f"layers.{i}"
    att = {"query": _linear_t(sd[f"{p}.self_attn.q_proj.weight"]).reshape(d, h, dk),
           "key": _linear_t(sd[f"{p}.self_attn.k_proj.weight"]).reshape(d, hk, dk),
           "value": _linear_t(sd[f"{p}.self_attn.v_proj.weight"]).reshape(d, hk, dk),
           "out": _linear_t(sd[f"{p}.self_attn.o_proj.weight"]).reshape(h, dk, d)}
    if fields["attention_bias"]:
      for name, proj, heads in (("query", "q_proj", h), ("key", "k_proj", hk), ("value", "v_proj", hk)):
        att[f"{name}_bias"] = sd[f"{p}.self_attn.{proj}.bias"].reshape(heads, dk)
      if fields["attention_out_bias"]:
        att["out_bias"] = sd[f"{p}.self_attn.o_proj.bias"]
    ffn = {"wi": _linear_t(sd[f"{p}.mlp.gate_proj.weight"]),
           "wi_gate": _linear_t(sd[f"{p}.mlp.up_proj.weight"]),
           "wo": _linear_t(sd[f"{p}.mlp.down_proj.weight"])}
    if fields["use_bias"]:
      ffn.update(bi=sd[f"{p}.mlp.gate_proj.bias"], bi_gate=sd[f"{p}.mlp.up_proj.bias"],
                 bo=sd[f"{p}.mlp.down_proj.bias"])
    decoder[f"layer_{i}"] = {"norm_1": {"scale": sd[f"{p}.input_layernorm.weight"]},
                             "self_attention": att,
                             "norm_3": {"scale": sd[f"{p}.post_attention_layernorm.weight"]},
                             "ffn": ffn}
  decoder["final_norm"] = {"scale": sd["norm.weight"]}
  if not fields["tie_output"]:
    if "lm_head.weight" not in sd:
      raise KeyError("lm_head.weight")
    decoder["logits_kernel"] = rows(sd["lm_head.weight"]).T
  return {"embed": {"embedding": rows(wte)}, "decoder": decoder}


def state_dict_from_params(params: Dict[str, Any], fields: Dict[str, Any], order: np.ndarray,
                           vocab_size: int) -> Dict[str, np.ndarray]:
  """The LlamaForCausalLM state dict (float32 numpy, Hugging Face names, a tied table once) of txf
  parameters: the inverse of ``params_from_state_dict``. ``vocab_size``: the txf vocabulary (rows
  past it, padding for tensor parallelism, and txf's extra rows are dropped)."""
  hf_size = vocab_size - len(EXTRA_IDS)
  inverse = np.empty(len(order), np.int64)
  inverse[order] = np.arange(len(order))
  keep = inverse[:hf_size]  # the txf id of each Hugging Face id

  def hf_rows(table):
    return np.asarray(table, np.float32)[:vocab_size][keep]

  d, h = fields["d_model"], fields["num_heads"]
  dk = fields["head_dim"] or d // h
  dec = params["decoder"]
  sd = {"model.embed_tokens.weight": hf_rows(params["embed"]["embedding"])}
  t = lambda w, rows_: np.asarray(w, np.float32).reshape(rows_, -1).T  # [in.., out..] -> [out, in]
  for i in range(fields["num_decoder_layers"]):
    layer, p = dec[f"layer_{i}"], f"model.layers.{i}"
    att, ffn = layer["self_attention"], layer["ffn"]
    for name, proj in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
      sd[f"{p}.self_attn.{proj}.weight"] = t(att[name], d)
      if fields["attention_bias"]:
        sd[f"{p}.self_attn.{proj}.bias"] = np.asarray(att[f"{name}_bias"]).reshape(-1)
    sd[f"{p}.self_attn.o_proj.weight"] = t(att["out"], h * dk)
    if fields["attention_bias"] and fields["attention_out_bias"]:
      sd[f"{p}.self_attn.o_proj.bias"] = att["out_bias"]
    for txf_name, proj in (("wi", "gate_proj"), ("wi_gate", "up_proj"), ("wo", "down_proj")):
      sd[f"{p}.mlp.{proj}.weight"] = np.asarray(ffn[txf_name]).T
    if fields["use_bias"]:
      for txf_name, proj in (("bi", "gate_proj"), ("bi_gate", "up_proj"), ("bo", "down_proj")):
        sd[f"{p}.mlp.{proj}.bias"] = ffn[txf_name]
    sd[f"{p}.input_layernorm.weight"] = layer["norm_1"]["scale"]
    sd[f"{p}.post_attention_layernorm.weight"] = layer["norm_3"]["scale"]
  sd["model.norm.weight"] = dec["final_norm"]["scale"]
  if not fields["tie_output"]:
    sd["lm_head.weight"] = hf_rows(np.asarray(dec["logits_kernel"]).T)
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in sd.items()}


# the experiment whose data fields (Tiny Shakespeare) an imported run gets by default
DEFAULT_DATA_CONFIG = "shakespeare_char"


def read_tokenizer(local: str, hf_size: int, eos: int) -> JsonTokenizer:
  """The tokenizer of the checkpoint folder ``local``: its tokenizer.json (and
  tokenizer_config.json), read by txf (``txf.hf.tokenizer_json``), as txf ids numbered by
  ``vocab_order(hf_size, eos)``: the checkpoint's EOS at txf 2, txf's PAD, BOS and UNK rows of their
  own after the checkpoint's ids. Its ``adds_bos`` says whether the tokenizer's own template puts
  the BOS first (``txf generate``'s text start); its ``save_hf(folder)`` writes the files back for
  the export. TxfError when there is no tokenizer.json or txf cannot read it."""
  path = os.path.join(local, tokenizer_json.TOKENIZER_FILE)
  if not os.path.isfile(path):
    raise TxfError(f"{local} has no {tokenizer_json.TOKENIZER_FILE}")
  return JsonTokenizer(tokenizer_json.read(local), hf_size, {"eos": eos}, extra_rows=True)


def _codec(local: str, name: str, hf_size: int, eos: int, say: Callable[[str], None]) -> tok.Codec:
  """The txf codec of the checkpoint's tokenizer (``read_tokenizer``); without one it can read,
  txf.data.hf_ids's stand-in (text = Hugging Face ids in decimal), and ``say`` hears why."""
  try:
    tokenizer = read_tokenizer(local, hf_size, eos)
    used = tokenizer_json.TOKENIZER_FILE
  except TxfError as e:
    say(f"txf: note: imported the weights without a tokenizer ({e}): the workdir reads and writes "
        f"token ids as text, e.g. txf generate --prompt \"15 7 42\"")
    tokenizer, used = HFIdsTokenizer(hf_size, eos), "none (token ids as text)"
  return tok.Codec(tokenizer, tokenizer, {"tokenizer": tokenizer.kind, "from": name,
                                          "tokenizer_file": used})


def import_config(fields: Dict[str, Any], vocab_size: int, name: str, data_config: str,
                  context: int, num_beams: int):
  """The txf run config of an imported Llama-architecture model: ``fields``, the data fields of
  the experiment ``data_config`` but for the tokenizer and the context (``data.max_target_len``),
  no label smoothing (the masked ids get no mass), beam search as generate's."""
  c = common.imported_config(name, data_config, fields)
  c.data.tokenizer, c.data.vocab_size, c.data.joint_vocab = "sentencepiece", vocab_size, True
  c.data.max_input_len, c.data.max_target_len = 0, context
  c.optimizer.label_smoothing = 0.0
  c.decode_examples = 0
  c.beam_size = num_beams
  c.alpha, c.length_penalty, c.early_stopping = 1.0, "power", True
  return c


def import_run(local: str, hf: Dict[str, Any], workdir: str, name: str, data_config: str,
               max_len: int, say: Callable[[str], None] = common.note) -> None:
  """Write the txf workdir of the Llama / Qwen2 / Mistral save_pretrained directory ``local``
  (``hf``: its config.json) into ``workdir``; TxfError naming any option txf cannot represent."""
  context = min(int(max_len), int(hf.get("max_position_embeddings") or DEFAULTS["max_position_embeddings"]))
  try:
    fields = model_fields(hf, context)
  except UnsupportedLlamaConfig as e:
    raise TxfError(f"{os.path.join(local, 'config.json')}: txf cannot represent {e}") from None
  sd = common.read_state_dict(local)
  key = next((k for k in ("model.embed_tokens.weight", "embed_tokens.weight") if k in sd), None)
  if key is None:
    raise TxfError(f"{local}: the weights have no model.embed_tokens.weight (is it a "
                   f"{CLASSES.get(hf.get('model_type'), 'LlamaForCausalLM')}?)")
  hf_size = int(sd[key].shape[0])
  eos, bos = _first(hf.get("eos_token_id")), _first(hf.get("bos_token_id"))
  if not 0 <= eos < hf_size or (bos is not None and not 0 <= bos < hf_size):
    raise TxfError(f"{local}: eos_token_id={eos} / bos_token_id={bos} are not below the "
                   f"vocabulary size {hf_size}")
  order = vocab_order(hf_size, eos)
  txf_of = np.empty(len(order), np.int64)
  txf_of[order] = np.arange(len(order))
  fields["decoder_start_id"] = int(txf_of[bos]) if bos is not None else 2
  codec = _codec(local, name, hf_size, eos, say)
  gen_path = os.path.join(local, "generation_config.json")
  num_beams = int((common.read_json(gen_path) if os.path.isfile(gen_path) else {}).get("num_beams") or 1)
  size = len(order)
  config = import_config(fields, size, name, data_config, min(context, fields["max_len"]), num_beams)
  config_lib.validate(config)
  try:
    params = params_from_state_dict(sd, fields, order)
  except KeyError as e:
    raise TxfError(f"{local}: the weights have no {e} (is it a "
                   f"{CLASSES[hf['model_type']]}?)") from None
  del sd  # the checkpoint's arrays: freed before params.msgpack is serialised (peak memory)
  common.write_imported_run(workdir, config, codec, params, {
      "family": "decoder_lm", "vocab_size": size, "target_vocab_size": size, "num_classes": 0,
      "max_input_len": 0, "max_target_len": config.data.max_target_len,
      "hf_vocab": {"model_type": hf["model_type"]}})


def exports(config) -> bool:
  """Whether ``export-hf`` takes a run as a Llama-architecture model: a decoder_lm with RoPE in
  the half layout and RMSNorm, i.e. started from an import of this module."""
  m = config.model
  return (m.family == "decoder_lm" and m.positional == "rope" and m.rope_layout == "half"
          and m.norm == "rms_norm")


def export_problems(config) -> list:
  """What keeps such a decoder_lm run from being a Llama / Qwen2 model (empty when it exports)."""
  m, problems = config.model, []
  if not m.pre_ln or m.parallel_block or m.qk_norm != "none":
    problems.append(f"model.pre_ln={m.pre_ln} / parallel_block={m.parallel_block} / qk_norm="
                    f"{m.qk_norm!r} (Llama: pre-norm, sequential, no QK-norm)")
  if m.activation != "swiglu" or m.ffn_match_params:
    problems.append(f"model.activation={m.activation!r} / ffn_match_params={m.ffn_match_params} "
                    f"(Llama: swiglu at d_ff)")
  if m.embed_scale or m.logits_bias or m.logits_scale != 1.0 or m.attention != "scaled_dot_product":
    problems.append(f"model.embed_scale={m.embed_scale} / logits_bias={m.logits_bias} / "
                    f"logits_scale={m.logits_scale} / attention={m.attention!r} (Llama: none of "
                    f"them, scaled_dot_product)")
  if not m.mask_special_logits:
    problems.append("model.mask_special_logits=False (an imported model's vocabulary has txf's "
                    "three extra rows: start from an import with config.init_from)")
  return problems


def _vocabulary(workdir: str, config, codec) -> Dict[str, Any]:
  """The Hugging Face vocabulary of a run: {"size", "eos", "bos", "model_type"} from its tokenizer
  (attributes hf_size and eos: txf.data.hf_ids's, or a tokenizer.json one) and task.json's
  ``hf_vocab`` (the model type an import came from)."""
  task = workdir_lib.read_task_json(workdir) or {}
  known = {"model_type": (task.get("hf_vocab") or {}).get("model_type", "llama")}
  target = None if codec is None else codec.target
  if not (hasattr(target, "hf_size") and hasattr(target, "eos")):
    kind = "none" if target is None else target.kind
    raise TxfError(f"{workdir} cannot be exported as a Llama model: its tokenizer ({kind}) does "
                   f"not say which Hugging Face ids its rows are (start from an import with "
                   f"config.init_from)")
  known.update(size=int(target.hf_size), eos=int(target.eos))
  order = vocab_order(known["size"], known["eos"])
  start = int(config.model.decoder_start_id)
  known["bos"] = int(order[start]) if start != 2 else None
  return known


def export_run(workdir: str, config, output: str, params_name: Optional[str],
               say: Callable[[str], None]) -> None:
  """Write ``output`` (config.json, generation_config.json, model.safetensors, and the tokenizer
  when the run has one that can write itself) for LlamaForCausalLM / Qwen2ForCausalLM."""
  problems = export_problems(config)
  if problems:
    raise TxfError(f"{workdir} cannot be exported as a Llama model: {'; '.join(problems)}")
  codec = tok.load_codec(workdir_lib.path_of(workdir, workdir_lib.TOKENIZER_DIR))
  vocab = _vocabulary(workdir, config, codec)
  m = config.model
  fields = m.to_dict()
  order = vocab_order(vocab["size"], vocab["eos"])
  params = workdir_lib.load_params(workdir, params_name)
  sd = state_dict_from_params(params, fields, order, len(order))
  qwen = bool(m.attention_bias) and not m.attention_out_bias
  model_type = "qwen2" if qwen else vocab.get("model_type", "llama")
  if model_type == "qwen2" and not qwen:
    model_type = "llama"  # a Qwen2 without its Q/K/V biases is a Llama
  rope = {"rope_type": "default", "rope_theta": float(m.rope_base)}
  if m.rope_scaling == "linear":
    rope.update(rope_type="linear", factor=float(m.rope_scaling_factor))
  elif m.rope_scaling == "llama3":
    rope.update(rope_type="llama3", factor=float(m.rope_scaling_factor),
                low_freq_factor=float(m.rope_low_freq_factor),
                high_freq_factor=float(m.rope_high_freq_factor),
                original_max_position_embeddings=int(m.rope_original_max_len))
  dk = m.head_dim or m.d_model // m.num_heads
  hf = {"architectures": [CLASSES[model_type]], "model_type": model_type,
        "vocab_size": vocab["size"], "hidden_size": m.d_model, "intermediate_size": m.d_ff,
        "num_hidden_layers": m.num_decoder_layers, "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.num_kv_heads or m.num_heads, "head_dim": dk,
        "hidden_act": "silu", "max_position_embeddings": m.max_len,
        "rms_norm_eps": m.layer_norm_eps, "rope_parameters": rope,
        "tie_word_embeddings": bool(m.tie_output), "attention_dropout": m.attention_dropout_rate,
        "bos_token_id": vocab.get("bos"), "eos_token_id": vocab["eos"], "use_cache": True,
        "initializer_range": 0.02}
  if model_type != "qwen2":
    hf.update(attention_bias=bool(m.attention_bias), mlp_bias=bool(m.use_bias))
  elif m.use_bias:
    raise TxfError(f"{workdir} cannot be exported as a Qwen2 model: model.use_bias=True (Qwen2's "
                   f"FFN has no biases)")
  if model_type == "mistral":
    hf["sliding_window"] = None
  generation = {"bos_token_id": vocab.get("bos"), "eos_token_id": vocab["eos"],
                **common.generation_settings(DecodingSpec.from_config(config), say)}
  writer = getattr(None if codec is None else codec.target, "save_hf", None)
  with common.staged_directory(output, ".export-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, "config.json"), hf)
    workdir_lib.write_json(os.path.join(tmp, "generation_config.json"), generation)
    common.safetensors_module().save_file(sd, os.path.join(tmp, "model.safetensors"),
                                          metadata={"format": "pt"})
    if writer is not None:  # a tokenizer.json tokenizer writes its own files
      writer(tmp)
  if writer is None:
    say("txf: note: the run has no tokenizer that writes tokenizer.json: exported the model "
        "alone")
