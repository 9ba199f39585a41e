"""Building a model: the family's module for a config, its parameters (and their logical axes),
a family-agnostic forward, the model config a run builds, and the vocabulary tables' padding."""

import dataclasses
from typing import Callable, Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import kernels
from txf.core import families
from txf.runtime import program_cache
from txf.core.config import resolve_vocab_multiple
from txf.nn import TransformerConfig


def build_model(cfg: TransformerConfig, deterministic: bool = False, decode: bool = False) -> nn.Module:
  """The module of ``cfg.family`` (its record in ``txf.core.families``) with the run-mode switches set
  (train / eval / decode)."""
  module = families.resolve_module(families.get(cfg.family))
  return module(dataclasses.replace(cfg, deterministic=deterministic or decode, decode=decode))


def model_inputs(family: str, batch: Dict[str, jnp.ndarray]) -> Dict[str, jnp.ndarray]:
  """The keyword arguments of the family's ``__call__`` taken from a batch dict (the record's
  ``inputs`` that the batch holds)."""
  return {k: batch[k] for k in families.get(family).inputs if k in batch}


# Builds a module for a config: ``build(cfg, deterministic=False, decode=False) -> nn.Module``.
ModelBuilder = Callable[..., nn.Module]


def init_boxed_params(cfg: TransformerConfig, rng: jax.Array, batch: Dict[str, jnp.ndarray],
                      build: Optional[ModelBuilder] = None):
  """Parameters as flax makes them: every leaf an ``nn.LogicallyPartitioned`` box holding the
  array and its logical axis names (one per dimension). Traceable; ``init_params`` unboxes.
  ``build`` makes the module (default ``build_model``)."""
  model = (build or build_model)(cfg, deterministic=True)
  return model.init(rng, **model_inputs(cfg.family, batch))["params"]


def init_params(cfg: TransformerConfig, rng: jax.Array, batch: Dict[str, jnp.ndarray],
                build: Optional[ModelBuilder] = None):
  """Initialise parameters (plain arrays) from one example batch (only its keys and dtypes matter
  for txf's own models; a custom ``build`` gets the batch as it is).

  One compiled program per config: txf's modules take every parameter's shape from the config,
  never from the batch, so the init is traced on a probe batch of the same keys and dtypes with
  every dimension 1 (``_probe``) and reused for any batch shape, in this process and, through the
  compilation cache, in the next."""
  return _init_unboxed(cfg, rng, _probe(batch) if build is None else batch, build)


def _probe(batch: Dict[str, jnp.ndarray]) -> Dict[str, jnp.ndarray]:
  """{key: zeros of the same rank and dtype with every dimension 1}."""
  return {k: jnp.zeros((1,) * len(v.shape), v.dtype) for k, v in batch.items()}


@program_cache.cached_jit(static_argnums=(0, 3))
def _init_unboxed(cfg: TransformerConfig, rng: jax.Array, batch: Dict[str, jnp.ndarray],
                  build: Optional[ModelBuilder]):
  """``nn.unbox(init_boxed_params(...))`` compiled once per (config, builder, batch signature)."""
  return nn.unbox(init_boxed_params(cfg, rng, batch, build))


def param_axes(cfg: TransformerConfig, batch: Dict[str, jnp.ndarray],
               build: Optional[ModelBuilder] = None):
  """The logical axes every parameter is declared with: a tree like the parameters whose leaves are
  ``PartitionSpec``s of logical names, e.g. ``PartitionSpec('embed', 'mlp')`` for ``ffn/wi``.

  Nothing is computed (``jax.eval_shape``); ``batch`` may hold ShapeDtypeStructs.
  """
  return abstract_params(cfg, batch, build)[1]


def abstract_params(cfg: TransformerConfig, batch: Dict[str, jnp.ndarray],
                    build: Optional[ModelBuilder] = None):
  """(the parameters as ``jax.ShapeDtypeStruct``s, their logical axes as in ``param_axes``), from
  one trace of the init (kept in the program cache: a warm start does not trace); nothing is
  computed."""
  boxed = program_cache.cached_eval_shape(
      lambda b: init_boxed_params(cfg, jax.random.key(0), b, build), batch)
  return nn.unbox(boxed), nn.get_partition_spec(boxed)


def forward(model: nn.Module, params, batch: Dict[str, jnp.ndarray], dropout_rng=None
            ) -> Tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """Run any family on a batch: returns (logits [..., V], targets [...], weights [...]).

  A family that predicts targets (translation, LM): per-token logits against ``targets``, weight 0
  on padding. One that predicts a label (classification): one logit row per example against
  ``label``; rows whose inputs are all padding (filler rows of a fixed-size eval batch) get
  weight 0.
  """
  family = model.config.family
  rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
  logits = model.apply({"params": params}, **model_inputs(family, batch), rngs=rngs)
  if families.get(family).predicts == "label":
    return logits, batch["label"], (batch["inputs"] != 0).any(-1).astype(jnp.float32)
  return logits, batch["targets"], (batch["targets"] != 0).astype(jnp.float32)


def has_token_head(model: nn.Module) -> bool:
  """Whether ``model``'s ``__call__(..., project=False)`` hands back (h, output table) instead of
  logits: its family's record says so (``txf.core.families.Family.token_head``) and the model is
  exactly the family's module class (a subclass may compute something else)."""
  record = families.get(model.config.family)
  return record.token_head and type(model) is families.resolve_module(record)


