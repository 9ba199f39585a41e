"""LayerNorm with its gradient in closed form, for bf16 compute on CPU (the ``bf16_dots="layout"``
kernels of txf.kernels.select).

The forward pass is txf.ops.layer_norm itself. The backward pass is the closed form of its
gradient, row by row (d = the last axis, x̂ = (x - mu) / sqrt(sigma^2 + eps), g the output's
cotangent):

  dx = (g gamma - mean_d(g gamma) - x̂ mean_d(g gamma x̂)) / sqrt(sigma^2 + eps)
  dgamma = sum over rows of g x̂;  dbeta = sum over rows of g

in float32, from x (the statistics recomputed, nothing else saved). Differentiated by jax, the
same gradient took about twice as long on XLA:CPU (docs/benchmarks.md); float32 compute keeps
jax's own gradient, so float32 runs do not change by a bit.
"""

from functools import partial

import jax
import jax.numpy as jnp

from txf import ops


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x: jnp.ndarray, gamma: jnp.ndarray, beta: jnp.ndarray, eps: float) -> jnp.ndarray:
  r"""LN(v) = gamma * (v - mu) / sqrt(sigma^2 + eps) + beta over the last axis
  (``txf.ops.layer_norm``, the same values), with the closed-form gradient above.

  Args:
    x: [..., d]; gamma, beta: [d]; eps: the variance floor.
  Returns:
    [..., d] in x's dtype.
  """
  return ops.layer_norm(x, gamma, beta, eps)


def _layer_norm_fwd(x, gamma, beta, eps):
  return ops.layer_norm(x, gamma, beta, eps), (x, gamma)


def _layer_norm_bwd(eps, res, g):
  x, gamma = res
  xf, gf = x.astype(jnp.float32), g.astype(jnp.float32)
  mu = xf.mean(axis=-1, keepdims=True)
  rstd = jnp.reciprocal(jnp.sqrt(jnp.square(xf - mu).mean(axis=-1, keepdims=True) + eps))
  xhat = (xf - mu) * rstd
  gx = gf * gamma.astype(jnp.float32)
  dx = rstd * (gx - gx.mean(axis=-1, keepdims=True)
               - xhat * (gx * xhat).mean(axis=-1, keepdims=True))
  rows = tuple(range(g.ndim - 1))
  dgamma = (gf * xhat).sum(axis=rows)
  dbeta = gf.sum(axis=rows)
  return dx.astype(x.dtype), dgamma.astype(gamma.dtype), dbeta.astype(gamma.dtype)


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)
