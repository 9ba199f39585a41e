"""Flags and error handling shared by the commands."""

import functools
import os
import sys
import traceback

from absl import flags

flags.DEFINE_bool("verbose_errors", False, "show the full traceback of user errors")


def guarded(fn):
  """Run a command's main; user-fixable errors become one message on stderr and exit status 2."""

  @functools.wraps(fn)
  def wrapper(argv):
    from txf.config import ConfigError
    from txf.workdir import RunConflictError
    user_errors = (ConfigError, RunConflictError, FileNotFoundError, NotADirectoryError, ValueError)
    try:
      return fn(argv)
    except Exception as e:  # pylint: disable=broad-except
      loop = sys.modules.get("txf.train.loop")  # NonFiniteLossError, if training ran at all
      if not isinstance(e, user_errors + ((loop.NonFiniteLossError,) if loop else ())):
        raise
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
  from txf.config import experiment_path
  return experiment_path("default")
