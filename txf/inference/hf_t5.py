"""Hugging Face T5 models (``T5ForConditionalGeneration``, v1.0 and v1.1) in and out of txf: the
``t5`` entry of txf.inference.hf's ``ARCHITECTURES`` (``txf import-hf`` / ``txf export-hf``).

Import reads a ``save_pretrained`` directory (config.json, model.safetensors, spiece.model,
optionally tokenizer_config.json and generation_config.json) and writes a txf workdir whose model
is T5's (txf.models.t5: pre-LN RMSNorm, unscaled attention, one relative bias table per stack,
head width d_kv, ReLU or gated tanh-GELU FFN, no biases, tied head with the d_model^-0.5 scale or
an untied one) and whose tokenizer is the checkpoint's SentencePiece model with T5's ``extra_ids``
sentinels ``<extra_id_N>`` at the top of the vocabulary (id V_spm + extra_ids - 1 - N; config
vocab_size may exceed that: the extra rows are kept, never produced by the tokenizer). Text is
encoded as it is: a task prefix such as "translate English to German: " is part of the source
line, and the source gets EOS appended as T5's tokenizer does. Export writes the inverse, for
``T5ForConditionalGeneration.from_pretrained`` and ``T5Tokenizer.from_pretrained``.

Decoding settings of an imported run are those of Hugging Face's ``generate(num_beams=K,
length_penalty=1.0, early_stopping=True)`` as for Marian (txf.inference.hf's docstring).
"""

import json
import os
from typing import Any, Callable, Dict, Optional

import sentencepiece as spm

from txf import config as config_lib
from txf import workdir as workdir_lib
from txf.data import tokenizer as tok
from txf.decode.spec import DecodingSpec
from txf.errors import TxfError
from txf.inference import hf as hf_lib
from txf.models import t5

DEFAULT_DATA_CONFIG = "multi30k_en_de"
SPM_FILE = "spiece.model"


def _read_json(path: str) -> Dict[str, Any]:
  with open(path) as f:
    return json.load(f)


def _extra_ids(tconf: Dict[str, Any]) -> int:
  """The number of ``<extra_id_N>`` sentinels tokenizer_config.json declares (T5's default 100)."""
  listed = [t for t in tconf.get("additional_special_tokens") or [] if "<extra_id_" in str(t)]
  return int(tconf.get("extra_ids") or len(listed) or (0 if "extra_ids" in tconf else 100))


def t5_codec(src: str, hf: Dict[str, Any], settings: Dict[str, Any]) -> tok.Codec:
  """The Codec of a T5 directory: spiece.model for both sides (one vocabulary), its pieces at
  their SentencePiece ids and the sentinels ``<extra_id_N>`` at V_spm + extra_ids - 1 - N, special
  ids pad and EOS from the model config, UNK from the SentencePiece model."""
  path = os.path.join(src, SPM_FILE)
  if not os.path.isfile(path):
    raise TxfError(f"{src} has no {SPM_FILE}: txf imports T5 models with their SentencePiece "
                   f"tokenizer (save the tokenizer with save_pretrained next to the model)")
  with open(path, "rb") as f:
    proto = f.read()
  tconf_path = os.path.join(src, "tokenizer_config.json")
  tconf = _read_json(tconf_path) if os.path.isfile(tconf_path) else {}
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
  return tok.Codec(side, side, {**settings, "extra_ids": extra})


