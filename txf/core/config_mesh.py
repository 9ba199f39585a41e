"""The device mesh's arithmetic that configs are checked with and runs are sized by: filling
``mesh_shape``'s -1, the mesh axes a sharding rule names, the vocabulary's padding multiple.
Plain arithmetic on config values (no jax): ``txf.core.config`` re-exports every name. The
functions read a complete config (``txf.core.config.complete``), no field missing."""

import math
from typing import Tuple

import ml_collections

from txf.core.errors import ConfigError


# Padding multiple of the vocabulary tables on GPU and TPU (and whenever a mesh splits them).
ACCELERATOR_VOCAB_MULTIPLE = 128


# The mesh's axes, in the order of ``mesh_shape`` and ``dcn_mesh_shape``.
MESH_AXES = ("data", "fsdp", "tensor")


def fill_mesh_shape(shape, total: int, field: str = "mesh_shape", strict: bool = True
                    ) -> Tuple[int, ...]:
  """(data, fsdp, tensor) of ``shape`` with its one -1 set to what the product ``total`` leaves.

  ``strict``: ConfigError (naming ``field``) unless ``shape`` has 3 entries, all positive but at
  most one -1, and they multiply to ``total``. Lenient (``strict=False``, for sizes read before
  any mesh is built): a shape without 3 entries is (1, 1, 1), a -1 that ``total`` does not leave
  room for (or a second -1) is 1, and any other entry below 1 counts as 1; the product is not
  checked (the mesh's own strict fill names the problem when it is built).
  """
  sizes = [int(x) for x in tuple(shape or ())]
  if len(sizes) != len(MESH_AXES):
    if not strict:
      return (1,) * len(MESH_AXES)
    raise ConfigError(f"{field}={tuple(shape)} needs {len(MESH_AXES)} entries {MESH_AXES}")
  if strict and (sizes.count(-1) > 1 or any(x == 0 or x < -1 for x in sizes)):
    raise ConfigError(f"{field}={tuple(shape)}: entries must be positive, with at most one -1")
  known = math.prod(x if x > 0 else 1 for x in sizes)
  if sizes.count(-1) == 1:
    if total % known == 0:
      sizes[sizes.index(-1)] = total // known
    elif strict:
      raise ConfigError(f"{field}={tuple(shape)}: {total} devices are not divisible by {known}; "
                        f"change {field}")
  if not strict:
    return tuple(max(x, 1) for x in sizes)
  if math.prod(sizes) != total:
    raise ConfigError(f"{field}={tuple(shape)} has {math.prod(sizes)} devices but there are "
                      f"{total}; use -1 for one axis to take the rest")
  return tuple(sizes)


def rule_axes(rule) -> Tuple[str, ...]:
  """The mesh axes one ``sharding_rules`` entry names: ``"data,fsdp"`` -> ("data", "fsdp"),
  ``""`` or None -> () (replicated); a sequence of names is taken as it is. Names are not checked
  here (``validate`` and ``txf.parallel.sharding.parse_rules`` do)."""
  if rule is None:
    return ()
  if isinstance(rule, str):
    return tuple(a.strip() for a in rule.split(",") if a.strip())
  return tuple(rule)


def mesh_axis_sizes(cfg: ml_collections.ConfigDict, num_devices: int,
                    num_granules: int = 1) -> dict:
  """{"data": n, "fsdp": n, "tensor": n} of the mesh ``cfg`` asks for on ``num_devices`` devices
  (``mesh_shape`` times ``dcn_mesh_shape`` over ``num_granules`` slices or processes), all 1 unless
  ``parallelism == "mesh"``. Lenient (``fill_mesh_shape(strict=False)``): a -1 that cannot be
  filled counts as 1 (the mesh's own checks name that problem when it is built)."""
  if cfg.parallelism != "mesh":
    return dict.fromkeys(MESH_AXES, 1)
  dcn = tuple(cfg.dcn_mesh_shape or ())
  dcn_sizes = fill_mesh_shape(dcn, num_granules, strict=False) if dcn else (1, 1, 1)
  slices = math.prod(dcn_sizes)
  ici = fill_mesh_shape(cfg.mesh_shape, max(num_devices // slices, 1), strict=False)
  return {n: a * b for n, a, b in zip(MESH_AXES, ici, dcn_sizes)}


def vocab_splits(cfg: ml_collections.ConfigDict, num_devices: int, num_granules: int = 1) -> int:
  """Into how many shards the mesh of ``cfg`` splits the vocabulary tables: the product of the
  sizes of the mesh axes that ``sharding_rules.vocab`` names (1 without a mesh)."""
  sizes = mesh_axis_sizes(cfg, num_devices, num_granules)
  rule = cfg.sharding_rules.vocab
  ways = 1
  for axis in rule_axes(str(rule or "")):
    ways *= sizes.get(axis, 1)
  return ways


def resolve_vocab_multiple(cfg: ml_collections.ConfigDict, num_devices: int, backend: str,
                           num_granules: int = 1) -> int:
  """``model.vocab_multiple`` when set (> 0); else (0 = auto) 1 on CPU, ACCELERATOR_VOCAB_MULTIPLE
  (128) on GPU/TPU, and lcm(128, s) whenever the mesh splits the vocabulary s > 1 ways (e.g. a
  tensor axis of 2): the padded vocabulary then always divides over the mesh, and stays the same
  for every power-of-two tensor axis up to 128 (so a run resumes on another such mesh)."""
  given = int(cfg.model.vocab_multiple or 0)
  if given > 0:
    return given
  splits = vocab_splits(cfg, num_devices, num_granules)
  if splits > 1:
    return math.lcm(ACCELERATOR_VOCAB_MULTIPLE, splits)
  return ACCELERATOR_VOCAB_MULTIPLE if backend in ("gpu", "tpu", "cuda", "rocm") else 1
