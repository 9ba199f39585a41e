"""Parallelism: wrap a pure step function for one device, pmap data parallelism, or a device mesh.

Knows nothing of models: a runner takes ``train_step(state, batch, rng) -> (state, metrics)`` and
``eval_step(params, batch) -> sums`` and returns placed, compiled versions of them. sharding.py maps the logical axes
the model declares on its parameters onto the mesh (``config.sharding_rules``), builds meshes in
physical device order (multi-slice with ``dcn_mesh_shape``) and creates states born sharded.
"""

from txf.parallel.mesh_runner import MeshRunner
from txf.parallel.placed import DeviceParams
from txf.parallel.pmap_runner import PmapRunner
from txf.parallel.runners import SingleDeviceRunner, make_runner
from txf.parallel.spec import ParallelSpec