def import_run(local: str, hf: Dict[str, Any], workdir: str, name: str, data_config: str,
               max_len: int) -> None:
  """Write the txf workdir of the T5 save_pretrained directory ``local`` (``hf``: its
  config.json) into ``workdir``; TxfError naming any option txf cannot represent."""
  config_path = os.path.join(local, "config.json")
  hf = {**t5.T5_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
  gen_path = os.path.join(local, "generation_config.json")
  if os.path.isfile(gen_path):  # generate()'s settings: beams, decoder start
    hf = {**hf, **{k: v for k, v in _read_json(gen_path).items()
                   if k in ("num_beams", "decoder_start_token_id") and v is not None}}
  sd = hf_lib.read_state_dict(local)
  try:
    fields = t5.model_fields(hf, t5.head_is_tied(sd))
  except t5.UnsupportedT5Config as e:
    raise TxfError(f"{config_path}: txf cannot represent {e}") from None
  except KeyError as e:
    raise TxfError(f"{local}/model.safetensors lacks {e}: give a directory written by "
                   f"T5ForConditionalGeneration.save_pretrained") from None
  config = hf_lib.import_config(hf, fields, name, data_config, max_len)
  config_lib.validate(config)
  codec = t5_codec(local, hf, {"tokenizer": "t5", "from": name})
  try:
    params = t5.params_from_state_dict(sd, fields, codec.target.order)
  except KeyError as e:
    raise TxfError(f"{local}/model.safetensors lacks {e}: give a directory written by "
                   f"T5ForConditionalGeneration.save_pretrained") from None
  rows = params["embed"]["embedding"].shape[0]
  if rows != codec.target.vocab_size:
    raise TxfError(f"{config_path}: vocab_size={codec.target.vocab_size} but the embedding table "
                   f"has {rows} rows")
  hf_lib.write_imported_run(workdir, config, codec, params, hf_lib.translation_task(config, codec))


def exports(config) -> bool:
  """Whether a run has T5's layout (one relative bias table per stack and unscaled attention):
  export-hf then writes a T5 model (or names what else stands in the way)."""
  m = config.model
  return (m.get("positional") == "relative" and bool(m.get("relative_shared", False))
          and m.get("attention") == "dot_product")


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
  if (m.get("num_kv_heads", 0) or m.num_heads) != m.num_heads or m.get("qk_norm", "none") != "none":
    problems.append(f"model.num_kv_heads={m.get('num_kv_heads', 0)} / model.qk_norm="
                    f"{m.get('qk_norm', 'none')!r} (T5: 0, none)")
  if m.activation not in t5.FEED_FORWARD_PROJ or m.ffn_match_params:
    problems.append(f"model.activation={m.activation!r} / ffn_match_params={m.ffn_match_params} "
                    f"(T5: one of {sorted(t5.FEED_FORWARD_PROJ)}, hidden size d_ff)")
  scale, rsqrt = float(m.get("logits_scale", 1.0)), m.d_model ** -0.5
  if scale not in (1.0, rsqrt) or (scale == rsqrt and not m.tie_output):
    problems.append(f"model.logits_scale={scale} with tie_output={m.tie_output} (T5: a tied head "
                    f"with d_model^-0.5 = {rsqrt}, or 1.0)")
  if m.decoder_start_id != 0 or m.forbid_pad:
    problems.append(f"model.decoder_start_id={m.decoder_start_id} / forbid_pad={m.forbid_pad} "
                    f"(T5 starts with its pad, id 0, and may generate it)")
  if (codec is None or not isinstance(codec.target, tok.T5Tokenizer)
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
  sd = t5.state_dict_from_params(params, fields, order, size)
  scaled = float(m.logits_scale) != 1.0
  hf = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": size,
        "d_model": m.d_model, "d_kv": m.head_dim or m.d_model // m.num_heads, "d_ff": m.d_ff,
        "num_layers": m.num_encoder_layers, "num_decoder_layers": m.num_decoder_layers,
        "num_heads": m.num_heads, "relative_attention_num_buckets": m.relative_buckets,
        "relative_attention_max_distance": m.relative_max_distance,
        "dropout_rate": m.dropout_rate, "layer_norm_epsilon": m.layer_norm_eps,
        "initializer_factor": 1.0, "feed_forward_proj": t5.FEED_FORWARD_PROJ[m.activation],
        "is_encoder_decoder": True, "use_cache": True, "pad_token_id": specials["pad"],
        "eos_token_id": specials["eos"], "decoder_start_token_id": specials["pad"],
        # v1.0: tied head over d_model^-0.5 h; v1.1: no scale (transformers 5 reads the second)
        "tie_word_embeddings": scaled, "scale_decoder_outputs": scaled}
  generation = {"decoder_start_token_id": specials["pad"], "eos_token_id": specials["eos"],
                "pad_token_id": specials["pad"], "max_length": m.max_len,
                **hf_lib.generation_settings(DecodingSpec.from_config(config), say)}
  with hf_lib.staged_directory(output, ".export-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, "config.json"), hf)
    workdir_lib.write_json(os.path.join(tmp, "generation_config.json"), generation)
    hf_lib._safetensors().save_file(sd, os.path.join(tmp, "model.safetensors"),
                                    metadata={"format": "pt"})
    with open(os.path.join(tmp, SPM_FILE), "wb") as f:
      f.write(target.model_proto)
    workdir_lib.write_json(os.path.join(tmp, "tokenizer_config.json"), {
        "tokenizer_class": "T5Tokenizer", "extra_ids": int(codec.settings.get("extra_ids", 0)),
        "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "model_max_length": m.max_len,
        "clean_up_tokenization_spaces": bool(getattr(target, "clean_up", False))})
  return output

