"""Remat and scanned layers (txf.nn.stack): the same loss and gradients as the plain stack, the
parameter layouts convert both ways, a scanned model decodes, and remat really rematerialises."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.core.config import ConfigError, base_config, validate
from txf.models import build_model, cross_entropy_loss, init_params
from txf.decode.adapter import init_cache, make_logits_fn
from txf.nn import TransformerConfig
from txf.nn.stack import LAYERS, stack_layers, unstack_layers

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

VOCAB = 11


def config(family, **overrides):
  return TransformerConfig(family=family, vocab_size=VOCAB, d_model=16, num_heads=2, d_ff=32,
                           num_encoder_layers=2, num_decoder_layers=3, max_len=16, **overrides)


def batch(family):
  rng = np.random.default_rng(0)
  out = {"targets": jnp.asarray(rng.integers(3, VOCAB, (3, 6)), jnp.int32).at[0, 4:].set(0)}
  if family != "decoder_lm":
    out["inputs"] = jnp.asarray(rng.integers(3, VOCAB, (3, 5)), jnp.int32).at[1, 3:].set(0)
  if family == "encoder_classifier":
    out = {"inputs": out["inputs"], "label": jnp.asarray([0, 1, 1], jnp.int32)}
  return out


def loss_and_grads(cfg, params, data, rng):
  loss = cross_entropy_loss(0.1)
  model = build_model(cfg, deterministic=cfg.dropout_rate == 0)
  fn = lambda p: loss(model, p, data, rng)[0]
  return jax.jit(jax.value_and_grad(fn))(params)


def close(a, b):
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6), a, b)


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_lm", "encoder_classifier"])
def test_scanned_stack_equals_unrolled_loss_and_gradients(family):
  plain = config(family, dropout_rate=0.0)
  scanned = dataclasses.replace(plain, scan_layers=True)
  data = batch(family)
  params = init_params(scanned, jax.random.key(1), data)
  for stack in [k for k in ("encoder", "decoder") if k in params]:
    assert set(k for k in params[stack] if k.startswith("layer")) == {LAYERS}
    n = plain.num_encoder_layers if stack == "encoder" else plain.num_decoder_layers
    assert params[stack][LAYERS]["ffn"]["wi"].shape == (n, 16, 32)
  unrolled = unstack_layers(params)
  # the unrolled layout is exactly the plain model's tree, shapes and names
  plain_shapes = jax.eval_shape(lambda r: init_params(plain, r, data), jax.random.key(0))
  assert jax.tree_util.tree_structure(unrolled) == jax.tree_util.tree_structure(plain_shapes)
  jax.tree_util.tree_map(lambda x, s: np.testing.assert_equal(x.shape, s.shape), unrolled, plain_shapes)
  loss_s, grads_s = loss_and_grads(scanned, params, data, None)
  loss_p, grads_p = loss_and_grads(plain, unrolled, data, None)
  np.testing.assert_allclose(loss_s, loss_p, rtol=1e-6)
  close(unstack_layers(grads_s), grads_p)
  close(grads_s, stack_layers(grads_p))


@pytest.mark.parametrize("positional", ["rope", "alibi", "relative"])
def test_positions_inside_attention_through_scan_and_remat(positional):
  # the packed rows' positions reach every layer as an extra argument: scanned (broadcast) and
  # rematerialised stacks give the plain stack's loss and gradients (the relative tables included)
  plain = config("encoder_decoder", dropout_rate=0.0, positional=positional)
  data = dict(batch("encoder_decoder"))
  data["inputs_segmentation"] = jnp.asarray([[1, 1, 2, 2, 2], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  data["inputs_position"] = jnp.asarray([[0, 1, 0, 1, 2], [0, 1, 2, 0, 0], [0, 1, 2, 3, 4]])
  data["targets_segmentation"] = jnp.asarray([[1, 1, 1, 2, 0, 0], [1] * 6, [1, 1, 1, 2, 2, 2]])
  data["targets_position"] = jnp.asarray([[0, 1, 2, 0, 0, 0], list(range(6)), [0, 1, 2, 0, 1, 2]])
  params = init_params(plain, jax.random.key(2), data)
  if positional == "relative":
    assert params["encoder"]["layer_1"]["self_attention"]["relative_bias"].shape == (32, 2)
  loss_p, grads_p = loss_and_grads(plain, params, data, None)
  cfg = dataclasses.replace(plain, scan_layers=True, remat="full")
  loss, grads = loss_and_grads(cfg, stack_layers(params), data, None)
  np.testing.assert_allclose(loss, loss_p, rtol=1e-6)
  close(unstack_layers(grads), grads_p)


@pytest.fixture(scope="module")
def remat_reference():
  """The plain (no remat) encoder-decoder's loss and gradients, with dropout and without."""
  plain = dataclasses.replace(config("encoder_decoder", dropout_rate=0.1), num_encoder_layers=1,
                              num_decoder_layers=2)
  data = batch("encoder_decoder")
  params = init_params(plain, jax.random.key(2), data)
  rng = jax.random.key(3)
  det = dataclasses.replace(plain, dropout_rate=0.0)
  return (plain, det, data, params, rng, loss_and_grads(plain, params, data, rng),
          loss_and_grads(det, params, data, None))


