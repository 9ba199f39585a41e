"""A corrupt entry of jax's persistent compilation cache is replaced in the run that finds it.

jax reads an entry (``<cache folder>/<key>-cache``), and when it cannot (a file cut short by a
process killed while writing it, a flipped bit) warns and compiles the program again; but it
writes the new program only where no file exists yet, so the bad file stays, and every later run
meets it again. ``install`` puts a guard around jax's read of an entry: an entry that cannot be
read is removed (only while it is still the file that failed: another process may have replaced it
meanwhile), the process says so in its one cache line (``compile_cache.unreadable_entry``), and jax
sees a miss, so it compiles the program and writes the new entry in the old one's place.

The same guard serves the programs txf keeps whole (``txf.runtime.program_cache``): a kept program
that could not be read must be compiled by XLA, not handed back by jax's cache (XLA:CPU serialises
a program read back from jax's cache without some of its functions, so such a program cannot be
kept). ``compiling_fresh()`` makes jax's reads in this thread misses while it is held (an entry
is still read, so that a bad one is replaced as well).

jax's own option ``jax_raise_persistent_cache_errors`` still raises. Where jax lacks the read this
guards (another jax version), nothing is installed and an entry jax cannot read stays as before.
"""

import contextlib
import functools
import os
import threading
from typing import Iterator, Optional, Tuple

import jax

from txf.runtime import compile_cache

try:  # jax's reader of persistent cache entries (jax 0.10 and 0.12: get_executable_and_time)
  from jax._src import compilation_cache as _jax_cache
except ImportError:  # a jax without the module: nothing to guard
  _jax_cache = None

_ENTRY_SUFFIXES = ("-cache", "-atime")  # jax's entry, and its last-access stamp
_local = threading.local()


@contextlib.contextmanager
def compiling_fresh() -> Iterator[None]:
  """While held, jax's persistent cache hands nothing back to this thread: a program compiled
  here is compiled by XLA (jax still writes it where its entry is missing)."""
  before = getattr(_local, "fresh", False)
  _local.fresh = True
  try:
    yield
  finally:
    _local.fresh = before


def _entry_path(cache_key: str) -> Optional[str]:
  folder = jax.config.values.get("jax_compilation_cache_dir")
  if not folder or "://" in str(folder):  # a bucket: left to jax
    return None
  return os.path.join(str(folder), f"{cache_key}{_ENTRY_SUFFIXES[0]}")


def _identity(path: Optional[str]) -> Optional[Tuple[int, int, int]]:
  """(inode, size, modification time) of ``path``, or None when there is no such file."""
  try:
    st = os.stat(path) if path else None
  except OSError:
    return None
  return None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns)


def _discard(cache_key: str, seen: Optional[Tuple[int, int, int]]) -> None:
  """Removes the entry ``cache_key`` (and its stamp) if its file is still the one read (``seen``)."""
  path = _entry_path(cache_key)
  if path is None or seen is None or _identity(path) != seen:
    return
  for suffix in _ENTRY_SUFFIXES:
    try:
      os.remove(path[:-len(_ENTRY_SUFFIXES[0])] + suffix)
    except OSError:
      pass


def install() -> bool:
  """Guards jax's read of its cache entries as the module docstring says (once a process);
  returns whether the guard is in place."""
  original = getattr(_jax_cache, "get_executable_and_time", None)
  if original is None:
    return False
  if getattr(original, "txf_guarded", False):
    return True

  @functools.wraps(original)
  def get_executable_and_time(cache_key, *args, **kwargs):
    seen = _identity(_entry_path(cache_key))
    try:
      found = original(cache_key, *args, **kwargs)
      # compiling fresh: the entry was read (so a bad one is replaced too), and is not used
      return (None, None) if getattr(_local, "fresh", False) else found
    except Exception as e:  # pylint: disable=broad-except  # any unreadable entry
      if (jax.config.values.get("jax_raise_persistent_cache_errors")
          or isinstance(e, getattr(_jax_cache, "CacheVerificationError", ()))):
        raise  # as jax itself would
      _discard(cache_key, seen)
      compile_cache.unreadable_entry(f"{type(e).__name__}: {e}")
      return None, None  # a miss: jax compiles the program and writes it in the old one's place

  get_executable_and_time.txf_guarded = True
  _jax_cache.get_executable_and_time = get_executable_and_time
  return True
