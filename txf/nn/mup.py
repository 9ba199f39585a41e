"""The maximal update parametrization (muP, ``model.parametrization=mup``): the width multipliers
that make a model of width d_model behave, in its first steps and its best learning rate, like
the same model at the base width d_0 = ``model.mup_base_width`` (Yang et al. 2022, Tensor Programs
V, the table for Adam). With r = d_model / d_0:

  hidden matrices (attention W^Q, W^K, W^V, W^O; FFN W1, V, W2; dense hidden layers of the heads)
      init variance  Var_0 / r         (Var_0: the standard init's variance at the base shapes,
                                        so Var ~ 1/fan_in with fan_in ~ r)
      Adam / Lion learning rate  lr / r
  attention logits   Q K^T * sqrt(d_k,0) / d_k    (1/d_k; = 1/sqrt(d_k) at the base width)
  output logits      (h / r) W^T                  (the readout multiplier d_0 / d_model)
  embeddings         E[x] * sqrt(d_0), E ~ N(0, 1/d_0): coordinates of size 1 at every width
  embeddings, biases, norms, output layer: learning rate and init unscaled.

The width is d_model, with d_ff and d_k = d_model / num_heads growing in proportion (num_heads
and the layer count fixed; a fixed ``model.head_dim`` does not scale). At r = 1 every multiplier
is 1 and is skipped: muP at the base width computes exactly what the standard parametrization
does. ``model.parametrization=standard`` (the default) leaves every formula untouched.
"""

import math
from typing import Sequence

import flax.linen as nn
import jax

# The logical axes (txf.nn.attention, layers) that grow with the width: d_model, d_ff, and d_k
# when it is d_model / num_heads.
WIDTH_AXES = ("embed", "act_embed", "mlp")

# The hidden matrices, by parameter name (the last key of their path): their learning rate is
# divided by r. A Dense "kernel" is hidden when its module is one of HIDDEN_DENSE.
HIDDEN_MATRICES = ("query", "key", "value", "out", "wi", "wi_gate", "wo")
HIDDEN_DENSE = ("mlm_dense", "pooler")


def is_mup(cfg) -> bool:
  """Whether ``cfg`` (a TransformerConfig) uses muP."""
  return getattr(cfg, "parametrization", "standard") == "mup"


def width_ratio(cfg) -> float:
  """r = d_model / mup_base_width under muP (1.0 when the base width is 0 = d_model), else 1.0."""
  if not is_mup(cfg) or not cfg.mup_base_width:
    return 1.0
  return cfg.d_model / cfg.mup_base_width


def output_multiplier(cfg) -> float:
  """The output logits' multiplier 1 / r = d_0 / d_model (1.0 in the standard parametrization)."""
  return 1.0 / width_ratio(cfg)


def schedule_width(cfg) -> int:
  """The d_model a learning-rate schedule reads (the paper's inverse-sqrt one scales by
  d_model^-1/2): d_model, or under muP the base width d_0, whose rate muP's per-parameter
  multipliers then carry to every width."""
  return int(round(cfg.d_model / width_ratio(cfg)))


def attention_multiplier(cfg) -> float:
  """The extra factor on Q K^T / sqrt(d_k) that makes it Q K^T sqrt(d_k,0) / d_k: r^-1/2 when
  d_k = d_model / num_heads grows with the width, 1.0 for a fixed ``head_dim`` or at r = 1."""
  return 1.0 if cfg.head_dim else width_ratio(cfg) ** -0.5


def embed_multiplier(cfg) -> float:
  """The factor on E[x] sqrt(d_model) (``embed_scale``) that makes it E[x] sqrt(d_0): r^-1/2."""
  return width_ratio(cfg) ** -0.5 if cfg.embed_scale else 1.0


def embed_std(cfg) -> float:
  """The embedding table's init standard deviation: d_model^-1/2 standard, d_0^-1/2 under muP."""
  return (cfg.d_model / width_ratio(cfg)) ** -0.5


def _xavier_variance(shape: Sequence[float]) -> float:
  """The variance flax's ``xavier_uniform`` gives a kernel of ``shape`` (in_axis -2, out_axis
  -1, the other axes a receptive field): 2 / (rf (shape[-2] + shape[-1])), rf = prod(shape[:-2])."""
  rf = math.prod(shape[:-2]) if len(shape) > 2 else 1.0
  return 2.0 / (rf * (shape[-2] + shape[-1]))


def hidden_init_factor(cfg, shape: Sequence[int], names: Sequence[str]) -> float:
  """The factor on a Xavier-uniform sample of a hidden kernel of ``shape`` with logical axes
  ``names`` that gives it the variance Var_0 / r, Var_0 = Xavier's variance at the base shape
  (each width axis divided by r): sqrt(Var_0 / (r Var(shape))). 1.0 at r = 1."""
  r = width_ratio(cfg)
  if r == 1.0:
    return 1.0
  scaled = set(WIDTH_AXES) | ({"kv"} if not cfg.head_dim else set())
  base = [s / r if n in scaled else float(s) for s, n in zip(shape, names)]
  return math.sqrt(_xavier_variance(base) / (r * _xavier_variance(shape)))


def hidden_init(cfg, init, names: Sequence[str]):
  """``nn.with_logical_partitioning(init, names)`` for a hidden kernel: the standard one as it
  is (the same object when not muP, so nothing changes), under muP its samples times
  :func:`hidden_init_factor`."""
  if width_ratio(cfg) == 1.0:
    return nn.with_logical_partitioning(init, tuple(names))

  def scaled(key, shape, dtype=jax.numpy.float32):
    return init(key, shape, dtype) * hidden_init_factor(cfg, shape, names)

  return nn.with_logical_partitioning(scaled, tuple(names))


def is_hidden(path) -> bool:
  """Whether a parameter path (a tuple of keys, or jax key entries) names a hidden matrix."""
  keys = [getattr(k, "key", k) for k in path]
  name = keys[-1] if keys else None
  return name in HIDDEN_MATRICES or (name == "kernel" and len(keys) > 1 and keys[-2] in HIDDEN_DENSE)


def lr_multipliers(cfg, params):
  """A tree like ``params`` of learning-rate multipliers: 1 / r on the hidden matrices
  (:func:`is_hidden`), 1.0 on every other parameter (embeddings, output layer, biases, norms,
  position tables)."""
  r = width_ratio(cfg)
  return jax.tree_util.tree_map_with_path(lambda p, _: 1.0 / r if is_hidden(p) else 1.0, params)
