"""Runs ``txf translate``; its usage text and flags are declared in txf.commands.declared.translate
(``txf translate --help``), which txf/cli.py parses before importing this module."""

import sys
import time

from absl import flags

from txf import inference
from txf.commands import terminal
from txf.decode import DecodingSpec
from txf.core.errors import TxfError


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}: give the text on stdin or with --input FILE")
  f = flags.FLAGS
  if f.beam is not None and f.beam < 1:  # before loading anything
    raise TxfError(f"--beam={f.beam}: the beam size must be >= 1 (1 = greedy)")
  run = terminal.load_run(f.workdir, f.params)
  inference.require_family(run, "encoder_decoder", "translate")
  spec = DecodingSpec.from_config(run.config, beam_size=f.beam, alpha=f.alpha, max_extra=f.max_extra,
                                  length_bucket=f.length_bucket,
                                  weights_dtype=f.decode_dtype)
  inference.check_decoding_flags(spec, f.batch_size)
  if terminal.from_terminal(f.input):
    print("txf translate: type a sentence per line (Ctrl-D ends)", file=sys.stderr, flush=True)
    with terminal.answer_stream(f.output) as out:
      for line in terminal.iter_lines():
        answer = inference.translate_lines(run, [line], spec, batch_size=1,
                                           warn=terminal.warn_stderr)
        terminal.write_lines(answer, stream=out)
    return
  lines = terminal.read_lines(f.input)
  started = time.time()
  out = inference.translate_lines(run, lines, spec, f.batch_size,
                                  warn=terminal.warn_stderr)
  terminal.write_lines(out, f.output)
  seconds = time.time() - started
  empty = sum(1 for line in lines if not line.strip())
  print(f"txf translate: {len(lines)} lines ({empty} empty) in {seconds:.1f} s, {spec.describe()}, "
        f"params {run.params_path}", file=sys.stderr)
