"""The optimizers and learning-rate schedules a run can name (``optimizer.name``,
``optimizer.schedule``), as variant tables: Adam with the paper's settings (AdamW with decoupled
weight decay), Adafactor (T5's), Lion and Muon; the paper's inverse-square-root warmup (section
5.3), a constant rate after a linear warmup, T5's reciprocal square root and a warmup + cosine
decay. Any schedule can end with a linear cooldown to zero over the run's last
``optimizer.cooldown_steps`` steps. ``PAPER_SETTINGS`` lists the settings each optimizer's paper
trained with."""

from typing import Dict

import jax
import jax.numpy as jnp
import optax
import optax.contrib
from txf.core import specs
from txf.core.config import ConfigError
from txf.core.variants import Table
from txf.nn import mup

# OptimizerSpec: ``config.optimizer`` read once, frozen (fields, types and defaults those of
# ``base_config().optimizer``, declared in txf/core/config.py only). The loop's set-up builds it.
OptimizerSpec = specs.section_spec(
    "OptimizerSpec", "optimizer",
    "The optimizer and schedule settings of a run (``config.optimizer``), read once: see "
    "txf/core/config.py. ``OptimizerSpec.from_config(config.optimizer)``; "
    "``OptimizerSpec(learning_rate=...)`` in a test or notebook.")


def optimizer_spec(opt_cfg) -> "OptimizerSpec":
  """``opt_cfg`` as an OptimizerSpec: a spec as it is, a ``config.optimizer`` section (or a dict
  of some of its fields, the rest at base_config's defaults) read into one."""
  return opt_cfg if isinstance(opt_cfg, OptimizerSpec) else OptimizerSpec.from_config(opt_cfg)


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


def rsqrt_schedule(warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  r"""T5's reciprocal square root: lr(step) = scale / sqrt(max(step, warmup)), step counted from 1.

  $$\mathit{lrate} = \mathit{scale} / \sqrt{\max(\mathit{step}, \mathit{warmup})}$$

  Constant at scale / sqrt(warmup) for the first ``warmup_steps`` steps (T5: 0.01 for 10^4
  steps), then decaying as 1/sqrt(step). Meant for Adafactor, whose updates are relative to each
  parameter's scale.
  """
  if warmup_steps <= 0 or scale <= 0:
    raise ValueError(f"need warmup_steps > 0 and scale > 0, got {warmup_steps}, {scale}")

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * jax.lax.rsqrt(jnp.maximum(step, float(warmup_steps)))

  return schedule


def cosine_schedule(learning_rate: float, warmup_steps: int, total_steps: int,
                    final_fraction: float = 0.0) -> optax.Schedule:
  r"""Linear warmup to ``learning_rate``, then a half cosine down to final_fraction * learning_rate
  at ``total_steps`` (step counted from 1; constant at the floor after it).

  $$\mathit{lrate} = \begin{cases} \eta\, s / w & s \le w \\
  \eta \big(f + (1 - f)\tfrac{1}{2}\big(1 + \cos\big(\pi \tfrac{s - w}{T - w}\big)\big)\big) & s > w
  \end{cases}$$
  with eta = learning_rate, w = warmup, T = total_steps, f = final_fraction.
  """
  if learning_rate <= 0 or warmup_steps <= 0 or total_steps <= warmup_steps:
    raise ValueError(f"need learning_rate > 0 and 0 < warmup_steps < total_steps, got "
                     f"{learning_rate}, {warmup_steps}, {total_steps}")

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    progress = jnp.clip((step - warmup_steps) / (total_steps - warmup_steps), 0.0, 1.0)
    decayed = final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    return learning_rate * jnp.where(step <= warmup_steps, step / warmup_steps, decayed)

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


def _cosine(opt_cfg, d_model: int, total_steps: int) -> optax.Schedule:
  del d_model
  if total_steps <= 0:
    raise ConfigError("optimizer.schedule='cosine' decays over the run: pass total_steps")
  return cosine_schedule(opt_cfg.learning_rate, opt_cfg.warmup_steps, total_steps,
                         opt_cfg.final_lr_fraction)


# The schedules (``optimizer.schedule``): name -> f(opt_cfg, d_model, total_steps) -> schedule.
SCHEDULES = Table("optimizer.schedule", {
    "inverse_sqrt": lambda o, d, t: inverse_sqrt_schedule(d, o.warmup_steps, o.learning_rate_scale),
    "constant": lambda o, d, t: constant_schedule(o.learning_rate, o.warmup_steps),
    "rsqrt": lambda o, d, t: rsqrt_schedule(o.warmup_steps, o.learning_rate_scale),
    "cosine": _cosine,
})


def make_schedule(opt_cfg, d_model: int, total_steps: int = 0) -> optax.Schedule:
  """The schedule ``opt_cfg.schedule`` names (``SCHEDULES``: "inverse_sqrt", the paper's, by
  default), followed by ``with_cooldown`` when ``opt_cfg.cooldown_steps > 0`` (``total_steps``:
  the run's ``num_train_steps``). ``opt_cfg``: an OptimizerSpec, or a ``config.optimizer``
  section or dict (``optimizer_spec``: the fields it lacks at base_config's defaults)."""
  opt_cfg = optimizer_spec(opt_cfg)
  kind = opt_cfg.schedule
  if kind not in SCHEDULES:
    raise ConfigError(f"optimizer.schedule={kind!r} is not one of {SCHEDULES.names()}")
  schedule = SCHEDULES[kind](opt_cfg, d_model, total_steps)
  cooldown = int(opt_cfg.cooldown_steps)
  if cooldown > 0:
    if total_steps <= 0:
      raise ConfigError("optimizer.cooldown_steps > 0 needs the run's length: pass total_steps")
    schedule = with_cooldown(schedule, total_steps, cooldown)
  return schedule


def adam(opt_cfg, schedule) -> optax.GradientTransformation:
  r"""Adam(b1, b2, eps) (Kingma & Ba 2015; the paper: 0.9, 0.98, 1e-9); AdamW (decoupled decay,
  Loshchilov & Hutter 2019) when ``weight_decay > 0``.

  $$m_t = \beta_1 m + (1-\beta_1) g,\ v_t = \beta_2 v + (1-\beta_2) g^2,\quad
  \theta \mathrel{-}= \eta_t\big(\hat m_t / (\sqrt{\hat v_t} + \epsilon) + \lambda \theta\big)$$
  """
  if opt_cfg.weight_decay > 0:
    return optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps,
                       weight_decay=opt_cfg.weight_decay)
  return optax.adam(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps)


