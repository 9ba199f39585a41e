"""The inference commands' terminal: UTF-8 lines from a file or stdin (at once, or one at a time as
typed), answers to a file or stdout, ``txf: warning:`` lines and progress lines on stderr.

``txf translate``, ``txf classify``, ``txf generate`` and ``txf eval`` read and write through these;
the library (txf.inference) takes and returns lists of strings and reports through callbacks.
"""

import contextlib
import os
import sys
import time
from typing import Callable, Iterator, List, Optional, Sequence, TextIO

from txf import inference
from txf.core.errors import TxfError


def load_run(workdir: str, params_name: Optional[str] = None, data_path: Optional[str] = None):
  """``txf.inference.load_run`` for a command: anything a data preparation prints goes to stderr,
  so stdout holds the command's answers only."""
  with contextlib.redirect_stdout(sys.stderr):
    return inference.load_run(workdir, params_name, data_path)


def warn_stderr(message: str) -> None:
  """Print ``txf: warning: <message>`` on stderr (the commands' ``warn``)."""
  print(f"txf: warning: {message}", file=sys.stderr, flush=True)


def read_lines(path: Optional[str] = None, stream=None) -> List[str]:
  """Lines of a UTF-8 file (or of ``stream``/stdin when ``path`` is None or "-").

  Split on LF only (a trailing CR is dropped); a final newline does not make an extra line.
  Invalid UTF-8 raises TxfError naming the line.
  """
  if path and path != "-":
    if not os.path.isfile(path):
      raise TxfError(f"--input {path}: no such file")
    with open(path, "rb") as f:
      raw, name = f.read(), path
  else:
    stream = stream if stream is not None else sys.stdin
    raw, name = getattr(stream, "buffer", stream).read(), "stdin"
    if isinstance(raw, str):
      raw = raw.encode("utf-8")
  if not raw:
    return []
  pieces = raw.split(b"\n")
  if pieces[-1] == b"":
    pieces.pop()
  lines = []
  for lineno, piece in enumerate(pieces, 1):
    try:
      lines.append(piece.decode("utf-8").removesuffix("\r"))
    except UnicodeDecodeError as e:
      raise TxfError(f"{name}:{lineno}: not UTF-8 (byte {piece[e.start]:#04x} at column "
                     f"{e.start + 1})") from None
  return lines


def from_terminal(path: Optional[str] = None, stream=None) -> bool:
  """True when the input is stdin (``path`` None or "-") and stdin is a terminal: then the commands
  answer each line as it is typed instead of reading everything first."""
  if path and path != "-":
    return False
  stream = stream if stream is not None else sys.stdin
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False


def iter_lines(stream=None) -> Iterator[str]:
  """Lines of ``stream`` (default stdin) one at a time, as they arrive, until end of input
  (Ctrl-D on a terminal); decoded as ``read_lines`` does."""
  stream = stream if stream is not None else sys.stdin
  raw = getattr(stream, "buffer", stream)
  lineno = 0
  while True:
    piece = raw.readline()
    if not piece:
      return
    lineno += 1
    if isinstance(piece, str):
      piece = piece.encode("utf-8")
    try:
      yield piece.removesuffix(b"\n").decode("utf-8").removesuffix("\r")
    except UnicodeDecodeError as e:
      raise TxfError(f"stdin:{lineno}: not UTF-8 (byte {piece[e.start]:#04x} at column "
                     f"{e.start + 1})") from None


@contextlib.contextmanager
def answer_stream(path: Optional[str] = None):
  """The stream answers go to: the file ``path`` (opened once, UTF-8, LF) or stdout."""
  if not path or path == "-":
    yield sys.stdout
    return
  with open(path, "w", encoding="utf-8", newline="\n") as f:
    yield f


def write_lines(lines: Sequence[str], path: Optional[str] = None, stream: Optional[TextIO] = None) -> None:
  """Write one line per item (UTF-8, LF) to ``path``, or to ``stream``/stdout."""
  text = "".join(line + "\n" for line in lines)
  if path and path != "-":
    with open(path, "w", encoding="utf-8", newline="\n") as f:
      f.write(text)
    return
  stream = stream if stream is not None else sys.stdout
  if hasattr(stream, "buffer"):
    stream.flush()
    stream.buffer.write(text.encode("utf-8"))
    stream.buffer.flush()
  else:
    stream.write(text)
    stream.flush()


class Progress:
  """Progress lines of a long evaluation on stderr: ``txf eval: <what> <done>/<total> <unit>,
  <elapsed> s`` after each step once ``after_s`` seconds have passed, at most one per ``every_s``
  seconds, and a last one at the total (only if any was printed). Silent for short evaluations."""

  def __init__(self, after_s: float = 5.0, every_s: float = 10.0, stream: Optional[TextIO] = None,
               clock: Callable[[], float] = time.time):
    self.after_s, self.every_s, self.clock = after_s, every_s, clock
    self.stream = stream if stream is not None else sys.stderr
    self.started = clock()
    self._last: Optional[float] = None

  def __call__(self, what: str, done: int, total: int, unit: str) -> None:
    now = self.clock()
    if now - self.started < self.after_s and self._last is None:
      return
    if done < total and self._last is not None and now - self._last < self.every_s:
      return
    self._last = now
    print(f"txf eval: {what} {done:,}/{total:,} {unit}, {now - self.started:.0f} s",
          file=self.stream, flush=True)
