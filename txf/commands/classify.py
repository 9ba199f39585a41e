"""``txf classify --workdir runs/sst2 [--input FILE] [--output FILE] [--params params_best.msgpack]
[--batch_size 64]``.

Reads lines (stdin or --input) and writes, per line, ``label<TAB>probability`` (the most probable
class and its softmax probability; stdout or --output), in order: empty lines stay empty, so line
counts always match. Lines longer than the model's data.max_input_len tokens are truncated with a
warning on stderr naming the line. Only the workdir is read (tokenizer, task.json, config,
parameters), not the training data. On a terminal each typed line is answered at once; from a file
or a pipe lines are batched.
"""

import sys
import time

from absl import flags

from txf import inference
from txf.commands import terminal
from txf.core.errors import TxfError

flags.DEFINE_string("workdir", None, "run directory of a trained encoder_classifier run", required=True)
flags.DEFINE_string("input", None, "file to classify, one text per line (default: stdin)")
flags.DEFINE_string("output", None, "where to write label<TAB>probability lines (default: stdout)")
flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack), e.g. "
                    "params_best.msgpack from `txf average-checkpoints --step best`, or a path")
flags.DEFINE_integer("batch_size", 64, "lines classified together (a fixed batch shape: one compile)")


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
