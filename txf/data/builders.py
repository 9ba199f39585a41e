"""tfds builders for local text, prepared once as ``array_record`` and read with ``tfds.data_source``.

Three ``GeneratorBasedBuilder`` classes, one per data kind (``BUILDERS``); each reads a split's files
with the reader of the run's ``data.format`` (``txf.core.formats``: txf's formats below, or one a
plugin registers):
  txf_parallel_text   {"source": Text, "target": Text}   parallel: {split}.{src_lang} / {split}.{tgt_lang}
  txf_labelled_text   {"text": Text, "label": int64}      tsv: {split}.tsv  (sentence<TAB>label)
  txf_plain_text      {"text": Text}                       plain: {split}.txt, or one .txt split by fraction
Records keep the file order (``disable_shuffling``); plain text is stored as consecutive chunks cut
at line ends, so ``"".join(records)`` is the split's exact text.

The builder config is made on the fly from the files: its name is the folder name plus a
fingerprint of (reader settings, each file's path within the folder, size and content digest), so
the same files are prepared once and reused (``tfds`` finds ``dataset_info.json`` and skips
generation), wherever they are copied, and edited files get a fresh preparation. Skip counts
(empty / over-long lines) and the number of classes are kept in the dataset's metadata. No TensorFlow is imported: array_record is written and read by tfds' own
Python writers and ``ArrayRecordDataSource``.
"""

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging as std_logging
import os
import re
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow_datasets as tfds

from txf.core import formats
from txf.data import text
from txf.data.base import DataError
from txf.runtime import storage

PREPARED_LOG = std_logging.getLogger("txf.data.prepared")  # say_prepared's one line

DATA_DIR_ENV = "TXF_DATA_DIR"              # prepared-data root when data.data_dir is ""
DEFAULT_DATA_DIR = "~/.cache/txf/tfds"
FILE_FORMAT = "array_record"
_CHUNK_CHARS = 4096                        # plain text: characters per record (cut at line ends)


def resolve_data_dir(data_dir: str, env: Optional[Mapping[str, str]] = None) -> str:
  """Where prepared data lives: ``data.data_dir``, else $TXF_DATA_DIR, else ~/.cache/txf/tfds."""
  env = os.environ if env is None else env
  return os.path.expanduser(data_dir or env.get(DATA_DIR_ENV, "") or DEFAULT_DATA_DIR)


@dataclasses.dataclass(eq=False)
class LocalTextConfig(tfds.core.BuilderConfig):
  """A builder config carrying the reader spec as JSON (files per split and reader settings)."""
  spec_json: str = "{}"

  @property
  def spec(self) -> Dict[str, Any]:
    return json.loads(self.spec_json)


class _LocalInfo(tfds.core.DatasetInfo):
  """The DatasetInfo of local text: nothing is fetched from tfds' bucket of pre-computed infos (the
  base class makes an empty temporary folder for that on every new, unprepared builder and leaves
  it behind)."""

  def initialize_from_bucket(self) -> None:
    return None


