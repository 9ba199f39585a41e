"""txf.kernels.dots (bf16 products laid out for the CPU's bf16 dot units) against numpy float64 and
against the model's reference bf16 path (XLA's own dots)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.models import build_model, init_params
from txf.nn.config import TransformerConfig
from txf import kernels
from txf.kernels import dots

RNG = np.random.default_rng(0)
BF16_EPS = 2.0 ** -8  # relative rounding of one bf16 value


@pytest.fixture(autouse=True)
def _fresh_rng():
  global RNG  # every test draws the same inputs whatever ran before it
  RNG = np.random.default_rng(0)


def _bf16(shape, scale=1.0):
  return jnp.asarray(RNG.standard_normal(shape) * scale, jnp.bfloat16)


def _f64(x):
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _close(got, want, rel):
  """|got - want| <= rel * max|want| elementwise: a product of bf16 inputs rounded once to bf16."""
  got, want = _f64(got), np.asarray(want, np.float64)
  assert got.shape == want.shape
  err, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
  assert err <= rel * scale, (err, scale)


@pytest.mark.parametrize("shape", [(2, 5, 24), (40, 24), (1, 1, 24)])
def test_dense_forward_and_gradients_equal_float64_products(shape):
  # y = x W; with cotangent g: dx = g W^T, dW = sum over rows of x^T g. Inputs are bf16 (exact in
  # float64), so the only error is the float32 accumulation and one rounding of each result to bf16.
  x, w = _bf16(shape), _bf16((24, 16), 24 ** -0.5)
  g = _bf16(shape[:-1] + (16,))
  y, vjp = jax.vjp(dots.dense, x, w)
  dx, dw = vjp(g)
  assert y.dtype == dx.dtype == dw.dtype == jnp.bfloat16
  xf, wf, gf = _f64(x), _f64(w), _f64(g)
  _close(y, xf @ wf, 2 * BF16_EPS)
  _close(dx, gf @ wf.T, 2 * BF16_EPS)
  _close(dw, xf.reshape(-1, 24).T @ gf.reshape(-1, 16), 2 * BF16_EPS)


def test_add_bias_sums_its_gradient_in_float32_with_one_rounding():
  # y = z + b; db = the sum of g over the 2048 rows (a base FFN's tokens), rounded once to bf16.
  # Differentiated as a plain add, XLA:CPU sums the bf16 cotangent to many roundings' error: the
  # plain add is the control that shows this test can tell the two apart.
  z, b, g = _bf16((32, 64, 256)), _bf16((256,)), _bf16((32, 64, 256))
  y, vjp = jax.vjp(jax.jit(dots.add_bias), z, b)
  dz, db = vjp(g)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(z + b))  # the forward: the bf16 add
  np.testing.assert_array_equal(np.asarray(dz), np.asarray(g))
  want = _f64(g).reshape(-1, 256).sum(axis=0)
  assert db.dtype == jnp.bfloat16
  _close(db, want, BF16_EPS)  # one rounding of the float64 sum (half an ulp: within BF16_EPS)
  _, plain_vjp = jax.vjp(jax.jit(lambda z, b: z + b), z, b)
  err_plain = np.max(np.abs(_f64(plain_vjp(g)[1]) - want))
  err_ours = np.max(np.abs(_f64(db) - want))
  assert err_plain > 4 * err_ours, (err_plain, err_ours)


def test_dense_nt_gives_float32_logits_and_the_tied_gradients():
  # logits = h E^T in float32; dh = g E, dE = g^T h.
  h, e = _bf16((3, 7, 32)), _bf16((50, 32), 32 ** -0.5)
  g = jnp.asarray(RNG.standard_normal((3, 7, 50)), jnp.float32)
  logits, vjp = jax.vjp(dots.dense_nt, h, e)
  dh, de = vjp(g)
  assert logits.dtype == jnp.float32 and dh.dtype == de.dtype == jnp.bfloat16
  hf, ef = _f64(h), _f64(e)
  gb = _f64(g.astype(jnp.bfloat16))  # the cotangent enters the bf16 dots rounded once
  _close(logits, hf @ ef.T, 1e-5)     # float32 accumulation, no rounding to bf16
  _close(dh, gb @ ef, 2 * BF16_EPS)
  _close(de, gb.reshape(-1, 50).T @ hf.reshape(-1, 32), 2 * BF16_EPS)


def test_attention_products_and_their_gradients_equal_float64():
  # S = Q K^T (float32), O = P V per (batch, head); dQ = gS K, dK = gS^T Q, dP = gO V^T, dV = P^T gO
  q, k, v = _bf16((2, 3, 5, 8)), _bf16((2, 3, 7, 8)), _bf16((2, 3, 7, 8))
  p = _bf16((2, 3, 5, 7))
  gs = jnp.asarray(RNG.standard_normal((2, 3, 5, 7)), jnp.float32)
  go = _bf16((2, 3, 5, 8))
  s, vjp_s = jax.vjp(dots.scores, q, k)
  o, vjp_o = jax.vjp(dots.weighted, p, v)
  (dq, dk), (dp, dv) = vjp_s(gs), vjp_o(go)
  assert s.dtype == jnp.float32 and o.dtype == dq.dtype == dv.dtype == jnp.bfloat16
  qf, kf, vf, pf, gof = (_f64(t) for t in (q, k, v, p, go))
  gsb = _f64(gs.astype(jnp.bfloat16))
  _close(s, np.einsum("bhqd,bhkd->bhqk", qf, kf), 1e-5)
  _close(o, np.einsum("bhqk,bhkd->bhqd", pf, vf), 2 * BF16_EPS)
  _close(dq, np.einsum("bhqk,bhkd->bhqd", gsb, kf), 2 * BF16_EPS)
  _close(dk, np.einsum("bhqk,bhqd->bhkd", gsb, qf), 2 * BF16_EPS)
  _close(dp, np.einsum("bhqd,bhkd->bhqk", gof, vf), 2 * BF16_EPS)
  _close(dv, np.einsum("bhqk,bhqd->bhkd", pf, gof), 2 * BF16_EPS)


def test_dense_matches_the_reference_bf16_product_under_jit_and_grad():
  # the same function as x @ w in bf16 (XLA's path), also when the cotangent is a broadcast
  # constant (loss = sum): a transposed dot result there once became a dot XLA could not run
  x, w = _bf16((64, 48)), _bf16((48, 40), 48 ** -0.5)
  for loss in (lambda f: lambda x, w: jnp.sum(f(x, w).astype(jnp.float32)),
               lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w).astype(jnp.float32)))):
    got = jax.jit(jax.grad(loss(dots.dense), argnums=(0, 1)))(x, w)
    want = jax.jit(jax.grad(loss(jnp.matmul), argnums=(0, 1)))(x, w)
    for a, b in zip(got, want):
      _close(a, _f64(b), 4 * BF16_EPS)


def test_dense_nt_runs_with_a_constant_cotangent():
  h, e = _bf16((16, 32)), _bf16((40, 32))
  dh, de = jax.jit(jax.grad(lambda h, e: jnp.sum(dots.dense_nt(h, e)), argnums=(0, 1)))(h, e)
  ones = np.ones((16, 40))
  _close(dh, ones @ _f64(e), 2 * BF16_EPS)
  _close(de, ones.T @ _f64(h), 2 * BF16_EPS)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the layout rules are XLA:CPU's")
def test_every_dot_of_the_bf16_gradient_runs_on_bf16_operands():
  # the point of the module: in the compiled fwd+bwd no dot has its operands converted to f32
  x, w = _bf16((256, 128)), _bf16((128, 512))
  e = _bf16((1000, 128))
  loss = lambda x, w, e: jnp.sum(dots.dense_nt(jnp.tanh(dots.dense(x, w))[:, :128], e) ** 2)
  text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, w, e).compile().as_text()
  if "__ynn_fusion" not in text:
    pytest.skip("this jaxlib does not send dots to YNNPACK")
  blocks = re.split(r"\n(?=%|ENTRY)", text)  # one HLO computation per block
  with_dot = [b for b in blocks if re.search(r"\bdot\(", b)]
  assert len(with_dot) == 6  # forward 2, backward 4, each alone in a YNNPACK fusion
  for block in with_dot:
    assert not block.startswith("ENTRY"), block
    operand_types = re.findall(r"(\w+)\[[\d,]*\]\{[\d,]*\} parameter\(", block)
    assert operand_types == ["bf16", "bf16"], block
  callers = re.findall(r"fusion\([^)]*\), kind=kCustom, calls=(%[\w.]+)", text)
  assert len(callers) >= 6 and text.count('"__ynn_fusion"') >= 6


def test_weight_gradient_of_a_wide_input_copies_the_narrow_side_transposed():
  # dW = xᵀ g for x [N, K] wide, g [N, M] narrow: the bf16 dot needs one operand transposed; the
  # kernel copies g ([M, N]) and transposes the small [M, K] result, not x ([K, N])
  n, k, m = 512, 256, 16
  x, w, g = _bf16((n, k)), _bf16((k, m), k ** -0.5), _bf16((n, m))
  dw_of = jax.jit(lambda x, w, g: jax.vjp(dots.dense, x, w)[1](g)[1])
  dw = dw_of(x, w, g)
  assert dw.dtype == jnp.bfloat16 and dw.shape == (k, m)
  _close(dw, _f64(x).T @ _f64(g), 2 * BF16_EPS)
  text = dw_of.lower(x, w, g).compile().as_text()
  copies = set(re.findall(r"bf16\[(\d+),(\d+)\]\{1,0\} (?:copy|fusion)\(", text))
  assert (str(m), str(n)) in copies and (str(k), str(n)) not in copies, copies
  # and the rule keeps the usual form where x is the narrow side
  dw_t = jax.jit(lambda g, w, x: jax.vjp(dots.dense, g, w)[1](x)[1])
  _close(dw_t(g, _bf16((m, k)), x), _f64(g).T @ _f64(x), 2 * BF16_EPS)


def _model_cfg(dtype):
  return TransformerConfig(family="encoder_decoder", vocab_size=96, d_model=64, num_heads=4, d_ff=128,
                           num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0,
                           max_len=16, dtype=dtype)


def _loss_and_grads(cfg, params, batch):
  model = build_model(cfg, deterministic=True)

  def loss(p):
    logits = model.apply({"params": p}, batch["inputs"], batch["targets"])
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, batch["targets"][..., None], -1))
  return jax.jit(jax.value_and_grad(loss))(params)


def _rel(a, b):
  a, b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return max(float(np.linalg.norm(_f64(x) - _f64(y)) / (np.linalg.norm(_f64(y)) + 1e-30))
             for x, y in zip(a, b))


@pytest.mark.slow  # a whole model three ways (16 s of compiles): the end-to-end tier
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the bf16 dots are used on CPU only")
def test_bf16_model_with_the_dots_equals_the_reference_bf16_path_and_float32(monkeypatch):
  rs = np.random.RandomState(0)
  batch = {"inputs": rs.randint(3, 96, (4, 12)).astype(np.int32),
           "targets": rs.randint(3, 96, (4, 10)).astype(np.int32)}
  params = jax.device_get(init_params(_model_cfg("float32"), jax.random.key(0), batch))
  with kernels.use(bf16_dots="layout"):   # txf.kernels.dots (the default where the CPU has bf16 units)
    assert kernels.select("bfloat16").layout_dots and not kernels.select("float32").layout_dots
    loss_dots, grads_dots = _loss_and_grads(_model_cfg("bfloat16"), params, batch)
  loss_f32, grads_f32 = _loss_and_grads(_model_cfg("float32"), params, batch)
  with kernels.use(bf16_dots="xla"):  # XLA's own bf16 dots: the formulas of txf.ops unchanged
    loss_ref, grads_ref = _loss_and_grads(_model_cfg("bfloat16"), params, batch)
  assert jax.tree_util.tree_map(lambda g: g.dtype, grads_dots) == \
      jax.tree_util.tree_map(lambda g: g.dtype, grads_f32)  # float32 gradients of float32 params
  assert abs(float(loss_dots) - float(loss_ref)) < 0.01 * float(loss_ref)
  assert abs(float(loss_dots) - float(loss_f32)) < 0.01 * float(loss_f32)
  # bf16 rounding only: each pair differs by the bf16 rounding of the sublayers, 0.05-0.08 on the
  # worst leaf of this one-batch random model (a wrong product would be off by O(1))
  assert _rel(grads_dots, grads_ref) < 0.1, _rel(grads_dots, grads_ref)
  assert _rel(grads_dots, grads_f32) < 0.1, _rel(grads_dots, grads_f32)
  assert _rel(grads_ref, grads_f32) < 0.1


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_float32_model_does_not_use_the_dots(monkeypatch):
  # float32 compute keeps XLA's own dots: the bf16 functions are never called
  def boom(*args):
    raise AssertionError("txf.kernels.dots used for float32")
  monkeypatch.setattr(dots, "dense", boom)
  monkeypatch.setattr(dots, "dense_nt", boom)
  rs = np.random.RandomState(1)
  batch = {"inputs": rs.randint(3, 96, (2, 6)).astype(np.int32),
           "targets": rs.randint(3, 96, (2, 5)).astype(np.int32)}
  cfg = _model_cfg("float32")
  params = init_params(cfg, jax.random.key(0), batch)
  loss, _ = _loss_and_grads(cfg, params, batch)
  assert np.isfinite(float(loss))
