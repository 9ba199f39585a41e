"""The analytic normalisation and softmax Jacobians against jax.jacobian in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.analysis import jacobians as jac
from txf.ops.norm import layer_norm


def reference_normalise(x, eps):
  """n(x) = (x - mu) / sqrt(var + eps), written independently with numpy-style jnp ops."""
  mu = jnp.sum(x) / x.shape[0]
  var = jnp.sum((x - mu) ** 2) / x.shape[0]
  return (x - mu) / jnp.sqrt(var + eps)


def formula_bare_sigma(x):
  """J = (N I - 1)/(N sigma) - (x-mu)(x-mu)^T/(N sigma^3), sigma the population std, in numpy."""
  x = np.asarray(x, np.float64)
  n = x.shape[0]
  c = x - x.mean()
  sigma = x.std()  # ddof=0
  return (n * np.eye(n) - 1.0) / (n * sigma) - np.outer(c, c) / (n * sigma ** 3)


@pytest.mark.parametrize("n", [2, 16])
@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.5])
def test_normalisation_jacobian_matches_autodiff(n, eps):
  rng = np.random.default_rng(n)
  with jax.enable_x64(True):
    x = jnp.asarray(rng.normal(loc=1.5, scale=2.0, size=(3, n)))  # a batch of 3 rows
    both = jax.jit(lambda v: (jac.normalisation_jacobian(v, eps),
                              jax.vmap(jax.jacobian(reference_normalise), (0, None))(v, eps)))
    got, expected = both(x)
    assert got.dtype == jnp.float64 and got.shape == (3, n, n)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-10, atol=1e-12)
  # the invariances the formula encodes: shifts never matter, scale only through eps
  got, x = np.asarray(got), np.asarray(x)
  np.testing.assert_allclose(got @ np.ones(n), 0.0, atol=1e-12)
  if eps == 0.0:
    np.testing.assert_allclose(np.einsum("bik,bk->bi", got, x - x.mean(-1, keepdims=True)), 0.0,
                               atol=1e-12)


def test_formula_is_exact_without_eps_and_off_with_eps():
  rng = np.random.default_rng(0)
  eps = 0.05
  with jax.enable_x64(True):
    x = jnp.asarray(rng.normal(scale=0.3, size=6))
    autodiff = jax.jit(jax.jacobian(reference_normalise))  # d/dx at a traced eps
    true_0, true_eps = np.asarray(autodiff(x, 0.0)), np.asarray(autodiff(x, eps))
    analytic_eps = np.asarray(jax.jit(jac.normalisation_jacobian)(x, eps))
  closed_form = formula_bare_sigma(x)
  # eps = 0: the closed-form formula, computed independently in numpy, is the true Jacobian.
  np.testing.assert_allclose(closed_form, true_0, rtol=1e-10, atol=1e-12)
  # eps > 0 with the bare sigma kept: not the Jacobian of (x - mu)/sqrt(var + eps) ...
  err = np.abs(closed_form - true_eps).max() / np.abs(true_eps).max()
  assert err > 0.5 * eps / (2 * np.asarray(x).var())  # about eps / (2 sigma^2) or more
  # ... but it is once both sigma's become sqrt(var + eps), which is what normalisation_jacobian does.
  np.testing.assert_allclose(analytic_eps, true_eps, rtol=1e-10, atol=1e-12)
  # sample (N-1) std in place of the population std is wrong even at eps = 0.
  xs = np.asarray(x)
  n, c, s = xs.shape[0], xs - xs.mean(), xs.std(ddof=1)
  sample_version = (n * np.eye(n) - 1.0) / (n * s) - np.outer(c, c) / (n * s ** 3)
  assert not np.allclose(sample_version, true_0, rtol=1e-3)


def test_layer_norm_jacobian_matches_autodiff_of_txf_layer_norm():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(3, 8)), jnp.float32)
  gamma = jnp.asarray(rng.normal(size=8), jnp.float32)
  beta = jnp.asarray(rng.normal(size=8), jnp.float32)
  both = jax.jit(lambda v: (jac.layer_norm_jacobian(v, gamma, eps=1e-6),
                            jax.vmap(jax.jacobian(lambda r: layer_norm(r, gamma, beta, 1e-6)))(v)))
  got, expected = both(x)
  assert got.shape == (3, 8, 8)
  # txf's layer_norm computes in float32, so float32 tolerances here
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-4, atol=1e-5)


def test_normalisation_vjp_matches_jax_vjp():
  rng = np.random.default_rng(2)
  with jax.enable_x64(True):
    x = jnp.asarray(rng.normal(size=(4, 7)))
    g = jnp.asarray(rng.normal(size=(4, 7)))
    ref = lambda v: jax.vmap(reference_normalise, (0, None))(v, 1e-3)  # noqa: E731
    check = jax.jit(lambda v, g: (jac.normalisation_vjp(v, g, 1e-3), jax.vjp(ref, v)[1](g)[0],
                                  jac.normalise(v, 1e-3), ref(v)))
    got, expected, got_n, expected_n = check(x, g)
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(np.asarray(got_n), np.asarray(expected_n), rtol=1e-12)


@pytest.mark.parametrize("n", [1, 11])
def test_softmax_jacobian_matches_autodiff(n):
  rng = np.random.default_rng(n)
  softmax = lambda v: jnp.exp(v - v.max()) / jnp.sum(jnp.exp(v - v.max()))  # noqa: E731
  j, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")

  def all_three(x):
    # matrix form; element-wise form w_j (delta_jk - w_k) entry by entry over the grid; autodiff
    return jac.softmax_jacobian(x), jac.softmax_partial(softmax(x), j, k), jax.jacobian(softmax)(x)

  with jax.enable_x64(True):
    got, entries, expected = jax.jit(all_three)(jnp.asarray(rng.normal(scale=3.0, size=n)))
    assert got.dtype == jnp.float64
  got, entries, expected = np.asarray(got), np.asarray(entries), np.asarray(expected)
  np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-14)
  np.testing.assert_allclose(entries, expected, rtol=1e-10, atol=1e-14)
  np.testing.assert_allclose(got @ np.ones(n), 0.0, atol=1e-14)


def test_softmax_jacobian_batched_and_vjp():
  rng = np.random.default_rng(7)

  def check(x, g):
    w, vjp = jax.vjp(lambda v: jax.nn.softmax(v, axis=-1), x)
    expected = jax.vmap(jax.vmap(jax.jacobian(jax.nn.softmax)))(x)
    return jac.softmax_jacobian(x), expected, jac.softmax_vjp(w, g), vjp(g)[0]

  with jax.enable_x64(True):
    got, expected, got_vjp, expected_vjp = jax.jit(check)(jnp.asarray(rng.normal(size=(2, 3, 5))),
                                                         jnp.asarray(rng.normal(size=(2, 3, 5))))
  assert got.shape == (2, 3, 5, 5)
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-10, atol=1e-14)
  np.testing.assert_allclose(np.asarray(got_vjp), np.asarray(expected_vjp), rtol=1e-10, atol=1e-14)