class _LocalTextBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared machinery: info with metadata, one generator per split, records in file order."""
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "txf local text builders, array_record."}

  def _features(self) -> tfds.features.FeaturesDict:
    raise NotImplementedError

  def _read_split(self, split: str, spec: Dict[str, Any]) -> Tuple[List[Any], Dict[str, int]]:
    """(records, skip counts) of one split: the reader of the format ``spec["kind"]`` names."""
    return formats.reader(spec["kind"])(spec["splits"][split], spec)

  def _info(self) -> tfds.core.DatasetInfo:
    return _LocalInfo(
        builder=self, description=f"txf local text: {self.builder_config.description}",
        features=self._features(), disable_shuffling=True, metadata=tfds.core.MetadataDict())

  def _split_generators(self, dl_manager):
    del dl_manager  # local files only
    spec = self.builder_config.spec
    generators, skipped, extra, read = {}, {}, {}, {}
    for split in spec["splits"]:
      read[split], skipped[split] = self._read_split(split, spec)
      if not read[split]:
        files = " / ".join(f for f in spec["splits"][split][:2] if isinstance(f, str))
        raise DataError(f"{files}: the {split} split has no usable lines (the file is empty, all "
                        f"blank, or every line was skipped: {skipped[split]}): fill it, or point "
                        f"data.source at the right folder")
    self._check(read, spec)
    for split, records in read.items():
      extra.update(self._split_metadata(split, records))
      generators[split] = self._generate_examples(records)
    self.info.metadata.update({"skipped": skipped, "spec": spec, **extra})
    return generators

  def _split_metadata(self, split: str, records: List[Any]) -> Dict[str, Any]:
    del split, records
    return {}

  def _check(self, records: Dict[str, List[Any]], spec: Dict[str, Any]) -> None:
    """Raise DataError on records no run can use (all splits read); nothing by default."""
    del records, spec

  def _generate_examples(self, records):
    for i, record in enumerate(records):
      yield i, record


class TxfParallelText(_LocalTextBuilder):
  """Line-aligned parallel text: ``{split}.{src}`` and ``{split}.{tgt}``."""

  def _features(self):
    return tfds.features.FeaturesDict({"source": tfds.features.Text(),
                                       "target": tfds.features.Text()})


class TxfLabelledText(_LocalTextBuilder):
  """``sentence<TAB>label`` rows: ``{split}.tsv``."""

  def _features(self):
    return tfds.features.FeaturesDict({"text": tfds.features.Text(),
                                       "label": tfds.features.Scalar(np.int64)})

  def _check(self, records, spec):
    """Class ids are 0..K-1 from the training split: a dev/test label the training data lacks
    (its loss would be NaN) or one far beyond the others (a huge output layer) is refused."""
    train_split = spec["train_split"]
    train = {r["label"] for r in records[train_split]}
    path = spec["splits"][train_split][0]
    top = max(train)
    if top + 1 > max(2 * len(train), len(train) + 8):
      lineno = text.find_label_line(path, top)
      raise DataError(f"{path}:{lineno}: label {top} would make a {top + 1:,}-class model, but the "
                      f"training data has {len(train)} distinct labels ({_few(train)}): class ids "
                      f"must be 0..K-1; fix that line")
    for split, rows in records.items():
      unseen = {r["label"] for r in rows} - train
      if split != train_split and unseen:
        other = spec["splits"][split][0]
        lineno = text.find_label_line(other, min(unseen))
        raise DataError(f"{other}:{lineno}: label {min(unseen)} of the {split} split never occurs in "
                        f"the training data {path} (labels {_few(train)}): the model could not "
                        f"predict it; fix the labels or add training rows with it")

  def _split_metadata(self, split, records):
    if split != self.builder_config.spec["train_split"]:
      return {}
    return {"num_classes": 1 + max((r["label"] for r in records), default=-1)}


class TxfPlainText(_LocalTextBuilder):
  """Plain text for language modelling: ``{split}.txt`` or one file split by a character fraction."""

  def _features(self):
    return tfds.features.FeaturesDict({"text": tfds.features.Text()})


def _few(labels) -> str:
  shown = sorted(labels)
  return ", ".join(map(str, shown[:8])) + (", ..." if len(shown) > 8 else "")


# The builder of each data kind (txf.core.formats.KIND_FIELDS: the records a format's reader yields).
BUILDERS = {"parallel": TxfParallelText, "tsv": TxfLabelledText, "plain": TxfPlainText}


def read_parallel_split(files: Sequence[str], spec: Dict[str, Any]
                        ) -> Tuple[List[Dict[str, str]], Dict[str, Any]]:
  """The ``parallel`` format's reader: line-aligned files [source, target] -> records
  {"source", "target"} and the skip counts (txf.data.text.read_parallel)."""
  src, tgt = files
  pairs, stats = text.read_parallel(src, tgt, spec["max_line_chars"])
  return [{"source": s, "target": t} for s, t in pairs], stats.as_dict()


def read_tsv_split(files: Sequence[str], spec: Dict[str, Any]
                   ) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
  """The ``tsv`` format's reader: ``sentence<TAB>label`` rows -> records {"text", "label"}."""
  rows, stats = text.read_tsv(files[0], spec["max_line_chars"])
  return [{"text": s, "label": y} for s, y in rows], stats.as_dict()


def read_plain_split(files: Sequence[Any], spec: Dict[str, Any]
                     ) -> Tuple[List[Dict[str, str]], Dict[str, Any]]:
  """The ``plain`` format's reader: [path, part] (part 0 / 1: the train / eval share of one file
  cut by ``spec["fraction"]``, None: the whole file) -> records {"text"}, consecutive chunks cut
  at line ends."""
  path, part = files
  content = text.read_plain(path)
  if part is not None:                      # [train, eval] halves of one file
    content = text.split_plain(content, spec["fraction"])[part]
  chunks = text.chunk_text(content, _CHUNK_CHARS)
  return [{"text": c} for c in chunks], {"total": len(content)}