def adafactor(opt_cfg, schedule) -> optax.GradientTransformation:
  r"""Adafactor as T5 trains with it (Shazeer & Stern 2018): factored second moments for matrices
  with both sides >= 128 (row and column means R, C of g^2 + 1e-30, V = R C / mean(R)), decay
  1 - t^-0.8, no first moment, updates clipped to RMS <= 1 and scaled by max(1e-3, RMS(theta)).

  $$u = g / \sqrt{\hat V},\quad u \leftarrow u / \max(1, \mathrm{RMS}(u)),\quad
  \theta \mathrel{-}= \eta_t \max(10^{-3}, \mathrm{RMS}(\theta))\, u$$

  ``weight_decay > 0`` adds decoupled decay: theta -= lambda theta each step (not scaled by the
  rate, as optax's ``adafactor`` applies it).
  """
  return optax.adafactor(schedule, decay_rate=0.8, clipping_threshold=1.0,
                         multiply_by_parameter_scale=True, momentum=None,
                         weight_decay_rate=opt_cfg.weight_decay or None)


def lion(opt_cfg, schedule) -> optax.GradientTransformation:
  r"""Lion (Chen et al. 2023): the sign of an interpolated momentum, with decoupled weight decay.

  $$u = \mathrm{sign}(\beta_1 m + (1 - \beta_1) g),\quad \theta \mathrel{-}= \eta_t (u + \lambda\theta),
  \quad m \leftarrow \beta_2 m + (1 - \beta_2) g$$

  b1, b2 = ``optimizer.b1``, ``optimizer.b2`` (the paper: 0.9, 0.99), lambda =
  ``optimizer.weight_decay``.
  """
  return optax.lion(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, weight_decay=opt_cfg.weight_decay)


# Muon orthogonalises the update of each hidden weight matrix; these parameter names are matrices
# of x W products, by their last axes (earlier axes, e.g. the scanned layer axis, are a batch):
# name -> (reduction axes, output axes) counted from the end.
MUON_MATRICES = {"query": ((-3,), (-2, -1)), "key": ((-3,), (-2, -1)), "value": ((-3,), (-2, -1)),
                 "out": ((-3, -2), (-1,)), "wi": ((-2,), (-1,)), "wi_gate": ((-2,), (-1,)),
                 "wo": ((-2,), (-1,))}


def muon_dimension_numbers(params):
  """For each leaf of ``params``: its Muon matrix layout (``optax.contrib.MuonDimensionNumbers``)
  when its name is in ``MUON_MATRICES`` (the attention and FFN kernels), else None: embeddings,
  the output layer, norms and biases go to Adam."""
  def spec(path, leaf):
    name = getattr(path[-1], "key", None)
    if name not in MUON_MATRICES:
      return None
    reduction, output = MUON_MATRICES[name]
    return optax.contrib.MuonDimensionNumbers(tuple(leaf.ndim + a for a in reduction),
                                              tuple(leaf.ndim + a for a in output))
  return jax.tree_util.tree_map_with_path(spec, params)


