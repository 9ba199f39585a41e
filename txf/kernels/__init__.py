"""Backend- and version-specific kernels behind one selection function (:func:`select`).

``txf.ops`` holds the paper's formulas; this package holds what makes them fast on a given backend
(bf16 products laid out for the CPU's dot units, an unrolled threefry dropout mask, a fused output
head, top-k through block maxima, a two-reduction argmax, fused/cuDNN attention), each tested
against the formula it replaces (tests/test_kernels.py and the per-kernel tests). ``txf.nn`` calls the dispatch functions
below; they read :func:`select` at trace time.
"""

from txf.kernels.attention import (ATTENTION, Attention, attend, fused_attention, fused_kernel,
                                   project_heads, project_output, resolve_impl,
                                   scaled_dot_product_attention)
from txf.kernels.threefry import bernoulli, dropout
from txf.kernels.head import head_cross_entropy
from txf.kernels.products import dense, feed_forward, layer_norm, tied_logits
from txf.kernels.select import (ATTENTION_IMPLS, Kernels, backend, default_bf16_dots, describe,
                                has_bf16_units, select, use)
from txf.kernels.topk import argmax, blocked_top_k, first_argmax, top_k
