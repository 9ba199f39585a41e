"""Seed 003: the analytic Jacobians of the normalisation (LayerNorm without gamma, beta) and of softmax.

These are the derivatives that jax.grad computes for ``txf.ops.layer_norm`` and ``jax.nn.softmax``;
tests check them against ``jax.jacobian`` in float64. All functions act on the last axis and
broadcast over leading axes.

Derivation of the normalisation Jacobian (done here in full so it can be checked):
  n(x) = c / s,  c = x - mu 1,  mu = (1/N) sum_i x_i,  s = sqrt(sigma^2 + eps),  sigma^2 = (1/N) sum_i c_i^2.
  dc_i/dx_k = delta_ik - 1/N.
  d sigma^2/dx_k = (2/N) sum_i c_i (delta_ik - 1/N) = (2/N) c_k          (because sum_i c_i = 0)
  ds/dx_k = (d sigma^2/dx_k) / (2 s) = c_k / (N s)
  dn_i/dx_k = (delta_ik - 1/N) / s - c_i c_k / (N s^3)
  so  J = (N I - 1 1^T) / (N s) - c c^T / (N s^3).
With eps = 0 (s = sigma) this is exactly the article's J = (N*I - 1)/(N*sigma) - (x-mu)(x-mu)^T/(N*sigma^3).
Checks: J 1 = 0 (shift invariance) and, for eps = 0, J c = c/s - c sigma^2/s^3 = 0 (scale invariance).
"""

import jax
import jax.numpy as jnp


def normalise(x: jnp.ndarray, eps: float = 0.0) -> jnp.ndarray:
  """The parameter-free normalisation n(x) = (x - mu) / sqrt(sigma^2 + eps) over the last axis.

  mu = (1/N) sum_i x_i, sigma^2 = (1/N) sum_i (x_i - mu)^2 (population variance, as in LayerNorm).

  Args:
    x: [..., N]; eps: added to the variance (0 gives the article's n(x) = (x - mu)/sigma).
  Returns:
    [..., N].
  """
  c = x - x.mean(axis=-1, keepdims=True)
  return c / jnp.sqrt(jnp.square(c).mean(axis=-1, keepdims=True) + eps)


def normalisation_jacobian(x: jnp.ndarray, eps: float = 0.0) -> jnp.ndarray:
  """J[i, k] = dn_i/dx_k for n(x) = (x - mu) / s, s = sqrt(sigma^2 + eps):

  J = (N I - 1 1^T) / (N s) - (x - mu)(x - mu)^T / (N s^3),  i.e.
  J[i, k] = (delta_ik - 1/N) / s - (x_i - mu)(x_k - mu) / (N s^3).   J is symmetric.

  Where the article's formula J = (N*I - 1)/(N*sigma) - (x - mu)(x - mu)^T/(N*sigma^3) holds, and where
  it does not (derivation in the module docstring; checked against jax.jacobian in the tests):
    * "1" must be read as the all-ones matrix 1 1^T (a scalar 1 broadcast), not the identity.
    * eps = 0, sigma the population (1/N) standard deviation: the article's formula is exact.
    * eps > 0: exact only if BOTH sigma's are replaced by s = sqrt(sigma^2 + eps). Keeping the bare
      sigma (the formula as written) while the function divides by s is wrong by
      (I - 1 1^T/N)(1/sigma - 1/s) - c c^T (1/sigma^3 - 1/s^3)/N, a relative error of about
      eps / (2 sigma^2) in the first term and 3 eps / (2 sigma^2) in the second (negligible for
      LayerNorm's eps = 1e-6 at sigma ~ 1, large when sigma^2 is comparable to eps).
    * sigma the sample (1/(N-1)) standard deviation: the formula is wrong; then ds/dx_k =
      c_k / ((N-1) s) and the second term becomes c c^T / ((N-1) s^3).

  Args:
    x: [..., N]; eps: the variance epsilon of the normalisation being differentiated.
  Returns:
    [..., N, N].
  """
  n = x.shape[-1]
  c = x - x.mean(axis=-1, keepdims=True)
  s = jnp.sqrt(jnp.square(c).mean(axis=-1, keepdims=True) + eps)[..., None]  # [..., 1, 1]
  centring = n * jnp.eye(n, dtype=x.dtype) - jnp.ones((n, n), x.dtype)   # N I - 1 1^T
  return centring / (n * s) - c[..., :, None] * c[..., None, :] / (n * s ** 3)


