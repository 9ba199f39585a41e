"""Runs ``txf import-hf``; its usage text and flags are declared in txf.commands.declared.import_hf
(``txf import-hf --help``), which txf/cli.py parses before importing this module."""

from absl import flags

from txf.core import families
from txf.runtime import workdir as workdir_lib
from txf.core.errors import TxfError
from txf import hf


def main(argv):
  if len(argv) != 2:
    raise TxfError("give one SRC: a save_pretrained directory or a Hub name, e.g. "
                   "txf import-hf Helsinki-NLP/opus-mt-en-de --workdir runs/opus-en-de")
  f = flags.FLAGS
  if f.max_len < 2:
    raise TxfError(f"--max_len={f.max_len} must be >= 2")
  out = hf.import_hf(argv[1], f.workdir, f.data_config, f.max_len, f.plugins)
  family = families.get(workdir_lib.load_config(out).model.family)
  used = hf.imported_tokenizer_file(out)
  print(f"imported {argv[1]} -> {out} ({f'tokenizer: {used}; ' if used else ''}"
        f"{family.command} --workdir {out})")
