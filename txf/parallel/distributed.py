"""Multi-host set-up: ``jax.distributed.initialize`` when the environment asks for it."""

import os


def maybe_initialize() -> bool:
  """Initialise jax.distributed if TXF_COORDINATOR (or a cluster environment) says so.

  Returns True when running as one process of several.
  """
  coordinator = os.environ.get("TXF_COORDINATOR")
  if coordinator:
    import jax
    jax.distributed.initialize(coordinator_address=coordinator,
                               num_processes=int(os.environ["TXF_NUM_PROCESSES"]),
                               process_id=int(os.environ["TXF_PROCESS_ID"]))
    return True
  return False
