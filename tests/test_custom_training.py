"""A researcher's own loss and model train in txf's loop without a fork (``txf.train.train(config,
workdir, loss_fn=..., model=...)``); each is checked against an independent numpy computation."""

import json
import os
import runpy

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.conftest import ROOT
from txf.runtime import workdir as workdir_lib
from txf.core.config import ConfigError
from txf.data import make_task
from txf.models import (DecoderLM, build_model, cross_entropy_loss, init_params,
                        model_config_from)
from txf.train import create_train_state, make_train_step, train

LAM = 1e-3  # weight of the L2 penalty


def _l2(params) -> jnp.ndarray:
  return sum(jnp.sum(jnp.square(p)) for p in jax.tree_util.tree_leaves(params))


def l2_penalised_loss(model, params, batch, rng):
  """Cross-entropy + LAM * sum(p^2) per token: the step divides loss_sum by the token count."""
  loss_sum, terms = cross_entropy_loss(0.0)(model, params, batch, rng)
  return loss_sum + LAM * terms["count"] * _l2(params), terms


class ScaledLM(nn.Module):
  """txf's DecoderLM with one learned scalar on its logits: a model built from txf's modules."""
  config: object

  @nn.compact
  def __call__(self, targets, targets_segmentation=None, targets_position=None):
    logits = DecoderLM(self.config, name="lm")(targets, targets_segmentation, targets_position)
    return logits * self.param("logit_scale", nn.initializers.ones, ())


def build_scaled_lm(cfg, deterministic=False, decode=False):
  return ScaledLM(build_model(cfg, deterministic, decode).config)


def _config(**overrides):
  config = runpy.run_path(os.path.join(ROOT, "experiments", "copy.py"))["get_config"]()
  config.update(num_train_steps=12, batch_size=8, log_every=4, eval_every=0, checkpoint_every=0,
                eval_batches=1, num_samples=0, decode_examples=0)
  config.model.update(family="decoder_lm", d_model=16, d_ff=32, num_heads=2)
  config.update(overrides)
  return config


def test_l2_penalty_changes_one_sgd_step_by_exactly_its_gradient():
  """With SGD(lr=1): params' = p - grad, so the penalised step differs from the plain one by
  -2 * LAM * p (numpy float64), and its loss by LAM * sum(p^2)."""
  config = _config()
  task = make_task(config)
  cfg = model_config_from(config, task)
  batch = next(task.train_iterator(config.batch_size, 0))
  params = init_params(cfg, jax.random.key(0), batch)
  tx = optax.sgd(1.0)
  plain = jax.jit(make_train_step(cfg, tx, 0.0))
  penalised = jax.jit(make_train_step(cfg, tx, loss_fn=l2_penalised_loss))
  state = lambda: create_train_state(jax.tree_util.tree_map(jnp.copy, params), tx)
  a, ma = plain(state(), batch, jax.random.key(1))
  b, mb = penalised(state(), batch, jax.random.key(1))
  p64 = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(params)]
  np.testing.assert_allclose(float(mb["loss"]) - float(ma["loss"]),
                             LAM * sum(np.sum(x ** 2) for x in p64), rtol=1e-3)
  for x, pa, pb in zip(p64, jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
    np.testing.assert_allclose(np.asarray(pb, np.float64) - np.asarray(pa, np.float64),
                               -2.0 * LAM * x, atol=1e-6)
  assert float(mb["nll"]) == pytest.approx(float(ma["nll"]))  # the terms are the plain CE's


def test_a_non_finite_step_leaves_params_and_adam_state_bit_for_bit():
  """The step's guard: a NaN loss skips the optimizer (params and Adam moments unchanged, bit for
  bit; the step counter advances); a finite step moves every parameter and both moments."""
  config = _config()
  task = make_task(config)
  cfg = model_config_from(config, task)
  batch = next(task.train_iterator(config.batch_size, 0))
  params = init_params(cfg, jax.random.key(0), batch)
  tx = optax.adam(1e-3)

  def nan_loss(model, params, batch, rng):
    loss_sum, terms = cross_entropy_loss(0.0)(model, params, batch, rng)
    return loss_sum * jnp.nan, terms

  for loss_fn, finite in ((nan_loss, False), (None, True)):
    step = jax.jit(make_train_step(cfg, tx, 0.0, loss_fn=loss_fn))
    before = create_train_state(jax.tree_util.tree_map(jnp.copy, params), tx)
    keep = jax.tree_util.tree_map(np.asarray, (before.params, before.opt_state))
    after, metrics = step(before, batch, jax.random.key(1))
    assert float(metrics["finite"]) == float(finite) and int(after.step) == 1
    pairs = zip(jax.tree_util.tree_leaves(keep), jax.tree_util.tree_leaves((after.params, after.opt_state)))
    same = [np.array_equal(a, np.asarray(b)) for a, b in pairs]
    if finite:  # the Adam count and every float leaf change
      assert not any(same)
    else:
      assert all(same)


@pytest.mark.slow
def test_train_takes_a_custom_loss_and_model(tmp_path):
  """The loop trains ScaledLM under the penalised loss: its scalar is a parameter that moved, and
  the final evaluation's loss - nll equals LAM * sum(p^2) of the saved parameters (numpy)."""
  workdir = str(tmp_path / "run")
  final = train(_config(), workdir, loss_fn=l2_penalised_loss, model=build_scaled_lm)
  params = workdir_lib.load_params(workdir)
  assert set(params) == {"lm", "logit_scale"}
  assert float(params["logit_scale"]) != 1.0
  l2 = sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree_util.tree_leaves(params))
  assert final["loss"] - final["nll"] == pytest.approx(LAM * l2, rel=1e-3)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows if r["split"] == "train"] == [4, 8, 12]


def test_a_custom_model_is_not_decoded_in_loop(tmp_path):
  config = _config(**{"decode_examples": 4})
  config.model.family = "encoder_decoder"
  with pytest.raises(ConfigError, match="decode_examples=0"):
    train(config, str(tmp_path / "run"), model=build_scaled_lm)
