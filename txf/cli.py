"""The ``txf`` command: ``txf <command> [flags]``. Each command runs in txf/commands/<module>.py.

What a command takes (its purpose, usage text and absl flags) is declared in txf/commands/declared.py,
which imports no jax: this module answers ``txf CMD --help`` from there, defines the chosen command's
flags and parses the command line, and only then imports the command's module to run it
(``command_module``, the one place that does), so help and a refused flag answer at once. Before
that, it settles what absl would otherwise turn into tracebacks or library noise: ``--help``/
``--version``, ``-v`` (library logging back on), the experiment named by ``--config`` (a path, or the
name of an experiment shipped with txf), unknown ``--config.FIELD`` overrides and flags that do not
parse. Errors a user can fix print one ``txf: error: ...`` line and exit with status 2;
``--verbose_errors`` shows their traceback too.
"""

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from typing import List, Optional

from absl import app
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

import txf
from txf.runtime import compile_cache
from txf.core import config as config_lib
from txf.runtime import process as runtime
from txf.runtime import supervise
from txf.commands import common
from txf.commands import declared

# name -> (module, purpose, declaration): txf.commands.declared.COMMANDS
COMMANDS = declared.COMMANDS
HELP_FLAGS = ("-h", "--help", "--helpshort", "--helpfull")


class UsageError(Exception):
  """A command line that cannot run: printed as one ``txf: error:`` line, exit status 2."""


def version() -> str:
  """The installed distribution's version (the package's own when run from a source tree)."""
  from importlib import metadata
  try:
    return metadata.version("txf")
  except metadata.PackageNotFoundError:
    return txf.__version__


def usage() -> str:
  """``txf --help``: how to call txf, and each command with its one-line purpose."""
  lines = ["usage: txf <command> [flags]   (txf <command> --help for its flags)",
           "       txf --version", "", "commands:"]
  lines += [f"  {name:<20} {command.purpose}" for name, command in COMMANDS.items()]
  lines += ["", "every command: -v shows library logging; --verbose_errors shows "
            "the traceback of a txf: error"]
  return "\n".join(lines)


def _config_arg(args: List[str]) -> Optional[tuple]:
  """(index, value, form) of the ``--config`` flag in args, or None; form '=' or ' '."""
  for i, a in enumerate(args):
    if a.startswith("--config="):
      return i, a[len("--config="):], "="
    if a == "--config" and i + 1 < len(args):
      return i, args[i + 1], " "
  return None


def resolve_config_args(args: List[str]) -> List[str]:
  """Replace ``--config NAME`` by the experiment file it names (txf.core.config.experiment_path) and
  check every ``--config.FIELD=VALUE`` override names a field txf knows; raise UsageError."""
  args = list(args)
  found = _config_arg(args)
  if found:
    i, value, form = found
    try:
      path = config_lib.experiment_path(value)
    except config_lib.ConfigError as e:
      raise UsageError(str(e)) from e
    if form == "=":
      args[i] = f"--config={path}"
    else:
      args[i + 1] = path
  known = config_lib.field_names()
  for a in args:
    if a.startswith("--config.") or a.startswith("--noconfig."):
      field = a.split("=", 1)[0].split(".", 1)[1]
      if field not in known:
        close = difflib.get_close_matches(field, known, n=1)
        hint = f"did you mean --config.{close[0]}?" if close else "see txf/core/config.py for the fields"
        raise UsageError(f"unknown config field '{field}' in {a}: {hint}")
  return args