def muon(opt_cfg, schedule) -> optax.GradientTransformation:
  r"""Muon (Jordan et al. 2024) on the attention and FFN matrices: Nesterov momentum (beta =
  ``optimizer.momentum``, 0.95), orthogonalised by 5 Newton-Schulz iterations, scaled by
  sqrt(max(1, fan_out / fan_in)); AdamW(b1, b2) with Nesterov momentum (NAdamW, as optax's muon
  builds it) at ``muon_adam_lr_ratio`` times the rate on the other parameters (embeddings, output
  layer, norms, biases).

  $$m \leftarrow \beta m + g,\quad O = \mathrm{NS}_5(\beta m + g) \approx U V^\top
  \ (\text{for } U \Sigma V^\top = \beta m + g),\quad \theta \mathrel{-}= \eta_t O$$
  """
  ratio = opt_cfg.muon_adam_lr_ratio
  return optax.contrib.muon(schedule, beta=opt_cfg.momentum, nesterov=True,
                            weight_decay=opt_cfg.weight_decay, adam_b1=opt_cfg.b1,
                            adam_b2=opt_cfg.b2, adam_learning_rate=lambda c: ratio * schedule(c),
                            muon_weight_dimension_numbers=muon_dimension_numbers)


# The optimizers (``optimizer.name``): name -> f(opt_cfg, schedule) -> optax.GradientTransformation.
OPTIMIZERS = Table("optimizer.name", {"adam": adam, "adafactor": adafactor, "lion": lion,
                                      "muon": muon})

# The settings each optimizer's paper trained with, as ``optimizer.*`` overrides (the learning
# rates are the papers' for their model sizes: tune them for yours).
PAPER_SETTINGS: Dict[str, Dict[str, object]] = {
    "adam": {"schedule": "inverse_sqrt", "warmup_steps": 4000, "b1": 0.9, "b2": 0.98, "eps": 1e-9},
    "adafactor": {"schedule": "rsqrt", "warmup_steps": 10000, "learning_rate_scale": 1.0},
    "lion": {"schedule": "cosine", "learning_rate": 1e-4, "warmup_steps": 1000, "b1": 0.9,
             "b2": 0.99, "weight_decay": 1.0},
    "muon": {"schedule": "constant", "learning_rate": 0.02, "warmup_steps": 1, "momentum": 0.95,
             "b1": 0.9, "b2": 0.95},
}


def scale_by_multipliers(multipliers) -> optax.GradientTransformation:
  """u -> m * u per leaf, with ``multipliers(updates)`` a tree of Python floats like the updates
  (computed from the tree's structure only); a leaf whose m is 1.0 is passed through untouched."""

  def update_fn(updates, state, params=None):
    del params
    scaled = jax.tree_util.tree_map(lambda u, m: u if m == 1.0 else u * m, updates,
                                    multipliers(updates))
    return scaled, state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def mup_scaling(model_cfg) -> optax.GradientTransformation:
  """muP's per-parameter learning rates (txf.nn.mup.lr_multipliers): each update of a hidden
  matrix times d_0 / d_model, the others unchanged. For Adam and Lion, whose updates are
  entrywise normalised, this is the rate lr * d_0 / d_model of Tensor Programs V's Adam table
  (with AdamW the decoupled decay, lr * lambda * theta, is scaled with the rate)."""
  return scale_by_multipliers(lambda tree: mup.lr_multipliers(model_cfg, tree))


def make_optimizer(opt_cfg, d_model: int, total_steps: int = 0,
                   model_cfg=None) -> optax.GradientTransformation:
  """The optimizer ``opt_cfg.name`` names (``OPTIMIZERS``; "adam" by default: Adam(b1, b2, eps),
  AdamW when weight_decay > 0) on ``make_schedule(opt_cfg, d_model, total_steps)``, after
  global-norm clipping when ``grad_clip_norm > 0``. ``opt_cfg`` as for ``make_schedule``.
  ``model_cfg`` (a TransformerConfig, optional): under ``model.parametrization=mup`` away from the
  base width the updates are then rescaled per parameter (:func:`mup_scaling`)."""
  opt_cfg = optimizer_spec(opt_cfg)
  name = opt_cfg.name
  if name not in OPTIMIZERS:
    raise ConfigError(f"optimizer.name={name!r} is not one of {OPTIMIZERS.names()}")
  tx = OPTIMIZERS[name](opt_cfg, make_schedule(opt_cfg, d_model, total_steps))
  if model_cfg is not None and mup.width_ratio(model_cfg) != 1.0:
    if name not in ("adam", "lion"):
      raise ConfigError(f"model.parametrization=mup with optimizer.name={name!r}: its width "
                        f"scaling is defined for adam and lion only; use one of those")
    tx = optax.chain(tx, mup_scaling(model_cfg))
  if opt_cfg.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(opt_cfg.grad_clip_norm), tx)
  return tx
