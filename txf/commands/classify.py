"""Runs ``txf classify``; its usage text and flags are declared in txf.commands.declared.classify
(``txf classify --help``), which txf/cli.py parses before importing this module."""

import sys
import time

from absl import flags

from txf import inference
from txf.commands import terminal
from txf.core.errors import TxfError


def _format(probs):
  """``label<TAB>probability`` per line (empty for an empty line)."""
  return ["" if p is None else f"{int(p.argmax())}\t{float(p.max()):.4f}" for p in probs]


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}: give the text on stdin or with --input FILE")
  f = flags.FLAGS
  if f.batch_size < 1:  # before loading anything
    raise TxfError(f"--batch_size={f.batch_size} must be >= 1")
  run = terminal.load_run(f.workdir, f.params)
  inference.require_family(run, "encoder_classifier", "classify")
  if terminal.from_terminal(f.input):
    print("txf classify: type a text per line (Ctrl-D ends)", file=sys.stderr, flush=True)
    with terminal.answer_stream(f.output) as out:
      for line in terminal.iter_lines():
        probs = inference.classify_lines(run, [line], 1, warn=terminal.warn_stderr)
        terminal.write_lines(_format(probs), stream=out)
    return
  lines = terminal.read_lines(f.input)
  started = time.time()
  probs = inference.classify_lines(run, lines, f.batch_size, warn=terminal.warn_stderr)
  out = _format(probs)
  terminal.write_lines(out, f.output)
  print(f"txf classify: {len(lines)} lines ({sum(p is None for p in probs)} empty) in "
        f"{time.time() - started:.1f} s, params {run.params_path}", file=sys.stderr)
