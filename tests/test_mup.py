"""muP (model.parametrization=mup, txf.nn.mup): equal to the standard parametrization at the base
width step for step; away from it the init variances, the per-parameter learning rates and the
first Adam update follow the hand-worked table."""

import dataclasses

import jax
import numpy as np
import pytest

from txf.core import config as config_lib
from txf.core.config import ConfigError
from txf.models import init_params
from txf.nn import TransformerConfig, mup
from txf.train.optimizer import make_optimizer
from txf.train.steps import create_train_state, make_train_step

SMALL = dict(num_encoder_layers=1, num_decoder_layers=1, vocab_size=29, max_len=12)

FAMILIES = [  # the first in the quick tier, the others in the slow one
    dict(family="encoder_decoder", activation="swiglu", num_kv_heads=2),
    pytest.param(dict(family="decoder_lm", pre_ln=True, tie_output=False, positional="rope"),
                 marks=pytest.mark.slow),
    pytest.param(dict(family="encoder_classifier", num_classes=3, pooler=True, pooling="first"),
                 marks=pytest.mark.slow),
]


def _batch(cfg):
  rng = np.random.default_rng(0)
  targets = rng.integers(4, cfg.vocab_size, (4, 7)).astype(np.int32)
  targets[0, 5:] = 0
  inputs = rng.integers(4, cfg.vocab_size, (4, 6)).astype(np.int32)
  inputs[1, 4:] = 0
  return {"inputs": inputs, "targets": targets, "label": np.array([0, 2, 1, 1], np.int32)}


def _adam(lr=1e-2, name="adam"):
  o = config_lib.base_config().optimizer
  o.name, o.schedule, o.learning_rate, o.warmup_steps = name, "constant", lr, 1
  return o


def _train(cfg, steps=3, lr=1e-2, name="adam"):
  """(params after init, [(loss, params) after each step]) of ``steps`` steps of optimizer
  ``name`` on one batch."""
  batch = _batch(cfg)
  tx = make_optimizer(_adam(lr, name), cfg.d_model, steps, cfg)
  params = init_params(cfg, jax.random.key(0), batch)
  state = create_train_state(params, tx)
  step = jax.jit(make_train_step(cfg, tx, 0.1))
  out = []
  for i in range(steps):
    state, metrics = step(state, batch, jax.random.key(i))
    out.append((float(metrics["loss"]), jax.device_get(state.params)))
  return jax.device_get(params), out


@pytest.mark.parametrize("overrides", FAMILIES)
def test_mup_at_the_base_width_is_the_standard_parametrization_step_for_step(overrides):
  std = TransformerConfig(d_model=16, num_heads=4, d_ff=24, dropout_rate=0.1, **SMALL, **overrides)
  mu = dataclasses.replace(std, parametrization="mup", mup_base_width=16)
  p0, run0 = _train(std)
  p1, run1 = _train(mu)
  jax.tree_util.tree_map(np.testing.assert_array_equal, p0, p1)
  for (l0, q0), (l1, q1) in zip(run0, run1):
    assert l0 == l1
    jax.tree_util.tree_map(np.testing.assert_array_equal, q0, q1)


WIDE = TransformerConfig(family="decoder_lm", d_model=64, num_heads=4, d_ff=128, num_kv_heads=2,
                         activation="swiglu", parametrization="mup", mup_base_width=16,
                         dropout_rate=0.0, **SMALL)


def _flat(tree):
  return {"/".join(str(getattr(k, "key", k)) for k in path): v
          for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_lr_multipliers_match_the_hand_worked_table():
  params = init_params(WIDE, jax.random.key(0), _batch(WIDE))
  got = _flat(mup.lr_multipliers(WIDE, params))
  quarter = 16 / 64  # base / width: the hidden matrices' rate
  expected = {"embed/embedding": 1.0}  # post-LN, no cross-attention: norm_1 and norm_3
  for sub in ("norm_1", "norm_3"):
    expected.update({f"decoder/layer_0/{sub}/scale": 1.0, f"decoder/layer_0/{sub}/bias": 1.0})
  for name in ("query", "key", "value", "out"):
    expected[f"decoder/layer_0/self_attention/{name}"] = quarter
  for name in ("wi", "wi_gate", "wo"):
    expected[f"decoder/layer_0/ffn/{name}"] = quarter
  for name in ("bi", "bi_gate", "bo"):
    expected[f"decoder/layer_0/ffn/{name}"] = 1.0
  assert got == expected


def test_mup_init_variances_follow_the_base_shapes():
  """Var(W) = Xavier's variance at the base shape / r, worked by hand; the embedding N(0, 1/d_0)."""
  params = init_params(WIDE, jax.random.key(0), _batch(WIDE))
  flat = _flat(params)
  r, d0, h, hk = 4, 16, 4, 2
  dk0, f0 = d0 // h, 128 // r
  expected = {  # xavier_uniform: 2 / (rf * (shape[-2] + shape[-1])) at the base shape, then / r
      "self_attention/query": 2 / (d0 * (h + dk0)) / r,          # [d, h, d_k]
      "self_attention/key": 2 / (d0 * (hk + dk0)) / r,           # [d, h_kv, d_k]
      "self_attention/out": 2 / (h * (dk0 + d0)) / r,            # [h, d_k, d]
      "ffn/wi": 2 / (d0 + f0) / r, "ffn/wo": 2 / (f0 + d0) / r,  # [d, f], [f, d]
  }
  for name, var in expected.items():
    w = np.asarray(flat[f"decoder/layer_0/{name}"], np.float64)
    assert abs(w.var() / var - 1) < 0.15, (name, w.var(), var)
  emb = np.asarray(flat["embed/embedding"], np.float64)
  assert abs(emb.var() * d0 - 1) < 0.15


@pytest.mark.parametrize("name", ["adam", "lion"])
def test_first_step_moves_hidden_matrices_by_lr_over_r(name):
  """Adam's first update is lr * g / (|g| + eps) ~ lr per entry, Lion's lr * sign(g): lr / r on
  the hidden matrices, lr on the embedding."""
  lr = 1e-3
  p0, [(_, p1)] = _train(WIDE, steps=1, lr=lr, name=name)
  before, after = _flat(p0), _flat(p1)
  for name, rate in (("decoder/layer_0/ffn/wi", lr / 4), ("decoder/layer_0/self_attention/query", lr / 4),
                     ("embed/embedding", lr)):
    delta = np.abs(np.asarray(after[name], np.float64) - np.asarray(before[name], np.float64))
    moved = delta[delta > 0]
    np.testing.assert_allclose(np.median(moved), rate, rtol=1e-3)


def _config(**model):
  c = config_lib.base_config()
  c.model.update(model)
  return c


def test_mup_rules_name_the_fix():
  from txf.train import tables
  tables.validate(_config(parametrization="mup", mup_base_width=256))  # passes
  with pytest.raises(ConfigError, match="optimizer.name='adafactor'"):
    c = _config(parametrization="mup", mup_base_width=256)
    c.optimizer.name = "adafactor"
    tables.validate(c)
  tables.validate(_config(mup_base_width=256))  # read only under mup: a sweep sets it for every arm
  with pytest.raises(ConfigError, match="must be an integer"):
    tables.validate(_config(parametrization="mup", mup_base_width=-1))
  with pytest.raises(ConfigError, match="adam and lion"):
    make_optimizer(_adam(name="muon"), 64, 10, WIDE)
