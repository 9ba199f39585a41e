"""Flax linen modules that declare parameters and call txf.ops; ``kv_cache``: the decode cache's
layout (its entries, the per-source ones, the step writes and the beam layout)."""

from txf.nn import kv_cache
from txf.nn.attention import MultiHeadAttention
from txf.nn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, TransformerConfig
from txf.nn.layers import (HEADS, NORMS, POSITIONAL, AddPositions, Decoder, DecoderLayer, Embed,
                           Encoder, EncoderLayer, FeedForward, LayerNorm, parallel_residual,
                           residual)
