"""Hugging Face checkpoints in and out of txf: ``txf import-hf`` and ``txf export-hf``.

One table, ``ARCHITECTURES``, maps a checkpoint's ``model_type`` to the module that reads and
writes it, one module per architecture (config mapping, parameters both ways, tokenizer, import
and export), over what they share (txf.hf.common). Each architecture module has

  DEFAULT_DATA_CONFIG: str, the experiment whose data fields an imported run gets by default;
  import_run(local, hf, workdir, name, data_config, max_len) -> None: write the txf workdir of the
    ``save_pretrained`` directory ``local`` (``hf``: its config.json as a dict) into ``workdir``,
    in one step; TxfError naming any option txf cannot represent;
  exports(config) -> bool: whether a txf run (its config) is of this architecture;
  export_run(workdir, config, output, params_name, say) -> None: write ``output`` for
    ``from_pretrained``, in one step; TxfError naming what cannot be exported.

Export asks the architectures in the table's order; Marian, last, takes every run the others do
not claim and names what keeps it from being a Marian model. A new architecture is a module with
those four names and a line in ``ARCHITECTURES``; from a plugin file (``txf import-hf --plugins
FILE``), one :func:`register` line, which puts it before txf's own so that its ``exports`` is asked
first. An imported run's ``config.plugins`` keeps the file, so ``txf export-hf`` and the serving
commands import it again.
"""

import dataclasses
import importlib
import json
import os
from typing import Callable, Dict, Optional

from txf.core import families
from txf.core.errors import TxfError
from txf.data import tokenizer as tok
from txf.hf import common
from txf.runtime import storage
from txf.runtime import workdir as workdir_lib


@dataclasses.dataclass(frozen=True)
class Architecture:
  """One Hugging Face architecture txf reads and writes.

  Attributes:
    module: the module with DEFAULT_DATA_CONFIG, import_run, exports and export_run.
    model_class: the transformers class an export loads into.
    families: the txf model families an import becomes.
    tokenizer: the tokenizer files an import reads.
  """
  module: str
  model_class: str
  families: tuple
  tokenizer: str


# model_type -> its architecture, in the order export asks them (Marian last: the fallback; the
# Llama family before GPT-2, whose rule takes every imported decoder_lm the others leave)
ARCHITECTURES: Dict[str, Architecture] = {
    "bert": Architecture("txf.hf.bert", "BertForSequenceClassification / BertForMaskedLM",
                         ("encoder_classifier", "encoder_mlm"),
                         "tokenizer.json or vocab.txt (WordPiece)"),
    "llama": Architecture("txf.hf.llama", "LlamaForCausalLM", ("decoder_lm",),
                          "tokenizer.json (txf.hf.tokenizer_json; without it the weights alone)"),
    "qwen2": Architecture("txf.hf.llama", "Qwen2ForCausalLM", ("decoder_lm",),
                          "tokenizer.json (txf.hf.tokenizer_json; without it the weights alone)"),
    "mistral": Architecture("txf.hf.llama", "MistralForCausalLM", ("decoder_lm",),
                            "tokenizer.json (txf.hf.tokenizer_json; without it the weights alone)"),
    "gpt2": Architecture("txf.hf.gpt2", "GPT2LMHeadModel", ("decoder_lm",),
                         "tokenizer.json or vocab.json + merges.txt (byte-level BPE)"),
    "t5": Architecture("txf.hf.t5", "T5ForConditionalGeneration", ("encoder_decoder",),
                       "spiece.model (SentencePiece), else tokenizer.json (read by txf)"),
    "marian": Architecture("txf.hf.marian", "MarianMTModel", ("encoder_decoder",),
                           "source.spm, target.spm, vocab.json (SentencePiece)"),
}


_OWN = tuple(ARCHITECTURES)  # txf's own, which export asks after any registered by a plugin


