"""``txf import-hf SRC --workdir W [--data_config multi30k_en_de] [--max_len 128]``.

SRC is a directory written by Hugging Face's ``save_pretrained`` (config.json, model.safetensors or
pytorch_model.bin, the tokenizer's files), or a Hub name such as ``Helsinki-NLP/opus-mt-en-de``,
downloaded only then (needs the network and huggingface_hub). Its ``model_type`` picks the
architecture in txf.hf's ``ARCHITECTURES`` (Marian, BERT, GPT-2, T5), which writes a complete txf
workdir W (config.json, task.json, tokenizer/, params.msgpack) of the family it becomes: the
serving command it prints (``txf translate``, ``txf classify``, ``txf generate``), ``txf eval``,
``txf export-hf`` and ``txf train --config.init_from=W`` use it like a trained run. Decoding
settings are Hugging Face's ``generate`` defaults (docs/huggingface.md).
"""

from absl import flags

from txf.core import families
from txf.runtime import workdir as workdir_lib
from txf.core.errors import TxfError
from txf import hf

flags.DEFINE_string("workdir", None, "the new txf workdir (must not exist, or be empty)", required=True)
flags.DEFINE_string("data_config", None, "the experiment whose data fields (source, languages, "
                    "splits) the imported run gets: what `txf eval` reads; '' = none; default: the "
                    "architecture's (Marian: multi30k_en_de, BERT: sst2)")
flags.DEFINE_integer("max_len", 128, "data.max_input_len / max_target_len: longer source lines are "
                     "truncated by txf translate (at most the model's max_position_embeddings); "
                     "GPT-2: data.max_target_len, the context of txf generate and eval (at most "
                     "n_positions)")


def main(argv):
  if len(argv) != 2:
    raise TxfError("give one SRC: a save_pretrained directory or a Hub name, e.g. "
                   "txf import-hf Helsinki-NLP/opus-mt-en-de --workdir runs/opus-en-de")
  f = flags.FLAGS
  if f.max_len < 2:
    raise TxfError(f"--max_len={f.max_len} must be >= 2")
  out = hf.import_hf(argv[1], f.workdir, f.data_config, f.max_len)
  family = families.get(workdir_lib.load_config(out).model.family)
  print(f"imported {argv[1]} -> {out} ({family.command} --workdir {out})")
