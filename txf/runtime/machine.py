"""What this process runs on: CPU model and SIMD features, cores, jax and its devices, XLA flags,
malloc, load (``txf info``; the benchmarks record it with their figures)."""

import functools
import os
import platform
from typing import Dict, FrozenSet, Iterable, Mapping, Optional

import jax

from txf.core.errors import TxfError
from txf.runtime import process as runtime

CPUS_ENV = "TXF_CPUS"  # e.g. 0-3 or 0,2: the CPUs a run keeps to (txf sweep --pin_cpus sets it)


def load_average() -> float:
  """The 1-minute load average (runnable processes); compare it with ``os.cpu_count()``."""
  try:
    return round(os.getloadavg()[0], 2)
  except OSError:  # pragma: no cover - not on every platform
    return float("nan")


@functools.lru_cache(maxsize=1)
def cpu_model_and_flags() -> tuple:
  """(CPU model name, frozenset of its feature flags) from /proc/cpuinfo ("flags" on x86,
  "Features" on ARM); ("unknown", frozenset()) where there is no /proc/cpuinfo."""
  model, flags = platform.processor() or "unknown", frozenset()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name") and model in ("unknown", "x86_64", ""):
          model = line.split(":", 1)[1].strip()
        if line.startswith(("flags", "Features")) and not flags:
          flags = frozenset(line.split(":", 1)[1].split())
  except OSError:
    pass
  return model, flags


def usable_cores() -> int:
  """The CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none):
  the size of XLA:CPU's thread pool when jax starts here."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):  # pragma: no cover - not on every platform
    return os.cpu_count() or 1


def parse_cpus(text: str) -> FrozenSet[int]:
  """The CPU numbers of a list such as ``0-3,6`` (ranges inclusive); TxfError if it is not one."""
  cpus = set()
  try:
    for part in text.split(","):
      first, _, last = part.strip().partition("-")
      cpus.update(range(int(first), int(last or first) + 1))
  except ValueError:
    cpus = set()
  if not cpus or min(cpus) < 0:
    raise TxfError(f"{CPUS_ENV}={text!r} is not a list of CPUs: use numbers and ranges, e.g. 0-3,6")
  return frozenset(cpus)


def pin_threads(cpus: Iterable[int]) -> None:
  """Keep every thread of this process (and the threads it starts later) to ``cpus``."""
  cpus = set(cpus)
  for tid in os.listdir("/proc/self/task"):  # the calling thread among them
    try:
      os.sched_setaffinity(int(tid), cpus)
    except OSError:  # a thread that ended meanwhile
      pass


def pin_from_environment(environ: Mapping[str, str] = os.environ) -> Optional[FrozenSet[int]]:
  """With ``TXF_CPUS`` set, keep this process to those CPUs once jax's backend has started: XLA:CPU
  sizes its thread pool, which orders some of its sums, by the cores the process sees when the
  backend starts, so a run pinned after it computes what it computes unpinned, bit for bit, while
  the runs of a sweep stop taking each other's cores. Returns the CPUs (None without the
  variable)."""
  text = environ.get(CPUS_ENV, "").strip()
  if not text:
    return None
  cpus = parse_cpus(text)
  allowed = os.sched_getaffinity(0)
  unknown = cpus - allowed
  if unknown:
    raise TxfError(f"{CPUS_ENV}={text!r} names CPU {min(unknown)}, which this process may not run "
                   f"on (it may run on {','.join(str(c) for c in sorted(allowed))})")
  jax.devices()  # the backend and its thread pool first
  pin_threads(cpus)
  return cpus


def cpu_flags() -> FrozenSet[str]:
  """The CPU's feature flags (see :func:`cpu_model_and_flags`)."""
  return cpu_model_and_flags()[1]


def machine_info() -> Dict[str, object]:
  """What the figures were measured on: CPU model and features, cores, jax, XLA flags, malloc, load."""
  model, flags = cpu_model_and_flags()
  return {"cpu": model, "cpu_count": os.cpu_count(), "usable_cores": usable_cores(),
          "simd": sorted(f for f in flags if f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")),
          "platform": jax.devices()[0].platform, "device_kind": jax.devices()[0].device_kind,
          "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "allocator": runtime.allocator(), "load_1min": load_average()}
