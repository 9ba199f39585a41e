"""Process-level settings applied before JAX starts: quiet logging, tcmalloc under XLA:CPU.

Quiet by default: a ``txf`` command prints txf's own lines. Library logging (absl INFO from orbax
and jax, such as jax's ``Unable to initialize backend 'tpu'`` probe on machines without a TPU,
orbax's per-save lines and its read-only warning) is off unless ``-v``/``--verbosity=N`` asks
for it; txf's own warnings and every library error still show.

glibc's malloc returns XLA:CPU's large temporary buffers to the kernel after every step and
faults fresh zeroed pages back in on the next one: ~174k minor page faults and ~18% of the CPU
time in the kernel per train step of the small bench config. With tcmalloc (``LD_PRELOAD``) the
buffers are reused: 5 faults per step and ~18% less wall time (BENCHMARKS.md). The ``txf``
command therefore re-executes itself once with tcmalloc preloaded when the library is installed
(Debian/Ubuntu: ``apt-get install libtcmalloc-minimal4``) and not already loaded.
``TXF_MALLOC=system`` turns this off.
"""

import os
import sys
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from txf.core.errors import disk_errno_of

TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
SEARCH_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
               "/usr/local/lib")
_GUARD = "_TXF_MALLOC_REEXEC"
# the directory that holds this txf package (what a re-executed process must import again)
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # txf/
CODE_ROOT = os.path.dirname(PACKAGE_DIR)


def split_verbosity(args: List[str]) -> Tuple[bool, List[str]]:
  """(verbose, args) with a bare ``-v`` turned into absl's ``--verbosity=0`` (INFO); verbose is True when
  the user asked for library logging (``-v``, ``--verbosity=N``/``-v=N`` with N >= 0)."""
  out, verbose = [], False
  for i, a in enumerate(args):
    if a == "-v":
      a = "--verbosity=0"
    if a.startswith("--verbosity=") or a.startswith("-v="):
      try:
        verbose = int(a.split("=", 1)[1]) >= 0
      except ValueError:
        pass  # absl rejects it with its own message
    elif a in ("--verbosity",) and i + 1 < len(args):
      verbose = args[i + 1].lstrip("-").isdigit() and not args[i + 1].startswith("-")
    out.append(a)
  return verbose, out


def quiet_environment(verbose: bool, environ=os.environ) -> None:
  """Before JAX is imported: without ``verbose``, XLA's C++ INFO/WARNING lines are off unless the
  user set ``TF_CPP_MIN_LOG_LEVEL`` himself."""
  if not verbose:
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class LibraryFilter:
  """A logging filter that passes txf's own records (WARNING and up) and libraries' ERRORs."""

  def __init__(self, package_dir: str = PACKAGE_DIR):
    self.package_dir = package_dir + os.sep

  def filter(self, record) -> bool:
    import logging
    if record.levelno >= logging.ERROR:
      # a library's report of a full or read-only disk (orbax's background save logs it with its
      # traceback): txf reports it as one txf: error line when the failure reaches its caller
      # (and its abandoned metadata thread, which fails once the interpreter shuts down)
      exc = record.exc_info[1] if record.exc_info else None
      return not (exc is not None and (disk_errno_of(exc) or (
          isinstance(exc, RuntimeError) and "cannot schedule new futures after" in str(exc))))
    return record.levelno >= logging.WARNING and record.pathname.startswith(self.package_dir)


def quiet_logging() -> None:
  """After absl parsed the flags: unless ``--verbosity`` was given, log at WARNING (absl's app
  raises it to INFO) and drop libraries' records below ERROR."""
  import logging
  from absl import flags
  from absl import logging as absl_logging
  if flags.FLAGS["verbosity"].present:
    return
  absl_logging.set_verbosity(absl_logging.WARNING)
  handler = absl_logging.get_absl_handler()
  if not any(isinstance(f, LibraryFilter) for f in handler.filters):
    handler.addFilter(LibraryFilter())
  for h in logging.getLogger().handlers:  # handlers other than absl's (set up by a library)
    if h is not handler and not any(isinstance(f, LibraryFilter) for f in h.filters):
      h.addFilter(LibraryFilter())


def quiet_script_logging() -> None:
  """For ``python -m txf.X`` scripts (no txf command around them): libraries' log records below
  ERROR are dropped (absl WARNING lines from tfds, grain or orbax), txf's own warnings stay."""
  import logging
  from absl import logging as absl_logging
  handler = absl_logging.get_absl_handler()
  for h in [handler, *logging.getLogger().handlers]:
    if not any(isinstance(f, LibraryFilter) for f in h.filters):
      h.addFilter(LibraryFilter())
  if not logging.getLogger().handlers:  # absl's handler is installed by app.run; scripts add it
    logging.getLogger().addHandler(handler)


def allocator() -> str:
  """'tcmalloc' if this process runs with tcmalloc preloaded, else 'system'."""
  return "tcmalloc" if "tcmalloc" in os.environ.get("LD_PRELOAD", "") else "system"


def find_tcmalloc(dirs: Sequence[str] = SEARCH_DIRS) -> Optional[str]:
  """Path of an installed tcmalloc shared library, or None."""
  for d in dirs:
    for name in TCMALLOC_NAMES:
      path = os.path.join(d, name)
      if os.path.exists(path):
        return path
  return None


