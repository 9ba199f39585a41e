"""QK-norm (``model.qk_norm``): each query and key head normalised over d_k before Q K^T
(Henry et al. 2020, "Query-Key Normalization for Transformers"; Dehghani et al. 2023, "Scaling
Vision Transformers to 22 Billion Parameters").

  q_i <- Norm_q(q_i),  k_j <- Norm_k(k_j)   per position and head, over the d_k features

Norm is ``txf.ops.layer_norm`` or ``txf.ops.rms_norm`` (eps = ``model.layer_norm_eps``). The
queries and the keys each have their own learned gain gamma [d_k] (and, for layer_norm, bias beta
[d_k]), shared by all heads (as flax's ``MultiHeadDotProductAttention(normalize_qk=True)``, the
ViT-22B recipe; a gain per head would be [h, d_k]): ``query_norm/scale`` and ``key_norm/scale`` of
each attention layer, 1 at init. The keys are normalised before the KV cache stores them.
"""

import flax.linen as nn
import jax.numpy as jnp

from txf import ops
from txf.nn.config import TransformerConfig
from txf.core.variants import Table


def _gain(module: nn.Module, name: str, init, d: int) -> jnp.ndarray:
  """A [d] parameter over the d_k axis ("kv", never split)."""
  return module.param(name, nn.with_logical_partitioning(init, ("kv",)), (d,))


def layer_norm(module: nn.Module, cfg: TransformerConfig, x: jnp.ndarray) -> jnp.ndarray:
  """LN over d_k (``txf.ops.layer_norm``) with ``scale`` [d_k] (1 at init) and ``bias`` [d_k] (0 at
  init) of ``module``. x [B, h, L, d_k] -> same shape and dtype."""
  d = x.shape[-1]
  return ops.layer_norm(x, _gain(module, "scale", nn.initializers.ones, d),
                        _gain(module, "bias", nn.initializers.zeros, d), cfg.layer_norm_eps)


def rms_norm(module: nn.Module, cfg: TransformerConfig, x: jnp.ndarray) -> jnp.ndarray:
  """RMSNorm over d_k (``txf.ops.rms_norm``) with ``scale`` [d_k] (1 at init) of ``module``."""
  return ops.rms_norm(x, _gain(module, "scale", nn.initializers.ones, x.shape[-1]),
                      cfg.layer_norm_eps)


# The QK-norms (``model.qk_norm``; "none" = off, the paper's): name -> f(module, cfg, x), which
# declares its parameters in ``module`` and normalises the last axis of heads x [..., d_k].
QK_NORMS = Table("model.qk_norm", {"layer_norm": layer_norm, "rms_norm": rms_norm}, also=("none",))


class HeadNorm(nn.Module):
  """``QK_NORMS[model.qk_norm]`` on heads [B, h, L, d_k], one gain [d_k] shared by the heads
  (txf.nn.MultiHeadAttention makes two: ``query_norm`` and ``key_norm``)."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    return QK_NORMS[self.config.qk_norm](self, self.config, x)

