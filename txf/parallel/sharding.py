"""Meshes and shardings: logical axis names on parameters, mapped onto the data / fsdp / tensor mesh.

Two tables decide every placement:

1. ``PARAM_AXES`` (below): parameter name -> one *logical* axis name per dimension. The names are
   the ones txf/nn and txf/models declare (see the shapes in the comments), matched at the end of
   the '/'-joined path, so the same rule also places the optimizer's copies (``opt_state/.../mu/
   encoder/layer_0/ffn/wi``). First match wins; a leaf that matches nothing is replicated.
2. ``config.sharding_rules``: logical axis name -> mesh axes (``"fsdp"``, ``"data,fsdp"``, ``""``
   for replicated). The defaults give FSDP (embed over fsdp), tensor parallelism (heads, mlp and
   vocab over tensor) and data parallelism (batch over data x fsdp).

A dimension whose size is not divisible by its mesh axes, or whose mesh axis is already used by an
earlier dimension of the same array, is replicated instead (``describe`` shows what happened).
"""

import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from txf.config import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

# parameter path (regex, matched at the end)   logical axes, one per dimension
PARAM_AXES: Tuple[Tuple[str, Tuple[Optional[str], ...]], ...] = (
    (r"(^|/)pos_embedding$", (None, "embed")),               # learned PE [max_len, d]
    (r"(^|/)embedding$", ("vocab", "embed")),                # embed|source_embed|target_embed [V, d]
    (r"(^|/)(query|key|value)$", ("embed", "heads", "kv")),  # W^Q, W^K, W^V [d, h, d_k]
    (r"attention/out$", ("heads", "kv", "embed")),           # W^O [h, d_v, d]
    (r"ffn/wi$", ("embed", "mlp")),                          # W_1 [d, d_ff]
    (r"ffn/bi$", ("mlp",)),                                  # b_1 [d_ff]
    (r"ffn/wo$", ("mlp", "embed")),                          # W_2 [d_ff, d]
    (r"ffn/bo$", (None,)),                                   # b_2 [d]
    (r"norm\w*/(scale|bias)$", (None,)),                     # LayerNorm gamma, beta [d]
    (r"(^|/)logits_kernel$", ("embed", "vocab")),            # untied output [d, V]
    (r"classifier/kernel$", ("embed", None)),                # classifier [d, classes]
    (r"classifier/bias$", (None,)),                          # [classes]
)

DEFAULT_RULES = {"batch": "data,fsdp", "embed": "fsdp", "heads": "tensor", "kv": "",
                 "mlp": "tensor", "vocab": "tensor"}


def path_str(path) -> str:
  """A pytree key path as 'a/b/c' (dict keys, attribute names and sequence indices)."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def leaf_axes(name: str, ndim: int, table=PARAM_AXES) -> Tuple[Optional[str], ...]:
  """Logical axes of the leaf at path ``name`` ('a/b/c') with ``ndim`` dimensions (all None if no rule)."""
  for pattern, axes in table:
    if re.search(pattern, name) and len(axes) == ndim:
      return tuple(axes)
  return (None,) * ndim


def logical_axes(tree, table=PARAM_AXES):
  """Pytree like ``tree`` with a tuple of logical axis names (or None) per leaf dimension.

  Scalars and leaves matching no rule (or whose rank differs from the rule's) get all-None.
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: leaf_axes(path_str(path), len(np.shape(leaf)), table), tree)


def parse_rules(rules: Optional[Mapping[str, Any]]) -> Dict[str, Tuple[str, ...]]:
  """``{"embed": "fsdp", "batch": "data,fsdp", "kv": ""}`` -> ``{"embed": ("fsdp",), ...}``."""
  merged = dict(DEFAULT_RULES)
  merged.update(dict(rules or {}))
  out = {}
  for logical, mesh_axes in merged.items():
    if mesh_axes is None:
      mesh_axes = ()
    if isinstance(mesh_axes, str):
      mesh_axes = [a.strip() for a in mesh_axes.split(",") if a.strip()]
    for a in mesh_axes:
      if a not in MESH_AXES:
        raise ConfigError(f"sharding_rules.{logical}={merged[logical]!r} names mesh axis {a!r}; "
                         f"the mesh axes are {MESH_AXES}")
    out[logical] = tuple(mesh_axes)
  return out