def forward_hidden(model: nn.Module, params, batch: Dict[str, jnp.ndarray], dropout_rng=None
                   ) -> Tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """Like ``forward`` for the token families, stopping before the output projection: returns
  (final hidden states h [B, T, d], output table W [V, d], targets [B, T], weights [B, T]), where
  ``forward``'s logits = h W^T, for a model with a token head (:func:`has_token_head`)."""
  rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
  h, table = model.apply({"params": params}, **model_inputs(model.config.family, batch),
                         project=False, rngs=rngs)
  return h, table, batch["targets"], (batch["targets"] != 0).astype(jnp.float32)


def count_params(params) -> int:
  """Total number of scalars in a parameter pytree."""
  return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))


def model_config_for(config, vocab_size: int, target_vocab_size: int = 0, num_classes: int = 0,
                     vocab_multiple: Optional[int] = None, mask_id: int = 0,
                     first_sentinel: int = 0) -> TransformerConfig:
  """The model's frozen config: ``config.model`` and ``config.pretrain`` fields plus the sizes the
  data decides (``vocab_size``; ``target_vocab_size``, 0 = the source vocabulary; ``num_classes``,
  0 = 2; ``mask_id``, the tokenizer's mask token for masked-LM training, 0 = none;
  ``first_sentinel``, its <extra_id_0> for span corruption, 0 = none).
  The one place a run (``model_config_from``), ``txf plan`` and the checkpoint tools get theirs.

  ``vocab_size`` stays the real vocabulary; the tables' padded row count follows
  ``vocab_multiple`` (default: ``config.model.vocab_multiple`` resolved for this run's backend and
  mesh by ``txf.core.config.resolve_vocab_multiple``; 1 for parameters exported without padding).
  """
  fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  kwargs = {k: v for k, v in config.model.items() if k in fields}
  kwargs.update({k: v for k, v in config.pretrain.items() if k in fields})
  if vocab_multiple is None:
    vocab_multiple = resolve_vocab_multiple(config, jax.device_count(), kernels.backend(),
                                            jax.process_count())
  kwargs.update(vocab_size=vocab_size, target_vocab_size=target_vocab_size,
                num_classes=num_classes or 2, vocab_multiple=vocab_multiple, mask_id=int(mask_id),
                first_sentinel=int(first_sentinel))
  return TransformerConfig(**kwargs)


def model_config_from(config, task, vocab_multiple: Optional[int] = None) -> TransformerConfig:
  """``model_config_for`` with the sizes of a data task (``task.vocab_size``,
  ``task.target_vocab_size``, ``task.num_classes``, a masked-LM task's ``mask_id`` and a span
  corruption task's ``first_sentinel``)."""
  return model_config_for(config, task.vocab_size, task.target_vocab_size, task.num_classes,
                          vocab_multiple, getattr(task, "mask_id", 0),
                          getattr(task, "first_sentinel", 0))


def _vocab_tables(params, cfg: TransformerConfig):
  """(path, real rows, axis) of every vocabulary-sized table in a parameter tree of ``cfg``'s model."""
  out = []
  for name, size in (("embed", cfg.vocab_size), ("source_embed", cfg.vocab_size),
                     ("target_embed", cfg.tgt_vocab_size)):
    if name in params and "embedding" in params[name]:
      out.append(((name, "embedding"), size, 0))
  if "decoder" in params and "logits_kernel" in params["decoder"]:
    out.append((("decoder", "logits_kernel"), cfg.tgt_vocab_size, 1))
  return out


def unpad_vocab(params, cfg: TransformerConfig):
  """``params`` with the padding rows of every vocabulary table dropped (``model.vocab_multiple``):
  embeddings [V_pad, d] -> [V, d], an untied output kernel [d, V_pad] -> [d, V]. What every export
  (params.msgpack, averaged checkpoints, other formats) writes; a no-op on unpadded parameters.
  Returns a new (shallow-copied) tree; the leaves of other parameters are the same objects."""
  out = dict(params)
  for (outer, inner), size, axis in _vocab_tables(params, cfg):
    table = params[outer][inner]
    if table.shape[axis] > size:
      cut = table[:size] if axis == 0 else table[:, :size]
      out[outer] = dict(out[outer], **{inner: cut})
  return out


def pad_vocab(params, cfg: TransformerConfig):
  """The inverse of ``unpad_vocab``: vocabulary tables of real size V given zero rows up to
  ``cfg``'s padded size (those rows are never looked up nor predicted, so their values do not
  matter). A no-op on tables that already have the padded size."""
  out = dict(params)
  padded = {cfg.vocab_size: cfg.padded_vocab_size, cfg.tgt_vocab_size: cfg.padded_tgt_vocab_size}
  for (outer, inner), size, axis in _vocab_tables(params, cfg):
    table = params[outer][inner]
    extra = padded[size] - table.shape[axis]
    if extra > 0:
      widths = [(0, extra), (0, 0)] if axis == 0 else [(0, 0), (0, extra)]
      out[outer] = dict(out[outer], **{inner: jnp.pad(jnp.asarray(table), widths)})
  return out
