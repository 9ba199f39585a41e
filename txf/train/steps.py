"""Pure train and eval steps, written once and wrapped by jit, pmap or a device mesh.

``train_step(state, batch, rng) -> (state, metrics)``. With ``axis_name`` set (pmap / shard_map),
loss sums, token counts and gradients are summed over that axis before normalising, so the update
equals the single-device update on the whole batch.
"""

import dataclasses
from typing import Any, Callable, Dict, Optional

import flax
import jax
import jax.numpy as jnp
import optax

from txf import ops
from txf.models import build_model, forward
from txf.nn import TransformerConfig


@flax.struct.dataclass
class TrainState:
  """step (int32 scalar), params and opt_state pytrees. The optimizer itself is static, outside."""
  step: jnp.ndarray
  params: Any
  opt_state: Any


def create_train_state(params, tx: optax.GradientTransformation) -> TrainState:
  return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params))


def _loss_terms(model, params, batch, rng, label_smoothing):
  logits, targets, weights = forward(model, params, batch, rng)
  loss_sum, count = ops.label_smoothed_cross_entropy(logits, targets, weights, label_smoothing)
  nll_sum, _ = ops.label_smoothed_cross_entropy(logits, targets, weights, 0.0)
  correct, _ = ops.token_accuracy(logits, targets, weights)
  return loss_sum, {"count": count, "nll_sum": nll_sum, "correct": correct}


def make_train_step(model_cfg: TransformerConfig, tx: optax.GradientTransformation,
                    label_smoothing: float, schedule: Optional[Callable] = None,
                    axis_name: Optional[str] = None, grad_accum_steps: int = 1) -> Callable:
  """Returns the pure ``train_step(state, batch, rng) -> (state, metrics)``.

  loss = sum_t w_t * LS-CE_t / sum_t w_t (mean over real tokens); gradients likewise normalised.
  A non-finite loss or gradient leaves the state unchanged and reports ``finite = 0``; the loop
  decides whether to stop or carry on (``nan_policy``).
  """
  model = build_model(model_cfg)

  def grads_and_terms(params, batch, rng):
    grad_fn = jax.value_and_grad(lambda p, b, r: _loss_terms(model, p, b, r, label_smoothing), has_aux=True)
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
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.tree.norm(grads)
    loss = loss_sum / count
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = TrainState(step=state.step + 1, params=keep(params, state.params),
                           opt_state=keep(opt_state, state.opt_state))
    metrics = {"loss": loss, "nll": terms["nll_sum"] / count, "accuracy": terms["correct"] / count,
               "tokens": terms["count"], "grad_norm": grad_norm, "finite": finite.astype(jnp.float32)}
    if schedule is not None:
      metrics["learning_rate"] = schedule(state.step)
    return new_state, metrics

  return train_step


def make_eval_step(model_cfg: TransformerConfig, label_smoothing: float,
                   axis_name: Optional[str] = None) -> Callable:
  """``eval_step(params, batch) -> metric sums`` (deterministic model; sums, so batches add up)."""
  model = build_model(model_cfg, deterministic=True)

  def eval_step(params, batch):
    loss_sum, terms = _loss_terms(model, params, batch, None, label_smoothing)
    sums = {"loss_sum": loss_sum, "nll_sum": terms["nll_sum"], "correct": terms["correct"],
            "count": terms["count"]}
    if axis_name is not None:
      sums = jax.lax.psum(sums, axis_name)
    return sums

  return eval_step


def model_config_from(config, task) -> TransformerConfig:
  """The model's frozen config: ``config.model`` fields plus the sizes the data decides."""
  fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  kwargs = {k: v for k, v in config.model.items() if k in fields}
  kwargs.update(vocab_size=task.vocab_size, target_vocab_size=task.target_vocab_size,
                num_classes=task.num_classes or 2)
  return TransformerConfig(**kwargs)
