"""What this process runs on: CPU model and SIMD features, cores, jax and its devices, XLA flags,
malloc, load (``txf info``; the benchmarks record it with their figures)."""

import functools
import os
import platform
from typing import Dict, FrozenSet

import jax

from txf.runtime import process as runtime


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