def local_spec(directory: str, fmt: str, splits: Sequence[str], src_lang: str, tgt_lang: str,
               max_line_chars: int, lm_split_fraction: float, file_pattern: str = ""
               ) -> Dict[str, Any]:
  """The reader spec of a text folder: files per split (train and eval required, test optional).

  ``file_pattern`` (config ``data.file_pattern``) names the files relative to ``directory`` with
  ``{split}`` and ``{lang}`` placeholders, e.g. ``tok/{split}.lc.norm.tok.{lang}``; "" means the
  format's own (``txf.core.formats``: ``{split}.{lang}`` parallel, ``{split}.tsv`` tsv). A format
  whose splits may be one file (plain) ignores it.
  """
  data_format = formats.get(fmt)
  train, evals, test = splits
  spec: Dict[str, Any] = {"kind": fmt, "max_line_chars": int(max_line_chars), "splits": {},
                          "train_split": train}
  if data_format.whole:
    named, single = text.plain_split_files(directory, train, evals, data_format.files)
    if named:
      spec["splits"] = {s: [p, None] for s, p in named.items()}
    else:
      spec["splits"] = {train: [single, 0], evals: [single, 1]}
      spec["fraction"] = float(lm_split_fraction)
    return spec
  pattern = file_pattern or data_format.files
  langs = (src_lang, tgt_lang) if data_format.per_language else (src_lang,)
  for i, split in enumerate((train, evals, test)):
    files = [os.path.join(directory, pattern.format(split=split, lang=lang)) for lang in langs]
    if all(os.path.isfile(f) for f in files):
      spec["splits"][split] = files
    elif i < 2:                               # train and eval must exist
      missing = [f for f in files if not os.path.isfile(f)][0]
      text.require_file(missing, f"{'train' if i == 0 else 'eval'} split ({split!r})")
    else:
      logging.info("no test split %r in %s (files %s absent); continuing without it", split,
                   directory, files)
  return spec


DIGESTS_DIR = "txf_digests"   # under data_dir: each data file's content digest, by path, size, mtime


def _content_digest(path: str, data_dir: str) -> str:
  """The sha256 of a file's bytes. Remembered under ``data_dir`` by (absolute path, size, mtime),
  so an unchanged file is read once rather than at every start; a bucket ``data_dir`` (or one that
  cannot be written) remembers nothing and the file is read each time."""
  st = os.stat(path)
  key = hashlib.sha1(json.dumps([os.path.abspath(path), st.st_size, st.st_mtime_ns]).encode())
  memo = None if "://" in data_dir else os.path.join(data_dir, DIGESTS_DIR, key.hexdigest())
  if memo and os.path.isfile(memo):
    with open(memo, encoding="utf-8") as f:
      kept = f.read().strip()
    if re.fullmatch(r"[0-9a-f]{64}", kept):
      return kept
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      h.update(block)
  if memo:
    try:
      os.makedirs(os.path.dirname(memo), exist_ok=True)
      storage.write_bytes(memo, h.hexdigest().encode())   # whole, even with processes racing
    except OSError:
      pass
  return h.hexdigest()


def _fingerprint(spec: Dict[str, Any], builder_cls, directory: str, data_dir: str) -> str:
  """A digest of what the prepared data holds: the reader settings, and each file's path within
  ``directory``, size and content. A copy of the same files (another folder, new mtimes) has the
  same fingerprint, so it reuses the preparation and a run resumes on it (its data position is
  checked against this); an edited file gives a new one."""
  root = os.path.abspath(directory)
  rel = lambda p: os.path.relpath(os.path.abspath(p), root) if isinstance(p, str) else p
  splits = {s: [rel(p) for p in v] for s, v in spec["splits"].items()}
  files = sorted({p for v in spec["splits"].values() for p in v if isinstance(p, str)})
  stamp = [(rel(p), os.path.getsize(p), _content_digest(p, data_dir)) for p in files]
  blob = json.dumps([dict(spec, splits=splits), stamp, builder_cls.__name__,
                     str(builder_cls.VERSION)], sort_keys=True)
  return hashlib.sha1(blob.encode()).hexdigest()[:12]


