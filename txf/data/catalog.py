"""tfds catalog datasets (``data.source='tfds:NAME'``) as array_record data sources, without TensorFlow.

Without TensorFlow, tfds finds a catalog builder only once its module is imported, so each known
name maps to the module that defines it. Preparing happens once under ``data.data_dir``
(``file_format='array_record'``, no GCS copy: those are tfrecord). When the data is not prepared
yet, the download hosts are probed first with a few-second timeout; if none answers, a DataError
explains how to prepare the data elsewhere (``txf prepare-data NAME --data_dir DIR``) --
instead of tfds' minutes-long download retries.

Known TensorFlow dependency: lm1b's builder lists its extracted files with ``tf.io.gfile.glob``;
``prepare`` swaps in ``glob.glob`` for that one call site when TensorFlow is not installed.
"""

import contextlib
import dataclasses
import glob
import importlib
import importlib.util
import socket
import sys
import tempfile
import threading
import types
from typing import Any, Callable, Dict, Optional, Sequence
from unittest import mock

from absl import logging
import numpy as np
import tensorflow_datasets as tfds

from txf.data import builders
from txf.data.base import DataError
from txf.data.builders import FILE_FORMAT, resolve_data_dir

# base name -> (module that registers the builder, hosts its download uses)
CATALOG = {
    "wmt14_translate": ("tensorflow_datasets.translate.wmt14", ("www.statmt.org", "data.statmt.org")),
    "wmt17_translate": ("tensorflow_datasets.translate.wmt17", ("www.statmt.org", "data.statmt.org")),
    "ted_hrlr_translate": ("tensorflow_datasets.datasets.ted_hrlr_translate."
                           "ted_hrlr_translate_dataset_builder", ("www.phontron.com",)),
    "imdb_reviews": ("tensorflow_datasets.datasets.imdb_reviews.imdb_reviews_dataset_builder",
                     ("ai.stanford.edu",)),
    "glue": ("tensorflow_datasets.text.glue", ("dl.fbaipublicfiles.com",)),
    "lm1b": ("tensorflow_datasets.datasets.lm1b.lm1b_dataset_builder", ("www.statmt.org",)),
}
PROBE_TIMEOUT_S = 3.0


def hosts_reachable(hosts: Sequence[str], timeout: float = PROBE_TIMEOUT_S) -> bool:
  """True if any host accepts a TCP connection on port 80 or 443 within ~``timeout`` seconds.

  The probe runs in a daemon thread so that a hanging DNS lookup cannot delay the answer.
  """
  answer = []

  def probe():
    for host in hosts:
      for port in (443, 80):
        try:
          socket.create_connection((host, port), timeout=timeout).close()
          answer.append(True)
          return
        except OSError:
          continue

  thread = threading.Thread(target=probe, daemon=True)
  thread.start()
  thread.join(timeout * 2 + 1)
  return bool(answer)


def base_name(name: str) -> str:
  """'wmt14_translate/de-en:1.0.0' -> 'wmt14_translate'."""
  return name.split("/")[0].split(":")[0]


def import_builder(name: str) -> None:
  """Import the module that registers ``name``'s builder (tfds cannot find it otherwise without TF)."""
  base = base_name(name)
  if base in CATALOG:
    importlib.import_module(CATALOG[base][0])
    return
  try:
    tfds.builder_cls(base)
  except Exception as e:  # tfds raises several types for unknown names
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]  # not tfds' list of all names
    raise DataError(f"data.source='tfds:{name}': unknown tfds dataset (without TensorFlow only "
                    f"imported builders are found): use one of {sorted(CATALOG)} or import the "
                    f"builder's module before make_task ({first})") from None


@contextlib.contextmanager
def _without_tensorflow_patches(name: str):
  """Work around catalog builders that call TensorFlow while preparing (lm1b: tf.io.gfile.glob)."""
  if base_name(name) != "lm1b" or importlib.util.find_spec("tensorflow") is not None:
    yield
    return
  module = sys.modules[CATALOG["lm1b"][0]]
  shim = types.SimpleNamespace(io=types.SimpleNamespace(
      gfile=types.SimpleNamespace(glob=lambda pattern: sorted(glob.glob(pattern)))))
  with mock.patch.object(module, "tf", shim):
    yield


def _not_prepared_error(name: str, data_dir: str, hosts: Sequence[str]) -> DataError:
  return DataError(
      f"data.source='tfds:{name}' is not prepared under {data_dir} and its download hosts "
      f"{list(hosts)} cannot be reached (no network?). Prepare it on a machine with network access:\n"
      f"    txf prepare-data {name} --data_dir /some/dir\n"
      f"then copy /some/dir/{base_name(name)} into {data_dir}/ (or point data.data_dir / "
      f"TXF_DATA_DIR at /some/dir). For datasets whose files must be fetched by hand, put them in "
      f"{data_dir}/downloads/manual and run the same command.")


