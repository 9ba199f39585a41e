"""optimizer.schedule = "constant": lr = learning_rate * min(1, step / warmup), and its dispatch/validation."""

import json

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from txf.core import config as config_lib
from txf.runtime import workdir as workdir_lib
from txf.train.optimizer import constant_schedule, inverse_sqrt_schedule, make_optimizer, make_schedule


def _opt_cfg(**kw):
  c = ml_collections.ConfigDict(dict(warmup_steps=10, learning_rate_scale=1.0, b1=0.9, b2=0.98, eps=1e-9,
                                     weight_decay=0.0, grad_clip_norm=0.0, schedule="constant",
                                     learning_rate=1e-3, cooldown_steps=0))
  c.update(kw)
  return c


def test_constant_schedule_ramps_then_holds():
  lr = constant_schedule(0.002, warmup_steps=4)
  # optax counts updates from 0; the formula's step is count + 1.
  got = [float(lr(c)) for c in range(8)]
  np.testing.assert_allclose(got, [0.0005, 0.001, 0.0015, 0.002, 0.002, 0.002, 0.002, 0.002], rtol=1e-6)


def test_constant_schedule_without_warmup_is_constant_from_the_first_update():
  lr = constant_schedule(1e-3, warmup_steps=1)
  np.testing.assert_allclose(np.asarray(lr(jnp.arange(5))), np.full(5, 1e-3), rtol=1e-6)


def test_constant_schedule_rejects_non_positive_values():
  with pytest.raises(ValueError):
    constant_schedule(0.0)
  with pytest.raises(ValueError):
    constant_schedule(1e-3, warmup_steps=0)


def test_make_schedule_dispatch():
  np.testing.assert_allclose(float(make_schedule(_opt_cfg(warmup_steps=1), 64)(100)), 1e-3, rtol=1e-6)
  paper = make_schedule(_opt_cfg(schedule="inverse_sqrt"), 64)
  np.testing.assert_allclose(float(paper(99)), float(inverse_sqrt_schedule(64, 10)(99)), rtol=1e-6)
  with pytest.raises(ValueError, match="schedule"):
    make_schedule(_opt_cfg(schedule="linear_decay"), 64)


def test_adam_first_step_with_constant_rate_moves_each_parameter_by_lr():
  """Adam's first update is -lr * g / (|g| + eps) (bias-corrected moments): each entry moves by lr."""
  tx = make_optimizer(_opt_cfg(warmup_steps=1, learning_rate=0.01), d_model=16)
  params = {"w": jnp.array([1.0, -2.0, 0.5])}
  grads = {"w": jnp.array([0.3, -4.0, 1e-3])}
  updates, _ = tx.update(grads, tx.init(params), params)
  new = optax.apply_updates(params, updates)
  np.testing.assert_allclose(np.asarray(new["w"]), [1.0 - 0.01, -2.0 + 0.01, 0.5 - 0.01], rtol=1e-5)


def test_config_validation_names_the_schedule_fields():
  c = config_lib.base_config()
  assert c.optimizer.schedule == "inverse_sqrt"  # the paper's schedule stays the default
  c.optimizer.schedule = "linear_decay"
  with pytest.raises(config_lib.ConfigError, match="optimizer.schedule"):
    config_lib.validate(c)
  c = config_lib.base_config()
  c.optimizer.schedule, c.optimizer.learning_rate = "constant", 0.0
  with pytest.raises(config_lib.ConfigError, match="optimizer.learning_rate"):
    config_lib.validate(c)
  c.optimizer.learning_rate = 1e-3
  config_lib.validate(c)


def test_a_run_saved_before_the_schedule_field_loads_with_the_papers_schedule(tmp_path):
  """config.json of an older run lacks optimizer.schedule and cooldown_steps: load_config fills
  them from base_config (inverse_sqrt, 0), and its schedule is the paper's."""
  stored = json.loads(config_lib.base_config().to_json())
  del stored["optimizer"]["schedule"], stored["optimizer"]["cooldown_steps"]
  (tmp_path / "config.json").write_text(json.dumps(stored))
  loaded = workdir_lib.load_config(str(tmp_path))
  assert (loaded.optimizer.schedule, loaded.optimizer.cooldown_steps) == ("inverse_sqrt", 0)
  d, warmup = loaded.model.d_model, loaded.optimizer.warmup_steps
  np.testing.assert_allclose(float(make_schedule(loaded.optimizer, d)(3)),
                             d ** -0.5 * min(4 ** -0.5, 4 * warmup ** -1.5), rtol=1e-6)
