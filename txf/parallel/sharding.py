"""Meshes and shardings: the logical axes the model declares, mapped onto the data / fsdp / tensor mesh.

Two things decide every placement:

1. The model's own declarations: every parameter is created with one *logical* axis name per
   dimension (``nn.with_logical_partitioning`` in txf/nn and txf/models); ``txf.models.param_axes``
   returns them as a tree of ``PartitionSpec``s of logical names. Optimizer state leaves take the
   axes of the parameter whose path ends theirs (``opt_state/0/mu/encoder/.../wi`` follows
   ``encoder/.../wi``); scalars are replicated; any other leaf is an error, never silently
   replicated.
2. ``config.sharding_rules``: logical axis name -> mesh axes (``"fsdp"``, ``"data,fsdp"``, ``""``
   for replicated). The defaults give FSDP (embed over fsdp), tensor parallelism (heads, mlp and
   vocab over tensor) and data parallelism (batch over data x fsdp). The same table, as flax
   ``logical_axis_rules``, drives the activation constraints inside the step (``step_context``).

A sharded dimension whose size its mesh axes do not divide is a ConfigError naming the fix; a mesh
axis already taken by an earlier dimension of the same array leaves the later dimension replicated.
"""

import contextlib
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from txf.core import config as config_lib
from txf.core.config import ConfigError, base_config

MESH_AXES = config_lib.MESH_AXES


