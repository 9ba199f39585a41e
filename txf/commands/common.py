"""Flags and error handling shared by the commands."""

import functools
import os
import sys
import traceback

from absl import flags

from txf.errors import TxfError
from txf.config import experiment_path

flags.DEFINE_bool("verbose_errors", False, "show the full traceback of user errors")


def guarded(fn):
  """Run a command's main; a ``txf.errors.TxfError`` (bad input) becomes one ``txf: error:`` line
  on stderr and exit status 2. Every other exception is a bug and keeps its traceback."""

  @functools.wraps(fn)
  def wrapper(argv):
    try:
      return fn(argv)
    except TxfError as e:
      if flags.FLAGS.verbose_errors:
        traceback.print_exc()
      print(f"txf: error: {e}", file=sys.stderr)
      sys.exit(2)

  return wrapper


def repo_experiments_dir() -> str:
  """experiments/ next to the txf package (an editable install or a source checkout)."""
  return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "experiments")


def default_config_path() -> str:
  """experiments/default.py of the checkout, or the copy packaged with an installed txf."""
  return experiment_path("default")
