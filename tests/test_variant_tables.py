"""The variant tables (txf.core.variants.Table): a variant registered from outside txf (one formula, one
table line) is allowed by the config and runs in the model, checked against numpy float64; every
table's names are exactly its config field's allowed values; the train command's imports declare
them before it validates."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.conftest import ROOT, run_txf
from txf.core import config as config_lib
from txf import kernels
from txf.kernels import ATTENTION, ATTENTION_IMPLS, Attention, attend
from txf.models import build_model, init_params, model_config_from
from txf.models.encoder_classifier import POOLINGS
from txf.nn import HEADS, NORMS, POSITIONAL, FeedForward
from txf.nn.qk_norm import QK_NORMS
from txf.nn.stack import REMAT
from txf.ops.feedforward import ACTIVATIONS
from txf.ops.positional import LAYOUTS
from txf.core.variants import Table, UnknownVariant

# Every table with a config field.
CONFIG_TABLES = (ACTIVATIONS, LAYOUTS, POSITIONAL, ATTENTION, NORMS, ATTENTION_IMPLS, REMAT, POOLINGS,
                 QK_NORMS)


def toy_activation(z):
  """The toy FFN activation f(z) = z tanh(z) (a formula txf does not have)."""
  return z * jnp.tanh(z)


class _Task:
  vocab_size, target_vocab_size, num_classes = 20, 0, 2


def _small_config(**model):
  cfg = config_lib.base_config()
  cfg.model.update(d_model=16, num_heads=2, d_ff=24, num_encoder_layers=1, num_decoder_layers=1,
                   max_len=12, **model)
  return cfg


def _model_batch_params(cfg, seed):
  """(model config, a random translation batch [2, 7] -> [2, 5], initialised parameters)."""
  model_cfg = model_config_from(cfg, _Task(), vocab_multiple=1)
  rng = np.random.default_rng(seed)
  batch = {"inputs": jnp.asarray(rng.integers(3, 20, (2, 7)), jnp.int32),
           "targets": jnp.asarray(rng.integers(3, 20, (2, 5)), jnp.int32)}
  return model_cfg, batch, init_params(model_cfg, jax.random.PRNGKey(0), batch)


def test_a_toy_activation_is_valid_only_while_its_table_line_is_registered():
  cfg = _small_config(activation="toy")
  with pytest.raises(config_lib.ConfigError, match=r"model.activation='toy' is not one of"):
    config_lib.validate(cfg)
  with ACTIVATIONS.registered("toy", toy_activation):
    config_lib.validate(cfg)
  with pytest.raises(config_lib.ConfigError, match=r"model.activation='toy' is not one of"):
    config_lib.validate(cfg)


@pytest.mark.slow  # a model's compiles (~7 s); the validation alone is the quick test above
def test_a_toy_activation_registered_here_is_validated_and_runs_in_the_model():
  cfg = _small_config(activation="toy")
  with pytest.raises(config_lib.ConfigError, match=r"model.activation='toy' is not one of"):
    config_lib.validate(cfg)
  with ACTIVATIONS.registered("toy", toy_activation):  # the one table line
    config_lib.validate(cfg)
    model_cfg, batch, params = _model_batch_params(cfg, 0)
    calls = []

    def record(next_fun, args, kwargs, context):  # each FFN's input, output and parameters
      out = next_fun(*args, **kwargs)
      if isinstance(context.module, FeedForward) and context.method_name == "__call__":
        calls.append((args[0], out, context.module.variables["params"]))
      return out

    with nn.intercept_methods(record):
      logits = build_model(model_cfg, deterministic=True).apply({"params": params}, **batch)
  assert np.all(np.isfinite(logits)) and logits.shape == (2, 5, 20)
  assert len(calls) == 2  # the encoder's and the decoder's layer
  for x, out, p in calls:
    x, p = np.asarray(x, np.float64), {k: np.asarray(v, np.float64) for k, v in p.items()}
    z = x @ p["wi"] + p["bi"]
    expected = (z * np.tanh(z)) @ p["wo"] + p["bo"]
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, rtol=1e-5, atol=1e-5)
    relu = np.maximum(z, 0) @ p["wo"] + p["bo"]
    assert np.abs(expected - relu).max() > 1e-2  # the check tells the toy from the paper's relu
  with pytest.raises(config_lib.ConfigError,
                     match=r"is not one of \('relu', 'gelu', 'swish', 'reglu', 'geglu', 'swiglu', 'gelu_tanh', 'geglu_tanh'\)"):
    config_lib.validate(cfg)  # gone again with its table line


def test_a_toy_attention_formula_runs_through_attend():
  def toy(q, k, v, mask):  # softmax(Q K^T / d_k + M) V: a temperature of d_k instead of sqrt(d_k)
    logits = jnp.einsum("...qd,...kd->...qk", q, k) / q.shape[-1]
    logits = jnp.where(mask, logits, -1e30)
    w = jax.nn.softmax(logits, axis=-1)
    return w @ v, w

  rng = np.random.default_rng(1)
  q, k, v = (rng.normal(size=(2, 2, 3, 4)) for _ in range(3))
  mask = np.tril(np.ones((3, 3), bool))[None, None]
  s = np.einsum("bhqd,bhkd->bhqk", q, k) / 4 + np.where(mask, 0.0, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  expected = (w / w.sum(-1, keepdims=True)) @ v
  args = [jnp.asarray(a, jnp.float32) for a in (q, k, v)] + [jnp.asarray(mask)]
  with ATTENTION.registered("toy", Attention(toy)):
    for impl in ("reference", "fused"):  # no fused kernel: "fused" runs the formula
      out, _ = attend(*args, impl, causal=True, formula="toy")
      np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
  with pytest.raises(UnknownVariant, match="'toy' is not one of"):
    attend(*args, "reference", formula="toy")


def test_a_registered_attention_formula_is_what_the_model_attends_with():
  """``model.attention`` names the formula every attention sublayer runs: each call of the toy
  formula inside the built model gets the model's q, k, v and mask, and its output is the numpy
  float64 value of the formula on them."""
  seen = []

  def toy(q, k, v, mask):
    logits = jnp.einsum("...qd,...kd->...qk", q, k) / q.shape[-1]
    w = jax.nn.softmax(jnp.where(mask, logits, -1e30), axis=-1)
    out = w @ v
    seen.append((q, k, v, mask, out))
    return out, w

  cfg = _small_config(attention="toy")
  with pytest.raises(config_lib.ConfigError, match=r"model.attention='toy' is not one of"):
    config_lib.validate(cfg)
  with ATTENTION.registered("toy", Attention(toy)):
    config_lib.validate(cfg)
    model_cfg, batch, params = _model_batch_params(cfg, 2)
    seen.clear()   # the init's trace
    build_model(model_cfg, deterministic=True).apply({"params": params}, **batch)
  assert len(seen) == 3  # encoder self, decoder causal self, cross
  for q, k, v, mask, out in seen:
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / q.shape[-1] + np.where(np.asarray(mask), 0, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(out), (w / w.sum(-1, keepdims=True)) @ v, rtol=1e-5,
                               atol=1e-6)


def test_every_table_names_its_configs_allowed_values():
  assert {t.key for t in CONFIG_TABLES} == set(config_lib.VARIANT_FIELDS)
  defaults = config_lib.base_config()
  for table in CONFIG_TABLES:
    assert config_lib.allowed_values(table.key) == table.names(), table.key
    section, field = table.key.split(".")
    assert defaults[section][field] in table.names(), table.key
  assert ACTIVATIONS.names() == ("relu", "gelu", "swish", "reglu", "geglu", "swiglu", "gelu_tanh",
                                 "geglu_tanh")
  assert POSITIONAL.names() == ("sinusoidal", "learned", "none", "rope", "alibi", "relative")
  assert ATTENTION_IMPLS.names() == ("auto", "reference", "fused")
  assert QK_NORMS.names() == ("none", "layer_norm", "rms_norm")
  # the head has no config field of its own (model.tie_output picks it)
  assert tuple(NORMS) == ("layer_norm", "rms_norm") and tuple(HEADS) == ("tied", "untied")
  assert tuple(ATTENTION) == ("scaled_dot_product", "dot_product")
  assert ATTENTION["scaled_dot_product"].fused is kernels.fused_attention


def test_a_table_refuses_unknown_and_duplicate_names():
  table = Table(None, {"a": 1}, also=("auto",))
  assert table["a"] == 1 and "auto" not in table and table.names() == ("auto", "a")
  with pytest.raises(ValueError, match=r"variant='b' is not one of \('auto', 'a'\)"):
    table["b"]  # pylint: disable=pointless-statement
  for name in ("a", "auto"):
    with pytest.raises(ValueError, match="already registered"):
      table.register(name, 2)
  with pytest.raises(KeyError, match="not a field"):
    Table("model.no_such_field", {"a": 1})


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_the_train_commands_imports_declare_the_choices_before_validate():
  # a fresh process that imports only what `txf train` imports, then validates
  code = ("import txf.commands.train\n"
          "from txf.core import config\n"
          "c = config.base_config(); c.model.activation = 'nope'\n"
          "try:\n"
          "  config.validate(c)\n"
          "except config.ConfigError as e:\n"
          "  print(e)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=120, check=True).stdout
  assert f"model.activation='nope' is not one of {ACTIVATIONS.names()}" in out


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
@pytest.mark.parametrize("command", ["train", "plan"])
def test_the_cli_rejects_an_unknown_variant_with_the_tables_names(command, tmp_path):
  run = run_txf(command, "--config", "default", "--config.model.positional=rotary",
                *(["--workdir", str(tmp_path / "run")] if command == "train" else []), timeout=120)
  assert run.returncode == 2, run.stderr[-2000:]
  assert f"model.positional='rotary' is not one of {POSITIONAL.names()}" in run.stderr
  assert not (tmp_path / "run").exists()


def test_validate_refuses_to_run_before_the_tables_are_declared():
  code = ("from txf.core import config\n"
          "config.validate(config.base_config())\n")
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
  assert run.returncode != 0
  assert "RuntimeError" in run.stderr and "model.activation" in run.stderr
