"""``txf prepare-data NAME [--data_dir DIR]``: download and prepare a tfds catalog dataset.

Run it once on a machine with network (e.g. ``txf prepare-data wmt14_translate/de-en --data_dir
/data/tfds``); training on ``data.source=tfds:NAME`` with the same ``data.data_dir`` (or
``TXF_DATA_DIR``) then reads the prepared files offline. An unknown name or no network is one
``txf: error:`` line, exit status 2.
"""

from absl import flags

from txf.data.builders import resolve_data_dir
from txf.data.catalog import prepare
from txf.core.errors import TxfError

flags.DEFINE_string("data_dir", "", "where the prepared dataset goes; default $TXF_DATA_DIR or "
                    "~/.cache/txf/tfds")


def main(argv):
  if len(argv) != 2:
    raise TxfError("give one catalog dataset name, e.g. txf prepare-data wmt14_translate/de-en "
                   "--data_dir /data/tfds")
  name = argv[1]
  builder = prepare(name, resolve_data_dir(flags.FLAGS.data_dir))
  print(f"prepared {name} in {builder.data_path}")
