"""Parallelism: wrap a pure step function for one device, pmap data parallelism, or a device mesh.

Knows nothing of models: a runner takes ``train_step(state, batch, rng) -> (state, metrics)`` and
``eval_step(params, batch) -> sums`` and returns placed, compiled versions of them. The parameter
placement table (parameter names -> logical axes) and the logical -> mesh rules are in sharding.py.
"""

from txf.parallel.mesh_runner import MeshRunner
from txf.parallel.pmap_runner import PmapRunner
from txf.parallel.runners import SingleDeviceRunner, make_runner
