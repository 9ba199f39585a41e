"""txf.train.steps.guarded_update (a lax.cond) against selecting between the updated and the old
trees with jnp.where, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from txf.train.steps import guarded_update


@pytest.mark.parametrize("finite", [True, False])
def test_guarded_update_equals_select(finite):
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32), "b": jnp.zeros((3,), jnp.float32)}
  grads = jax.tree_util.tree_map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  tx = optax.adam(0.01, b1=0.9, b2=0.98, eps=1e-9)
  opt_state = tx.update(grads, tx.init(params), params)[1]   # non-trivial moments

  def select(flag):
    updates, new_opt = tx.update(grads, opt_state, params)
    new = optax.apply_updates(params, updates)
    keep = lambda n, o: jax.tree_util.tree_map(lambda a, b: jnp.where(flag, a, b), n, o)
    return keep(new, params), keep(new_opt, opt_state)

  flag = jnp.asarray(finite)
  got = jax.jit(lambda f: guarded_update(tx, f, grads, params, opt_state))(flag)
  want = jax.jit(select)(flag)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(a, b)
  moved = not np.array_equal(got[0]["w"], params["w"])
  assert moved == finite
