"""Encoder-only classifier (the sentiment model): encoder -> pooled representation -> linear."""

import flax.linen as nn
import jax.numpy as jnp

from txf.nn import Embed, Encoder, TransformerConfig


class EncoderClassifier(nn.Module):
  """logits = W_c pool(Encoder(x)) + b_c.

  pool (``model.pooling``): ``mean`` = sum_t m_t h_t / sum_t m_t over real tokens (m_t = 1, padding 0);
  ``max`` = max_t h_t per feature over real tokens (max-over-time, as CNN sentence classifiers);
  ``first`` = h_0.
  """
  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs, inputs_segmentation=None, inputs_position=None):
    """inputs int [B, S] (0 = padding) -> logits [B, num_classes]."""
    cfg = self.config
    embed = Embed(cfg, cfg.vocab_size, name="embed")
    encoded, valid = Encoder(cfg, embed, name="encoder")(inputs, inputs_segmentation, inputs_position)
    if cfg.pooling == "first":
      pooled = encoded[:, 0]
    elif cfg.pooling == "max":
      lowest = jnp.finfo(encoded.dtype).min
      pooled = jnp.where(valid[..., None], encoded, lowest).max(1)
      pooled = jnp.where(valid.any(1, keepdims=True), pooled, 0.0)  # an all-padding row pools to 0
    else:
      w = valid.astype(encoded.dtype)[..., None]
      pooled = (encoded * w).sum(1) / jnp.maximum(w.sum(1), 1.0)
    pooled = nn.Dropout(cfg.dropout_rate)(pooled, deterministic=cfg.deterministic)
    classifier = nn.Dense(
        cfg.num_classes, name="classifier",
        kernel_init=nn.with_logical_partitioning(nn.linear.default_kernel_init, ("embed", "classes")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("classes",)))
    return classifier(pooled).astype(jnp.float32)
