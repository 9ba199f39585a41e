"""XLA's persistent compilation cache, on by default: a program compiled once is read back.

Every ``txf`` command, and ``txf.train`` called from Python, keeps the programs XLA compiles in a
per-user folder, so a second run of the same config (or a notebook re-running a cell, or a test
suite building the same tiny model again) skips compilation. Where the cache lives:

- ``config.compile_cache``: a folder, or ``off``; ``""`` (the default) defers to
- the ``TXF_COMPILE_CACHE`` environment variable: a folder, or ``off`` (also ``0``/``none``/``false``);
  unset, it is
- ``$XDG_CACHE_HOME/txf/xla`` (``~/.cache/txf/xla``).

Programs are kept below that folder in a sub-folder named by a fingerprint of what a compiled
CPU program depends on beyond jax's own cache key: the jax and jaxlib versions, ``XLA_FLAGS``,
``JAX_PLATFORMS`` and the CPU's model and feature flags. A folder shared by machines with other
CPUs (AVX-512 beside AVX2), or kept across an upgrade, therefore never hands back a program built
for something else. The folder is bounded (``TXF_COMPILE_CACHE_MAX_MB``, default 2048 MB per
fingerprint): jax evicts the least recently used programs past it.

Beside jax's entries, ``txf.runtime.program_cache`` keeps whole programs (keyed by the code, the config and
the argument shapes, so a warm start skips tracing as well) in the ``programs`` sub-folder, under
the same bound.

A cache that cannot be used is never a failed run: an unwritable folder is one ``txf: warning:``
line and compiling as usual. A corrupt entry (jax's, or a program kept whole) is compiled again and
replaced in the run that finds it (``txf.runtime.cache_repair``), so the next run reads it back
without a word; however many entries were bad, a process says so in one line (``entry_problem``).

This module never imports jax (the CLI sets the cache up through jax's environment variables
before jax starts); ``jax_options`` gives the same settings for ``jax.config.update`` when jax is
already running.
"""

import hashlib
import importlib.util
import os
import re
import sys
import warnings
from importlib import metadata
from typing import Dict, Mapping, MutableMapping, Optional, Tuple

ENV = "TXF_COMPILE_CACHE"
ENV_MAX_MB = "TXF_COMPILE_CACHE_MAX_MB"
ENV_MIN_SECS = "TXF_COMPILE_CACHE_MIN_SECS"
DEFAULT_MAX_MB = 2048
# programs that compile faster than this are not kept: reading one back costs about as much, and
# thousands of tiny entries (op-by-op dispatch compiles one program per primitive) slow the
# eviction's scan of the folder
MIN_COMPILE_SECS = 0.5  # TXF_COMPILE_CACHE_MIN_SECS overrides (0 keeps every program)
OFF = ("off", "0", "none", "false", "no")
# the sub-folder where txf.runtime.program_cache keeps whole programs (traced, lowered and compiled)
PROGRAMS_SUBDIR = "programs"
# From this jax version on, a program of a multi-process CPU run (collectives over gloo) that jax
# reads back from its persistent cache waits forever at its first collective (jax 0.12.1; 0.10.2
# reads it back and runs): such runs compile their programs instead (``serves_multi_process``).
MULTI_PROCESS_CPU_HANG_FROM = (0, 12, 1)
# the messages jax's compiler warns with when an entry cannot be read or written
_JAX_CACHE_WARNINGS = ("Error reading persistent compilation cache entry",
                       "Error writing persistent compilation cache entry")


def _release(text: str) -> Tuple[int, ...]:
  return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def serves_multi_process(jax_version: str, backend: str) -> bool:
  """Whether jax's persistent cache may serve the programs of a run of several processes on
  ``backend`` under ``jax_version``: not on CPU from ``MULTI_PROCESS_CPU_HANG_FROM`` on, where a
  program read back hangs at its first collective (txf.parallel.distributed turns the cache off
  for such a run)."""
  return backend != "cpu" or _release(jax_version) < MULTI_PROCESS_CPU_HANG_FROM


_forced_off = False


def force_off(jax_config) -> None:
  """Turns the cache off for the rest of this process, whatever a later ``apply`` is given (a
  multi-process run that ``serves_multi_process`` rules out)."""
  global _forced_off
  _forced_off = True
  apply(jax_config, OFF[0])