@pytest.mark.parametrize("remat", ["full", "dots_saveable", "nothing_saveable"])
def test_remat_equals_plain_loss_and_gradients_with_dropout(remat, remat_reference):
  plain, det, data, params, rng, (loss_p, grads_p), (loss_d, grads_d) = remat_reference
  # unrolled with dropout: remat replays the same dropout masks in the backward pass
  loss_r, grads_r = loss_and_grads(dataclasses.replace(plain, remat=remat), params, data, rng)
  np.testing.assert_allclose(loss_r, loss_p, rtol=1e-6)
  close(grads_r, grads_p)
  # scanned: a scan draws per-layer dropout keys of its own, so compare without dropout
  loss_rs, grads_rs = loss_and_grads(dataclasses.replace(det, remat=remat, scan_layers=True),
                                     stack_layers(params), data, None)
  np.testing.assert_allclose(loss_rs, loss_d, rtol=1e-6)
  close(unstack_layers(grads_rs), grads_d)
  if remat == "full":  # and with dropout it runs, finite
    loss_sd, _ = loss_and_grads(dataclasses.replace(plain, remat=remat, scan_layers=True),
                                stack_layers(params), data, rng)
    assert np.isfinite(loss_sd)


def test_remat_rematerialises_in_the_backward_pass():
  """The gradient's program holds a remat (checkpoint) region only when remat is on."""
  data = batch("decoder_lm")
  for remat, expected in (("none", False), ("full", True), ("dots_saveable", True)):
    cfg = config("decoder_lm", dropout_rate=0.0, remat=remat)
    params = init_params(cfg, jax.random.key(0), data)
    model = build_model(cfg, deterministic=True)
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda p: cross_entropy_loss(0.0)(model, p, data, None)[0]))(params))
    assert ("remat" in jaxpr or "checkpoint" in jaxpr) == expected, remat


def test_stack_and_unstack_are_inverse_on_a_train_state_like_tree():
  rng = np.random.default_rng(0)
  layer = lambda: {"ffn": {"wi": rng.normal(size=(2, 3)).astype(np.float32)},
                   "norm_1": {"scale": rng.normal(size=(2,)).astype(np.float32)}}
  per_layer = {"params": {"decoder": {"layer_0": layer(), "layer_1": layer(), "layer_2": layer(),
                                      "final_norm": {"scale": np.ones(2)}}, "embed": {"embedding": np.ones((4, 2))}},
               "opt_state": ({"mu": {"decoder": {"layer_0": layer(), "layer_1": layer(), "layer_2": layer()}}},),
               "step": np.int32(7)}
  stacked = stack_layers(per_layer)
  wi = stacked["params"]["decoder"][LAYERS]["ffn"]["wi"]
  assert wi.shape == (3, 2, 3) and "layer_0" not in stacked["params"]["decoder"]
  np.testing.assert_array_equal(wi[2], per_layer["params"]["decoder"]["layer_2"]["ffn"]["wi"])
  assert stacked["opt_state"][0]["mu"]["decoder"][LAYERS]["norm_1"]["scale"].shape == (3, 2)
  back = unstack_layers(stacked)
  assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(per_layer)
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, per_layer)


def test_a_scanned_model_decodes_like_the_unrolled_one():
  plain = config("encoder_decoder", dropout_rate=0.0)
  scanned = dataclasses.replace(plain, scan_layers=True)
  data = batch("encoder_decoder")
  params = init_params(scanned, jax.random.key(4), data)
  ids = jnp.asarray([[1], [1], [1]], jnp.int32)
  outs = []
  for cfg, p in ((scanned, params), (plain, unstack_layers(params))):
    cache = init_cache(cfg, p, 3, 4, data["inputs"])
    logits, _ = make_logits_fn(cfg, p)(ids, cache)
    outs.append(logits)
  np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)


def test_config_rejects_an_unknown_remat_policy():
  cfg = base_config()
  cfg.model.remat = "dots"
  with pytest.raises(ConfigError, match="model.remat"):
    validate(cfg)
