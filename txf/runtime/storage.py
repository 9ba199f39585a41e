"""Paths on a local disk or in a bucket (``gs://bucket/run``): the file calls a workdir's files go through.

Every path is an ``etils.epath.Path``: a local path takes epath's os backend (the same calls as
``os``/``open``), a bucket path epath's fsspec backend (gcsfs for gs://). What needs a local
folder (sentencepiece's model file, jax's profiler, tensorboardX's event writer) works in a
temporary local folder that ``local_copy`` fills from the bucket or ``staged_dir`` copies up to it.
A bucket object cannot be appended to or renamed atomically: ``write_bytes`` writes the whole
object at once (an upload replaces the object only when it completes).
"""

import contextlib
import importlib.util
import os
import shutil
import tempfile
from typing import Iterator, Union

from etils import epath

from txf.core.errors import TxfError

PathLike = Union[str, os.PathLike]

# The bucket schemes txf runs in: orbax (checkpoints) reaches gs:// through TensorStore's GCS
# driver; its other schemes (s3://, az://) it does not.
BUCKET_SCHEMES = ("gs",)
# Modules a scheme needs beside its fsspec file system (gcsfs for gs://): orbax lists the steps of
# a gs:// checkpoints folder with the Cloud Storage client. module -> pip package
EXTRA_MODULES = {"gs": {"google.cloud.storage": "google-cloud-storage"}}
# The fsspec file system package of each scheme (named in the error when it is missing)
FSSPEC_PACKAGES = {"gs": "gcsfs"}


def scheme_of(path: PathLike) -> str:
  """The URL scheme of ``path`` ("gs" for gs://bucket/run), "" for a local path."""
  text = os.fspath(path)
  return text.split("://", 1)[0] if "://" in text else ""


def is_local(path: PathLike) -> bool:
  """Whether ``path`` is on a local disk (no URL scheme)."""
  return not scheme_of(path)


def wpath(path: PathLike) -> epath.Path:
  """``path`` as an ``epath.Path`` (local or bucket)."""
  return epath.Path(path)


def join(path: PathLike, *names: str) -> str:
  """``path/name/...`` as a string, for local and bucket paths alike."""
  if is_local(path):
    return os.path.join(path, *names)
  return os.fspath(wpath(path).joinpath(*names))


def absolute(path: PathLike) -> str:
  """A local path made absolute (``os.path.abspath``); a bucket path as it is."""
  return os.path.abspath(path) if is_local(path) else os.fspath(wpath(path))


def _importable(module: str) -> bool:
  """Whether ``module`` (dotted) can be imported."""
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def check_filesystem(path: PathLike, flag: str = "--workdir") -> None:
  """Raise TxfError (one line naming what to pip install) if ``path`` is in a bucket whose scheme
  txf cannot use, or whose file system package is not installed; a local path passes."""
  scheme = scheme_of(path)
  if not scheme:
    return
  if scheme not in BUCKET_SCHEMES:
    raise TxfError(f"{flag} {os.fspath(path)}: txf keeps runs on a local disk or in a gs:// bucket "
                   f"(orbax checkpoints reach no {scheme}://): choose a local or gs:// {flag}")
  import fsspec  # deferred: only bucket paths need it
  missing = []
  try:
    fsspec.get_filesystem_class(scheme)
  except (ImportError, ValueError):
    missing.append(FSSPEC_PACKAGES[scheme])
  missing += [pip for module, pip in EXTRA_MODULES.get(scheme, {}).items() if not _importable(module)]
  if missing:
    raise TxfError(f"{flag} {os.fspath(path)} needs {' and '.join(missing)}: pip install "
                   f"{' '.join(missing)} (or pip install -e '.[gcs]' in txf's checkout)")


def read_bytes(path: PathLike) -> bytes:
  """The content of the file at ``path``."""
  return wpath(path).read_bytes()


def read_text(path: PathLike) -> str:
  """The text (UTF-8) of the file at ``path``."""
  return wpath(path).read_text(encoding="utf-8")


def size_of(path: PathLike) -> int:
  """Bytes of the file at ``path``."""
  return os.path.getsize(path) if is_local(path) else int(wpath(path).stat().length or 0)


def write_bytes(path: PathLike, data: bytes) -> None:
  """Write ``data`` to ``path`` whole: locally a temp file renamed over it (a crash never leaves
  half a file); in a bucket one upload, which replaces the object only once it is complete."""
  if not is_local(path):
    wpath(path).write_bytes(data)
    return
  path = os.fspath(path)
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def upload_tree(local: str, target: PathLike) -> None:
  """Copy the files under the local folder ``local`` to ``target`` (a folder, local or bucket)."""
  for root, _, files in os.walk(local):
    rel = os.path.relpath(root, local)
    folder = wpath(target) if rel == "." else wpath(target).joinpath(*rel.split(os.sep))
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
      with open(os.path.join(root, name), "rb") as f:
        folder.joinpath(name).write_bytes(f.read())


def download_tree(source: PathLike, local: str) -> None:
  """Copy the files under ``source`` (a folder, local or bucket) into the local folder ``local``."""
  os.makedirs(local, exist_ok=True)
  for entry in wpath(source).iterdir():
    if entry.is_dir():
      download_tree(entry, os.path.join(local, entry.name))
    else:
      with open(os.path.join(local, entry.name), "wb") as f:
        f.write(entry.read_bytes())


@contextlib.contextmanager
def local_copy(path: PathLike) -> Iterator[str]:
  """A local folder holding what the folder ``path`` holds: ``path`` itself when local, else a
  temporary copy (removed on exit) downloaded from the bucket."""
  if is_local(path):
    yield os.fspath(path)
    return
  tmp = tempfile.mkdtemp(prefix="txf-")
  try:
    local = os.path.join(tmp, wpath(path).name or "copy")
    download_tree(path, local)
    yield local
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(path: PathLike) -> Iterator[str]:
  """A local folder to write ``path``'s files into: ``path`` itself when local, else a temporary
  folder whose files are copied up to ``path`` when the block ends without an error."""
  if is_local(path):
    yield os.fspath(path)
    return
  tmp = tempfile.mkdtemp(prefix="txf-")
  try:
    yield tmp
    upload_tree(tmp, path)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
