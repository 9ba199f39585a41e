"""Multi-host set-up: ``jax.distributed.initialize`` when the environment asks for it.

Every process of a job runs the same command; this decides, from the environment, whether it is
one of several and how to find the others:

  TXF_COORDINATOR=host:port, TXF_NUM_PROCESSES=N, TXF_PROCESS_ID=i
      explicit (launch/local.py sets these; works on any cluster)
  TXF_DISTRIBUTED=auto
      ``jax.distributed.initialize()`` with no arguments: jax's cluster detection (Cloud TPU pods,
      SLURM, Open MPI, Kubernetes). launch/tpu_pod.sh and launch/slurm.sbatch set it.
  SLURM_STEP_NUM_TASKS > 1 (inside `srun` with several tasks; not the batch script itself)
      the same as TXF_DISTRIBUTED=auto
  TXF_DISTRIBUTED=off
      never initialise (e.g. one process per node of a SLURM allocation on purpose)

Options (all processes must agree):
  TXF_HEARTBEAT_TIMEOUT  seconds without heartbeats after which a process counts as dead and every
                         other process exits with an error instead of hanging (default 100)
  TXF_INIT_TIMEOUT       seconds to wait for all processes to connect (default 300)
  TXF_SHUTDOWN_TIMEOUT   seconds a finishing (or failing) process waits for the others at exit
                         (default 300)
  TXF_LOCAL_DEVICE_IDS   comma list of the accelerator ids this process drives, e.g. "0,1,2,3"
                         for one process per node on SLURM (jax's SLURM detection otherwise
                         gives each process only the GPU of its SLURM_LOCALID)
"""

import os
from typing import Any, Callable, Dict, Mapping, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

from txf.config import ConfigError
from txf.errors import TxfError

_MESSAGE_BYTES = 4096


def distributed_args(env: Mapping[str, str] = os.environ) -> Optional[Dict[str, Any]]:
  """The keyword arguments for ``jax.distributed.initialize`` the environment asks for, or None.

  Raises ValueError for an incomplete explicit set-up (names the missing variables).
  """
  mode = env.get("TXF_DISTRIBUTED", "").strip().lower()
  if mode in ("off", "0", "false", "no"):
    return None
  args: Dict[str, Any] = {}
  if env.get("TXF_COORDINATOR"):
    missing = [k for k in ("TXF_NUM_PROCESSES", "TXF_PROCESS_ID") if not env.get(k)]
    if missing:
      raise ConfigError(f"TXF_COORDINATOR={env['TXF_COORDINATOR']} is set but {', '.join(missing)} "
                       f"is not: set all three (launch/local.py does)")
    args.update(coordinator_address=env["TXF_COORDINATOR"],
                num_processes=int(env["TXF_NUM_PROCESSES"]), process_id=int(env["TXF_PROCESS_ID"]))
  elif mode in ("auto", "1", "true", "yes"):
    pass  # jax detects the cluster (TPU pod metadata, SLURM variables, ...)
  elif int(env.get("SLURM_STEP_NUM_TASKS", "1") or 1) > 1:
    pass
  else:
    return None
  args["heartbeat_timeout_seconds"] = int(env.get("TXF_HEARTBEAT_TIMEOUT", "100"))
  args["initialization_timeout"] = int(env.get("TXF_INIT_TIMEOUT", "300"))
  args["shutdown_timeout_seconds"] = int(env.get("TXF_SHUTDOWN_TIMEOUT", "300"))
  if env.get("TXF_LOCAL_DEVICE_IDS"):
    args["local_device_ids"] = [int(i) for i in env["TXF_LOCAL_DEVICE_IDS"].split(",") if i.strip()]
  return args


def maybe_initialize(env: Mapping[str, str] = os.environ) -> bool:
  """Initialise jax.distributed if the environment says so (see the module docstring).

  Call before anything touches a jax device. Returns True when running as one process of several.
  """
  args = distributed_args(env)
  if args is None:
    return False
  jax.distributed.initialize(**args)
  return jax.process_count() > 1


def describe() -> str:
  """'process i of n, l local / g global devices (platform)' for logs."""
  return (f"process {jax.process_index()} of {jax.process_count()}, {jax.local_device_count()} local / "
          f"{jax.device_count()} global {jax.devices()[0].platform} devices")


def main_first(fn: Callable[[], int], name: str) -> int:
  """Run ``fn() -> int`` on process 0 alone, then meet every process at a barrier; returns
  process 0's result on every process.

  The barrier is a broadcast of process 0's outcome (``multihost_utils.broadcast_one_to_all``),
  so nobody reads what ``fn`` writes before it is done, and a failure there stops everyone at
  once instead of leaving the others waiting: a ``TxfError`` raised by ``fn`` is raised on process
  0 as it is and on the others as a ``TxfError`` with the same message (one ``txf: error:`` line
  and exit 2 everywhere); any other exception is re-raised on process 0 and the others raise a
  RuntimeError naming ``name``. With one process, simply ``fn()``.
  """
  if jax.process_count() == 1:
    return fn()
  status, message, error = 0, b"", None
  if jax.process_index() == 0:
    try:
      result = int(fn())
    except TxfError as e:
      status, message, error = 1, str(e).encode()[:_MESSAGE_BYTES], e
    except BaseException as e:  # a bug on process 0: the others must not wait for it
      status, error = 2, e
    else:
      status = 0
  else:
    result = 0
  buffer = np.zeros(_MESSAGE_BYTES, np.int32)
  buffer[:len(message)] = np.frombuffer(message, np.uint8)
  out = multihost_utils.broadcast_one_to_all(
      {"status": np.int32(status), "result": np.int32(result if status == 0 else 0),
       "message": buffer})
  status = int(out["status"])
  if error is not None:
    raise error
  if status == 1:
    text = bytes(np.asarray(out["message"], np.uint8)).rstrip(b"\0").decode(errors="replace")
    raise TxfError(text)
  if status == 2:
    raise RuntimeError(f"process 0 failed during {name}: see its traceback")
  return int(out["result"])
