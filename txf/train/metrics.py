"""Metrics to metrics.jsonl (one JSON object per logged point), TensorBoard event files and,
with ``config.tracker="wandb"``, Weights & Biases.

TensorBoard files are written with tensorboardX (no TensorFlow): scalars per split, the run's
config (text and hparams) and eval samples (text). Only process 0 writes.

Weights & Biases (an optional extra: ``pip install 'txf[wandb]'``) gets the same rows as
metrics.jsonl, each number as ``SPLIT/KEY`` at its step, and the run's config. The W&B run id is
kept in the workdir (``wandb.json``): a resumed run logs to the same W&B run (``resume="allow"``),
and steps it logs again after its checkpoint, which W&B already has, are not sent twice.
``wandb.init`` takes WANDB_MODE (e.g. offline), WANDB_PROJECT (default "txf"), WANDB_DIR (default:
the workdir) and WANDB_NAME (default: the workdir's last two path parts) from the environment.

In a bucket workdir (gs://...) an object cannot be appended to: metrics.jsonl is kept in memory and
uploaded whole at each row, and the event files are written in a local temporary folder and copied
up to ``tensorboard/`` at ``flush``/``close`` and at most every ``TB_UPLOAD_SECONDS`` while writing.
"""

import contextlib
import json
import os
import queue
import secrets
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, Optional

import numpy as np

from txf.core.errors import TxfError
from txf.runtime.storage import is_local, read_text, upload_tree, write_bytes, wpath
from txf.runtime.workdir import METRICS_FILE, TENSORBOARD_DIR, WANDB_RUN_FILE, disk_errors, path_of, write_json

