"""The model's matrix-product formulas, dispatched once on :func:`txf.kernels.select`: txf.ops's
formula, or its bf16 CPU restatement in txf.kernels.bf16."""

from typing import Callable, Optional

import jax.numpy as jnp

from txf import ops
from txf.kernels import bf16, norm
from txf.kernels.select import select


def feed_forward(x: jnp.ndarray, w1: jnp.ndarray, b1: Optional[jnp.ndarray], w2: jnp.ndarray,
                 b2: Optional[jnp.ndarray], activation: str = "relu",
                 w_gate: Optional[jnp.ndarray] = None,
                 b_gate: Optional[jnp.ndarray] = None,
                 hidden_fn: Optional[Callable] = None) -> jnp.ndarray:
  """FFN(x) = f(x W1 + b1) W2 + b2, or the gated (f(x W1 + b1) * (x V + c)) W2 + b2
  (``txf.ops.feed_forward``, same arguments): x [..., d_model] -> [..., d_model].
  ``hidden_fn``: applied to the hidden activations [..., d_ff] before W2 (None: nothing)."""
  if select(x.dtype).layout_dots:
    return bf16.feed_forward(x, w1, b1, w2, b2, activation, w_gate, b_gate, hidden_fn)
  return ops.feed_forward(x, w1, b1, w2, b2, activation=activation, w_gate=w_gate, b_gate=b_gate,
                           hidden_fn=hidden_fn)


def tied_logits(h: jnp.ndarray, table: jnp.ndarray) -> jnp.ndarray:
  """logits = h E^T (``txf.ops.tied_logits``): h [..., d], E [V, d] -> [..., V] (float32 from the
  bf16 CPU products, h's dtype otherwise)."""
  if select(h.dtype).layout_dots:
    return bf16.tied_logits(h, table)
  return ops.tied_logits(h, table)


def dense(x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
  """x W: x [..., K], w [K, M] -> [..., M] in x's dtype."""
  if select(x.dtype).layout_dots:
    return bf16.dense(x, w)
  return jnp.matmul(x, w)


def layer_norm(x: jnp.ndarray, gamma: jnp.ndarray, beta: jnp.ndarray, eps: float,
               compute_dtype=None) -> jnp.ndarray:
  """LN(v) = gamma * (v - mu) / sqrt(sigma^2 + eps) + beta (``txf.ops.layer_norm``): x [..., d]
  -> [..., d]. Under ``compute_dtype`` bf16 with the bf16 CPU kernels, its gradient is
  txf.kernels.norm's closed form; otherwise jax differentiates the formula."""
  if select(compute_dtype).layout_dots:
    return norm.layer_norm(x, gamma, beta, eps)
  return ops.layer_norm(x, gamma, beta, eps)
