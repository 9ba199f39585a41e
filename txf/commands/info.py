"""Runs ``txf info``; its usage text and flags are declared in txf.commands.declared.info
(``txf info --help``), which txf/cli.py parses before importing this module."""

import jax

from txf import kernels
from txf.runtime import compile_cache
from txf.core.errors import TxfError
from txf.runtime.machine import machine_info


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}")
  info = machine_info()
  info["devices"] = ", ".join(str(d) for d in jax.devices())
  info["process"] = f"{jax.process_index()} of {jax.process_count()}"
  for key in ("jax", "platform", "device_kind", "devices", "process", "cpu", "cpu_count",
              "usable_cores", "simd", "allocator", "xla_flags", "load_1min"):
    value = info[key]
    print(f"{key}: {','.join(value) if isinstance(value, list) else value}")
  print(f"compile_cache: {compile_cache.describe()}")
  chosen = kernels.describe()
  print("kernels: " + ", ".join(f"{k} {v}" for k, v in chosen.items() if k not in ("jax", "backend")))
