"""Adam with the paper's settings and its inverse-square-root warmup schedule (section 5.3), or a
constant learning rate after a linear warmup (``optimizer.schedule``); either can end with a linear
cooldown to zero over the run's last ``optimizer.cooldown_steps`` steps."""

import jax.numpy as jnp
import optax
from txf.config import ConfigError


def inverse_sqrt_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  r"""lr(step) = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

  $$\mathit{lrate} = \mathit{scale} \cdot d_\text{model}^{-0.5} \cdot
  \min\big(\mathit{step}^{-0.5},\ \mathit{step} \cdot \mathit{warmup}^{-1.5}\big)$$

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


def with_cooldown(schedule: optax.Schedule, total_steps: int, cooldown_steps: int) -> optax.Schedule:
  """lr'(step) = lr(step) * min(1, (total - step + 1) / cooldown), step counted from 1.

  The last ``cooldown_steps`` updates of a ``total_steps`` run fall linearly to zero: update
  ``total - cooldown + 1`` has the full rate, the last one (step = total) 1/cooldown of it.
  Earlier steps are unchanged. (A "warmup-stable-decay" tail; T5X ends its rsqrt schedule
  the same way.) It ends only if the run reaches ``total_steps``: size the run to its time limit.
  """
  if total_steps <= 0 or not 0 < cooldown_steps <= total_steps:
    raise ValueError(f"need 0 < cooldown_steps <= total_steps, got {cooldown_steps}, {total_steps}")

  def cooled(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return schedule(count) * jnp.clip((total_steps - step + 1.0) / cooldown_steps, 0.0, 1.0)

  return cooled


def make_schedule(opt_cfg, d_model: int, total_steps: int = 0) -> optax.Schedule:
  """The schedule ``opt_cfg.schedule`` names: "inverse_sqrt" (the paper's) or "constant" (``opt_cfg.learning_rate``), followed by
  ``with_cooldown`` when ``opt_cfg.cooldown_steps > 0`` (``total_steps``: the run's
  ``num_train_steps``)."""
  kind = opt_cfg.schedule
  if kind == "inverse_sqrt":
    schedule = inverse_sqrt_schedule(d_model, opt_cfg.warmup_steps, opt_cfg.learning_rate_scale)
  elif kind == "constant":
    schedule = constant_schedule(opt_cfg.learning_rate, opt_cfg.warmup_steps)
  else:
    raise ConfigError(f"optimizer.schedule={kind!r} is not one of ('inverse_sqrt', 'constant')")
  cooldown = int(opt_cfg.cooldown_steps)
  if cooldown > 0:
    if total_steps <= 0:
      raise ConfigError("optimizer.cooldown_steps > 0 needs the run's length: pass total_steps")
    schedule = with_cooldown(schedule, total_steps, cooldown)
  return schedule


def make_optimizer(opt_cfg, d_model: int, total_steps: int = 0) -> optax.GradientTransformation:
  """Adam(b1, b2, eps) (AdamW when weight_decay > 0) on ``make_schedule(opt_cfg, d_model,
  total_steps)``, optional clipping."""
  schedule = make_schedule(opt_cfg, d_model, total_steps)
  if opt_cfg.weight_decay > 0:
    adam = optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps,
                       weight_decay=opt_cfg.weight_decay)
  else:
    adam = optax.adam(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps)
  if opt_cfg.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(opt_cfg.grad_clip_norm), adam)
  return adam
