"""Decoder-only causal language model: the decoder stack without cross-attention."""

import flax.linen as nn

from txf.models.encoder_decoder import shift_right
from txf.nn import Decoder, Embed, TransformerConfig


class DecoderLM(nn.Module):
  """p(y_t | y_<t) from causal self-attention; tied input/output embedding by default."""
  config: TransformerConfig

  def setup(self):
    self.embed = Embed(self.config, self.config.vocab_size, name="embed")
    self.decoder = Decoder(self.config, self.embed, cross=False, name="decoder")

  def decode_step(self, ids):
    """One cached step (decode config): ids [B, L] -> logits [B, L, V]."""
    return self.decoder(ids)

  def __call__(self, targets, targets_segmentation=None, targets_position=None,
               project: bool = True):
    """targets int [B, T] (0-padded) -> next-token logits [B, T, V] over shift_right(targets)
    (the row starts with ``model.decoder_start_id``: BOS, or an imported GPT-2's <|endoftext|>).

    ``project=False``: (final states h [B, T, d], output table W [V, d]), logits = h W^T.
    """
    return self.decoder(shift_right(targets, targets_segmentation, self.config.decoder_start_id),
                        None, None,
                        targets_segmentation, targets_position, project=project)
