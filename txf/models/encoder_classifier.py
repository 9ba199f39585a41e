"""Encoder-only classifier (the sentiment model): encoder -> pooled representation -> linear."""

import flax.linen as nn
import jax.numpy as jnp

from txf.nn import Embed, Encoder, TransformerConfig, mup
from txf.core.variants import Table


def mean_pool(encoded: jnp.ndarray, valid: jnp.ndarray) -> jnp.ndarray:
  """sum_t m_t h_t / max(sum_t m_t, 1) over real tokens (m_t = 1, padding 0).

  encoded [B, S, d]; valid bool [B, S] -> [B, d]."""
  w = valid.astype(encoded.dtype)[..., None]
  return (encoded * w).sum(1) / jnp.maximum(w.sum(1), 1.0)


def max_pool(encoded: jnp.ndarray, valid: jnp.ndarray) -> jnp.ndarray:
  """max_t h_t per feature over real tokens (max-over-time, as CNN sentence classifiers); an
  all-padding row pools to 0. encoded [B, S, d]; valid bool [B, S] -> [B, d]."""
  lowest = jnp.finfo(encoded.dtype).min
  pooled = jnp.where(valid[..., None], encoded, lowest).max(1)
  return jnp.where(valid.any(1, keepdims=True), pooled, 0.0)


def first_pool(encoded: jnp.ndarray, valid: jnp.ndarray) -> jnp.ndarray:
  """h_0, the first position's vector. encoded [B, S, d] -> [B, d]."""
  del valid
  return encoded[:, 0]


# The poolings of the encoder's output, the allowed values of model.pooling.
POOLINGS = Table("model.pooling", {"mean": mean_pool, "max": max_pool, "first": first_pool})


class EncoderClassifier(nn.Module):
  """logits = W_c pool(Encoder(x)) + b_c.

  pool (``model.pooling``, a name of ``POOLINGS``): ``mean`` = sum_t m_t h_t / sum_t m_t over real tokens (m_t = 1, padding 0);
  ``max`` = max_t h_t per feature over real tokens (max-over-time, as CNN sentence classifiers);
  ``first`` = h_0. With ``model.pooler`` the pooled vector p becomes tanh(W_p p + b_p) first
  (``pooler``, a Dense d_model -> d_model: BERT's pooler, with pooling ``first``).
  """
  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs, inputs_segmentation=None, inputs_position=None):
    """inputs int [B, S] (0 = padding) -> logits [B, num_classes]."""
    cfg = self.config
    embed = Embed(cfg, cfg.vocab_size, name="embed")
    encoded, valid = Encoder(cfg, embed, name="encoder")(inputs, inputs_segmentation, inputs_position)
    pooled = POOLINGS[cfg.pooling](encoded, valid)
    if cfg.pooler:  # BERT's pooler: tanh(W_p p + b_p)
      pooled = jnp.tanh(nn.Dense(
          cfg.d_model, name="pooler",
          kernel_init=nn.with_logical_partitioning(nn.linear.default_kernel_init, ("embed", "act_embed")),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("norm",)))(pooled))
    pooled = nn.Dropout(cfg.dropout_rate)(pooled, deterministic=cfg.deterministic)
    if mup.output_multiplier(cfg) != 1.0:  # muP: logits = W_c (p d_0 / d_model) + b_c
      pooled = pooled * mup.output_multiplier(cfg)
    classifier = nn.Dense(
        cfg.num_classes, name="classifier",
        kernel_init=nn.with_logical_partitioning(nn.linear.default_kernel_init, ("embed", "classes")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("classes",)))
    return classifier(pooled).astype(jnp.float32)
