"""``txf translate --workdir runs/x [--input FILE] [--output FILE] [--beam 4] [--alpha 0.6]
[--params params_avg5.msgpack] [--max_extra 50] [--length_bucket 8] [--batch_size 32]``.

Reads lines (stdin or --input), writes one detokenized translation per line (stdout or --output),
in order: empty lines stay empty, so line counts always match. Lines longer than the model's
data.max_input_len tokens are truncated with a warning on stderr naming the line and its length.
Only the workdir is read (tokenizer, task.json, config, parameters), not the training data. On a
terminal each typed line is translated at once; from a file or a pipe lines are batched.
"""

import sys
import time

from absl import flags

from txf import inference
from txf.commands import terminal
from txf.decode import DecodingSpec
from txf.core.errors import TxfError

flags.DEFINE_string("workdir", None, "run directory of a trained encoder_decoder run", required=True)
flags.DEFINE_string("input", None, "file to translate, one sentence per line (default: stdin)")
flags.DEFINE_string("output", None, "where to write the translations (default: stdout)")
flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack), e.g. "
                    "params_avg5.msgpack from `txf average-checkpoints`, or a path")
flags.DEFINE_integer("beam", None, "beam size (1 = greedy; default: the run's config.beam_size)")
flags.DEFINE_float("alpha", None, "the length penalty's exponent, of the run's length_penalty kind "
                  "(gnmt: ((5 + L) / 6) ** alpha; power: L ** alpha; default: the run's config.alpha)")
flags.DEFINE_enum("decode_dtype", None, ["float32", "bfloat16"], "decode with the weights cast to "
                  "this dtype (default: the run's config.decode_dtype, else its own); bfloat16 is "
                  "faster on a CPU with AVX512-BF16 (txf info), its outputs may differ a little")
flags.DEFINE_integer("max_extra", None, "each output has at most source length + this many tokens "
                     "(default: the run's config.decode_max_extra, 50)")
flags.DEFINE_integer("length_bucket", None, "sentences are decoded longest first, each batch padded "
                     "to its longest source rounded up to a multiple of this (a compile per shape); "
                     "0 = one fixed shape in the data's order (default: the run's "
                     "config.decode_length_bucket, 8)")
flags.DEFINE_integer("batch_size", 32, "sentences decoded together")


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
