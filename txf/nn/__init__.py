"""Flax linen modules that declare parameters and call txf.ops."""

from txf.nn.attention import MultiHeadAttention
from txf.nn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, TransformerConfig
from txf.nn.layers import (AddPositions, Decoder, DecoderLayer, Embed, Encoder, EncoderLayer,
                           FeedForward, LayerNorm, residual)
