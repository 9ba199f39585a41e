"""Adam with the paper's settings and its inverse-square-root warmup schedule (section 5.3), or a
constant learning rate after a linear warmup (``optimizer.schedule``)."""

import jax.numpy as jnp
import optax


def inverse_sqrt_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  """lr(step) = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

  Linear warmup for ``warmup_steps`` steps, then decay proportional to 1/sqrt(step); the peak,
  at step = warmup, is scale * (d_model * warmup)^-0.5. optax passes the update count (0-based),
  so the schedule evaluates the formula at count + 1.
  """
  if d_model <= 0 or warmup_steps <= 0:
    raise ValueError(f"need d_model > 0 and warmup_steps > 0, got {d_model}, {warmup_steps}")

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)

  return schedule


def constant_schedule(learning_rate: float, warmup_steps: int = 1) -> optax.Schedule:
  """lr(step) = learning_rate * min(1, step / warmup), step counted from 1 (as the inverse-sqrt one).

  ``warmup_steps = 1`` gives the plain constant rate from the first update on.
  """
  if learning_rate <= 0 or warmup_steps <= 0:
    raise ValueError(f"need learning_rate > 0 and warmup_steps > 0, got {learning_rate}, {warmup_steps}")

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return learning_rate * jnp.minimum(1.0, step / warmup_steps)

  return schedule


def make_schedule(opt_cfg, d_model: int) -> optax.Schedule:
  """The schedule ``opt_cfg.schedule`` names: "inverse_sqrt" (default; also when the field is absent,
  as in configs saved before it existed) or "constant" (``opt_cfg.learning_rate``)."""
  kind = opt_cfg.get("schedule", "inverse_sqrt")
  if kind == "inverse_sqrt":
    return inverse_sqrt_schedule(d_model, opt_cfg.warmup_steps, opt_cfg.learning_rate_scale)
  if kind == "constant":
    return constant_schedule(opt_cfg.learning_rate, opt_cfg.warmup_steps)
  raise ValueError(f"optimizer.schedule={kind!r} is not one of ('inverse_sqrt', 'constant')")


def make_optimizer(opt_cfg, d_model: int) -> optax.GradientTransformation:
  """Adam(b1, b2, eps) (AdamW when weight_decay > 0) on ``make_schedule(opt_cfg)``, optional clipping."""
  schedule = make_schedule(opt_cfg, d_model)
  if opt_cfg.weight_decay > 0:
    adam = optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps,
                       weight_decay=opt_cfg.weight_decay)
  else:
    adam = optax.adam(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps)
  if opt_cfg.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(opt_cfg.grad_clip_norm), adam)
  return adam
