"""Hugging Face Marian (OPUS-MT) models in and out of txf: ``txf import-hf`` and ``txf export-hf``.

Import reads a ``save_pretrained`` directory (config.json, model.safetensors or pytorch_model.bin,
source.spm, target.spm, vocab.json) with ``safetensors`` (numpy; torch only for a .bin file) and
writes a complete txf workdir: config.json, task.json, tokenizer/ and params.msgpack, which
``txf translate``, ``txf eval``, ``txf train --config.init_from`` and ``txf.inference.load_run`` use
like any trained run. Export writes the inverse: a directory ``MarianMTModel.from_pretrained`` and
``MarianTokenizer.from_pretrained`` load, with safetensors weights.

Decoding conventions of an imported run (its config.json): ``beam_size`` = the model's num_beams,
``length_penalty="power"`` with ``alpha=1.0`` and ``early_stopping=True``, i.e. Hugging Face's
``generate(num_beams=K, length_penalty=1.0, early_stopping=True)``: a finished hypothesis scores
log p(y) / |y| (|y| counts the generated tokens, EOS included, not the decoder start), a row
stops at K finished hypotheses. txf bounds each output by its source length + ``--max_extra``
tokens (HF: ``max_new_tokens``); the two agree on every output that ends with EOS before both.
"""

import contextlib
import importlib
import json
import os
import re
import shutil
import socket
import tempfile
from typing import Any, Callable, Dict, Optional

import numpy as np

from txf import config as config_lib
from txf import storage
from txf import workdir as workdir_lib
from txf.data import tokenizer as tok
from txf.data.base import BOS_ID, EOS_ID, PAD_ID
from txf.decode.spec import DecodingSpec
from txf.errors import TxfError
from txf.models import marian

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")

# The architectures beside Marian: a Hugging Face ``model_type`` -> the module that imports and
# exports it (imported when first used). Each such module has
#   DEFAULT_DATA_CONFIG: str, the experiment whose data fields an imported run gets by default;
#   import_run(local, hf, workdir, name, data_config, max_len) -> None: write the txf workdir of the
#     save_pretrained directory ``local`` (``hf`` its config.json, a dict) into ``workdir``
#     (``staged_directory``), TxfError naming any option txf cannot represent;
#   exports(config) -> bool: whether a txf run (its config) is of this architecture;
#   export_run(workdir, config, output, params_name, say) -> None: write ``output`` for
#     ``from_pretrained`` (``staged_directory``), TxfError naming what cannot be exported.
ARCHITECTURES: Dict[str, str] = {"bert": "txf.inference.hf_bert", "gpt2": "txf.inference.hf_gpt2",
                                 "t5": "txf.inference.hf_t5"}


def _safetensors():
  try:
    from safetensors import numpy as st_numpy
  except ImportError:
    raise TxfError("reading and writing Hugging Face weights needs the safetensors package: "
                   "pip install safetensors (or pip install 'txf[hf]')") from None
  return st_numpy


def read_state_dict(src: str) -> Dict[str, np.ndarray]:
  """The weights of a save_pretrained directory as float32 numpy arrays (safetensors; a
  pytorch_model.bin only with torch installed)."""
  path = os.path.join(src, "model.safetensors")
  if os.path.isfile(path):
    return _safetensors().load_file(path)
  path = os.path.join(src, "pytorch_model.bin")
  if os.path.isfile(path):
    try:
      import torch  # only for the legacy format
    except ImportError:
      raise TxfError(f"{path} is a torch pickle and torch is not installed: install torch, or save "
                     f"the model with safetensors (save_pretrained's default)") from None
    return {k: v.float().numpy() for k, v in torch.load(path, map_location="cpu",
                                                         weights_only=True).items()}
  raise TxfError(f"{src} has no model.safetensors or pytorch_model.bin: give a directory written "
                 f"by MarianMTModel.save_pretrained")


