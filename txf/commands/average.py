"""Runs ``txf average-checkpoints``; its usage text and flags are declared in txf.commands.declared.average
(``txf average-checkpoints --help``), which txf/cli.py parses before importing this module."""

import os

from absl import flags
import jax

from txf.train.averaging import average_checkpoints
from txf.runtime import workdir as workdir_lib
from txf.core import families
from txf.runtime import storage
from txf.core.errors import TxfError
from txf.parallel import distributed


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}")
  distributed.maybe_initialize()
  f = flags.FLAGS
  storage.check_filesystem(f.workdir)
  if not storage.wpath(f.workdir).is_dir():
    raise TxfError(f"no run directory {f.workdir}")
  sharded = f.sharded == "true" or (f.sharded == "auto" and jax.process_count() > 1)
  path, steps = average_checkpoints(f.workdir, f.last, f.output, f.step, sharded=sharded)
  shown = f.output or os.path.basename(path)
  if f.step:
    done = f"exported the parameters of the checkpoint at step {steps[-1]}"
  else:
    done = f"averaged the parameters of the checkpoints at steps {', '.join(map(str, steps))}"
  print(f"{done} -> {path}\nuse them with --params={shown} ({users(f.workdir)})")


def users(workdir: str) -> str:
  """The commands that take a run's --params, for its model family (config.json)."""
  try:
    command = families.get(workdir_lib.load_config(workdir).model.family).command
  except Exception:  # pylint: disable=broad-except  # an unreadable config: name only txf eval
    return "txf eval"
  return "txf eval" if command == "txf eval" else f"txf eval / {command}"