def base_dir(setting: str = "", environ: Mapping[str, str] = os.environ) -> Optional[str]:
  """The cache's root folder, or None when the cache is off.

  ``setting`` is ``config.compile_cache``: a folder, ``off``, or ``""`` to use ``TXF_COMPILE_CACHE``,
  else ``$XDG_CACHE_HOME/txf/xla`` (``~/.cache/txf/xla`` when XDG_CACHE_HOME is unset).
  """
  chosen = (setting or "").strip() or environ.get(ENV, "").strip()
  if chosen.lower() in OFF:
    return None
  if chosen:
    return os.path.abspath(os.path.expanduser(chosen))
  xdg = environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(xdg, "txf", "xla")


def _version(name: str) -> str:
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return "none"


def _cpu() -> Tuple[str, str]:
  """(model, sorted feature flags) from /proc/cpuinfo; ('', '') where there is none."""
  model, flags = "", ""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name") and not model:
          model = line.split(":", 1)[1].strip()
        elif line.startswith(("flags", "Features")) and not flags:
          flags = " ".join(sorted(line.split(":", 1)[1].split()))
        if model and flags:
          break
  except OSError:
    pass
  return model, flags


def fingerprint(environ: Mapping[str, str] = os.environ) -> str:
  """16 hex digits of sha256 over what a compiled program depends on beyond jax's cache key:
  jax and jaxlib versions, ``XLA_FLAGS``, ``JAX_PLATFORMS``, the CPU's model and feature flags."""
  model, flags = _cpu()
  parts = [f"jax={_version('jax')}", f"jaxlib={_version('jaxlib')}",
           f"xla_flags={' '.join(environ.get('XLA_FLAGS', '').split())}",
           f"platforms={environ.get('JAX_PLATFORMS', '')}", f"cpu={model}", f"cpu_flags={flags}"]
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def cache_dir(setting: str = "", environ: Mapping[str, str] = os.environ) -> Optional[str]:
  """The folder jax keeps programs in: ``base_dir(setting)/fingerprint()``, or None when off."""
  base = base_dir(setting, environ)
  return None if base is None else os.path.join(base, fingerprint(environ))


def max_bytes(environ: Mapping[str, str] = os.environ) -> int:
  """The size bound in bytes (``TXF_COMPILE_CACHE_MAX_MB``, default 2048; -1 = unbounded). jax
  evicts under a file lock: without the ``filelock`` package (a txf dependency) it is unbounded."""
  if importlib.util.find_spec("filelock") is None:
    warn("the filelock package is missing, so the cache is unbounded: pip install filelock")
    return -1
  raw = environ.get(ENV_MAX_MB, "").strip()
  try:
    mb = float(raw) if raw else DEFAULT_MAX_MB
  except ValueError:
    warn(f"{ENV_MAX_MB}={raw!r} is not a number: using {DEFAULT_MAX_MB}")
    mb = DEFAULT_MAX_MB
  return -1 if mb < 0 else int(mb * 2 ** 20)


_said = set()


def min_compile_secs(environ: Mapping[str, str] = os.environ) -> float:
  """Programs compiled faster than this many seconds are not kept (``TXF_COMPILE_CACHE_MIN_SECS``,
  default ``MIN_COMPILE_SECS``)."""
  raw = environ.get(ENV_MIN_SECS, "").strip()
  try:
    return max(0.0, float(raw)) if raw else MIN_COMPILE_SECS
  except ValueError:
    warn(f"{ENV_MIN_SECS}={raw!r} is not a number: using {MIN_COMPILE_SECS}")
    return MIN_COMPILE_SECS


def warn(message: str) -> None:
  """One ``txf: warning: compilation cache: ...`` line on stderr (once a process per message)."""
  if message not in _said:
    _said.add(message)
    print(f"txf: warning: compilation cache: {message}", file=sys.stderr, flush=True)


_entry_said = False


def entry_problem(message: str) -> None:
  """The one ``txf: warning: compilation cache: ...`` line of a process about its entries (one
  that could not be read, or written): the first problem is said, every later one is not, however
  many entries of jax's cache or of the kept programs it meets."""
  global _entry_said
  if not _entry_said:
    _entry_said = True
    warn(message)


def unreadable_entry(reason: str) -> None:
  """An entry could not be read (``reason``: one phrase): said once (``entry_problem``); the
  caller compiles the program again and puts the new entry in its place."""
  reason = " ".join(str(reason).split())[:160]
  entry_problem(f"an entry could not be read ({reason}): compiled again and replaced")


def usable(path: str) -> Optional[str]:
  """None when ``path`` can hold the cache (created if missing), else why not (one phrase)."""
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    return f"cannot create {path} ({e.strerror or e})"
  if not os.access(path, os.W_OK | os.X_OK):
    return f"{path} is not writable"
  return None


