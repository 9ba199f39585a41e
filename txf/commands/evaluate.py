"""Runs ``txf eval``; its usage text and flags are declared in txf.commands.declared.evaluate
(``txf eval --help``), which txf/cli.py parses before importing this module."""

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
