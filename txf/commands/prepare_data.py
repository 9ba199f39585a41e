"""Runs ``txf prepare-data``; its usage text and flags are declared in txf.commands.declared.prepare_data
(``txf prepare-data --help``), which txf/cli.py parses before importing this module."""

from absl import flags

from txf.data.builders import resolve_data_dir
from txf.data.catalog import prepare
from txf.core.errors import TxfError


def main(argv):
  if len(argv) != 2:
    raise TxfError("give one catalog dataset name, e.g. txf prepare-data wmt14_translate/de-en "
                   "--data_dir /data/tfds")
  name = argv[1]
  builder = prepare(name, resolve_data_dir(flags.FLAGS.data_dir))
  print(f"prepared {name} in {builder.data_path}")
