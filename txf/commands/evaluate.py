"""``txf eval --workdir runs/x [--split test] [--beam 4] [--alpha 0.6] [--params params_avg5.msgpack]
[--output report.json] [--max_examples N] [--max_extra 50] [--batch_size 32]``.

Writes a JSON report to --output (default workdir/eval_<split>.json) and prints it:
translation: sacreBLEU and chrF on detokenized text (with their signatures) and exact match;
classification: accuracy; language models: perplexity and loss in nats per token. Every family also
reports the teacher-forced loss and accuracy (see txf.inference.evaluate_split).
"""

import json
import os
import sys

from absl import flags

from txf import inference
from txf import workdir as workdir_lib
from txf.errors import TxfError

flags.DEFINE_string("workdir", None, "run directory of a trained run", required=True)
flags.DEFINE_string("split", None, "split to evaluate (default: the run's config.data.test_split)")
flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack), e.g. "
                    "params_avg5.msgpack from `txf average-checkpoints`, or a path")
flags.DEFINE_string("output", None, "report path (default: <workdir>/eval_<split>.json)")
flags.DEFINE_integer("beam", None, "beam size (1 = greedy; default: the run's config.beam_size)")
flags.DEFINE_float("alpha", None, "GNMT length penalty exponent (default: the run's config.alpha)")
flags.DEFINE_integer("max_extra", None, "each output has at most source length + this many tokens "
                     "(default: the run's config.decode_max_extra)")
flags.DEFINE_integer("max_examples", 0, "evaluate only the first N examples (0 = the whole split; "
                     "synthetic tasks: 1000)")
flags.DEFINE_integer("batch_size", 32, "examples per batch (fixed shape: one compile)")


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}")
  f = flags.FLAGS
  if f.beam is not None and f.beam < 1:
    raise TxfError(f"--beam={f.beam}: the beam size must be >= 1 (1 = greedy)")
  run = inference.load_run(f.workdir, f.params)
  split = f.split or run.config.data.test_split
  report = inference.evaluate_split(
      run, split,
      beam=run.config.beam_size if f.beam is None else f.beam,
      alpha=run.config.alpha if f.alpha is None else f.alpha,
      max_extra=run.config.decode_max_extra if f.max_extra is None else f.max_extra,
      max_examples=f.max_examples, batch_size=f.batch_size)
  path = f.output or os.path.join(f.workdir, f"eval_{split}.json")
  if os.path.dirname(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
  workdir_lib.write_json(path, report)
  print(json.dumps(report, indent=2, sort_keys=True))
  print(f"report written to {path}", file=sys.stderr)