def resolve_source(src: str) -> str:
  """A local directory as given; a Hub name (``Helsinki-NLP/opus-mt-en-de``, ``gpt2``) downloaded with
  huggingface_hub, failing fast (TxfError) when it is not installed or the Hub cannot be reached."""
  if os.path.isdir(src):
    return src
  if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", src) or os.path.exists(src):  # owner/name, or gpt2
    raise TxfError(f"{src} is not a directory: give a save_pretrained directory or a Hub name "
                   f"such as Helsinki-NLP/opus-mt-en-de")
  try:
    from huggingface_hub import snapshot_download
  except ImportError:
    raise TxfError(f"{src} is not a local directory, and downloading it from the Hugging Face Hub "
                   f"needs huggingface_hub: pip install 'txf[hf]'") from None
  if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
    raise TxfError(f"{src} is not a local directory and HF_HUB_OFFLINE is set: download it "
                   f"where the network is (save_pretrained) and pass the directory")
  try:
    socket.create_connection(("huggingface.co", 443), timeout=5).close()
  except OSError as e:
    raise TxfError(f"{src} is not a local directory and huggingface.co cannot be reached ({e}): "
                   f"download it where the network is (save_pretrained) and pass the "
                   f"directory") from None
  # configs, tokenizers (Marian's *.spm, BERT's vocab.txt, GPT-2's merges.txt, T5's spiece.model)
  return snapshot_download(src, allow_patterns=["*.json", "*.spm", "*.txt", "*.model",
                                                "model.safetensors"])


def _read_json(path: str) -> Dict[str, Any]:
  with open(path) as f:
    return json.load(f)


def marian_codec(src: str, hf: Dict[str, Any], settings: Dict[str, Any]) -> tok.Codec:
  """The Codec of a Marian tokenizer directory: source.spm for sources, target.spm for targets,
  one vocab.json, special ids from the model config (pad, eos) and the vocabulary (``<unk>``)."""
  missing = [f for f in TOKENIZER_FILES if not os.path.isfile(os.path.join(src, f))]
  if missing:
    raise TxfError(f"{src} has no {', '.join(missing)}: txf imports Marian models with their "
                   f"SentencePiece tokenizer (source.spm, target.spm, vocab.json)")
  tconf_path = os.path.join(src, "tokenizer_config.json")
  tconf = _read_json(tconf_path) if os.path.isfile(tconf_path) else {}
  if tconf.get("separate_vocabs"):
    raise TxfError(f"{tconf_path}: separate_vocabs=True (two vocabularies) is not supported")
  clean_up = bool(tconf.get("clean_up_tokenization_spaces", False))
  vocab = _read_json(os.path.join(src, "vocab.json"))
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
  return tok.Codec(source, target, settings)


# data fields an imported run keeps from its own tokenizer, not from --data_config's experiment
_OWN_DATA_FIELDS = ("tokenizer", "vocab_size", "spm_model_type", "joint_vocab", "max_input_len",
                    "max_target_len")


def imported_config(name: str, data_config: str, fields: Dict[str, Any],
                    own_data_fields=_OWN_DATA_FIELDS):
  """``base_config()`` of an imported run named ``name``: ``fields`` as config.model, and the data
  fields of the experiment ``data_config`` ("" = base_config's) but for ``own_data_fields``, which
  the caller sets from the checkpoint (its tokenizer and lengths)."""
  c = config_lib.base_config()
  c.name = name
  if data_config:
    theirs = config_lib.load_experiment(data_config).data
    for k, v in theirs.items():
      if k not in own_data_fields:
        c.data[k] = v
  for k, v in fields.items():
    c.model[k] = v
  return c


