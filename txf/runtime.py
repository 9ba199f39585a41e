"""Process-level settings applied before JAX starts: tcmalloc under XLA:CPU.

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
from typing import Callable, Dict, List, Optional, Sequence, Tuple

TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
SEARCH_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
               "/usr/local/lib")
_GUARD = "_TXF_MALLOC_REEXEC"


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


def reexec_plan(environ: Dict[str, str], argv: List[str], platform: str = sys.platform,
                find: Callable[[], Optional[str]] = find_tcmalloc
                ) -> Optional[Tuple[List[str], Dict[str, str]]]:
  """(argv, environment) to re-execute ``python -m txf.cli`` with tcmalloc preloaded, or None
  when that is off (``TXF_MALLOC=system``), done already, not Linux, or tcmalloc is absent."""
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
  return [sys.executable, "-m", "txf.cli", *argv[1:]], env


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
