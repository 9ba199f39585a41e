"""Pure train steps, written once and wrapped by jit, pmap or a device mesh.

``train_step(state, batch, rng) -> (state, metrics)``. With ``axis_name`` set (pmap / shard_map),
loss sums, token counts and gradients are summed over that axis before normalising, so the update
equals the single-device update on the whole batch. The loss is a ``txf.models.LossFn`` (default:
label-smoothed cross-entropy) and the model comes from a ``txf.models.ModelBuilder`` (default:
``txf.models.build_model``), so a researcher's own loss or model trains in the same loop.
"""

from typing import Any, Callable, Dict, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from txf.runtime import program_cache
from txf.inference.evaluate import make_eval_step  # noqa: F401  (the eval step, for callers of both)
from txf.models import LossFn, ModelBuilder, build_model, default_loss
from txf.nn import TransformerConfig


@flax.struct.dataclass
class TrainState:
  """step (int32 scalar), params and opt_state pytrees. The optimizer itself is static, outside."""
  step: jnp.ndarray
  params: Any
  opt_state: Any


def create_train_state(params, tx: optax.GradientTransformation) -> TrainState:
  """Step 0: ``params`` as they are and ``tx.init(params)``, in one compiled program per (tx,
  parameter shapes) (the optimizer's many small zero-filled moments would otherwise each be an
  eager dispatch); the parameters are passed through, not copied."""
  return _create_train_state(params, tx)


@program_cache.cached_jit(static_argnums=(1,))
def _create_train_state(params, tx: optax.GradientTransformation) -> TrainState:
  return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params))


def run_keys(seed: int) -> Tuple[jax.Array, jax.Array]:
  """(init key, dropout key) = ``split(key(seed))``, the same bits as the eager split, as one
  compiled program (kept in the program cache: a warm start compiles nothing for it). Seeds outside
  int32 take the eager split."""
  if not -2 ** 31 <= seed < 2 ** 31:
    return tuple(jax.random.split(jax.random.key(seed)))
  return _run_keys(np.int32(seed))


@program_cache.cached_jit
def _run_keys(seed):
  return tuple(jax.random.split(jax.random.key(seed)))


def guarded_update(tx: optax.GradientTransformation, finite: jnp.ndarray, grads, params, opt_state):
  """(new params, new opt_state) after ``tx``'s update when ``finite`` (a bool scalar), else the
  old ones unchanged. A ``lax.cond``: the update writes its results once, where selecting between
  the updated and the old trees would read both and write a third copy."""

  def update(operands):
    grads, params, opt_state = operands
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return jax.lax.cond(finite, update, lambda operands: operands[1:], (grads, params, opt_state))


def fold_step_into_key(train_step: Callable) -> Callable:
  """``train_step(state, batch, rng)`` -> ``step(state, batch, key)`` taking the run's dropout
  ``key`` and using ``fold_in(key, state.step)`` as the step's rng, derived on device: the host
  passes the same key every step and fetches nothing (step n's rng is ``fold_in(key, n)``, the
  same bits as folding ``n`` in on the host)."""

  def step(state, batch, key):
    return train_step(state, batch, jax.random.fold_in(key, state.step))

  return step


def make_train_step(model_cfg: TransformerConfig, tx: optax.GradientTransformation,
                    label_smoothing: float = 0.0, schedule: Optional[Callable] = None,
                    axis_name: Optional[str] = None, grad_accum_steps: int = 1, *,
                    loss_fn: Optional[LossFn] = None,
                    build: Optional[ModelBuilder] = None) -> Callable:
  """Returns the pure ``train_step(state, batch, rng) -> (state, metrics)``.

  loss = loss_sum / sum_t w_t (default: sum_t w_t * LS-CE_t, the mean over real tokens); the
  gradients are normalised likewise. ``loss_fn`` replaces the default loss (then
  ``label_smoothing`` is unused); ``build`` replaces ``build_model``. A non-finite loss or
  gradient leaves the state unchanged and reports ``finite = 0``; the loop decides whether to
  stop or carry on (``nan_policy``).
  """
  model = (build or build_model)(model_cfg)
  loss = loss_fn or default_loss(model_cfg, label_smoothing)

  def grads_and_terms(params, batch, rng):
    grad_fn = jax.value_and_grad(lambda p, b, r: loss(model, p, b, r), has_aux=True)
    if grad_accum_steps == 1:
      (loss_sum, terms), grads = grad_fn(params, batch, rng)
      return loss_sum, terms, grads
    micro = jax.tree_util.tree_map(
        lambda x: x.reshape(grad_accum_steps, x.shape[0] // grad_accum_steps, *x.shape[1:]), batch)

    def body(carry, xs):
      mb, i = xs
      (ls, t), g = grad_fn(params, mb, jax.random.fold_in(rng, i))
      return jax.tree_util.tree_map(jnp.add, carry, (ls, t, g)), None

    zeros = (jnp.zeros(()), {"count": jnp.zeros(()), "nll_sum": jnp.zeros(()), "correct": jnp.zeros(())},
             jax.tree_util.tree_map(jnp.zeros_like, params))
    (loss_sum, terms, grads), _ = jax.lax.scan(body, zeros, (micro, jnp.arange(grad_accum_steps)))
    return loss_sum, terms, grads

  def train_step(state: TrainState, batch: Dict[str, jnp.ndarray], rng: jax.Array):
    if axis_name is not None:
      rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
    loss_sum, terms, grads = grads_and_terms(state.params, batch, rng)
    if axis_name is not None:
      loss_sum, terms, grads = jax.lax.psum((loss_sum, terms, grads), axis_name)
    count = jnp.maximum(terms["count"], 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / count, grads)
    grad_norm = optax.tree.norm(grads)
    mean_loss = loss_sum / count
    finite = jnp.isfinite(mean_loss) & jnp.isfinite(grad_norm)
    params, opt_state = guarded_update(tx, finite, grads, state.params, state.opt_state)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
    metrics = {"loss": mean_loss, "nll": terms["nll_sum"] / count,
               "accuracy": terms["correct"] / count, "tokens": terms["count"],
               "grad_norm": grad_norm, "finite": finite.astype(jnp.float32)}
    if schedule is not None:
      metrics["learning_rate"] = schedule(state.step)
    return new_state, metrics

  return train_step