def write_imported_run(workdir: str, config, codec: tok.Codec, params, task: Dict[str, Any]) -> None:
  """Write an imported run into ``workdir`` in one step (``staged_directory``): config.json, the
  codec's tokenizer/, task.json (``task``: family, vocabulary sizes, classes, lengths) and
  params.msgpack."""
  with staged_directory(workdir, ".import-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, workdir_lib.CONFIG_FILE), workdir_lib.config_to_dict(config))
    codec.save(os.path.join(tmp, workdir_lib.TOKENIZER_DIR))
    workdir_lib.write_json(os.path.join(tmp, workdir_lib.TASK_FILE), task)
    workdir_lib.save_params(tmp, params)


def import_config(hf: Dict[str, Any], fields: Dict[str, Any], name: str, data_config: str,
                  max_len: int):
  """The txf run config of an imported Marian model (decoding as Hugging Face's generate); its
  data fields (what `txf eval` and fine-tuning read) are those of the experiment ``data_config``
  ("" = base_config's), but for the tokenizer and lengths."""
  c = imported_config(name, data_config, fields)
  c.data.tokenizer, c.data.vocab_size, c.data.joint_vocab = "sentencepiece", int(hf["vocab_size"]), False
  c.data.max_input_len = c.data.max_target_len = min(max_len, fields["max_len"])
  c.beam_size = int(hf.get("num_beams") or 4)
  c.alpha, c.length_penalty, c.early_stopping = 1.0, "power", True
  return c


def _architecture(model_type: str):
  """The module of ``ARCHITECTURES[model_type]``, imported."""
  return importlib.import_module(ARCHITECTURES[model_type])


def import_hf(src: str, workdir: str, data_config: Optional[str] = None, max_len: int = 128) -> str:
  """Write the txf workdir of a Hugging Face model (Marian, or an architecture of
  ``ARCHITECTURES``); returns the workdir. Refuses a non-empty workdir. ``data_config`` None: the
  architecture's default experiment (Marian: multi30k_en_de)."""
  local = resolve_source(src)
  config_path = os.path.join(local, "config.json")
  if not os.path.isfile(config_path):
    raise TxfError(f"{local} has no config.json: give a directory written by save_pretrained")
  model_type = _read_json(config_path).get("model_type")
  if model_type in ARCHITECTURES:
    check_new_workdir(workdir)
    arch = _architecture(model_type)
    arch.import_run(local, _read_json(config_path), workdir, os.path.basename(os.path.normpath(src)),
                    arch.DEFAULT_DATA_CONFIG if data_config is None else data_config, max_len)
    return workdir
  if data_config is None:
    data_config = "multi30k_en_de"
  hf = {**marian.MARIAN_DEFAULTS, **_read_json(config_path)}
  gen_path = os.path.join(local, "generation_config.json")
  if os.path.isfile(gen_path):  # generate()'s settings: beams, never-generated ids
    hf = {**hf, **{k: v for k, v in _read_json(gen_path).items()
                   if k in ("num_beams", "bad_words_ids") and v is not None}}
  try:
    fields = marian.model_fields(hf)
  except marian.UnsupportedMarianConfig as e:
    raise TxfError(f"{config_path}: txf cannot represent {e}") from None
  check_new_workdir(workdir)
  name = os.path.basename(os.path.normpath(src))
  config = import_config(hf, fields, name, data_config, max_len)
  config_lib.validate(config)
  codec = marian_codec(local, hf, {"tokenizer": "marian", "from": src})
  order = codec.target.order
  params = marian.params_from_state_dict(read_state_dict(local), fields, order)
  write_imported_run(workdir, config, codec, params, translation_task(config, codec))
  return workdir


def translation_task(config, codec: tok.Codec) -> Dict[str, Any]:
  """task.json of an imported translation model: one joint vocabulary, the config's lengths."""
  size = codec.source.vocab_size
  return {"family": "encoder_decoder", "vocab_size": size, "target_vocab_size": size,
          "num_classes": 0, "max_input_len": config.data.max_input_len,
          "max_target_len": config.data.max_target_len}


def check_new_workdir(workdir: str) -> None:
  """TxfError unless ``workdir`` is absent or an empty directory (an import never overwrites)."""
  storage.check_filesystem(workdir)
  where = storage.wpath(workdir)
  if where.exists() and (not where.is_dir() or any(True for _ in where.iterdir())):
    raise TxfError(f"--workdir {workdir} exists and is not empty: choose a new directory")


@contextlib.contextmanager
def staged_directory(target: str, prefix: str):
  """A new folder beside ``target`` to write every file into; when the block ends without error it
  becomes ``target`` (absent or empty) in one rename, else it is removed. Disk failures inside are
  DiskErrors naming the folder. A bucket ``target`` gets a local temporary folder, copied up at the end."""
  if not storage.is_local(target):
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
      yield tmp
      storage.upload_tree(tmp, target)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
    return
  parent = os.path.dirname(os.path.abspath(target))
  with workdir_lib.disk_errors(parent, "creating"):
    os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
  try:
    with workdir_lib.disk_errors(tmp):
      yield tmp
      if os.path.isdir(target):
        os.rmdir(target)
      os.replace(tmp, target)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def export_problems(config, codec: Optional[tok.Codec]) -> list:
  """What keeps a run from being a Marian model (empty when it can be exported)."""
  m, problems = config.model, []
  if m.family != "encoder_decoder":
    problems.append(f"model.family={m.family!r} (Marian is a translation model; a decoder_lm "
                    f"exports as GPT-2 only when it starts from an imported GPT-2)")
  if m.positional != "sinusoidal" or m.positional_layout != "sin_cos" or m.position_offset:
    problems.append(f"positional encodings {m.positional}/{m.positional_layout}/offset "
                    f"{m.position_offset} (Marian: sinusoidal, sin_cos, offset 0)")
  if abs(m.layer_norm_eps - marian.MARIAN_LAYER_NORM_EPS) > 1e-12:
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
  if (m.get("num_kv_heads", 0) or m.num_heads) != m.num_heads or m.get("qk_norm", "none") != "none":
    problems.append(f"model.num_kv_heads={m.get('num_kv_heads', 0)} / model.qk_norm="
                    f"{m.get('qk_norm', 'none')!r} (Marian: as many key/value heads as query heads "
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


def generation_settings(spec: DecodingSpec, say: Callable[[str], None] = lambda line: None
                        ) -> Dict[str, Any]:
  """The fields of generation_config.json that carry a run's decoding ``spec`` as far as Hugging
  Face's ``generate`` can express it: ``num_beams``; ``length_penalty`` = alpha for the power
  penalty L ** alpha (``average`` is alpha 1, ``none`` alpha 0); ``early_stopping`` True (stop at K
  finished) or ``"never"`` (stop when no live beam can beat them, txf's False). The GNMT penalty
  ((5 + L) / 6) ** alpha has no counterpart: ``say`` hears one line naming what was written instead."""
  out = {"num_beams": spec.beam_size}
  if spec.beam_size == 1:
    return out
  power = {"power": spec.alpha, "average": 1.0, "none": 0.0}.get(spec.length_penalty)
  if power is None:
    power = 1.0
    say(f"generate() has no GNMT length penalty ((5 + L) / 6) ** {spec.alpha:g}: "
        f"generation_config.json has length_penalty=1.0 (L ** 1), so beam outputs may differ "
        f"from txf translate's")
  out["length_penalty"] = float(power)
  out["early_stopping"] = True if spec.early_stopping else "never"
  return out


def export_hf(workdir: str, output: str, params_name: Optional[str] = None,
              say: Callable[[str], None] = lambda line: None) -> str:
  """Write ``output``: config.json, generation_config.json, model.safetensors and the tokenizer
  files of the run in ``workdir``, as the architecture of ``ARCHITECTURES`` whose ``exports`` takes
  the run, else as Marian. Raises TxfError naming what cannot be exported."""
  config = workdir_lib.load_config(workdir)
  for model_type in ARCHITECTURES:
    arch = _architecture(model_type)
    if arch.exports(config):
      if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise TxfError(f"--output {output} exists and is not empty: choose a new directory")
      arch.export_run(workdir, config, output, params_name, say)
      return output
  codec = tok.load_codec(workdir_lib.path_of(workdir, workdir_lib.TOKENIZER_DIR))
  problems = export_problems(config, codec)
  if problems:
    raise TxfError(f"{workdir} cannot be exported as a Marian model: {'; '.join(problems)}")
  if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
    raise TxfError(f"--output {output} exists and is not empty: choose a new directory")
  vocab, order, ids, protos = _vocab_and_specials(codec)
  size = codec.target.vocab_size
  m = config.model
  fields = m.to_dict()
  params = workdir_lib.load_params(workdir, params_name)
  sd = marian.state_dict_from_params(params, fields, order, size)
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
                "max_length": m.max_len, **generation_settings(DecodingSpec.from_config(config), say)}
  if m.forbid_pad:
    generation["bad_words_ids"] = [[ids["pad"]]]
  with staged_directory(output, ".export-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, "config.json"), hf)
    workdir_lib.write_json(os.path.join(tmp, "generation_config.json"), generation)
    _safetensors().save_file(marian.stored_once(sd, fields), os.path.join(tmp, "model.safetensors"),
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