def _unsafe_path_entry() -> Optional[str]:
  """The entry Python put first on ``sys.path`` for this process (the script's directory, or the
  working directory under ``python -m``), or None when it put none (``python -P``)."""
  if sys.flags.safe_path or not sys.path:
    return None
  return sys.path[0] or os.getcwd()


def txf_argv(args: Sequence[str]) -> List[str]:
  """argv of a new process running ``txf ARGS``: this Python's ``-P -m txf.cli ARGS``. ``-P`` keeps
  the working directory off ``sys.path``, so a command run inside another checkout of txf does
  not import that checkout's code; pair it with :func:`same_code_env`."""
  return [sys.executable, "-P", "-m", "txf.cli", *args]


def same_code_env(environ: Mapping[str, str], code_root: str = CODE_ROOT,
                  path0: Optional[str] = "auto") -> Dict[str, str]:
  """``environ`` for a :func:`txf_argv` process that must import the txf this one runs.

  When this process's txf came from the entry Python put first on its path (``path0``; "auto" =
  this process's: ``python -m txf.cli`` in a checkout puts the working directory there), which
  ``-P`` leaves out, ``code_root`` goes first on ``PYTHONPATH``; otherwise nothing changes."""
  env = dict(environ)
  path0 = _unsafe_path_entry() if path0 == "auto" else path0
  if path0 is not None and os.path.realpath(path0) == os.path.realpath(code_root):
    env["PYTHONPATH"] = os.pathsep.join(p for p in (code_root, environ.get("PYTHONPATH")) if p)
  return env


def reexec_plan(environ: Dict[str, str], argv: List[str], platform: str = sys.platform,
                find: Callable[[], Optional[str]] = find_tcmalloc,
                code_root: str = CODE_ROOT, path0: Optional[str] = "auto"
                ) -> Optional[Tuple[List[str], Dict[str, str]]]:
  """(argv, environment) to re-execute ``txf`` (:func:`txf_argv`, the same code:
  :func:`same_code_env` with ``code_root`` and ``path0``) with tcmalloc preloaded, or None when
  that is off (``TXF_MALLOC=system``), done already, not Linux, or tcmalloc is absent."""
  choice = environ.get("TXF_MALLOC", "auto")
  if choice not in ("auto", "tcmalloc", "system"):
    raise ValueError(f"TXF_MALLOC={choice!r}: use auto (tcmalloc if installed), tcmalloc or system")
  if choice == "system" or not platform.startswith("linux") or environ.get(_GUARD):
    return None
  if "tcmalloc" in environ.get("LD_PRELOAD", ""):
    return None
  lib = find()
  if lib is None:
    if choice == "tcmalloc":
      raise ValueError("TXF_MALLOC=tcmalloc but no tcmalloc library was found in "
                       f"{', '.join(SEARCH_DIRS)}: apt-get install libtcmalloc-minimal4, or unset it")
    return None
  preload = " ".join(p for p in (lib, environ.get("LD_PRELOAD", "")) if p)
  env = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40),  # no stderr line per >1 GB buffer
         **environ, "LD_PRELOAD": preload, _GUARD: "1"}
  return txf_argv(argv[1:]), same_code_env(env, code_root, path0)


def maybe_reexec_with_tcmalloc(argv: List[str]) -> None:
  """Replace this process with the same ``txf`` command under tcmalloc (see the module doc).

  Call before JAX is imported; returns normally when nothing is to be done. The process id
  stays the same (``execve``), so signals and exit codes reach the caller unchanged.
  """
  plan = reexec_plan(dict(os.environ), argv)
  if plan is None:
    return
  new_argv, env = plan
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(new_argv[0], new_argv, env)


def _xla_libraries() -> List[str]:
  """The installed jaxlib's shared libraries (where XLA's flag table lives), found without importing
  jax: XLA reads ``XLA_FLAGS`` once, when its backend starts, so flags must be settled before."""
  import glob
  import importlib.util
  spec = importlib.util.find_spec("jaxlib")
  if spec is None or not spec.submodule_search_locations:
    return []
  out = []
  for d in spec.submodule_search_locations:
    out += glob.glob(os.path.join(d, "**", "*.so"), recursive=True)
  return sorted(out)


def xla_knows(flag: str, libraries: Optional[Sequence[str]] = None) -> bool:
  """Whether the installed XLA defines ``flag`` (``--xla_name=value`` or ``xla_name``): its name is a
  string of jaxlib's libraries, as each flag registers it (not only a field of the options proto). XLA aborts the process on a flag it does not know (e.g.
  ``--xla_cpu_use_fusion_emitters``, gone from jaxlib 0.12), so version-dependent flags go through this."""
  import mmap
  name = b"\0" + flag.lstrip("-").split("=", 1)[0].encode() + b"\0"  # the C string a flag registers
  for path in _xla_libraries() if libraries is None else libraries:
    try:
      with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < len(name):
          continue
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
          if m.find(name) >= 0:
            return True
    except (OSError, ValueError):
      continue
  return False


def add_xla_flags(*flags: str, environ=os.environ) -> List[str]:
  """Append to ``XLA_FLAGS`` those of ``flags`` the installed XLA knows (xla_knows); returns the
  ones left out. Call before JAX starts its backend."""
  known = [f for f in flags if xla_knows(f)]
  environ["XLA_FLAGS"] = " ".join([environ.get("XLA_FLAGS", "").strip(), *known]).strip()
  return [f for f in flags if f not in known]
