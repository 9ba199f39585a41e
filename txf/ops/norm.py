"""The normalisations of Add & Norm: layer normalisation (the paper's) and RMSNorm."""

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


def rms_norm(x: jnp.ndarray, gamma: jnp.ndarray, eps: float = 1e-6) -> jnp.ndarray:
  r"""RMSNorm(v) = gamma * v / sqrt(mean(v^2) + eps) over the last axis: LayerNorm without the
  mean subtracted and without beta.

  $$\operatorname{RMSNorm}(v) = \gamma \odot \frac{v}{\sqrt{\tfrac{1}{d}\sum_i v_i^2 + \epsilon}}$$

  Args:
    x: [..., d]; gamma: [d].
  Returns:
    [..., d], same dtype as x (statistics computed in float32).
  """
  xf = x.astype(jnp.float32)
  ms = jnp.square(xf).mean(axis=-1, keepdims=True)
  return (xf * jnp.reciprocal(jnp.sqrt(ms + eps)) * gamma).astype(x.dtype)
