"""The encoder-decoder Transformer for translation (Vaswani et al. 2017, figure 1)."""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from txf.nn import BOS_ID, Decoder, Embed, Encoder, TransformerConfig


def shift_right(targets: jnp.ndarray, segmentation: Optional[jnp.ndarray] = None,
                bos_id: int = BOS_ID) -> jnp.ndarray:
  """Teacher-forcing decoder inputs: [BOS, y_1, ..., y_{T-1}]; in packed rows BOS starts every segment.

  targets int [B, T] -> int [B, T].
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=bos_id)[:, :-1]
  if segmentation is not None:
    previous = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
    starts = (segmentation != previous) & (segmentation != 0)
    shifted = jnp.where(starts, bos_id, shifted)
    shifted = jnp.where(segmentation == 0, 0, shifted)
  return shifted


class EncoderDecoder(nn.Module):
  """Encoder stack over the source, decoder stack (causal self + cross attention) over the target.

  ``share_embeddings``: one table for source and target (needs one shared vocabulary);
  ``tie_output``: logits = h E_target^T.
  """
  config: TransformerConfig

  def setup(self):
    cfg = self.config
    if cfg.share_embeddings:
      if cfg.tgt_vocab_size != cfg.vocab_size:
        raise ValueError("share_embeddings needs one vocabulary: set model.target_vocab_size=0 "
                         "or model.share_embeddings=False")
      self.source_embed = self.target_embed = Embed(cfg, cfg.vocab_size, name="embed")
    else:
      self.source_embed = Embed(cfg, cfg.vocab_size, name="source_embed")
      self.target_embed = Embed(cfg, cfg.tgt_vocab_size, name="target_embed")
    self.encoder = Encoder(cfg, self.source_embed, name="encoder")
    self.decoder = Decoder(cfg, self.target_embed, cross=True, name="decoder")

  def encode(self, inputs, inputs_segmentation=None, inputs_position=None):
    """inputs int [B, S] -> (encoded [B, S, d_model], valid bool [B, S])."""
    return self.encoder(inputs, inputs_segmentation, inputs_position)

  def decode(self, encoded, encoded_valid, decoder_inputs, targets_segmentation=None,
             targets_position=None, inputs_segmentation=None, project: bool = True):
    """Decoder over already-shifted inputs [B, T] attending to encoded [B, S, d] -> logits [B, T, V]
    (``project=False``: (h [B, T, d], output table [V, d]), see ``Decoder``)."""
    return self.decoder(decoder_inputs, encoded, encoded_valid, targets_segmentation,
                        targets_position, inputs_segmentation, project=project)

  def decode_step(self, ids):
    """One cached step (decode config): ids [B, L] -> logits [B, L, V]; cross K/V come from the cache."""
    return self.decoder(ids)

  def __call__(self, inputs, targets, inputs_segmentation=None, targets_segmentation=None,
               inputs_position=None, targets_position=None, project: bool = True):
    """Teacher-forced logits: inputs [B, S], targets [B, T] (ending in EOS, 0-padded) -> [B, T, V].

    ``project=False``: (final decoder states h [B, T, d], output table W [V, d]), logits = h W^T.
    """
    encoded, valid = self.encode(inputs, inputs_segmentation, inputs_position)
    decoder_inputs = shift_right(targets, targets_segmentation, self.config.decoder_start_id)
    return self.decode(encoded, valid, decoder_inputs,
                       targets_segmentation, targets_position, inputs_segmentation, project)