TB_UPLOAD_SECONDS = 60.0  # a bucket workdir's event files are copied up at most this often while writing


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without torch (tensorboardX imports torch when it is
  installed, only to accept torch tensors, which txf never logs: a broken torch install must not
  stop a run); None, with one ``txf: warning:`` line, when the import fails all the same."""
  hidden = "torch" not in sys.modules
  if hidden:
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    return SummaryWriter
  except Exception as e:  # pylint: disable=broad-except  # an optional writer: warn, go on
    first = (str(e).strip().splitlines() or [""])[0][:200]
    print(f"txf: warning: TensorBoard logging is off: importing tensorboardX failed "
          f"({type(e).__name__}: {first}); metrics.jsonl is written as usual", file=sys.stderr,
          flush=True)
    return None
  finally:
    if hidden and sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]


class MetricWriter:
  """``write(step, split, metrics)`` appends {"step", "split", **metrics} to metrics.jsonl and logs
  scalars (TensorBoard; and Weights & Biases with ``tracker="wandb"``, given the run's config dict)."""

  def __init__(self, workdir: str, enabled: bool = True, tensorboard: bool = True,
               tracker: str = "none", run_config: Optional[Dict] = None):
    self.enabled = enabled
    self._wandb = start_wandb(workdir, run_config or {}) if enabled and tracker == "wandb" else None
    self.path = path_of(workdir, METRICS_FILE)
    self.local = is_local(workdir)
    self._text = None  # a bucket workdir's metrics.jsonl, read once
    self._tb = None
    self._tb_target = path_of(workdir, TENSORBOARD_DIR)
    self._tb_local = None  # a bucket workdir's local event folder
    self._uploaded = time.monotonic()
    if enabled and tensorboard:
      writer = _summary_writer_class()
      if writer is not None:
        if not self.local:
          self._tb_local = tempfile.mkdtemp(prefix="txf-tensorboard-")
        self._tb = writer(self._tb_local or self._tb_target)
        _guard_event_writer(self._tb._get_file_writer())  # pylint: disable=protected-access

  def _bucket_text(self) -> str:
    """A bucket workdir's metrics.jsonl as it is now (read from the bucket once)."""
    if self._text is None:
      self._text = read_text(self.path) if wpath(self.path).exists() else ""
    return self._text

  def _upload_events(self) -> None:
    """Copy a bucket workdir's event files up to ``tensorboard/`` (whole files)."""
    if self._tb_local is not None:
      upload_tree(self._tb_local, self._tb_target)
      self._uploaded = time.monotonic()

  def write(self, step: int, split: str, metrics: Dict[str, float]) -> Dict:
    row = {"step": int(step), "split": split}
    row.update({k: (float(v) if isinstance(v, (np.floating, np.integer, float, int)) or np.ndim(v) == 0 else v)
                for k, v in metrics.items()})
    if not self.enabled:
      return row
    with disk_errors(self.path):
      if self.local:
        with open(self.path, "a") as f:
          f.write(json.dumps(row) + "\n")
      else:
        self._text = self._bucket_text() + json.dumps(row) + "\n"
        write_bytes(self.path, self._text.encode("utf-8"))
    if self._tb is not None:
      with self._event_writes():
        for k, v in row.items():
          if k not in ("step", "split") and isinstance(v, float):
            self._tb.add_scalar(f"{split}/{k}", v, step)
      if self._tb_local is not None and time.monotonic() - self._uploaded > TB_UPLOAD_SECONDS:
        self._tb.flush()
        self._upload_events()
    if self._wandb is not None:
      numbers = {f"{split}/{k}": v for k, v in row.items()
                 if k not in ("step", "split") and isinstance(v, float)}
      if step >= (self._wandb.step or 0):  # a resumed run's re-logged steps: W&B has them
        self._wandb.log(numbers, step=int(step))
    return row

  @contextlib.contextmanager
  def _event_writes(self):
    """Run TensorBoard writes; when its writer thread has died, end TensorBoard logging there
    (``_writer_stopped``) instead of raising."""
    try:
      yield
    except _WriterStopped:
      self._writer_stopped()

  def _writer_stopped(self) -> None:
    """TensorBoard's writer thread has died (a write of its failed: a full disk). Flush its file
    here, which raises the disk's error as the run's one ``txf: error:`` line (``disk_errors``);
    when that flush succeeds (the disk has room again), TensorBoard logging ends with one warning
    and metrics.jsonl goes on."""
    target = self._tb_local or self._tb_target
    with disk_errors(target):
      self._tb._get_file_writer().event_writer._ev_writer.flush()  # pylint: disable=protected-access
    print(f"txf: warning: TensorBoard's event writer stopped (writing {target} failed); "
          "metrics.jsonl is written as usual", file=sys.stderr, flush=True)
    self._tb = None

  def write_text(self, tag: str, text: str, step: int) -> None:
    """Log ``text`` to TensorBoard's Text tab under ``tag`` (shown as preformatted lines)."""
    if self.enabled and self._tb is not None:
      with self._event_writes():
        self._tb.add_text(tag, "\n".join("    " + line for line in text.splitlines()), step)

  def write_config(self, config: Dict, step: int = 0) -> None:
    """Log a run's config to TensorBoard: the whole JSON as text (tag ``config``) and its flat
    scalar fields as hparams (the HParams tab)."""
    if not (self.enabled and self._tb is not None):
      return
    from tensorboardX.summary import hparams  # beside SummaryWriter: imported only when writing
    self.write_text("config", json.dumps(config, indent=2, sort_keys=True), step)
    if self._tb is None:  # its writer stopped
      return
    flat = {}

    def walk(prefix, node):
      for k, v in node.items():
        if isinstance(v, dict):
          walk(f"{prefix}{k}.", v)
        elif isinstance(v, (bool, int, float, str)):
          flat[prefix + k] = v
    walk("", config)
    with self._event_writes():
      for summary in hparams(flat, {}):  # experiment, session start, session end
        self._tb.file_writer.add_summary(summary, step)

  def truncate_after(self, step: int) -> None:
    """Drop rows logged after ``step`` (a resumed run re-logs them exactly)."""
    if not (self.enabled and wpath(self.path).exists()):
      return
    def keep(line: str) -> bool:
      try:
        return json.loads(line)["step"] <= step
      except ValueError:  # a line cut short by a killed process
        return False

    if not self.local:
      self._text = "".join(line + "\n" for line in self._bucket_text().splitlines()
                           if line.strip() and keep(line))
      write_bytes(self.path, self._text.encode("utf-8"))
      return
    with open(self.path) as f:
      rows = [line.rstrip("\n") + "\n" for line in f if line.strip() and keep(line)]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(rows)
    os.replace(tmp, self.path)

  def flush(self):
    """Write the pending event records (and copy a bucket workdir's event files up)."""
    if self._tb is not None:
      self._tb.flush()
      self._upload_events()

  def close(self):
    """Close the event writer (a bucket workdir's event files are copied up, the local copy removed)
    and finish the W&B run."""
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None
    if self._tb is not None:
      with disk_errors(self._tb_local or self._tb_target):
        self._tb.close()
    if self._tb_local is not None:
      self._upload_events()
      shutil.rmtree(self._tb_local, ignore_errors=True)
      self._tb, self._tb_local = None, None


class _WriterStopped(Exception):
  """TensorBoard's event writer thread is no longer running: its queue is never emptied again."""


def _guard_event_writer(file_writer) -> None:
  """Keep tensorboardX's event writer from hanging or printing when a write of its fails (a full
  disk). It hands each event to a thread through a queue of 10; when that thread dies, the queue
  fills and the next ``add_event`` waits forever, and ``close`` (the run's, or tensorboardX's own
  at interpreter exit, after the run's one-line error) raises or waits too. ``add_event`` now waits
  at most a second at a time and raises ``_WriterStopped`` once the thread has ended; ``close``
  drops a disk error and does not wait on a dead thread: the events it could not write are lost
  either way."""
  event_writer = getattr(file_writer, "event_writer", None)
  events = getattr(event_writer, "_event_queue", None)
  if events is None:
    return
  close = event_writer.close

  def dead() -> bool:
    worker = getattr(event_writer, "_worker", None)
    return worker is None or not worker.is_alive()

  def add_event(event) -> None:
    while not event_writer._closed:  # pylint: disable=protected-access
      if dead():
        raise _WriterStopped()
      try:
        events.put(event, timeout=1.0)
        return
      except queue.Full:
        continue

  def end_without_the_thread() -> None:
    try:
      event_writer._ev_writer.close()  # pylint: disable=protected-access
    except OSError:
      pass
    event_writer._worker, event_writer._closed = None, True  # pylint: disable=protected-access

  def close_dropping_disk_errors() -> None:
    if event_writer._closed:  # pylint: disable=protected-access
      return
    if dead():
      end_without_the_thread()
      return
    try:
      close()
    except OSError:  # the final flush met the full disk: end the writer's thread as close would
      if not dead():
        event_writer._worker.stop()  # pylint: disable=protected-access
      end_without_the_thread()

  event_writer.add_event = add_event
  event_writer.close = close_dropping_disk_errors


def start_wandb(workdir: str, run_config: Dict[str, Any]):
  """``wandb.init`` for the run in ``workdir``: the id stored in workdir/wandb.json (a new one is
  made and stored on the first start), ``resume="allow"``, the run's config; mode, project, folder
  and name from WANDB_MODE, WANDB_PROJECT, WANDB_DIR, WANDB_NAME (module doc). Returns the W&B run.
  Raises TxfError when wandb is not installed or its init fails (not logged in, offline network)."""
  try:
    import wandb  # an optional extra, imported only when a run uses it
  except ImportError as e:
    raise TxfError("tracker='wandb' needs the wandb package, which is not installed: "
                   "pip install 'txf[wandb]' (or set tracker=none)") from e
  path = path_of(workdir, WANDB_RUN_FILE)
  stored = json.loads(read_text(path)) if wpath(path).exists() else {}
  run_id = stored.get("id")
  if not run_id:
    run_id = secrets.token_hex(4)  # 8 characters, as W&B's own ids
    write_json(path, {"id": run_id})
  local = is_local(workdir)
  name = "/".join(os.path.abspath(workdir).split(os.sep)[-2:]) if local else workdir.rstrip("/")
  try:
    return wandb.init(id=run_id, resume="allow", config=run_config,
                      project=os.environ.get("WANDB_PROJECT") or "txf",
                      name=os.environ.get("WANDB_NAME") or name,
                      mode=os.environ.get("WANDB_MODE") or None,
                      dir=os.environ.get("WANDB_DIR") or (workdir if local else None))
  except wandb.errors.Error as e:  # not logged in, no network, a bad project: the user's to fix
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise TxfError(f"tracker='wandb': wandb.init failed: {first} (log in with `wandb login`, or "
                   f"run offline with WANDB_MODE=offline and upload later with `wandb sync`)") from e
