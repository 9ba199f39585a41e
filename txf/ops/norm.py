"""Layer normalisation (Ba et al. 2016) as used in Add & Norm."""

import jax.numpy as jnp


def layer_norm(x: jnp.ndarray, gamma: jnp.ndarray, beta: jnp.ndarray, eps: float = 1e-6) -> jnp.ndarray:
  r"""LN(v) = gamma * (v - mu) / sqrt(sigma^2 + eps) + beta over the last axis.

  $$\operatorname{LN}(v) = \gamma \odot \frac{v - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta$$

  mu and sigma^2 are the mean and the biased (1/N) variance of the last axis.

  Args:
    x: [..., d]; gamma, beta: [d].
  Returns:
    [..., d], same dtype as x (statistics computed in float32).
  """
  xf = x.astype(jnp.float32)
  mu = xf.mean(axis=-1, keepdims=True)
  var = jnp.square(xf - mu).mean(axis=-1, keepdims=True)
  y = (xf - mu) * jnp.reciprocal(jnp.sqrt(var + eps))
  return (y * gamma + beta).astype(x.dtype)

