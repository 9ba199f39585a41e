"""What every Hugging Face architecture of txf.hf shares: finding a checkpoint (a folder or a Hub
name), reading its weights and JSON files, the txf config and workdir of an import (written in one
step), the settings of ``generate`` a txf decoding spec carries, and the staged output folder.
"""

import contextlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from typing import Any, Callable, Dict

import numpy as np

from txf.core import config as config_lib
from txf.core.errors import TxfError
from txf.data import tokenizer as tok
from txf.decode.spec import DecodingSpec
from txf.runtime import storage
from txf.runtime import workdir as workdir_lib

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def safetensors_module():
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
    reader = safetensors_module()
    try:
      return reader.load_file(path)
    except Exception as e:  # safetensors' SafetensorError (truncated, not a safetensors file)
      raise TxfError(f"{path} cannot be read ({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
                     f"the file is truncated or damaged; save the model again with "
                     f"save_pretrained (or download it again)") from None
  path = os.path.join(src, "pytorch_model.bin")
  if os.path.isfile(path):
    try:
      import torch  # only for the legacy format
    except ImportError:
      raise TxfError(f"{path} is a torch pickle and torch is not installed: install torch, or save "
                     f"the model with safetensors (save_pretrained's default)") from None
    try:
      state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or damaged pickle
      raise TxfError(f"{path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): "
                     f"the file is truncated or damaged; save the model again with save_pretrained") from None
    return {k: v.float().numpy() for k, v in state.items()}
  raise TxfError(f"{src} has no model.safetensors or pytorch_model.bin: give a directory written "
                 f"by save_pretrained")


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


def note(line: str) -> None:
  """One ``txf: note:`` line on stderr (something an import or export left out, and why)."""
  print(line, file=sys.stderr, flush=True)


def read_json(path: str) -> Dict[str, Any]:
  with open(path) as f:
    return json.load(f)


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
  codec's tokenizer/ (none when ``codec`` is None), task.json (``task``: family, vocabulary sizes, classes, lengths) and
  params.msgpack."""
  with staged_directory(workdir, ".import-hf-") as tmp:
    workdir_lib.write_json(os.path.join(tmp, workdir_lib.CONFIG_FILE), workdir_lib.config_to_dict(config))
    if codec is not None:  # None: the weights came in without a tokenizer
      codec.save(os.path.join(tmp, workdir_lib.TOKENIZER_DIR))
    workdir_lib.write_json(os.path.join(tmp, workdir_lib.TASK_FILE), task)
    workdir_lib.save_params(tmp, params)


def import_config(hf: Dict[str, Any], fields: Dict[str, Any], name: str, data_config: str,
                  max_len: int):
  """The txf run config of an imported translation model (Marian, T5; decoding as Hugging Face's
  generate); its
  data fields (what `txf eval` and fine-tuning read) are those of the experiment ``data_config``
  ("" = base_config's), but for the tokenizer and lengths."""
  c = imported_config(name, data_config, fields)
  c.data.tokenizer, c.data.vocab_size, c.data.joint_vocab = "sentencepiece", int(hf["vocab_size"]), False
  c.data.max_input_len = c.data.max_target_len = min(max_len, fields["max_len"])
  c.beam_size = int(hf.get("num_beams") or 4)
  c.alpha, c.length_penalty, c.early_stopping = 1.0, "power", True
  return c


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
