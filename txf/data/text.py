"""Readers for local text data, with the bad-data checks: parallel text, labelled TSV, plain text.

Every problem is either a ``DataError`` (a ``ValueError`` whose message names the file, the line and
the fix) or a counted skip that is logged with its line numbers -- never a silent misalignment:

  missing file / directory        DataError naming the path (and the config field / env var)
  mismatched parallel line counts DataError naming both files and both counts
  non-UTF-8 bytes                 DataError naming file:line and the offending byte
  TSV row without a label         DataError naming file:line
  empty line (either side)        skipped, counted, logged (the pair is skipped on both sides)
  over-long line (> max chars)    skipped, counted, logged

Lines are split on LF only (``\\n``; a trailing ``\\r`` is dropped), never with ``str.splitlines``,
which would also split on form feeds, U+2028 and friends and shift one side of a parallel corpus.
A TAB inside parallel text is just a character (multi30k train.de line 7366 has one).
"""

import dataclasses
import os
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from absl import logging

from txf.data.base import DataError

TEXT_DATA_ENV = "TXF_DATA"          # root of text:NAME sources when data.path is ""
_MAX_LISTED = 5                     # line numbers quoted per skip reason


@dataclasses.dataclass
class SkipStats:
  """Counted skips of one file (or file pair): reason -> count, and the first line numbers."""
  name: str
  total: int = 0
  skipped: Dict[str, int] = dataclasses.field(default_factory=dict)
  lines: Dict[str, List[int]] = dataclasses.field(default_factory=dict)

  def skip(self, reason: str, lineno: int) -> None:
    """Count one skipped line (1-based ``lineno``) under ``reason``."""
    self.skipped[reason] = self.skipped.get(reason, 0) + 1
    listed = self.lines.setdefault(reason, [])
    if len(listed) < _MAX_LISTED:
      listed.append(lineno)

  def log(self) -> None:
    """One warning line per file if anything was skipped."""
    if not self.skipped:
      return
    parts = [f"{n} {reason} (lines {', '.join(map(str, self.lines[reason]))}"
             f"{', ...' if n > len(self.lines[reason]) else ''})"
             for reason, n in sorted(self.skipped.items())]
    logging.warning("%s: skipped %d of %d lines: %s", self.name, sum(self.skipped.values()),
                    self.total, "; ".join(parts))

  def as_dict(self) -> Dict[str, int]:
    """JSON-friendly counts: {"total": n, "<reason>": n, ...}."""
    return {"total": self.total, **self.skipped}


def resolve_text_dir(name_or_dir: str, data_path: str, env: Optional[Mapping[str, str]] = None
                     ) -> str:
  """The directory of a ``text:`` source.

  A bare name (``multi30k``) is looked up under ``data_path`` (config ``data.path``), or under the
  ``TXF_DATA`` environment variable when ``data_path`` is ""; anything with a path separator (or
  starting with ``.`` or ``~``) is used as given. Raises DataError naming the path, the field and
  the variable when it does not exist.
  """
  env = os.environ if env is None else env
  if not name_or_dir:
    raise DataError("data.source='text:' needs a directory or a dataset name, e.g. text:multi30k")
  explicit = (os.sep in name_or_dir or name_or_dir.startswith((".", "~"))
              or os.path.isabs(name_or_dir))
  if explicit:
    path, how = os.path.expanduser(name_or_dir), "as given in data.source"
  else:
    root = data_path or env.get(TEXT_DATA_ENV, "")
    if not root:
      raise DataError(
          f"data.source='text:{name_or_dir}' names a dataset under the data root, but data.path is "
          f"\"\" and the {TEXT_DATA_ENV} environment variable is not set: set "
          f"--config.data.path=/path/to/data or export {TEXT_DATA_ENV}=/path/to/data "
          f"(in this checkout: {TEXT_DATA_ENV}=../shared/data)")
    how = "from data.path" if data_path else f"from the {TEXT_DATA_ENV} environment variable"
    path = os.path.join(os.path.expanduser(root), name_or_dir)
  if not os.path.isdir(path):
    raise DataError(
        f"text data directory {path!r} does not exist (resolved {how}): point data.path or "
        f"{TEXT_DATA_ENV} at the folder that contains '{os.path.basename(path)}', or give a "
        f"directory, e.g. data.source='text:/abs/path/{os.path.basename(path)}'")
  return os.path.abspath(path)


