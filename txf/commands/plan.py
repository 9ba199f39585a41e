"""Runs ``txf plan``; its usage text and flags are declared in txf.commands.declared.plan
(``txf plan --help``), which txf/cli.py parses before importing this module."""

import json
import os
import sys

from absl import flags

from txf.runtime import process as runtime
from txf.core.errors import TxfError


FAKE_FLAG = "--xla_force_host_platform_device_count"


def _reexec_with_fake_devices(n: int) -> None:
  """Run this command again with ``n`` fake CPU devices (XLA reads XLA_FLAGS once, at start)."""
  xla = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(FAKE_FLAG))
  env = dict(os.environ, XLA_FLAGS=f"{xla} {FAKE_FLAG}={n}".strip(), TXF_PLAN_FAKE_DEVICES=str(n),
             JAX_PLATFORMS="cpu")
  # sys.argv is ["txf plan", flags...] here (txf.cli sets it before importing the command)
  argv = runtime.txf_argv(["plan"] + sys.argv[1:])
  os.execve(argv[0], argv, runtime.same_code_env(env))


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}: flags look like --config.mesh_shape=(1,8,1)")
  f = flags.FLAGS
  from txf.core.config import ConfigError, complete
  from txf.train.tables import validate
  config = complete(f.config)  # an experiment file may leave fields at their defaults
  from txf.train.init_from import apply_init_from
  apply_init_from(config)  # config.init_from (an imported GPT-2, ...): plan the model it starts
  validate(config)
  if f.devices < 0 or f.mfu <= 0 or f.mfu > 1 or f.device_peak_tflops < 0:
    raise ConfigError("--devices must be >= 0, --mfu in (0, 1], --device_peak_tflops >= 0")
  import jax
  if f.topology:
    jax.config.update("jax_platforms", "cpu")  # the host compiles; the TPU devices come from libtpu
    _plan_topology(config, f)
    return
  devices = jax.devices()
  if f.devices > len(devices):
    if devices[0].platform == "cpu" and not os.environ.get("TXF_PLAN_FAKE_DEVICES"):
      _reexec_with_fake_devices(f.devices)
    raise ConfigError(f"--devices={f.devices} but only {len(devices)} {devices[0].platform} devices "
                      f"are available: lower --devices, or plan on a CPU with fake devices "
                      f"(JAX_PLATFORMS=cpu txf plan --devices {f.devices})")
  if f.devices:
    devices = devices[:f.devices]
  from txf.plan import plan
  result = plan(config, f.vocab_size or config.data.vocab_size, devices, f.device_peak_tflops, f.mfu,
                hosts=f.hosts)
  _report(result, f.json)


def _plan_topology(config, f) -> None:
  """``--topology``: the plan compiled for a TPU slice's devices (libtpu, ahead of time)."""
  from txf.plan import plan, topology
  if f.devices:
    raise TxfError("--devices and --topology do not go together: the topology decides the devices")
  devices = topology.topology_devices(f.topology)
  chip = topology.chip(f.topology)
  result = plan(config, f.vocab_size or config.data.vocab_size, devices,
                f.device_peak_tflops or chip["peak_tflops"], f.mfu, chip["hbm_bytes"], f.hosts)
  result["topology"] = f.topology
  _report(result, f.json)


def _report(result, json_path: str) -> None:
  """Print the plan; with ``--json`` also write it (atomically) to ``json_path``."""
  from txf.plan import format_plan
  print(format_plan(result))
  if json_path:
    tmp = f"{json_path}.tmp{os.getpid()}"
    with open(tmp, "w") as out:
      json.dump(result, out, indent=1)
    os.replace(tmp, json_path)
