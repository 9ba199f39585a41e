"""TPU topologies for ``txf plan --topology NAME``: compile for a pod slice from a CPU host.

``topology_devices(name)`` asks libtpu (``pip install -e '.[tpu]'``) for the devices of a TPU
slice that is not here (``jax.experimental.topologies.get_topology_desc``): jit lowers and
compiles for them ahead of time, nothing runs. The names are Cloud TPU's accelerator types
(``v5e-8``, ``v4-32``, ``v5p-128``, ``v6e-256``; v4 and v5p count TensorCores, two per chip, v5e and
v6e count chips), ``NxTYPE`` for N slices of one (multislice, ``2xv5e-256``), or a libtpu
topology string (``v5e:2x4``). ``CHIPS`` gives each generation's HBM per chip and peak dense
bf16 FLOP/s (Cloud TPU's published figures), for "fits" and the step-time estimate.
"""

import os
import re
from typing import Dict, List, Tuple

from txf.core.config import ConfigError

# generation: (HBM bytes per chip, peak bf16 TFLOP/s per chip, TensorCores per chip in the name)
CHIPS: Dict[str, Tuple[int, float, int]] = {
    "v4": (32 * 2 ** 30, 275.0, 2),
    "v5e": (16 * 2 ** 30, 197.0, 1),
    "v5p": (95 * 2 ** 30, 459.0, 2),
    "v6e": (32 * 2 ** 30, 918.0, 1),
}

# accelerator type -> libtpu topology (chip grid) of one slice
SLICES: Dict[str, str] = {
    "v5e-1": "v5e:1x1", "v5e-4": "v5e:2x2", "v5e-8": "v5e:2x4", "v5e-16": "v5e:4x4",
    "v5e-32": "v5e:4x8", "v5e-64": "v5e:8x8", "v5e-128": "v5e:8x16", "v5e-256": "v5e:16x16",
    "v4-8": "v4:2x2x1", "v4-16": "v4:2x2x2", "v4-32": "v4:2x2x4", "v4-64": "v4:2x4x4",
    "v4-128": "v4:4x4x4", "v4-256": "v4:4x4x8",
    "v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2", "v5p-32": "v5p:2x2x4", "v5p-64": "v5p:2x4x4",
    "v5p-128": "v5p:4x4x4", "v5p-256": "v5p:4x4x8",
    "v6e-1": "v6e:1x1", "v6e-4": "v6e:2x2", "v6e-8": "v6e:2x4", "v6e-16": "v6e:4x4",
    "v6e-32": "v6e:4x8", "v6e-64": "v6e:8x8", "v6e-128": "v6e:8x16", "v6e-256": "v6e:16x16",
}


def known_topologies() -> List[str]:
  """The names ``--topology`` accepts (besides ``NxNAME`` and libtpu topology strings)."""
  return sorted(SLICES, key=lambda n: (n.split("-")[0], int(n.split("-")[1])))


def parse_topology(name: str) -> Tuple[str, str, int]:
  """``name`` -> (generation, libtpu topology string, number of slices). Raises ConfigError."""
  slices, single = 1, name.strip()
  match = re.fullmatch(r"(\d+)x(.+)", single)
  if match and not re.fullmatch(r"[\dx]+", single):
    slices, single = int(match.group(1)), match.group(2)
  if single in SLICES:
    grid = SLICES[single]
  elif re.fullmatch(r"(v4|v5e|v5p|v6e):\d+(x\d+)+", single):
    grid = single
  else:
    raise ConfigError(f"unknown TPU topology {name!r}: use one of {', '.join(known_topologies())}, "
                      f"NxNAME for N slices (e.g. 2xv5e-256), or a libtpu topology such as v5e:2x4")
  if slices < 1:
    raise ConfigError(f"topology {name!r}: the number of slices must be >= 1")
  return grid.split(":")[0], grid, slices


def topology_devices(name: str):
  """The devices of TPU topology ``name`` (compile-only: nothing runs on them), from libtpu.

  Raises ConfigError when libtpu is not installed or does not know the topology."""
  _, grid, slices = parse_topology(name)
  # compile only, on a host that may have no TPU: no lock on the TPU, no metadata-server queries
  single = name.split("x", 1)[1] if slices > 1 else name
  settings = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1",
              "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0"}
  if single in SLICES:  # Cloud TPU's name of the accelerator type (v5e is "v5litepod")
    settings["TPU_ACCELERATOR_TYPE"] = single.replace("v5e-", "v5litepod-")
  for key, value in settings.items():
    os.environ.setdefault(key, value)
  try:
    from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
    import libtpu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    raise ConfigError(f"--topology needs libtpu ({e}): pip install -e '.[tpu]' (jax[tpu], the "
                      f"libtpu matching the installed jax)") from None
  kwargs = {"num_slices": slices} if slices > 1 else {}
  try:
    desc = topologies.get_topology_desc(grid, "tpu", **kwargs)
  except Exception as e:  # pylint: disable=broad-except  # libtpu refuses the topology
    raise ConfigError(f"the installed libtpu does not know TPU topology {name!r} ({grid}): "
                      f"{str(e).splitlines()[0][:200]}; known names: {', '.join(known_topologies())}"
                      ) from None
  return list(desc.devices)


def chip(name: str) -> Dict[str, float]:
  """{"generation", "hbm_bytes", "peak_tflops"} of the chips of topology ``name``."""
  generation = parse_topology(name)[0]
  hbm, peak, _ = CHIPS[generation]
  return {"generation": generation, "hbm_bytes": hbm, "peak_tflops": peak}
