"""Hugging Face GPT-2 (``GPT2LMHeadModel``) in and out of txf: the ``gpt2`` entry of
txf.inference.hf's ``ARCHITECTURES`` (``txf import-hf`` / ``txf export-hf``).

Import reads a ``save_pretrained`` directory (config.json, model.safetensors or pytorch_model.bin,
tokenizer.json or vocab.json + merges.txt, tokenizer_config.json) and writes a txf workdir of
family ``decoder_lm`` (txf.models.gpt2: the architecture and weights; txf.data.bpe: the
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
from typing import Any, Callable, Dict, Optional

from txf import config as config_lib
from txf import workdir as workdir_lib
from txf.data import bpe
from txf.data import tokenizer as tok
from txf.data.base import EOS_ID
from txf.decode.spec import DecodingSpec
from txf.errors import TxfError
from txf.inference.hf import (_read_json, _safetensors, generation_settings, imported_config,
                              read_state_dict, staged_directory, write_imported_run)
from txf.models import gpt2

# the experiment whose data fields (Tiny Shakespeare) an imported GPT-2 run gets by default
DEFAULT_DATA_CONFIG = "shakespeare_char"
EOS_TOKEN = "<|endoftext|>"


def _codec(local: str, hf: Dict[str, Any], source: str) -> tok.Codec:
  """The txf codec of a GPT-2 directory's tokenizer files (TxfError when they are missing or do
  not fit the model)."""
  conf_path = os.path.join(local, "tokenizer_config.json")
  conf = _read_json(conf_path) if os.path.isfile(conf_path) else {}
  eos_token = conf.get("eos_token") or EOS_TOKEN
  if isinstance(eos_token, dict):  # an AddedToken as transformers serialises it
    eos_token = eos_token.get("content", EOS_TOKEN)
  try:
    tokenizer = bpe.tokenizer_from_files(local, eos_token, bool(conf.get("add_prefix_space", False)))
  except Exception as e:  # DataError (no files) or the tokenizers library refusing them
    raise TxfError(f"{local}: cannot read GPT-2's tokenizer: {e}") from None
  hf = gpt2.with_defaults(hf)
  size, eos = int(hf["vocab_size"]), int(hf["eos_token_id"])
  if tokenizer.get_vocab_size() > size:
    raise TxfError(f"{local}: the tokenizer has {tokenizer.get_vocab_size()} tokens, the model's "
                   f"vocab_size is {size}: give the tokenizer saved with this model")
  if tokenizer.token_to_id(eos_token) != eos:
    raise TxfError(f"{local}: the tokenizer's {eos_token} is id {tokenizer.token_to_id(eos_token)}, "
                   f"config.json's eos_token_id is {eos}: give the tokenizer saved with this model")
  target = bpe.GPT2Tokenizer(tokenizer.to_str(), size, eos,
                             bool(conf.get("clean_up_tokenization_spaces", False)))
  return tok.Codec(target, target, {"tokenizer": "gpt2", "from": source})


def import_config(fields: Dict[str, Any], vocab_size: int, name: str, data_config: str,
                  max_len: int, num_beams: int):
  """The txf run config of an imported GPT-2: ``fields`` (``gpt2.model_fields``), data fields of
  the experiment ``data_config`` ("" = base_config's) but for the tokenizer and the context
  (``data.max_target_len`` = min(max_len, n_positions)), no label smoothing (the masked ids get no
  mass), beam search as generate's (power penalty, alpha 1, early stopping)."""
  c = imported_config(name, data_config, fields)
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
    fields = gpt2.model_fields(hf)
  except gpt2.UnsupportedGPT2Config as e:
    raise TxfError(f"{os.path.join(local, 'config.json')}: txf cannot represent {e}") from None
  codec = _codec(local, hf, name)
  gen_path = os.path.join(local, "generation_config.json")
  num_beams = int((_read_json(gen_path) if os.path.isfile(gen_path) else {}).get("num_beams") or 1)
  config = import_config(fields, codec.target.vocab_size, name, data_config, max_len, num_beams)
  config_lib.validate(config)
  try:
    params = gpt2.params_from_state_dict(read_state_dict(local), fields, codec.target.order)
  except KeyError as e:
    raise TxfError(f"{local}: the weights have no {e} (is it a GPT2LMHeadModel?)") from None
  size = codec.target.vocab_size
  write_imported_run(workdir, config, codec, params, {
      "family": "decoder_lm", "vocab_size": size, "target_vocab_size": size, "num_classes": 0,
      "max_input_len": 0, "max_target_len": config.data.max_target_len})


def exports(config) -> bool:
  """Whether ``export-hf`` takes a run as GPT-2: a decoder_lm with ``model.mask_special_logits``,
  i.e. started from an imported GPT-2 (see the module docstring)."""
  return config.model.family == "decoder_lm" and bool(config.model.get("mask_special_logits", False))


def export_problems(config, codec: Optional[tok.Codec]) -> list:
  """What keeps a decoder_lm run from being a GPT-2 model (empty when it can be exported)."""
  m, problems = config.model, []
  if m.positional != "learned":
    problems.append(f"model.positional={m.positional!r} (GPT-2: learned)")
  if not m.pre_ln or m.norm != "layer_norm" or m.parallel_block:
    problems.append(f"model.pre_ln={m.pre_ln} / model.norm={m.norm!r} / model.parallel_block="
                    f"{m.parallel_block} (GPT-2: pre-LN, layer_norm, sequential sublayers)")
  if m.activation not in gpt2.EXPORT_ACTIVATIONS:
    problems.append(f"model.activation={m.activation!r} (GPT-2: gelu_tanh, gelu, relu)")
  if m.embed_scale or m.logits_bias or m.attention != "scaled_dot_product":
    problems.append(f"model.embed_scale={m.embed_scale} / model.logits_bias={m.logits_bias} / "
                    f"model.attention={m.attention!r} (GPT-2: no scale, no logits bias, "
                    f"scaled_dot_product)")
  if (m.get("num_kv_heads", 0) or m.num_heads) != m.num_heads or m.get("qk_norm", "none") != "none":
    problems.append(f"model.num_kv_heads={m.get('num_kv_heads', 0)} / model.qk_norm="
                    f"{m.get('qk_norm', 'none')!r} (GPT-2: 0, none)")
  if not m.get("mask_special_logits", False) or m.decoder_start_id != EOS_ID:
    problems.append(f"model.mask_special_logits={m.get('mask_special_logits', False)} / "
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
  sd = gpt2.state_dict_from_params(params, fields, target.order, target.vocab_size)
  vocab, merges = target.vocab_and_merges()
  eos_token = next((t for t, i in vocab.items() if i == target.eos), EOS_TOKEN)
  hf = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": target.hf_size,
        "n_positions": m.max_len, "n_embd": m.d_model, "n_layer": m.num_decoder_layers,
        "n_head": m.num_heads, "n_inner": m.d_ff,
        "activation_function": gpt2.EXPORT_ACTIVATIONS[m.activation],
        "resid_pdrop": m.dropout_rate, "embd_pdrop": m.dropout_rate,
        "attn_pdrop": m.attention_dropout_rate, "layer_norm_epsilon": m.layer_norm_eps,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "add_cross_attention": False,
        "bos_token_id": target.eos, "eos_token_id": target.eos,
        "tie_word_embeddings": bool(m.tie_output), "initializer_range": 0.02, "use_cache": True}
  generation = {"bos_token_id": target.eos, "eos_token_id": target.eos,
                **generation_settings(DecodingSpec.from_config(config), say)}
  pre = json.loads(target.serialized).get("pre_tokenizer") or {}
  with staged_directory(output, ".export-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, "config.json"), hf)
    workdir_lib.write_json(os.path.join(tmp, "generation_config.json"), generation)
    _safetensors().save_file(sd, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
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