def layer_norm_jacobian(x: jnp.ndarray, gamma: jnp.ndarray, eps: float = 1e-6) -> jnp.ndarray:
  """Jacobian of LN(x) = gamma * n(x) + beta (``txf.ops.layer_norm``) with respect to x.

  dLN_i/dx_k = gamma_i J[i, k], J = normalisation_jacobian(x, eps), i.e. diag(gamma) J (beta drops out).

  Args:
    x: [..., N]; gamma: [N]; eps: LayerNorm's variance epsilon (txf's default 1e-6).
  Returns:
    [..., N, N].
  """
  return gamma[:, None] * normalisation_jacobian(x, eps)


def normalisation_vjp(x: jnp.ndarray, g: jnp.ndarray, eps: float = 0.0) -> jnp.ndarray:
  """The backward pass of n(x) without forming J: J^T g = J g (J is symmetric).

  J g = (g - mean(g)) / s - n(x) * mean(g * n(x)) / s,  n(x) = (x - mu) / s.

  Args:
    x: [..., N] the forward input; g: [..., N] the cotangent dL/dn.
  Returns:
    dL/dx [..., N].
  """
  c = x - x.mean(axis=-1, keepdims=True)
  s = jnp.sqrt(jnp.square(c).mean(axis=-1, keepdims=True) + eps)
  y = c / s
  return (g - g.mean(axis=-1, keepdims=True) - y * (g * y).mean(axis=-1, keepdims=True)) / s


def softmax_partial(w: jnp.ndarray, j: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
  """One entry of the softmax Jacobian, element-wise form: dw_j/dx_k = w_j (delta_jk - w_k).

  Args:
    w: softmax weights [..., N] (w = softmax(x)); j, k: int indices (arrays broadcast together).
  Returns:
    dw_j/dx_k, shape [...] broadcast with j and k.
  """
  j, k = jnp.asarray(j), jnp.asarray(k)
  delta = (j == k).astype(w.dtype)
  return jnp.take(w, j, axis=-1) * (delta - jnp.take(w, k, axis=-1))


def softmax_jacobian_from_weights(w: jnp.ndarray) -> jnp.ndarray:
  """Matrix form of the softmax Jacobian given w = softmax(x): J = diag(w) - w w^T.

  J[j, k] = w_j (delta_jk - w_k); J is symmetric, J 1 = 0 (adding a constant to x changes nothing).

  Args:
    w: [..., N].
  Returns:
    [..., N, N].
  """
  eye = jnp.eye(w.shape[-1], dtype=w.dtype)
  return w[..., :, None] * eye - w[..., :, None] * w[..., None, :]


def softmax_jacobian(x: jnp.ndarray) -> jnp.ndarray:
  """dw/dx for w = softmax(x), w_j = exp(x_j) / sum_k exp(x_k):  J = diag(w) - w w^T.

  Args:
    x: logits [..., N].
  Returns:
    [..., N, N].
  """
  return softmax_jacobian_from_weights(jax.nn.softmax(x, axis=-1))


def softmax_vjp(w: jnp.ndarray, g: jnp.ndarray) -> jnp.ndarray:
  """The backward pass of softmax without forming J: J^T g = w * (g - <g, w>).

  Args:
    w: softmax weights [..., N]; g: cotangent dL/dw [..., N].
  Returns:
    dL/dx [..., N].
  """
  return w * (g - (g * w).sum(axis=-1, keepdims=True))