def register(model_type: str, arch: Architecture) -> Architecture:
  """Add the architecture of checkpoints whose config.json says ``model_type`` (from a plugin file:
  ``txf import-hf --plugins FILE``). It is asked before txf's own architectures by export, so its
  module's ``exports(config)`` decides which runs it claims. Returns ``arch``."""
  if model_type in ARCHITECTURES:
    raise TxfError(f"Hugging Face model_type {model_type!r} is already registered "
                   f"({ARCHITECTURES[model_type].module}): choose another name")
  for name in ("module", "model_class", "tokenizer"):
    if not isinstance(getattr(arch, name), str) or not getattr(arch, name):
      raise TxfError(f"architecture {model_type!r}: {name} must be a non-empty string")
  ours = {k: ARCHITECTURES.pop(k) for k in _OWN}
  ARCHITECTURES[model_type] = arch
  ARCHITECTURES.update(ours)
  return arch


def unregister(model_type: str) -> None:
  """Remove an architecture :func:`register` added (txf's own stay)."""
  if model_type in _OWN:
    raise TxfError(f"{model_type!r} is one of txf's own architectures")
  ARCHITECTURES.pop(model_type, None)


def architecture(model_type: str):
  """The module of ``ARCHITECTURES[model_type]``, imported."""
  return importlib.import_module(ARCHITECTURES[model_type].module)


def import_hf(src: str, workdir: str, data_config: Optional[str] = None, max_len: int = 128,
              plugins: str = "") -> str:
  """Write the txf workdir of a Hugging Face checkpoint ``src`` (a ``save_pretrained`` directory
  or a Hub name) of an architecture of ``ARCHITECTURES``; returns the workdir. Refuses a non-empty
  workdir. ``data_config`` None: the architecture's default experiment. ``plugins``: Python files
  or modules (comma-separated) imported first, each may :func:`register` an architecture; the run's
  ``config.plugins`` keeps them (files as absolute paths)."""
  families.import_plugins(plugins)
  local = common.resolve_source(src)
  config_path = os.path.join(local, "config.json")
  if not os.path.isfile(config_path):
    raise TxfError(f"{local} has no config.json: give a directory written by save_pretrained")
  hf = common.read_json(config_path)
  # a config.json without model_type is read as Marian's, as transformers' own MarianConfig writes
  model_type = hf.get("model_type") or "marian"
  if model_type not in ARCHITECTURES:
    raise TxfError(f"{config_path}: model_type {model_type!r} is not an architecture txf imports "
                   f"({', '.join(ARCHITECTURES)}): a plugin file may register it (--plugins FILE)")
  common.check_new_workdir(workdir)
  arch = architecture(model_type)
  arch.import_run(local, hf, workdir, os.path.basename(os.path.normpath(src)),
                  arch.DEFAULT_DATA_CONFIG if data_config is None else data_config, max_len)
  if families.plugin_list(plugins):  # later commands import the same files (load_config)
    config = workdir_lib.load_config(workdir)
    config.plugins = families.absolute_plugins(plugins)
    workdir_lib.write_json(workdir_lib.path_of(workdir, workdir_lib.CONFIG_FILE),
                           workdir_lib.config_to_dict(config))
  return workdir


def imported_tokenizer_file(workdir: str) -> Optional[str]:
  """The checkpoint's tokenizer file(s) an import of ``workdir`` read (its codec's settings),
  or None when it does not say."""
  path = os.path.join(workdir_lib.path_of(workdir, workdir_lib.TOKENIZER_DIR), tok.CODEC_FILE)
  if not storage.wpath(path).is_file():
    return None
  return json.loads(storage.wpath(path).read_text()).get("settings", {}).get("tokenizer_file")


def export_hf(workdir: str, output: str, params_name: Optional[str] = None,
              say: Callable[[str], None] = lambda line: None) -> str:
  """Write ``output``: config.json, generation_config.json, model.safetensors and the tokenizer
  files of the run in ``workdir``, as the first architecture of ``ARCHITECTURES`` whose
  ``exports`` takes the run. Raises TxfError naming what cannot be exported."""
  config = workdir_lib.load_config(workdir)
  for model_type in ARCHITECTURES:
    arch = architecture(model_type)
    if arch.exports(config):
      if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise TxfError(f"--output {output} exists and is not empty: choose a new directory")
      arch.export_run(workdir, config, output, params_name, say)
      return output
  raise AssertionError("the last architecture takes every run")