def spec_for(shape: Sequence[int], axes: Sequence[Optional[str]], rules: Mapping[str, Tuple[str, ...]],
             axis_sizes: Mapping[str, int]) -> PartitionSpec:
  """The PartitionSpec of one array: each dimension over its logical axis's mesh axes.

  Mesh axes of size 1 are dropped; a dimension not divisible by the product of its mesh axes, or
  whose mesh axis an earlier dimension already took, stays replicated.
  """
  used, spec = set(), []
  for size, logical in zip(shape, axes):
    mesh_axes = tuple(a for a in rules.get(logical, ()) if axis_sizes[a] > 1) if logical else ()
    ways = int(np.prod([axis_sizes[a] for a in mesh_axes])) if mesh_axes else 1
    if not mesh_axes or size % ways or used & set(mesh_axes):
      spec.append(None)
      continue
    used |= set(mesh_axes)
    spec.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
  while spec and spec[-1] is None:
    spec.pop()
  return PartitionSpec(*spec)


def partition_specs(tree, rules, axis_sizes: Mapping[str, int], table=PARAM_AXES):
  """Pytree of PartitionSpecs for ``tree`` (params, optimizer state or a whole TrainState)."""
  rules = parse_rules(rules)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: spec_for(np.shape(leaf), leaf_axes(path_str(path), len(np.shape(leaf)), table),
                                  rules, axis_sizes), tree)


def resolve_mesh_shape(mesh_shape: Sequence[int], num_devices: int) -> Tuple[int, ...]:
  """(data, fsdp, tensor) with at most one -1 filled so that the product is ``num_devices``."""
  shape = [int(s) for s in mesh_shape]
  if len(shape) != len(MESH_AXES):
    raise ConfigError(f"mesh_shape={tuple(mesh_shape)} needs {len(MESH_AXES)} entries {MESH_AXES}")
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ConfigError(f"mesh_shape={tuple(mesh_shape)}: entries must be positive, with at most one -1")
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if num_devices % known:
      raise ConfigError(f"mesh_shape={tuple(mesh_shape)}: {num_devices} devices are not divisible by "
                       f"{known}; change mesh_shape")
    shape[shape.index(-1)] = num_devices // known
  if int(np.prod(shape)) != num_devices:
    raise ConfigError(f"mesh_shape={tuple(mesh_shape)} has {int(np.prod(shape))} devices but there are "
                     f"{num_devices}; use -1 for one axis to take the rest")
  return tuple(shape)


def make_mesh(mesh_shape: Sequence[int] = (-1, 1, 1), devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh over all devices of all processes, classic (Auto) axis types."""
  devices = jax.devices() if devices is None else devices
  shape = resolve_mesh_shape(mesh_shape, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def named_shardings(tree, mesh: Mesh, rules, table=PARAM_AXES):
  """Pytree of NamedShardings for ``tree`` on ``mesh`` by the parameter table and the rules."""
  specs = partition_specs(tree, rules, dict(mesh.shape), table)
  return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs,
                                is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_spec(rules, axis_sizes: Mapping[str, int]) -> PartitionSpec:
  """Leading (batch) dimension over the ``batch`` rule's mesh axes (size-1 axes dropped)."""
  mesh_axes = tuple(a for a in parse_rules(rules)["batch"] if axis_sizes[a] > 1)
  if not mesh_axes:
    return PartitionSpec()
  return PartitionSpec(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)


def describe(tree, rules, axis_sizes: Mapping[str, int], table=PARAM_AXES) -> str:
  """One line per leaf: path, shape, logical axes, PartitionSpec (for logs and debugging)."""
  rules = parse_rules(rules)
  lines = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    name, shape = path_str(path), tuple(np.shape(leaf))
    axes = leaf_axes(name, len(shape), table)
    lines.append(f"{name:<60} {str(shape):<18} {str(axes):<32} {spec_for(shape, axes, rules, axis_sizes)}")
  return "\n".join(lines)
