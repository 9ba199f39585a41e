"""What a failure prints beside txf's own line: the event-loop tracebacks of a failed background
checkpoint write are dropped from stderr, and a broken optional package (a half-installed torch,
which tensorboardX imports) is one warning, not a failed run."""

import os
import subprocess
import sys
import threading

import pytest

from tests.conftest import ROOT
from txf.commands import reporting

NOISE = ("Traceback (most recent call last):\n"
         '  File "/usr/lib/python3.11/asyncio/base_events.py", line 806, in call_soon_threadsafe\n'
         "    self._check_closed()\n"
         '  File "/usr/lib/python3.11/asyncio/base_events.py", line 519, in _check_closed\n'
         "    raise RuntimeError('Event loop is closed')\n"
         "RuntimeError: Event loop is closed\n")
BUG = ("Traceback (most recent call last):\n"
       '  File "/work/txf/train/loop.py", line 12, in train\n'
       "    raise RuntimeError('Event loop is closed')\n"
       "RuntimeError: Event loop is closed\n")


class Sink:
  def __init__(self):
    self.text = ""

  def write(self, text):
    self.text += text
    return len(text)

  def flush(self):
    pass


def pieces(text):
  """The way the interpreter prints a traceback: header, each line, the type, ': ', the message."""
  head, _, last = text[:-1].rpartition("\n")
  kind, _, message = last.partition(": ")
  return [line + "\n" for line in head.split("\n")] + [kind, ": ", message, "\n"]


def test_closed_loop_tracebacks_are_dropped_and_everything_else_kept_in_order():
  sink = Sink()
  stream = reporting._WithoutClosedLoopNoise(sink)
  stream.write("step 10: loss 1.0\n")
  for piece in pieces(NOISE):
    stream.write(piece)
  for piece in pieces(BUG):  # the same error from txf's own code is no noise
    stream.write(piece)
  stream.write("txf: error: saving a checkpoint ...\n")
  assert sink.text == "step 10: loss 1.0\n" + BUG + "txf: error: saving a checkpoint ...\n"


def test_tracebacks_of_several_threads_are_held_per_thread():
  sink = Sink()
  stream = reporting._WithoutClosedLoopNoise(sink)
  parts = pieces(NOISE)
  barrier = threading.Barrier(2)

  def printer():
    for piece in parts:
      barrier.wait()      # the two threads alternate piece by piece
      stream.write(piece)

  threads = [threading.Thread(target=printer) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  stream.write("done\n")
  assert sink.text == "done\n"


def run_python(code, tmp_path, **env):
  full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT]), **env}
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        env=full, cwd=str(tmp_path))


WRITE = ("import sys\n"
         "from txf.train.metrics import MetricWriter\n"
         "w = MetricWriter(sys.argv[0] if False else '.')\n"
         "w.write(1, 'train', {'loss': 2.0})\n"
         "print('torch imported:', 'torch' in sys.modules and sys.modules['torch'] is not None)\n"
         "print('tensorboard:', w._tb is not None)\n")


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_the_tensorboard_writer_does_not_import_torch(tmp_path):
  r = run_python(WRITE, tmp_path)
  assert r.returncode == 0, r.stderr
  assert "torch imported: False" in r.stdout and "tensorboard: True" in r.stdout
  assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_a_broken_tensorboardx_is_one_warning_and_the_metrics_are_written(tmp_path):
  broken = tmp_path / "tensorboardX"
  broken.mkdir()
  (broken / "__init__.py").write_text("raise OSError('libtorch_cpu.so: cannot open shared object file')\n")
  r = run_python(WRITE, tmp_path)
  assert r.returncode == 0, r.stderr
  assert "tensorboard: False" in r.stdout
  warning = [line for line in r.stderr.splitlines() if "TensorBoard logging is off" in line]
  assert len(warning) == 1 and "OSError: libtorch_cpu.so" in warning[0], r.stderr
  assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1
