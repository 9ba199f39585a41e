"""Position-wise feed-forward network (section 3.3)."""

from typing import Callable, Optional

import jax
import jax.numpy as jnp


def feed_forward(x: jnp.ndarray, w1: jnp.ndarray, b1: jnp.ndarray, w2: jnp.ndarray,
                 b2: jnp.ndarray, matmul: Optional[Callable] = None) -> jnp.ndarray:
  """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately.

  Args:
    x: [..., d_model]; w1: [d_model, d_ff]; b1: [d_ff]; w2: [d_ff, d_model]; b2: [d_model].
    matmul: ``(x [..., K], w [K, M]) -> [..., M]`` for the two products (e.g.
      txf.ops.dots.dense); default ``x @ w``.
  Returns:
    [..., d_model].
  """
  if matmul is not None:
    return matmul(jax.nn.relu(matmul(x, w1) + b1), w2) + b2
  # jax.nn.relu = max(0, .) with the gradient select(z > 0, g, 0); jnp.maximum's gradient splits
  # ties with compares and a divide, which made the FFN's backward ~25% slower on CPU (BENCHMARKS.md).
  return jax.nn.relu(x @ w1 + b1) @ w2 + b2
