"""The fused output head (txf.kernels.head_cross_entropy) against numpy float64 and against the
reference path (logits, then txf.ops.label_smoothed_cross_entropy / token_accuracy), and the
default loss of every family with and without it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from txf import kernels, ops
from txf.kernels import dots
from txf.models import EncoderDecoder, build_model, cross_entropy_loss, init_params
from txf.models import loss as models_loss
from txf.nn import TransformerConfig
from txf.train.steps import create_train_state, make_train_step


def np_head(h, table, targets, weights, eps):
  """float64: loss/nll/correct sums and the gradient of the loss sum w.r.t. h and the table."""
  h, table = np.asarray(h, np.float64).reshape(-1, table.shape[1]), np.asarray(table, np.float64)
  y, w = np.asarray(targets).reshape(-1), np.asarray(weights, np.float64).reshape(-1)
  v = table.shape[0]
  z = h @ table.T
  logp = z - z.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  q = np.full(z.shape, eps / (v - 1))
  q[np.arange(len(y)), y] = 1.0 - eps
  loss = -(q * logp).sum(-1)
  nll = -logp[np.arange(len(y)), y]
  correct = (z.argmax(-1) == y).astype(np.float64)
  g = w[:, None] * (np.exp(logp) - q)
  return (w @ loss, w @ nll, w @ correct, w.sum()), g @ table, g.T @ h


def _inputs(seed=0, shape=(3, 5), d=8, v=11):
  rng = np.random.default_rng(seed)
  h = rng.normal(size=(*shape, d)).astype(np.float32)
  table = rng.normal(size=(v, d)).astype(np.float32)
  targets = rng.integers(0, v, shape).astype(np.int32)
  weights = (rng.random(shape) < 0.7).astype(np.float32)
  return h, table, targets, weights


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk_rows", [None, 4, 7, 64])
def test_head_matches_numpy_float64(eps, chunk_rows):
  h, table, targets, weights = _inputs()
  (loss, nll, correct, count), dh, dtable = np_head(h, table, targets, weights, eps)
  f = lambda a, b: kernels.head_cross_entropy(a, b, targets, weights, eps, chunk_rows)
  out = jax.jit(f)(h, table)
  np.testing.assert_allclose(np.array(out), [loss, nll, correct, count], rtol=1e-5)
  grads = jax.jit(jax.grad(lambda a, b: f(a, b)[0], (0, 1)))(h, table)
  np.testing.assert_allclose(grads[0], dh.reshape(h.shape), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(grads[1], dtable, rtol=1e-4, atol=1e-5)


def test_the_correct_count_takes_the_first_of_tied_maxima_as_numpy_argmax_does():
  # duplicate rows of the table tie the logits of their tokens exactly: a target is correct only
  # where it is the first of the tied maxima (numpy's argmax), not where a later copy is
  h, table, _, _ = _inputs(seed=3, shape=(4, 6), d=8, v=12)
  table *= 0.1
  table[[2, 5, 9]] = table[2] * 10.0  # tokens 2, 5 and 9 always tie, and hold most rows' max
  h[..., :] = np.sign(table[2]) + 0.5 * h
  z = h.reshape(-1, 8).astype(np.float64) @ table.T.astype(np.float64)
  assert (z.argmax(-1) == 2).mean() > 0.5
  for targets in (np.full((4, 6), 2), np.full((4, 6), 5), np.full((4, 6), 9),
                  np.random.default_rng(0).integers(0, 12, (4, 6))):
    targets = targets.astype(np.int32)
    weights = np.ones((4, 6), np.float32)
    logits = np.asarray(jnp.asarray(h) @ jnp.asarray(table).T)  # the float32 logits the head sees
    want = float((logits.reshape(-1, 12).argmax(-1) == targets.reshape(-1)).sum())
    for chunk_rows in (None, 5):
      out = jax.jit(lambda a, b: kernels.head_cross_entropy(a, b, targets, weights, 0.1,
                                                            chunk_rows))(h, table)
      assert float(out[2]) == want, (targets[0, 0], chunk_rows, float(out[2]), want)


def test_head_matches_reference_path_and_scales_with_the_cotangent():
  h, table, targets, weights = _inputs(1, (4, 6), 16, 37)

  def reference(a, b):
    logits = ops.tied_logits(a, b)
    loss, count = ops.label_smoothed_cross_entropy(logits, targets, weights, 0.1)
    nll, _ = ops.label_smoothed_cross_entropy(logits, targets, weights, 0.0)
    correct, _ = ops.token_accuracy(logits, targets, weights)
    return 2.5 * loss, (nll, correct, count)

  def fused(a, b):
    loss, nll, correct, count = kernels.head_cross_entropy(a, b, targets, weights, 0.1, 5)
    return 2.5 * loss, (nll, correct, count)

  (l0, a0), g0 = jax.value_and_grad(reference, (0, 1), has_aux=True)(h, table)
  (l1, a1), g1 = jax.value_and_grad(fused, (0, 1), has_aux=True)(h, table)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  np.testing.assert_allclose(np.array(a1), np.array(a0), rtol=1e-6)
  for x, y in zip(g1, g0):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_head_metrics_carry_no_gradient():
  h, table, targets, weights = _inputs(2)
  g = jax.grad(lambda a: kernels.head_cross_entropy(a, table, targets, weights, 0.1)[1])(h)
  assert not np.any(np.asarray(g))


def test_head_bfloat16_states_match_the_reference_path():
  h, table, targets, weights = _inputs(3, (2, 8), 16, 29)
  h = jnp.asarray(h, jnp.bfloat16)

  def reference(a, b):  # the model's unfused bf16 head: Embed.attend's logits (f32 from the bf16 dot units on CPU)
    b = b.astype(a.dtype)
    logits = dots.dense_nt(a, b) if kernels.select(a.dtype).layout_dots else ops.tied_logits(a, b)
    return ops.label_smoothed_cross_entropy(logits.astype(jnp.float32), targets, weights, 0.1)[0]

  fused = lambda a, b: kernels.head_cross_entropy(a, b, targets, weights, 0.1)[0]
  np.testing.assert_allclose(fused(h, table), reference(h, table), rtol=1e-5)
  g0 = jax.grad(reference, (0, 1))(h, table)
  g1 = jax.grad(fused, (0, 1))(h, table)
  assert g1[0].dtype == jnp.bfloat16 and g1[1].dtype == jnp.float32
  for x, y in zip(g1, g0):
    np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), rtol=2e-2, atol=2e-3)


def test_bfloat16_table_gradient_is_summed_over_blocks_in_float32():
  # under the bf16 dots each block's G^T h is a float32 product; the blocks' sum stays float32
  # and is rounded to bf16 once, so 16 blocks give the one-block gradient (up to float32
  # summation order: at most one bf16 step, in a few elements), where a bf16 running sum rounds
  # at every block
  h, table, targets, weights = _inputs(5, (16, 64), 32, 300)
  h = jnp.asarray(h, jnp.bfloat16)
  with kernels.use(bf16_dots="layout"):
    grad = lambda rows: jax.jit(jax.grad(lambda b: kernels.head_cross_entropy(
        h, b, targets, weights, 0.1, rows)[0]))(table)
    one, blocks = np.asarray(grad(None), np.float64), np.asarray(grad(64), np.float64)
  step = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(one), 1e-30))) - 7)  # one bf16 step
  assert np.all(np.abs(blocks - one) <= step * 1.001)
  assert np.mean(blocks == one) > 0.95, np.mean(blocks == one)


SMALL = dict(num_encoder_layers=1, num_decoder_layers=1)   # one layer each: quick to compile

FAMILIES = [  # the first in the quick tier, the others in the end-to-end tier (`pytest -m slow`)
    dict(family="encoder_decoder"),
    pytest.param(dict(family="encoder_decoder", share_embeddings=False, target_vocab_size=23,
                      tie_output=False), marks=pytest.mark.slow),
    pytest.param(dict(family="decoder_lm", pre_ln=True), marks=pytest.mark.slow),
    pytest.param(dict(family="decoder_lm", tie_output=False), marks=pytest.mark.slow),
    pytest.param(dict(family="encoder_classifier", num_classes=3), marks=pytest.mark.slow),
]


def _batch(cfg):
  rng = np.random.default_rng(0)
  targets = rng.integers(1, cfg.tgt_vocab_size, (3, 7)).astype(np.int32)
  targets[0, 5:] = 0
  inputs = rng.integers(1, cfg.vocab_size, (3, 6)).astype(np.int32)
  inputs[1, 4:] = 0
  return {"inputs": inputs, "targets": targets, "label": np.array([0, 2, 1], np.int32)}


@pytest.mark.parametrize("overrides", FAMILIES)
def test_default_loss_fused_equals_reference(overrides):
  cfg = TransformerConfig(vocab_size=31, d_model=16, num_heads=4, d_ff=24, max_len=12, **SMALL,
                          dropout_rate=0.1, **overrides)
  batch = _batch(cfg)
  params = init_params(cfg, jax.random.key(0), batch)
  model = build_model(cfg)
  rng = jax.random.key(5)
  out = {}
  for fused in (True, False):
    loss = cross_entropy_loss(0.1, fused=fused, chunk_rows=8)   # V = 31: fused only when asked
    out[fused] = jax.jit(jax.value_and_grad(lambda p: loss(model, p, batch, rng), has_aux=True))(params)
  (l1, t1), g1 = out[True]
  (l0, t0), g0 = out[False]
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  for k in ("count", "nll_sum", "correct"):
    np.testing.assert_allclose(t1[k], t0[k], rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g1, g0)


@pytest.mark.slow
def test_subclassed_model_takes_the_reference_path(monkeypatch):
  class Scaled(EncoderDecoder):
    def __call__(self, *args, **kwargs):
      return 2.0 * super().__call__(*args, **kwargs)

  cfg = TransformerConfig(vocab_size=31, d_model=16, num_heads=4, d_ff=24, max_len=12, **SMALL)
  batch = _batch(cfg)
  params = init_params(cfg, jax.random.key(0), batch)
  monkeypatch.setattr(kernels, "head_cross_entropy", None)   # any call of the fused op would fail
  model = Scaled(dataclasses.replace(cfg, deterministic=True))
  loss_sum, _ = jax.jit(lambda p: cross_entropy_loss(0.1)(model, p, batch, None))(params)
  logits = 2.0 * build_model(cfg, deterministic=True).apply({"params": params}, batch["inputs"],
                                                            batch["targets"])
  weights = (batch["targets"] != 0).astype(np.float32)
  expected = ops.label_smoothed_cross_entropy(logits, batch["targets"], weights, 0.1)[0]
  np.testing.assert_allclose(loss_sum, expected, rtol=1e-6)


def _spy_fused(monkeypatch):
  """Counts the calls of the fused op (it still runs)."""
  calls = []
  real = kernels.head_cross_entropy
  monkeypatch.setattr(kernels, "head_cross_entropy", lambda *a, **k: calls.append(1) or real(*a, **k))
  return calls


@pytest.mark.parametrize("min_vocab, expect_fused", [(32, False), (31, True)])
def test_default_loss_fuses_from_a_vocabulary_size(monkeypatch, min_vocab, expect_fused):
  cfg = TransformerConfig(vocab_size=31, d_model=16, num_heads=4, d_ff=24, max_len=12, **SMALL)
  batch = _batch(cfg)
  params = init_params(cfg, jax.random.key(0), batch)
  monkeypatch.setattr(models_loss, "FUSED_HEAD_MIN_VOCAB", min_vocab)
  calls = _spy_fused(monkeypatch)
  cross_entropy_loss(0.1)(build_model(cfg, deterministic=True), params, batch, None)
  assert bool(calls) == expect_fused


@pytest.mark.slow
def test_train_step_fused_equals_reference_step(monkeypatch):
  cfg = TransformerConfig(vocab_size=31, d_model=16, num_heads=4, d_ff=24, max_len=12, **SMALL,
                          dropout_rate=0.1)
  batch = _batch(cfg)
  monkeypatch.setattr(models_loss, "FUSED_HEAD_MIN_VOCAB", 16)   # the default step fuses this head
  calls = _spy_fused(monkeypatch)
  tx = optax.sgd(0.1)   # (Adam would turn rounding-level gradient differences into +-lr steps)
  state = create_train_state(init_params(cfg, jax.random.key(0), batch), tx)
  ref = jax.jit(make_train_step(cfg, tx, loss_fn=cross_entropy_loss(0.1, fused=False)))
  new = jax.jit(make_train_step(cfg, tx, 0.1))
  s0, m0 = ref(state, batch, jax.random.key(1))
  s1, m1 = new(state, batch, jax.random.key(1))
  assert calls, "the default step did not take the fused head"
  for k in ("loss", "nll", "accuracy", "grad_norm"):
    np.testing.assert_allclose(m1[k], m0[k], rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                         s1.params, s0.params)
