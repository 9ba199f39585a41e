"""ParallelSpec: the run config's layout fields, read once, for the runners and the mesh checks."""

import dataclasses

from txf.core import specs


@dataclasses.dataclass(frozen=True)
class ParallelSpec:
  """Where a run's steps run and how its batch splits (defaults: ``base_config``'s).

  Attributes:
    parallelism: "single", "pmap" or "mesh".
    mesh_shape: (data, fsdp, tensor) devices of one slice; one -1 takes the rest.
    dcn_mesh_shape: () for one slice, else (data, fsdp, tensor) across slices or processes.
    sharding_rules: logical axis -> mesh axes ("a,b"; "" replicated), a read-only mapping.
    batch_size: rows of a global batch.
    grad_accum_steps: micro-batches per step.
    vocab_multiple: the vocabulary tables' row multiple (0 = auto: padded to split).
  """
  parallelism: str = specs.field("parallelism")
  mesh_shape: tuple = specs.field("mesh_shape")
  dcn_mesh_shape: tuple = specs.field("dcn_mesh_shape")
  sharding_rules: dict = specs.field("sharding_rules")
  batch_size: int = specs.field("batch_size")
  grad_accum_steps: int = specs.field("grad_accum_steps")
  vocab_multiple: int = specs.field("model.vocab_multiple")

  @classmethod
  def from_config(cls, config) -> "ParallelSpec":
    """The spec of a run config (a ConfigDict or dict with those fields)."""
    return specs.read(cls, config)
