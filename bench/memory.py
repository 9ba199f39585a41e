"""Per-device memory of parameters + optimizer state under each parallel layout, from the shardings.

  python -m bench.memory                     (paper base and big, 8 devices)
  python -m bench.memory --devices 16 --models big

Nothing is allocated: the train state's shapes come from ``jax.eval_shape`` (model init + Adam),
and each layout's per-device shard shapes from the same code the mesh runner uses
(``txf.parallel.sharding.named_shardings``: the model's declared axes with ``config.sharding_rules``) on an ``AbstractMesh``,
so the figures are exactly what ``parallelism='mesh'`` would place. ``pmap`` keeps a full replica
on every device. Activations, gradients and XLA temporaries are not included (see
``txf bench`` for a compiled step's memory).
"""

import argparse
from typing import Dict, List, Sequence, Tuple

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType

from txf.core.config import base_config
from txf.models import init_params, param_axes
from txf.nn import TransformerConfig
from txf.parallel import sharding as sharding_lib
from txf.train.optimizer import make_optimizer
from txf.train.steps import create_train_state

# the paper's models (Table 3), translation with one shared 37000-token BPE vocabulary
MODELS = {
    "base": dict(d_model=512, num_encoder_layers=6, num_decoder_layers=6, num_heads=8, d_ff=2048,
                 vocab_size=37000),
    "big": dict(d_model=1024, num_encoder_layers=6, num_decoder_layers=6, num_heads=16, d_ff=4096,
                vocab_size=37000),
}


def layouts(devices: int) -> List[Tuple[str, str, Tuple[int, int, int]]]:
  """(name, parallelism, (data, fsdp, tensor)) for ``devices`` devices."""
  half = devices // 2
  return [("single", "single", (1, 1, 1)),
          (f"pmap x{devices}", "pmap", (devices, 1, 1)),
          (f"mesh data={devices}", "mesh", (devices, 1, 1)),
          (f"mesh fsdp={devices}", "mesh", (1, devices, 1)),
          (f"mesh data={half} x tensor=2", "mesh", (half, 1, 2)),
          (f"mesh fsdp={half} x tensor=2", "mesh", (1, half, 2))]


def abstract_state(model: Dict, family: str = "encoder_decoder"):
  """(ShapeDtypeStructs of the TrainState (params + Adam moments), the parameters' logical axes)."""
  config = base_config()
  cfg = TransformerConfig(family=family, max_len=256, **model)
  batch = {"inputs": np.zeros((1, 8), np.int32), "targets": np.zeros((1, 8), np.int32)}
  tx = make_optimizer(config.optimizer, cfg.d_model)
  state = jax.eval_shape(lambda: create_train_state(init_params(cfg, jax.random.key(0), batch), tx))
  return state, param_axes(cfg, batch)


def per_device_bytes(tree, shape: Sequence[int], parallelism: str, rules=None, axes=None) -> int:
  """Bytes of ``tree`` on one device: shard shapes of the mesh layout, whole arrays otherwise."""
  leaves = jax.tree_util.tree_leaves(tree)
  if parallelism != "mesh":
    return int(sum(np.prod(x.shape) * x.dtype.itemsize for x in leaves))
  mesh = AbstractMesh(tuple(shape), sharding_lib.MESH_AXES,
                      axis_types=(AxisType.Auto,) * len(sharding_lib.MESH_AXES))
  shardings = jax.tree_util.tree_leaves(sharding_lib.named_shardings(tree, mesh, rules, axes))
  return int(sum(np.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
                 for x, s in zip(leaves, shardings)))


def memory_table(models: Sequence[str], devices: int, rules=None) -> List[Dict]:
  """One row per (model, layout): parameter count, per-device MB of params, Adam state, total."""
  rows = []
  for name in models:
    state, axes = abstract_state(MODELS[name])
    count = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
    for layout, parallelism, shape in layouts(devices):
      p = per_device_bytes(state.params, shape, parallelism, rules, axes)
      o = per_device_bytes(state.opt_state, shape, parallelism, rules, axes)
      rows.append({"model": name, "params": count, "layout": layout, "mesh": shape,
                   "params_mb": p / 2**20, "opt_mb": o / 2**20, "total_mb": (p + o) / 2**20})
  return rows


def format_table(rows: List[Dict]) -> str:
  header = (f"{'model':<6} {'params':>8}  {'layout':<26} {'(data,fsdp,tensor)':<19} "
            f"{'params/dev':>11} {'adam/dev':>10} {'total/dev':>10} {'vs single':>9}")
  lines = [header, "-" * len(header)]
  single = {r["model"]: r["total_mb"] for r in rows if r["layout"] == "single"}
  for r in rows:
    lines.append(f"{r['model']:<6} {r['params'] / 1e6:>7.1f}M  {r['layout']:<26} "
                 f"{str(r['mesh']):<19} {r['params_mb']:>8.1f} MB {r['opt_mb']:>7.1f} MB "
                 f"{r['total_mb']:>7.1f} MB {r['total_mb'] / single[r['model']]:>9.3f}")
  return "\n".join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--devices", type=int, default=8, help="devices in each layout (even)")
  parser.add_argument("--models", default="base,big", help=f"comma list of {sorted(MODELS)}")
  args = parser.parse_args(argv)
  rules = dict(base_config().sharding_rules.items())
  print(f"per-device memory of float32 parameters + Adam state (mu, nu), encoder-decoder with a "
        f"shared {MODELS['base']['vocab_size']}-token vocabulary, {args.devices} devices; "
        f"sharding_rules {rules}")
  print(format_table(memory_table(args.models.split(","), args.devices, rules)))


if __name__ == "__main__":
  main()
