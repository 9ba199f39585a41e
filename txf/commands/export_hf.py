"""Runs ``txf export-hf``; its usage text and flags are declared in txf.commands.declared.export_hf
(``txf export-hf --help``), which txf/cli.py parses before importing this module."""

import sys

from absl import flags

from txf.runtime import workdir as workdir_lib
from txf.core import families
from txf.core.errors import TxfError
from txf import hf


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}")
  f = flags.FLAGS
  out = hf.export_hf(f.workdir, f.output, f.params,
                     say=lambda line: print(f"txf: note: {line}", file=sys.stderr))
  family = workdir_lib.load_config(f.workdir).model.family
  kind, tokenizer = families.get(family).hf_classes
  print(f"exported {f.workdir} -> {out} ({kind}.from_pretrained / {tokenizer}.from_pretrained)")