def command_help(name: str) -> str:
  """The command's purpose, its usage text (its declaration's docstring) and its own flags, read
  from txf.commands.declared (the flags defined on a FlagValues of their own): no jax."""
  fv = flags.FlagValues()
  names = declared.define(name, fv)
  doc = inspect.cleandoc(COMMANDS[name].declare.__doc__ or "")
  lines = [f"txf {name}: {COMMANDS[name].purpose}", ""]
  if doc:
    lines += [doc, ""]
  own = [fv[n] for n in names if "." not in n]
  if own:
    lines.append("flags:")
    for f in sorted(own, key=lambda f: f.name):
      if f.name == "config":
        note = " (default: experiments/default.py)"
      elif f.default is None:
        note = " (required)" if _required(f) else ""
      elif isinstance(f.default, bool):
        note = f" (default: {str(f.default).lower()})"
      else:
        note = f" (default: {f.default!r})" if isinstance(f.default, str) else \
            f" (default: {f.default_as_str.strip(chr(39))})"
      lines.append(f"  --{f.name}: {f.help}{note}")
    if any(f.name == "config" for f in own):
      lines.append("  --config.FIELD=VALUE: override one field of the config, e.g. "
                   "--config.model.num_heads=2 (the fields: txf/core/config.py)")
  lines += ["", "every command:", "  -v (= --verbosity=0): show library logging (absl, orbax, jax); --verbosity=1: debug",
            "  --verbose_errors: show the traceback of a txf: error"]
  return "\n".join(lines)


def _required(flag) -> bool:
  """Whether absl marks ``flag`` required (``required=True`` registers a validator)."""
  return any("other than None" in str(getattr(v, "message", "")) for v in flag.validators)


def _flag_error(e: Exception, name: str) -> str:
  """One line for a flag-parsing error, naming the flag and what to do."""
  text = str(e).splitlines()[0] if str(e) else type(e).__name__
  if isinstance(e, flags.UnrecognizedFlagError):
    return f"unknown flag --{e.flagname} for txf {name}: see txf {name} --help"
  if "must have a value other than None" in text:
    flag = text.split("=", 1)[0].split()[-1]
    return f"{flag} is required (txf {name} --help)"
  if isinstance(e, flags.IllegalFlagValueError):
    return f"{text}: give a value of the flag's type (txf {name} --help)"
  return f"{text} (txf {name} --help)"


def _config_load_error(e: BaseException, path: str = "") -> Optional[str]:
  """One line for an experiment file that does not load, or None if ``e`` is something else."""
  if isinstance(e, SyntaxError):
    return (f"the config file {e.filename} does not parse: {e.msg} at line {e.lineno}: "
            f"fix the file")
  if isinstance(e, AttributeError) and "get_config" in str(e):
    return (f"the config file {path or '(--config)'} has no get_config(): define get_config() returning the "
            "ml_collections.ConfigDict of the experiment (see experiments/default.py)")
  return None


def define_flags(name: str, args: List[str], verbose_errors: bool) -> List[str]:
  """Define command ``name``'s flags on absl's FLAGS (txf.commands.declared.define) and return
  their names; a ``--config`` flag loads its default experiment here, whose errors are one line."""
  try:
    return declared.define(name)
  except (SyntaxError, AttributeError) as e:
    found = _config_arg(args)
    message = _config_load_error(e, found[1] if found else "")
    if message is None:
      raise
    common.fail(message, verbose_errors)


def _config_flag():
  """The command's ``--config`` flag (ml_collections' config_flags), or None if it has none."""
  return flags.FLAGS["config"] if "config" in flags.FLAGS else None


def parse_flags(argv: List[str], name: str, verbose_errors: bool) -> List[str]:
  """absl flag parsing with one-line errors; also loads ``--config`` so its errors show here.
  Returns the arguments that are not flags (argv[0] first), as absl's parser does."""
  try:
    rest = flags.FLAGS(argv)
    config = _config_flag()
    if config is not None:
      config.value  # pylint: disable=pointless-statement  # ml_collections loads the file lazily
  except flags.Error as e:
    common.fail(_flag_error(e, name), verbose_errors)
  except (SyntaxError, AttributeError, OSError) as e:
    found = _config_arg(argv)
    path = found[1] if found else ""
    message = _config_load_error(e, path) or _config_load_error(e.__cause__ or e.__context__, path)
    if message is None and isinstance(e, OSError):
      message = str(e).splitlines()[0]
    if message is None:
      raise
    common.fail(message, verbose_errors)
  return rest


