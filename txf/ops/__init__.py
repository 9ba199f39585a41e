"""Pure jnp functions for the paper's math: no Flax, no state, formulas in docstrings."""

from txf.ops import cooccurrence, jacobians  # seed 003: PCA embeddings; LayerNorm/softmax Jacobians
from txf.ops.attention import (causal_mask, combine_masks, merge_heads, multi_head_attention,
                               padding_mask, scaled_dot_product_attention, segment_mask, split_heads)
from txf.ops.embedding import embed, tied_logits
from txf.ops.feedforward import feed_forward
from txf.ops.head import head_cross_entropy
from txf.ops.losses import label_smoothed_cross_entropy, token_accuracy
from txf.ops.norm import layer_norm
from txf.ops.positional import positional_encoding_at, sinusoidal_positional_encoding
