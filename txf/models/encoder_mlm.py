"""Encoder-only masked language model (BERT's MLM head): encoder -> a prediction per position.

The family ``encoder_mlm`` computes p(token | masked input) at every position; ``txf import-hf``
makes one of a ``BertForMaskedLM`` checkpoint and ``txf export-hf`` writes it back. Training it
needs masked inputs (which positions to mask, and the labels there), which no txf task makes yet:
the family has no real data (``data_kind=None``), its forward and its loss on a batch of
``inputs`` (masked) and ``targets`` (the original token at masked positions, 0 elsewhere) are
what it offers.
"""

import flax.linen as nn
import jax.numpy as jnp

from txf import kernels
from txf.errors import TxfError
from txf.nn import Embed, Encoder, LayerNorm, TransformerConfig
from txf.nn.attention import xavier
from txf.ops.feedforward import ACTIVATIONS


class EncoderMLM(nn.Module):
  """logits_t = LN(f(h_t W_t + b_t)) E^T + b for every position t of h = Encoder(x).

  W_t [d, d], b_t [d] (``mlm_dense``), f = ``model.activation`` (a dense entry of ``ACTIVATIONS``;
  BERT's gelu), LN (``mlm_norm``), E the input embedding table (``model.tie_output``; else the
  head's own ``logits_kernel`` [d, V]) and the output bias b [V] (``logits_bias``, when
  ``model.logits_bias``): BERT's ``cls.predictions``.
  """
  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs, targets=None, inputs_segmentation=None, inputs_position=None):
    """inputs int [B, S] (0 = padding) -> logits [B, S, V]. ``targets`` (the labels of the masked
    positions) is not read: the loss compares the logits with it (txf.models.forward)."""
    cfg = self.config
    if targets is not None and targets.shape != inputs.shape:
      raise TxfError(f"model.family=encoder_mlm predicts the token at each input position: its "
                     f"targets {tuple(targets.shape)} must have the inputs' shape "
                     f"{tuple(inputs.shape)} (no txf task masks text for it yet: data.max_input_len "
                     f"and data.max_target_len must be equal)")
    if cfg.gated_ffn:
      raise ValueError(f"model.activation={cfg.activation!r} is a gated FFN: the MLM head's "
                       f"transform needs a dense activation (gelu, relu, ...)")
    embed = Embed(cfg, cfg.vocab_size, name="embed")
    encoded, _ = Encoder(cfg, embed, name="encoder")(inputs, inputs_segmentation, inputs_position)
    h = nn.Dense(cfg.d_model, name="mlm_dense",
                 kernel_init=nn.with_logical_partitioning(xavier, ("embed", "act_embed")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("norm",))
                 )(encoded.astype(jnp.float32))
    h = LayerNorm(cfg, name="mlm_norm")(ACTIVATIONS[cfg.activation](h))
    h = h.astype(cfg.compute_dtype)
    if cfg.tie_output:
      logits = embed.attend(h)
    else:
      w = self.param("logits_kernel", nn.with_logical_partitioning(xavier, ("embed", "vocab")),
                     (cfg.d_model, cfg.padded_vocab_size))
      logits = kernels.dense(h, w.astype(h.dtype))
    logits = logits.astype(jnp.float32)[..., :cfg.vocab_size]
    if cfg.logits_bias:
      logits = logits + self.param("logits_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("vocab",)), (cfg.vocab_size,))
    return logits
