"""The ``txf`` command: ``txf <command> [flags]``. Each command lives in txf/commands/<name>.py.

Commands define their own absl flags at import, so only the chosen command's module is imported.
Errors a user can fix (bad config, occupied workdir, missing file, bad data) print one clear
message and exit with status 2; nothing deeper than that is shown unless --verbose_errors.
"""

import importlib
import os
import sys

COMMANDS = {
    "train": ("txf.commands.train", "train a model from an experiment config"),
    "translate": ("txf.commands.translate", "translate lines with a trained run (stdin or --input)"),
    "classify": ("txf.commands.classify", "label lines with a trained classifier (stdin or --input)"),
    "eval": ("txf.commands.evaluate", "evaluate a trained run on a split: BLEU/chrF, accuracy, perplexity"),
    "generate": ("txf.commands.generate", "sample text from a trained language model"),
    "average-checkpoints": ("txf.commands.average", "average the parameters of the last N checkpoints"),
    "bench": ("txf.commands.bench", "benchmark train-step and decode speed"),
    "info": ("txf.commands.info", "print jax, devices, CPU features and the malloc in use"),
    "plan": ("txf.commands.plan", "size a job before launch: per-device memory and step time on N devices"),
}


def usage() -> str:
  lines = ["usage: txf <command> [flags]   (txf <command> --help for its flags)", "", "commands:"]
  lines += [f"  {name:<20} {help_}" for name, (_, help_) in COMMANDS.items()]
  return "\n".join(lines)


def main(argv=None) -> None:
  if argv is None:  # the console script / python -m txf.cli (not an in-process call)
    from txf import runtime
    try:
      runtime.maybe_reexec_with_tcmalloc(list(sys.argv))
    except ValueError as e:
      print(f"txf: {e}", file=sys.stderr)
      sys.exit(2)
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(usage())
    sys.exit(0 if len(argv) >= 2 else 2)
  name = argv[1]
  if name not in COMMANDS:
    print(f"txf: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
    sys.exit(2)
  try:
    module = importlib.import_module(COMMANDS[name][0])
  except ModuleNotFoundError as e:
    if e.name and e.name.startswith("txf.commands"):
      print(f"txf: the {name!r} command is not available in this build", file=sys.stderr)
      sys.exit(2)
    raise
  from absl import app
  from txf.commands import common
  app.run(common.guarded(module.main), argv=[f"txf {name}"] + argv[2:])


if __name__ == "__main__":
  main()