def fit_config() -> None:
  """A run shortened below its experiment's cooldown gets the cooldown scaled down, with a note
  (txf.core.config.fit_cooldown); an explicit ``--config.optimizer.cooldown_steps`` is left alone."""
  flag = _config_flag()
  if flag is None or "optimizer.cooldown_steps" in config_flags.get_override_values(flag):
    return
  path = flag.config_filename
  if not os.path.isfile(path):
    return  # path:arguments form; nothing to compare with
  spec = importlib.util.spec_from_file_location("_txf_experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  note = config_lib.fit_cooldown(flags.FLAGS.config, module.get_config().num_train_steps)
  if note and _launched_as_process_0():
    print(f"txf: note: {note}", flush=True)


def _launched_as_process_0(environ=os.environ) -> bool:
  """Whether this process is process 0 of its job (or alone), from what the launchers set; jax is
  not initialised yet, so the rank comes from the environment (txf's launcher, SLURM, TPU VMs)."""
  for name in ("TXF_PROCESS_ID", "SLURM_PROCID", "TPU_WORKER_ID"):
    if environ.get(name, "").strip().isdigit():
      return int(environ[name]) == 0
  return True


def _prepare(fn):
  """Wrap a command's main: library logging below ERROR is off unless -v (after flags parse);
  the config's cooldown fits a shortened run."""

  def run(argv):
    runtime.quiet_logging()
    common.show_preparations()
    fit_config()
    return fn(argv)

  return run


def main(argv=None) -> None:
  """``txf CMD [flags]`` (``argv``: sys.argv's form; None = this process's own command line): help,
  version and usage errors answered from the declarations, else CMD's module run under absl."""
  if argv is None:  # the console script / python -m txf.cli (not an in-process call)
    try:
      runtime.maybe_reexec_with_tcmalloc(list(sys.argv))
    except ValueError as e:
      common.fail(str(e))
    try:  # one process of a multi-process job: the work runs in a supervised child
      supervise.supervise(list(sys.argv))
    except config_lib.ConfigError as e:
      common.fail(str(e))
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(usage(), file=sys.stdout if len(argv) >= 2 else sys.stderr)
    sys.exit(0 if len(argv) >= 2 else 2)
  if argv[1] == "--version":
    print(f"txf {version()}")
    sys.exit(0)
  name = argv[1]
  if name not in COMMANDS:
    close = difflib.get_close_matches(name, COMMANDS, n=1)
    common.fail(f"unknown command {name!r}: " + (f"did you mean {close[0]!r}? " if close else "") +
         "txf --help lists the commands")
  args = argv[2:]
  verbose_errors = "--verbose_errors" in args
  verbose, args = runtime.split_verbosity(args)
  runtime.quiet_environment(verbose)
  compile_cache.set_environment()  # before jax starts: programs compiled once are read back
  try:
    args = resolve_config_args(args)
  except UsageError as e:
    common.fail(str(e), verbose_errors)
  # ml_collections reads --config.* overrides from sys.argv when the --config flag is defined and parsed
  sys.argv = [f"txf {name}"] + args
  if any(a in HELP_FLAGS for a in args):
    print(command_help(name))
    sys.exit(0)
  define_flags(name, args, verbose_errors)
  # what app.run sets up before it parses: absl's log handler (a config file's log lines while it
  # loads keep absl's format) and absl's own help flags (--helpxml, -?)
  absl_logging.use_absl_handler()
  app.define_help_flags()
  rest = parse_flags(sys.argv, name, verbose_errors)
  module = command_module(name)
  app.run(_prepare(common.guarded(module.main)), argv=sys.argv, flags_parser=lambda _: rest)


def command_module(name: str):
  """The module that runs command ``name`` (its ``main(argv)``), imported only once its flags have
  parsed: it imports the machinery (jax and the layers below), seconds of start-up. The one place
  the command line imports a command's module."""
  try:
    return importlib.import_module(COMMANDS[name].module)
  except ModuleNotFoundError as e:
    if e.name and e.name.startswith("txf.commands"):
      common.fail(f"the {name!r} command is not available in this build")
    raise


if __name__ == "__main__":
  main()
