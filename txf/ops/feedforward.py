"""Position-wise feed-forward network (section 3.3)."""

import jax
import jax.numpy as jnp

from txf.variants import Table

# The FFN activations f of FFN(x) = f(x W1 + b1) W2 + b2, the allowed values of model.activation:
# relu (the paper), gelu (exact, erf), swish = silu (z * sigmoid(z), Marian/OPUS-MT). The bf16 CPU
# kernel (txf.kernels.bf16.feed_forward) applies the same f. jax.nn.relu = max(0, .) with the
# gradient select(z > 0, g, 0); jnp.maximum's gradient splits ties with compares and a divide, which
# made the FFN's backward ~25% slower on CPU (BENCHMARKS.md).
ACTIVATIONS = Table("model.activation", {
    "relu": jax.nn.relu,
    "gelu": lambda z: jax.nn.gelu(z, approximate=False),
    "swish": jax.nn.silu,
})


def feed_forward(x: jnp.ndarray, w1: jnp.ndarray, b1: jnp.ndarray, w2: jnp.ndarray,
                 b2: jnp.ndarray, activation: str = "relu") -> jnp.ndarray:
  r"""FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately.

  $$\operatorname{FFN}(x) = \max(0,\, xW_1 + b_1)\,W_2 + b_2$$

  ``activation`` replaces max(0, .) by another f of ``ACTIVATIONS``: gelu(z) = z Phi(z) (the
  exact, erf form), swish(z) = z sigmoid(z).

  Args:
    x: [..., d_model]; w1: [d_model, d_ff]; b1: [d_ff]; w2: [d_ff, d_model]; b2: [d_model].
  Returns:
    [..., d_model].
  """
  return ACTIVATIONS[activation](x @ w1 + b1) @ w2 + b2
