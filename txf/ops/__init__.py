"""Pure jnp functions for the paper's math: no Flax, no state, formulas in docstrings.

Backend-specific ways of computing these formulas live in txf.kernels; analysis tools used by the
notebooks (co-occurrence PCA embeddings, LayerNorm/softmax Jacobians) in txf.analysis.
"""

from txf.ops.attention import (attention_weights, causal_mask, combine_masks, merge_heads,
                               multi_head_attention, padding_mask, scaled_dot_product_attention,
                               segment_mask, split_heads)
from txf.ops.attention import group_heads, group_mask, grouped_query_attention, ungroup_heads
from txf.ops.attention import dot_product_attention
from txf.ops.attention import fold_beams, project_heads, project_output, unfold_beams
from txf.ops.dropout import dropout
from txf.ops.embedding import embed, tied_logits
from txf.ops.feedforward import feed_forward, is_gated, matched_hidden_size
from txf.ops.losses import label_smoothed_cross_entropy, token_accuracy
from txf.ops.masking import allowed_random_ids, mlm_mask
from txf.ops.norm import layer_norm, rms_norm
from txf.ops.positional import (alibi_bias, alibi_slopes, positional_encoding_at,
                                relative_position_bias, relative_position_bucket, rope,
                                rope_frequencies, rope_half,
                                sinusoidal_positional_encoding)