def require_file(path: str, what: str) -> str:
  """``path`` if it is a file, else a DataError naming it and listing its folder."""
  if os.path.isfile(path):
    return path
  folder = os.path.dirname(path) or "."
  listing = sorted(os.listdir(folder))[:20] if os.path.isdir(folder) else []
  raise DataError(f"missing {what} file {path!r}; the folder holds {listing}: check "
                  f"data.format, the split names (data.train_split/eval_split/test_split) and "
                  f"the languages (data.src_lang/tgt_lang)")


def count_lines(path: str) -> int:
  """Lines in a file as ``iter_lines`` counts them (a last line without LF counts)."""
  n, last = 0, b"\n"
  with open(require_file(path, "text"), "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      n += chunk.count(b"\n")
      last = chunk[-1:]
  return n + (last != b"\n")


def _decode(raw: bytes, path: str, lineno: int) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    bad = raw[e.start:e.start + 1].hex()
    raise DataError(
        f"{path}:{lineno}: not UTF-8 (byte 0x{bad} at column {e.start + 1}): re-encode the file as "
        f"UTF-8, e.g. iconv -f cp1252 -t utf-8 {os.path.basename(path)} > fixed && mv fixed "
        f"{os.path.basename(path)}") from None


def iter_lines(path: str) -> Iterator[Tuple[int, str]]:
  """(1-based line number, text without its LF / CRLF) for each line; DataError on non-UTF-8."""
  with open(require_file(path, "text"), "rb") as f:
    for lineno, raw in enumerate(f, 1):        # binary files split on b"\n" only
      if raw.endswith(b"\n"):
        raw = raw[:-1]
      if raw.endswith(b"\r"):
        raw = raw[:-1]
      yield lineno, _decode(raw, path, lineno)


def read_parallel(src_path: str, tgt_path: str, max_line_chars: int
                  ) -> Tuple[List[Tuple[str, str]], SkipStats]:
  """Aligned (source, target) line pairs of two files.

  Raises DataError if the files have different line counts (naming both files and counts).
  Pairs where either side is empty or longer than ``max_line_chars`` are skipped on both sides,
  counted and logged. Returns (pairs, stats).
  """
  n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)
  if n_src != n_tgt:
    raise DataError(
        f"parallel files are not aligned: {src_path} has {n_src} lines but {tgt_path} has {n_tgt}; "
        f"every line of one must translate the same line of the other (one sentence per line, LF "
        f"line endings): fix or re-extract the corpus")
  stats = SkipStats(f"{src_path} + {os.path.basename(tgt_path)}", total=n_src)
  pairs = []
  for (lineno, src), (_, tgt) in zip(iter_lines(src_path), iter_lines(tgt_path)):
    if not src.strip() or not tgt.strip():
      stats.skip("empty", lineno)
    elif max_line_chars and max(len(src), len(tgt)) > max_line_chars:
      stats.skip(f"longer than data.max_line_chars={max_line_chars}", lineno)
    else:
      pairs.append((src, tgt))
  stats.log()
  return pairs, stats


