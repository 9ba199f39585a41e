"""The library never touches the terminal: ``txf.train.train`` called in-process writes nothing to
stdout or stderr unless it is given a reporter, and hears its run through the one it is given."""

import logging
import os
import runpy
import sys

from tests.conftest import ROOT
from txf.train import train
from txf.train.report import Reporter

STEPS, LOG_EVERY = 6, 3


def _config():
  config = runpy.run_path(os.path.join(ROOT, "experiments", "copy.py"))["get_config"]()
  config.update(num_train_steps=STEPS, batch_size=8, log_every=LOG_EVERY, eval_every=0,
                checkpoint_every=0, eval_batches=1, num_samples=0, decode_examples=0)
  config.model.update(family="decoder_lm", d_model=16, d_ff=32, num_heads=2, num_decoder_layers=1)
  return config


class Recorder(Reporter):
  """Keeps every call, in order."""

  def __init__(self):
    self.calls = []

  def line(self, text):
    self.calls.append(("line", text))

  def start(self, total, done):
    self.calls.append(("start", total, done))

  def step(self, done):
    self.calls.append(("step", done))

  def train_row(self, step, total, metrics, eta_seconds):
    self.calls.append(("row", step, total, sorted(metrics)))

  def close(self):
    self.calls.append(("close",))


def test_train_in_process_writes_nothing_to_stdout_or_stderr_and_logs_its_lines(tmp_path, caplog,
                                                                                 capfd):
  stdout, stderr = sys.stdout, sys.stderr
  with caplog.at_level(logging.INFO, logger="txf.train"):
    final = train(_config(), str(tmp_path / "run"))
  assert capfd.readouterr() == ("", "")  # logged, not printed: txf adds no handler of its own
  assert sys.stdout is stdout and sys.stderr is stderr  # its streams are not replaced
  assert "loss" in final and os.path.isfile(tmp_path / "run" / "params.msgpack")
  said = [r.getMessage() for r in caplog.records if r.name == "txf.train"]
  assert said[0].startswith("txf: decoder_lm, ") and said[0].endswith(str(tmp_path / "run"))
  assert [s.split(" |")[0] for s in said if s.startswith("step ")] == ["step 3/6", "step 6/6"]


def test_a_given_reporter_hears_every_step_and_each_logged_row(tmp_path, capfd):
  seen = Recorder()
  train(_config(), str(tmp_path / "run"), report=seen)
  assert seen.calls[0][0] == "line" and seen.calls[0][1].startswith("txf: decoder_lm, ")
  assert ("start", STEPS, 0) in seen.calls
  assert [c[1] for c in seen.calls if c[0] == "step"] == list(range(1, STEPS + 1))
  rows = [c for c in seen.calls if c[0] == "row"]
  assert [(r[1], r[2]) for r in rows] == [(3, STEPS), (6, STEPS)]
  assert {"loss", "accuracy", "learning_rate"} <= set(rows[0][3])
  assert seen.calls.count(("close",)) == 1
  assert capfd.readouterr() == ("", "")
