"""``txf eval --workdir runs/x [--split test] [--data_path DIR] [--beam 4] [--alpha 0.6] [--params params_avg5.msgpack]
[--output report.json] [--max_examples N] [--max_extra 50] [--length_bucket 8] [--batch_size 32] [--bleu sacrebleu|tok-lc]``.

Writes a JSON report to --output (default workdir/eval_<split>.json; checked writable before the
evaluation runs) and prints it:
translation: BLEU under --bleu (sacrebleu: cased detokenized, or tok-lc: lowercased Moses tokens, as
multi-bleu.perl), chrF on detokenized text (with their signatures) and exact match;
classification: accuracy; language models: perplexity and loss in nats per token. Every family also
reports the teacher-forced loss and accuracy (see txf.inference.evaluate_split). The data is read
only for the split scored: from the run's config, or --data_path when it has moved. Evaluations
longer than a few seconds print progress to stderr.
"""

import json
import os
import sys
import tempfile

from absl import flags

from txf import inference
from txf.commands import terminal
from txf.runtime import storage
from txf.runtime import workdir as workdir_lib
from txf.data.base import DataError
from txf.decode import DecodingSpec
from txf.core.errors import TxfError

flags.DEFINE_string("workdir", None, "run directory of a trained run", required=True)
flags.DEFINE_string("split", None, "split to evaluate (default: the run's config.data.test_split, "
                    "or its eval_split when the data has no test split)")
flags.DEFINE_string("data_path", None, "where the run's data is now, if it moved: the dataset's "
                    "folder, or the folder holding it by name (like data.path); tfds sources: the "
                    "prepared-data directory (default: the run's config)")
flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack), e.g. "
                    "params_avg5.msgpack from `txf average-checkpoints`, or a path")
flags.DEFINE_string("output", None, "report path (default: <workdir>/eval_<split>.json)")
flags.DEFINE_enum("bleu", None, ["sacrebleu", "tok-lc"], "BLEU protocol (default: the run's "
                  "config.bleu_protocol): sacrebleu = cased detokenized text, sacreBLEU's 13a "
                  "tokenizer, WMT practice; tok-lc = lowercased, punctuation-normalised, Moses-"
                  "tokenized text scored on its tokens, multi-bleu.perl, the Multi30k papers")
flags.DEFINE_integer("beam", None, "beam size (1 = greedy; default: the run's config.beam_size)")
flags.DEFINE_float("alpha", None, "the length penalty's exponent, of the run's length_penalty kind "
                  "(gnmt: ((5 + L) / 6) ** alpha; power: L ** alpha; default: the run's config.alpha)")
flags.DEFINE_enum("decode_dtype", None, ["float32", "bfloat16"], "decode with the weights cast to "
                  "this dtype (default: the run's config.decode_dtype, else its own); bfloat16 is "
                  "faster on a CPU with AVX512-BF16 (txf info), its outputs may differ a little")
flags.DEFINE_integer("max_extra", None, "each output has at most source length + this many tokens "
                     "(default: the run's config.decode_max_extra)")
flags.DEFINE_integer("max_examples", 0, "evaluate only the first N examples (0 = the whole split; "
                     "synthetic tasks: 1000)")
flags.DEFINE_integer("length_bucket", None, "sentences are decoded longest first, each batch padded "
                     "to its longest source rounded up to a multiple of this (a compile per shape); "
                     "0 = one fixed shape in the data's order (default: the run's "
                     "config.decode_length_bucket, 8)")
flags.DEFINE_integer("batch_size", 32, "examples per batch")
flags.DEFINE_float("progress_every", 10.0, "an evaluation that runs over 5 s prints progress to "
                   "stderr at most every this many seconds (0: after every batch, from the start)")


def _one_line(e: Exception) -> str:
  return " ".join(str(e).split())


def eval_advice(message: str) -> str:
  """A data error's advice in txf eval's own flags: eval takes no --config.FIELD overrides; its
  --data_path is the run's data.path (the folder holding the dataset, or the dataset's own)."""
  return message.replace("set --config.data.path=", "pass --data_path=").replace(
      "--config.data.path=", "--data_path=")


def _split(run, wanted):
  """The split to score, checked against the data (opened here, from the run's data or
  --data_path): a missing split or missing data is a TxfError naming --data_path."""
  try:
    split = wanted or inference.default_split(run)
    names = inference.split_names(run.task)
    if names is not None:
      run.task.split_name(split)
  except DataError as e:
    raise TxfError(f"txf eval reads the split it scores from the run's data (data.source="
                   f"{run.config.data.source!r}): {eval_advice(_one_line(e))}; if the data has moved, "
                   f"pass --data_path=/where/it/is/now") from None
  return split


def check_writable(path: str) -> None:
  """TxfError, before any work, when the report cannot be written at ``path`` (local; a bucket's
  path is checked for its file system package, and written at the end)."""
  if not storage.is_local(path):
    storage.check_filesystem(path, "--output")
    return
  folder = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(folder, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".txf-eval-probe-"):
      pass
  except OSError as e:
    raise TxfError(f"cannot write the report to {path} ({e.strerror or e}): pass "
                   f"--output=/a/writable/path/report.json") from None


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}")
  f = flags.FLAGS
  if f.beam is not None and f.beam < 1:
    raise TxfError(f"--beam={f.beam}: the beam size must be >= 1 (1 = greedy)")
  if f.progress_every < 0:
    raise TxfError(f"--progress_every={f.progress_every} must be >= 0")
  run = terminal.load_run(f.workdir, f.params, data_path=f.data_path)
  split = _split(run, f.split)
  path = f.output or workdir_lib.path_of(f.workdir, workdir_lib.eval_report_name(split))
  check_writable(path)
  report = inference.evaluate_split(
      run, split,
      DecodingSpec.from_config(run.config, beam_size=f.beam, alpha=f.alpha, max_extra=f.max_extra,
                               length_bucket=f.length_bucket,
                               weights_dtype=f.decode_dtype),
      max_examples=f.max_examples, batch_size=f.batch_size, warn=terminal.warn_stderr,
      progress=terminal.Progress(after_s=min(5.0, f.progress_every), every_s=f.progress_every),
      bleu_protocol=f.bleu or run.config.bleu_protocol)
  workdir_lib.write_json(path, report, elsewhere="--output")
  print(json.dumps(report, indent=2, sort_keys=True))
  print(f"report written to {path}", file=sys.stderr)