def jax_options(setting: str = "", environ: Mapping[str, str] = os.environ) -> Dict[str, object]:
  """The ``jax.config`` options that put the cache at ``cache_dir(setting)`` (programs that took
  at least ``min_compile_secs`` to compile, bounded by ``max_bytes``), or that turn it off when
  it is off or its folder is unusable (one warning line then)."""
  path = None if _forced_off else cache_dir(setting, environ)
  if path is not None:
    problem = usable(path)
    if problem:
      warn(f"{problem}: compiling without it (set {ENV} to a writable folder, or to off)")
      path = None
  if path is None:
    return {"jax_enable_compilation_cache": False, "jax_compilation_cache_dir": None}
  return {"jax_enable_compilation_cache": True, "jax_compilation_cache_dir": path,
          "jax_persistent_cache_min_compile_time_secs": min_compile_secs(environ),
          "jax_persistent_cache_min_entry_size_bytes": 0,
          "jax_compilation_cache_max_size": max_bytes(environ)}


def set_environment(setting: str = "", environ: MutableMapping[str, str] = os.environ) -> Optional[str]:
  """Before jax is imported: set jax's environment variables for ``jax_options(setting)`` (a
  variable the user set himself is kept); returns the cache folder or None. Child processes
  (a launcher's workers) inherit the same cache."""
  options = jax_options(setting, environ)
  for name, value in options.items():
    key = name.upper()
    if value is None or key in environ:
      continue
    environ[key] = str(value).lower() if isinstance(value, bool) else str(value)
  install_warning_filter()
  return options.get("jax_compilation_cache_dir")


def apply(jax_config, setting: str = "", environ: Mapping[str, str] = os.environ) -> Optional[str]:
  """With jax running (``jax.config`` passed in): point its cache at ``cache_dir(setting)``, or
  turn it off; a cache already in use elsewhere is reset so the next compile uses the new folder.
  Returns the folder or None."""
  options = jax_options(setting, environ)
  want = options["jax_compilation_cache_dir"]
  current = getattr(jax_config, "jax_compilation_cache_dir", None)
  enabled = getattr(jax_config, "jax_enable_compilation_cache", None)
  if current == want and bool(enabled) == (want is not None):
    return want
  for name, value in options.items():
    jax_config.update(name, value)
  _reset(jax_config)
  install_warning_filter()
  return want


def _reset(jax_config) -> None:
  """Forget the cache jax opened, so the next compile opens the folder now configured."""
  del jax_config  # the reset lives beside jax.config, in jax's public experimental module
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=import-outside-toplevel
  compilation_cache.reset_cache()


_original_showwarning = None


def _showwarning(message, category, filename, lineno, file=None, line=None):
  """jax's warning about an unreadable or unwritable entry as the process's one entry line
  (``entry_problem``); every other warning as Python shows it."""
  text = str(message)
  if any(text.startswith(w) for w in _JAX_CACHE_WARNINGS):
    reason = text.split("': ", 1)[-1].splitlines()[0][:160]
    if "reading" in text.split(" entry", 1)[0]:
      unreadable_entry(reason)
    else:
      entry_problem(f"an entry could not be written ({reason}): compiled as usual")
    return
  _original_showwarning(message, category, filename, lineno, file, line)


def install_warning_filter() -> None:
  """Show jax's cache-entry warnings as one ``txf: warning:`` line (see ``_showwarning``)."""
  global _original_showwarning
  if _original_showwarning is None:
    _original_showwarning = warnings.showwarning
    warnings.showwarning = _showwarning


def describe(setting: str = "", environ: Mapping[str, str] = os.environ) -> str:
  """``PATH (N programs, X MB of at most Y MB)`` or ``off``, for ``txf info``."""
  path = cache_dir(setting, environ)
  if path is None:
    return "off"
  problem = usable(path)
  if problem:
    return f"off ({problem})"
  count, size = 0, 0
  if os.path.isdir(path):
    for entry in os.scandir(path):
      if entry.is_file() and entry.name.endswith("-cache"):
        count += 1
        size += entry.stat().st_size
  kept, kept_size = 0, 0
  whole = os.path.join(path, PROGRAMS_SUBDIR)
  if os.path.isdir(whole):
    for entry in os.scandir(whole):
      if entry.is_file() and entry.name.endswith(".program"):
        kept += 1
        kept_size += entry.stat().st_size
  bound = max_bytes(environ)
  limit = "unbounded" if bound < 0 else f"at most {bound / 2 ** 20:.0f} MB"
  return (f"{path} ({count} programs, {size / 2 ** 20:.1f} MB, {limit}; {kept} kept whole in "
          f"{PROGRAMS_SUBDIR}/, {kept_size / 2 ** 20:.1f} MB, {limit})")