@dataclasses.dataclass
class Prepared:
  """A prepared local dataset: per-split random-access sources and the builder's metadata."""
  sources: Dict[str, Sequence[Dict[str, Any]]]
  metadata: Dict[str, Any]
  fingerprint: str                  # changes when the files or reader settings change
  prepared_now: bool                # False when an earlier preparation was reused
  path: str                         # the prepared dataset's directory


def quiet_prepare(builder, **kwargs) -> None:
  """``builder.download_and_prepare(**kwargs)`` without tfds' own output, and without touching
  the process's stdout: no tqdm bars (``tfds.disable_progress_bar``), and not the two lines tfds
  prints ("Downloading and preparing dataset ...", "Dataset ... downloaded and prepared ...").
  tfds (4.9) prints those with ``termcolor.cprint`` from ``DatasetBuilder._log_download_bytes`` and
  ``_log_download_done`` and has no switch for them, so both are replaced on this builder instance
  (only) by log records. txf says in one line what was prepared (say_prepared)."""
  tfds.disable_progress_bar()
  for method in ("_log_download_bytes", "_log_download_done"):
    if hasattr(builder, method):
      setattr(builder, method, lambda: logging.info("tfds: %s prepares %s", builder.name,
                                                     builder.data_dir))
  builder.download_and_prepare(**kwargs)


def say_prepared(name: str, sources: Mapping[str, Sequence[Any]], path: str) -> None:
  """The one line of a preparation, 'txf: prepared NAME: train 29,000, val 1,014 examples -> PATH',
  as an INFO record of the ``txf.data.prepared`` logger: txf's commands print it on stderr
  (``txf.commands.terminal.show_preparations``); a program that set up no logging sees nothing."""
  counts = ", ".join(f"{split} {len(src):,}" for split, src in sources.items())
  PREPARED_LOG.info("txf: prepared %s: %s examples -> %s", name, counts, path)


LOCKS_DIR = "txf_locks"   # under data_dir: one lock file per dataset being prepared


@contextlib.contextmanager
def prepare_lock(lock: str) -> Iterator[None]:
  """Hold an exclusive lock (``fcntl.flock`` on the file ``lock``) while a dataset is checked and
  prepared: processes that open the same new dataset at once (a sweep's runs) take turns, the
  first prepares it and the others find it prepared, instead of racing to rename their copies
  into place. A bucket path (``gs://...``) takes no lock."""
  if "://" in lock:
    yield
    return
  os.makedirs(os.path.dirname(lock) or ".", exist_ok=True)
  with open(lock, "a", encoding="utf-8") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def prepare_local(directory: str, spec: Dict[str, Any], data_dir: str) -> Prepared:
  """Prepare (once) and open the local text in ``directory`` as tfds array_record data sources."""
  cls = BUILDERS[formats.get(spec["kind"]).kind]
  fingerprint = _fingerprint(spec, cls, directory, data_dir)
  slug = re.sub(r"[^a-z0-9]+", "_", os.path.basename(os.path.normpath(directory)).lower()).strip("_")
  builder_config = LocalTextConfig(name=f"{slug or 'data'}_{fingerprint}", spec_json=json.dumps(spec),
                                   description=f"{spec['kind']} text from {os.path.abspath(directory)}")
  path = os.path.join(data_dir, cls.name, builder_config.name, str(cls.VERSION))
  lock = os.path.join(data_dir, LOCKS_DIR, f"{cls.name}-{builder_config.name}.lock")
  with prepare_lock(lock):        # runs started together (a sweep's): one prepares, the others wait
    prepared_now = not os.path.isfile(os.path.join(path, "dataset_info.json"))
    if prepared_now:
      logging.info("preparing %s (%s) as array_record under %s", directory, spec["kind"], data_dir)
    builder = tfds.builder(cls.name, data_dir=data_dir, config=builder_config, file_format=FILE_FORMAT)
    if not builder.is_prepared():   # prepared once, then every split is opened
      quiet_prepare(builder, file_format=FILE_FORMAT,
                    download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  sources = {str(k): v for k, v in builder.as_data_source().items()}
  if prepared_now:
    say_prepared(slug or directory, sources, path)
  metadata = dict(next(iter(sources.values())).dataset_info.metadata or {})
  return Prepared(sources, metadata, fingerprint, prepared_now, path)