def prepare(name: str, data_dir: str,
            reachable: Optional[Callable[[Sequence[str]], bool]] = None) -> tfds.core.DatasetBuilder:
  """The builder of ``name`` under ``data_dir``, prepared as array_record (downloading if needed).

  ``reachable(hosts) -> bool`` decides whether to try downloading (default: ``hosts_reachable``).
  """
  reachable = reachable or hosts_reachable
  import_builder(name)
  with _removed_temporary_folders():
    builder = tfds.builder(name, data_dir=data_dir, file_format=FILE_FORMAT)
  if not builder.is_prepared():
    hosts = CATALOG.get(base_name(name), ("", ("storage.googleapis.com",)))[1]
    if not reachable(hosts):
      raise _not_prepared_error(name, data_dir, hosts)
    logging.info("preparing tfds:%s as %s under %s (downloads %s)", name, FILE_FORMAT, data_dir,
                 list(hosts))
    with _without_tensorflow_patches(name):
      builders.quiet_prepare(builder, file_format=FILE_FORMAT,
                             download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return builder


@contextlib.contextmanager
def _removed_temporary_folders():
  """Temporary folders made inside the block go into one that is removed at its end: the
  DatasetInfo of an unprepared tfds builder makes an empty one for its bucket lookup and leaves
  it behind."""
  saved = tempfile.tempdir
  with tempfile.TemporaryDirectory(prefix="txf-tfds-info-") as scratch:
    tempfile.tempdir = scratch
    try:
      yield
    finally:
      tempfile.tempdir = saved


@dataclasses.dataclass
class CatalogData:
  """A catalog dataset in txf's record format: ``kind`` parallel | tsv | plain (sentences)."""
  kind: str
  sources: Dict[str, Sequence[Any]]          # split -> random-access source of raw tfds records
  adapt: Callable[[Dict[str, Any]], Dict[str, Any]]  # raw record -> {"source","target"} / {"text","label"} / {"text"}
  num_classes: int = 0
  fingerprint: str = ""


def _text(value: Any) -> str:
  if isinstance(value, np.ndarray):
    value = value.item()
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def open_catalog(name: str, splits: Sequence[str], data_dir: str, src_lang: str, tgt_lang: str,
                 reachable: Optional[Callable[[Sequence[str]], bool]] = None) -> CatalogData:
  """Prepare (once) and open ``splits`` of a catalog dataset with ``tfds.data_source``.

  The kind follows the features: a Translation (or two Text features named ``src_lang`` and
  ``tgt_lang``) -> parallel; a ``label`` -> tsv (text from ``sentence`` or ``text``); only
  ``text`` -> plain (one sentence per record, for decoder_lm).
  """
  data_dir = resolve_data_dir(data_dir)
  builder = prepare(name, data_dir, reachable)
  features = builder.info.features
  keys = set(features.keys()) if hasattr(features, "keys") else set()
  if isinstance(features, tfds.features.Translation):
    keys = set(features.languages)
  sources = {}
  for split in splits:
    try:
      with _removed_temporary_folders():  # a builder without its dataset_info.json (mock data)
        sources[split] = tfds.data_source(name, split=split, data_dir=data_dir, download=False,
                                          builder_kwargs={"file_format": FILE_FORMAT})
    except Exception as e:  # tfds raises ValueError/KeyError for unknown splits
      known = sorted(builder.info.splits.keys())
      raise DataError(f"tfds:{name} has no split {split!r} (it has {known}): set "
                      f"data.train_split / eval_split / test_split") from e
  fingerprint = f"{name}:{builder.info.version}"
  if src_lang in keys and tgt_lang in keys:
    return CatalogData("parallel", sources, lambda r: {"source": _text(r[src_lang]),
                                                       "target": _text(r[tgt_lang])},
                       fingerprint=fingerprint)
  if "label" in keys:
    text_key = "sentence" if "sentence" in keys else "text"
    num_classes = getattr(features["label"], "num_classes", 0) or 0
    return CatalogData("tsv", sources, lambda r: {"text": _text(r[text_key]),
                                                  "label": int(np.asarray(r["label"]))},
                       num_classes=int(num_classes), fingerprint=fingerprint)
  if "text" in keys:
    return CatalogData("plain", sources, lambda r: {"text": _text(r["text"])},
                       fingerprint=fingerprint)
  raise DataError(f"tfds:{name} has features {sorted(keys)}: txf needs the languages "
                  f"data.src_lang={src_lang!r} and data.tgt_lang={tgt_lang!r} (translation), a "
                  f"'label' (classification), or 'text' (language modelling)")
