"""txf.train.metrics.MetricWriter when TensorBoard's event writer thread dies (a write of its
failed on a full disk): the run neither waits forever on the thread's queue nor loses its rows.
Found by the chaos run (bench/chaos.py) on Multi30k: the disk filled, the thread died, and the
next metrics row waited on a full queue of 10 events until the scheduler's time limit."""

import errno
import json
import threading

import pytest

from txf.runtime.workdir import DiskError
from txf.train.metrics import MetricWriter


def _full(*args, **kwargs):
  raise OSError(errno.ENOSPC, "No space left on device")


def _within(seconds, fn):
  """fn() in a thread; returns what it returned or raised, or fails the test when it is still
  running after ``seconds`` (the hang this file is about)."""
  out = {}

  def run():
    try:
      out["value"] = fn()
    except BaseException as e:  # pylint: disable=broad-except  # handed back to the test
      out["error"] = e

  worker = threading.Thread(target=run, daemon=True)
  worker.start()
  worker.join(seconds)
  assert not worker.is_alive(), f"still waiting after {seconds} s"
  return out


@pytest.fixture
def quiet_threads(monkeypatch):
  """The dying event thread's traceback is not printed (txf's commands set the same up)."""
  monkeypatch.setattr(threading, "excepthook", lambda args: None)


def _kill_event_thread(writer, disk_still_full: bool) -> None:
  events = writer._tb.file_writer.event_writer._ev_writer  # pylint: disable=protected-access
  events.write_event = _full      # the thread's next write fails: it dies
  if disk_still_full:
    events.flush = _full
  worker = writer._tb.file_writer.event_writer._worker  # pylint: disable=protected-access
  writer._tb.add_scalar("probe", 0.0, 0)  # pylint: disable=protected-access
  worker.join(10)
  assert not worker.is_alive()


def test_a_full_disk_that_killed_the_event_thread_is_the_disk_error_not_a_hang(tmp_path, quiet_threads):
  writer = MetricWriter(str(tmp_path))
  writer.write(1, "train", {"loss": 1.0})
  _kill_event_thread(writer, disk_still_full=True)

  def rows():  # more events than the thread's queue holds (10)
    for step in range(2, 30):
      writer.write(step, "train", {"loss": 1.0 / step, "accuracy": 0.5})

  out = _within(30, rows)
  assert isinstance(out.get("error"), DiskError), out
  assert "tensorboard" in str(out["error"])
  # closing neither waits on the dead thread nor raises more than the disk's error; the close
  # tensorboardX makes at interpreter exit (after the run's one line) raises nothing
  closed = _within(30, writer.close)
  assert isinstance(closed.get("error", DiskError("")), DiskError), closed
  assert "error" not in _within(30, writer._tb.file_writer.event_writer.close)  # pylint: disable=protected-access


def test_an_event_thread_that_died_while_the_disk_has_room_again_ends_tensorboard_with_a_warning(
    tmp_path, quiet_threads, capsys):
  writer = MetricWriter(str(tmp_path))
  _kill_event_thread(writer, disk_still_full=False)

  def rows():
    for step in range(1, 30):
      writer.write(step, "train", {"loss": 1.0 / step, "accuracy": 0.5})
    writer.write_text("samples", "a b c", 29)

  assert "error" not in _within(30, rows)
  warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("txf: warning:")]
  assert len(warnings) == 1 and "TensorBoard" in warnings[0], warnings
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in lines] == list(range(1, 30))
  assert "error" not in _within(30, writer.close)