def path_parts(path) -> Tuple[str, ...]:
  """A pytree key path as a tuple of strings (dict keys, attribute names, sequence indices)."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return tuple(parts)


def parse_rules(rules: Optional[Mapping[str, Any]] = None) -> Dict[str, Tuple[str, ...]]:
  """``{"embed": "fsdp", "batch": "data,fsdp", "kv": ""}`` -> ``{"embed": ("fsdp",), ...}``.

  ``rules`` override the defaults of ``config.sharding_rules`` (base_config); a mesh axis that does
  not exist is a ConfigError.
  """
  merged = dict(base_config().sharding_rules.items())
  merged.update(dict(rules or {}))
  out = {}
  for logical, rule in merged.items():
    mesh_axes = config_lib.rule_axes(rule)
    for a in mesh_axes:
      if a not in MESH_AXES:
        raise ConfigError(f"sharding_rules.{logical}={merged[logical]!r} names mesh axis {a!r}, which "
                          f"does not exist: the mesh axes are {MESH_AXES}")
    out[logical] = tuple(mesh_axes)
  return out


def flax_rules(rules: Optional[Mapping[str, Any]] = None):
  """The rules as flax ``logical_axis_rules``: ((logical, mesh axes or None), ...)."""
  return tuple((k, (v[0] if len(v) == 1 else v) if v else None) for k, v in parse_rules(rules).items())


def _dimension_splits(shape: Sequence[int], names: Sequence[Optional[str]],
                      rules: Mapping[str, Tuple[str, ...]], axis_sizes: Mapping[str, int]):
  """[(size, logical name, mesh axes, ways)] per dimension of one array: the mesh axes (of size > 1)
  its logical name maps to and their product, () and 1 when replicated (no rule, or a mesh axis an
  earlier dimension already took)."""
  used, out = set(), []
  for size, logical in zip(shape, names):
    mesh_axes = tuple(a for a in rules.get(logical, ()) if axis_sizes.get(a, 1) > 1) if logical else ()
    if not mesh_axes or used & set(mesh_axes):
      out.append((size, logical, (), 1))
      continue
    used |= set(mesh_axes)
    out.append((size, logical, mesh_axes, int(np.prod([axis_sizes[a] for a in mesh_axes]))))
  return out


def mesh_spec(shape: Sequence[int], names: Sequence[Optional[str]], rules: Mapping[str, Tuple[str, ...]],
              axis_sizes: Mapping[str, int], where: str = "an array") -> PartitionSpec:
  """The mesh PartitionSpec of one array from its logical axis ``names`` (one per dimension).

  Mesh axes of size 1 are dropped; a mesh axis an earlier dimension already took leaves the later
  dimension replicated; a dimension its mesh axes do not divide raises ConfigError.
  """
  spec = []
  for size, logical, mesh_axes, ways in _dimension_splits(shape, names, rules, axis_sizes):
    if not mesh_axes:
      spec.append(None)
      continue
    if size % ways:
      raise ConfigError(
          f"mesh_shape {dict(axis_sizes)}: the '{logical}' axis of {where} has {size} entries, not "
          f"divisible by {'x'.join(mesh_axes)}={ways}: change mesh_shape, the model size, or set "
          f"sharding_rules.{logical}='' to replicate it")
    spec.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
  while spec and spec[-1] is None:
    spec.pop()
  return PartitionSpec(*spec)


# What the model's logical axes are, for the errors of check_splits.
DIMENSIONS = {"heads": "model.num_heads", "kv_heads": "model.num_kv_heads",
              "mlp": "model.d_ff (the FFN hidden size)", "embed": "model.d_model",
              "norm": "model.d_model", "act_embed": "model.d_model", "kv": "d_k (d_model / num_heads)",
              "vocab": "the vocabulary rows", "length": "model.max_len",
              "classes": "the classifier's classes"}


def _dimension_sizes(abstract_params, param_axes) -> Dict[str, set]:
  """{logical axis name: the sizes it has in some parameter}."""
  sizes: Dict[str, set] = {}
  for leaf, names in zip(jax.tree_util.tree_leaves(abstract_params),
                         jax.tree_util.tree_leaves(param_axes,
                                                   is_leaf=lambda x: isinstance(x, PartitionSpec))):
    for size, logical in zip(np.shape(leaf), tuple(names)):
      if logical:
        sizes.setdefault(logical, set()).add(int(size))
  return sizes


def check_splits(layout, abstract_params, param_axes, num_devices: int) -> None:
  """One ConfigError, before anything compiles, if the mesh of ``layout`` (a ``ParallelSpec``,
  parallelism="mesh") splits a model dimension into pieces of unequal size: it names each
  dimension, its size, the mesh axes and their size, and suggests a mesh_shape over
  ``num_devices`` devices that divides every dimension (and ``batch_size`` over data x fsdp).
  ``abstract_params``: the parameters (or their ShapeDtypeStructs); ``param_axes``: their logical
  axes (``txf.models.param_axes``). The vocabulary's rows are padded to divide
  (``vocab_multiple``); only an explicit multiple that does not can fail here."""
  if layout.parallelism != "mesh":
    return
  rules = parse_rules(dict(layout.sharding_rules))
  axis_sizes = config_lib.mesh_axis_sizes(layout, num_devices)
  problems = {}
  for leaf, names in zip(jax.tree_util.tree_leaves(abstract_params),
                         jax.tree_util.tree_leaves(param_axes,
                                                   is_leaf=lambda x: isinstance(x, PartitionSpec))):
    for size, logical, mesh_axes, ways in _dimension_splits(np.shape(leaf), tuple(names), rules,
                                                             axis_sizes):
      if mesh_axes and size % ways:
        problems[(logical, size)] = (mesh_axes, ways)
  if not problems:
    return
  parts = []
  for (logical, size), (mesh_axes, ways) in sorted(problems.items()):
    what = DIMENSIONS.get(logical, f"the '{logical}' axis")
    over = "x".join(f"{a}={axis_sizes[a]}" for a in mesh_axes)
    parts.append(f"{what}={size} (logical axis '{logical}') does not split over {over}")
  advice = []
  if any(logical == "vocab" for logical, _ in problems):
    advice.append("set model.vocab_multiple=0 (auto: pads the vocabulary to divide)")
  mesh = suggest_mesh_shape(layout, _dimension_sizes(abstract_params, param_axes), rules,
                            num_devices)
  if mesh:
    advice.append(f"use e.g. --config.mesh_shape=\"{mesh}\" on {num_devices} devices")
  advice.append("or set sharding_rules.<axis>='' to replicate that axis")
  shape = tuple(layout.mesh_shape)
  raise ConfigError(f"mesh_shape={shape}: " + "; ".join(parts) + ": " + ", ".join(advice))


def suggest_mesh_shape(layout, dimension_sizes: Mapping[str, set], rules, num_devices: int
                       ) -> Optional[Tuple[int, int, int]]:
  """The (data, fsdp, tensor) over ``num_devices`` closest to ``layout.mesh_shape`` (a
  ``ParallelSpec``; tensor, then fsdp, nearest; smaller first) that divides every dimension in
  ``dimension_sizes`` (logical name -> sizes; the vocabulary is skipped when ``vocab_multiple`` is
  auto: it is padded to fit) and ``batch_size`` over its batch axes; None if there is none."""
  want = [int(x) if int(x) > 0 else 1 for x in tuple(layout.mesh_shape)]
  auto_vocab = not layout.vocab_multiple
  batch = layout.batch_size
  best = None
  for tensor in range(1, num_devices + 1):
    for fsdp in range(1, num_devices // tensor + 1):
      if num_devices % (tensor * fsdp):
        continue
      sizes = {"data": num_devices // (tensor * fsdp), "fsdp": fsdp, "tensor": tensor}
      ways = lambda logical: int(np.prod([sizes[a] for a in rules.get(logical, ())]))
      if any(size % ways(logical) for logical, all_sizes in dimension_sizes.items()
             for size in all_sizes if not (auto_vocab and logical == "vocab")):
        continue
      if batch and batch % ways("batch"):
        continue
      key = (abs(tensor - want[2]), tensor > want[2], abs(fsdp - want[1]), fsdp > want[1])
      if best is None or key < best[0]:
        best = (key, (sizes["data"], fsdp, tensor))
  return None if best is None else best[1]


def state_axes(tree, param_axes):
  """Logical axes (a PartitionSpec of names) for every leaf of ``tree``.

  ``param_axes``: the parameters' logical PartitionSpecs (``txf.models.param_axes``). A leaf whose
  path ends with a parameter's path and has its rank takes that parameter's axes (the parameters
  themselves, Adam's mu and nu, ...); replicated are a scalar, a leaf of lower rank under a
  parameter's path (Adafactor's factored row and column statistics) and a vector that follows no
  parameter (Muon's Newton-Schulz coefficients); any other leaf raises
  ValueError. A leaf of one entry (a placeholder) is replicated.
  """
  table = {path_parts(p): spec for p, spec in jax.tree_util.tree_leaves_with_path(
      param_axes, is_leaf=lambda x: isinstance(x, PartitionSpec))}

  def one(path, leaf):
    parts, ndim = path_parts(path), len(np.shape(leaf))
    if all(size == 1 for size in np.shape(leaf)):  # a placeholder (Adafactor's unfactored v_row)
      return PartitionSpec()
    follows = False
    for k in range(len(parts)):
      spec = table.get(parts[k:])
      if spec is not None and len(spec) == ndim:
        return spec
      follows = follows or (spec is not None and len(spec) > ndim)
    if ndim <= 1 or follows:
      return PartitionSpec()
    raise ValueError(f"state leaf {'/'.join(parts)} {tuple(np.shape(leaf))} follows no parameter: "
                     f"it has no logical axes to shard it by")

  return jax.tree_util.tree_map_with_path(one, tree)


def partition_specs(tree, param_axes, rules, axis_sizes: Mapping[str, int]):
  """Pytree of mesh PartitionSpecs for ``tree`` (params, optimizer state or a whole TrainState)."""
  rules = parse_rules(rules)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf, names: mesh_spec(np.shape(leaf), tuple(names), rules, axis_sizes,
                                          "/".join(path_parts(path))),
      tree, state_axes(tree, param_axes))


def named_shardings(tree, mesh: Mesh, rules, param_axes):
  """Pytree of NamedShardings for ``tree`` on ``mesh`` by the declared axes and the rules."""
  specs = partition_specs(tree, param_axes, rules, dict(mesh.shape))
  return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs,
                                is_leaf=lambda x: isinstance(x, PartitionSpec))


def abstract_sharded(abstract_tree, mesh: Mesh, rules, param_axes):
  """``jax.ShapeDtypeStruct``s of ``abstract_tree`` carrying their target shardings: what an
  orbax restore reads into (every process reads only its own shards) and what ``txf plan`` lowers."""
  shardings = named_shardings(abstract_tree, mesh, rules, param_axes)
  return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                abstract_tree, shardings)


def init_sharded(init_fn: Callable, mesh: Mesh, rules, param_axes, *args):
  """Create a state directly in its shardings: no device or host ever holds all of it.

  ``init_fn(*args) -> state`` (e.g. ``create_train_state(init_params(cfg, rng, batch), tx)``) is
  traced once with ``jax.eval_shape`` for the shapes, then compiled with ``out_shardings`` from the
  declared axes and the rules; each device computes only its own shards. ``args`` (an rng key) are
  replicated. The values equal the single-device ``init_fn(*args)`` (partitionable threefry).
  """
  abstract = jax.eval_shape(init_fn, *args)
  shardings = named_shardings(abstract, mesh, rules, param_axes)
  with step_context(mesh, rules):
    return jax.jit(init_fn, out_shardings=shardings)(*args)


@contextlib.contextmanager
def step_context(mesh: Optional[Mesh], rules):
  """Trace a step under ``mesh`` with the rules as flax ``logical_axis_rules``, so the model's
  ``nn.with_logical_constraint`` calls constrain the activations (outside it they do nothing)."""
  if mesh is None:
    yield
    return
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(flax_rules(rules)):
    yield


def batch_spec(rules, axis_sizes: Mapping[str, int]) -> PartitionSpec:
  """Leading (batch) dimension over the ``batch`` rule's mesh axes (size-1 axes dropped)."""
  mesh_axes = tuple(a for a in parse_rules(rules)["batch"] if axis_sizes[a] > 1)
  if not mesh_axes:
    return PartitionSpec()
  return PartitionSpec(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)


def resolve_mesh_shape(mesh_shape: Sequence[int], num_devices: int,
                       field: str = "mesh_shape") -> Tuple[int, ...]:
  """(data, fsdp, tensor) with at most one -1 filled so that the product is ``num_devices``;
  anything else is a ConfigError naming ``field`` (``txf.core.config.fill_mesh_shape``, strict)."""
  return config_lib.fill_mesh_shape(mesh_shape, num_devices, field, strict=True)


def _granules(devices) -> Tuple[str, int]:
  """('slice', n) when the devices carry TPU slice indices, else ('process', n)."""
  slices = {getattr(d, "slice_index", None) for d in devices}
  if None not in slices and len(slices) > 1:
    return "slice", len(slices)
  return "process", len({d.process_index for d in devices})


def make_mesh(mesh_shape: Sequence[int] = (-1, 1, 1), devices=None,
              dcn_mesh_shape: Optional[Sequence[int]] = None) -> Mesh:
  """A (data, fsdp, tensor) mesh over all devices of all processes, in physical order.

  Without ``dcn_mesh_shape``: ``mesh_utils.create_device_mesh`` (neighbouring chips along the
  inner axes). With it (multi-slice, or several hosts joined by a data-centre network):
  ``mesh_shape`` is the mesh within one slice (or process), ``dcn_mesh_shape`` the mesh of slices,
  their product the whole mesh (``create_hybrid_device_mesh``); (-1, 1, 1) puts data parallelism
  across slices. Its product must be the number of slices (TPU) or processes.
  """
  devices = list(jax.devices() if devices is None else devices)
  if dcn_mesh_shape:
    check_dcn_mesh_shape(dcn_mesh_shape, devices)
    kind, count = _granules(devices)
    dcn = resolve_mesh_shape(dcn_mesh_shape, count, "dcn_mesh_shape")
    ici = resolve_mesh_shape(mesh_shape, len(devices) // count)
    array = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices,
                                                 process_is_granule=kind == "process")
  else:
    shape = resolve_mesh_shape(mesh_shape, len(devices))
    try:
      array = mesh_utils.create_device_mesh(shape, devices)
    except (ValueError, NotImplementedError):  # a topology it cannot fold: the plain device order
      array = np.asarray(devices).reshape(shape)
  return Mesh(array, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def check_dcn_mesh_shape(dcn_mesh_shape: Sequence[int], devices=None) -> None:
  """ConfigError unless ``dcn_mesh_shape`` covers exactly the slices (or processes) of the job."""
  devices = list(jax.devices() if devices is None else devices)
  kind, count = _granules(devices)
  shape = [int(s) for s in dcn_mesh_shape]
  if -1 not in shape and int(np.prod(shape)) != count:
    raise ConfigError(f"dcn_mesh_shape={tuple(dcn_mesh_shape)} spans {int(np.prod(shape))} "
                      f"{kind}(es) but this job has {count}: make its product {count} (e.g. "
                      f"({count}, 1, 1) for data parallelism across them) or leave it empty")
  resolve_mesh_shape(shape, count, "dcn_mesh_shape")