def read_tsv(path: str, max_line_chars: int) -> Tuple[List[Tuple[str, int]], SkipStats]:
  """(sentence, label) rows of a ``sentence<TAB>label`` file; a ``sentence<TAB>label`` header is skipped.

  Raises DataError on a row without a TAB-separated label or with a label that is not a
  non-negative integer (file:line). Empty and over-long sentences are skipped, counted, logged.
  """
  stats, rows = SkipStats(path), []
  for lineno, line in iter_lines(path):
    stats.total += 1
    if not line.strip():
      stats.skip("empty", lineno)
      continue
    sentence, tab, label = line.rpartition("\t")
    if not tab:
      raise DataError(f"{path}:{lineno}: row has no TAB-separated label (expected "
                      f"'sentence<TAB>label'): add the label or remove the row")
    label = label.strip()
    if lineno == 1 and label.lower() == "label":
      stats.total -= 1                          # a header row
      continue
    if not label.isdigit():
      raise DataError(f"{path}:{lineno}: label {label!r} is not a non-negative integer class id "
                      f"(expected 'sentence<TAB>label', e.g. 'a fine film<TAB>1')")
    if not sentence.strip():
      stats.skip("empty", lineno)
    elif max_line_chars and len(sentence) > max_line_chars:
      stats.skip(f"longer than data.max_line_chars={max_line_chars}", lineno)
    else:
      rows.append((sentence, int(label)))
  stats.log()
  return rows, stats


def find_label_line(path: str, label: int) -> int:
  """The number of the first line of a ``sentence<TAB>label`` file whose label is ``label`` (0: none)."""
  for lineno, line in iter_lines(path):
    value = line.rpartition("\t")[2].strip()
    if value.isdigit() and int(value) == label:
      return lineno
  return 0


def read_plain(path: str) -> str:
  """The whole UTF-8 text of a file (DataError naming file:line on non-UTF-8 bytes)."""
  with open(require_file(path, "plain text"), "rb") as f:
    raw = f.read()
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    lineno = raw.count(b"\n", 0, e.start) + 1
    line_start = raw.rfind(b"\n", 0, e.start) + 1
    line_end = raw.find(b"\n", e.start)
    _decode(raw[line_start:len(raw) if line_end < 0 else line_end], path, lineno)  # raises
    raise


def split_plain(text: str, fraction: float) -> Tuple[str, str]:
  """Deterministic LM split in characters: (first ``fraction`` of the text, the rest)."""
  if not 0.0 < fraction < 1.0:
    raise DataError(f"data.lm_split_fraction={fraction} must be in (0, 1), e.g. 0.9")
  cut = int(len(text) * fraction)
  return text[:cut], text[cut:]


def chunk_text(text: str, max_chars: int = 4096) -> List[str]:
  """Consecutive pieces of ``text`` cut at line ends (a longer line is cut anywhere); ''.join = text."""
  chunks, start = [], 0
  while start < len(text):
    end = min(start + max_chars, len(text))
    if end < len(text):
      newline = text.rfind("\n", start, end)
      end = newline + 1 if newline >= start else end
    chunks.append(text[start:end])
    start = end
  return chunks


def plain_split_files(directory: str, train_split: str, eval_split: str,
                      pattern: str = "{split}.txt"
                      ) -> Tuple[Optional[Dict[str, str]], Optional[str]]:
  """Plain-text layout of ``directory``: ({split: file}, None) if ``pattern``'s files (default
  ``{split}.txt``) exist for the train and eval splits, else (None, the single file with the
  pattern's extension, to split by fraction)."""
  named = {s: os.path.join(directory, pattern.format(split=s)) for s in (train_split, eval_split)}
  if all(os.path.isfile(p) for p in named.values()):
    return named, None
  ext = os.path.splitext(pattern)[1]
  txt = sorted(f for f in os.listdir(directory) if f.endswith(ext))
  if len(txt) != 1:
    first, second = (os.path.basename(named[s]) for s in (train_split, eval_split))
    raise DataError(
        f"plain-text source {directory!r} needs either {first} and {second}, or exactly one "
        f"{ext} file to split by data.lm_split_fraction; it holds {txt or f'no {ext} file'}")
  return None, os.path.join(directory, txt[0])
