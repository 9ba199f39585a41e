"""txf.kernels: the one selection function, and each kernel against the txf.ops formula it replaces."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import kernels, ops
from txf.kernels import bf16

RS = np.random.RandomState(0)


def _bf16(*shape):
  """A bf16 array and the same values in float32 (the formula's input, so only the kernel rounds)."""
  x = jnp.asarray(RS.randn(*shape), jnp.bfloat16)
  return x, x.astype(jnp.float32)


def _close(got, want, rtol=2e-2):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)
  assert err < rtol, err


def test_only_the_selection_module_asks_for_the_backend():
  root = pathlib.Path(kernels.__file__).parents[1]
  callers = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if "default_backend()" in p.read_text() and "bench" not in p.parts]
  # and the multi-process set-up, below kernels, for jax 0.12.1's multi-process CPU cache rule
  # (txf.runtime.compile_cache.serves_multi_process): a cache choice, not a kernel choice
  assert callers == ["kernels/select.py", "parallel/distributed.py"], callers


def test_cpu_choices_and_overrides():
  assert jax.default_backend() == "cpu"
  default = kernels.default_bf16_dots("cpu")   # this CPU's and jax's (the policy: test below)
  assert kernels.select("bfloat16").bf16_dots == default and not kernels.select("float32").layout_dots
  assert kernels.select().attention_auto == "reference" and kernels.resolve_impl("auto") == "reference"
  with kernels.use(bf16_dots="layout"):
    assert kernels.select("bfloat16").layout_dots
    assert kernels.select("float32").bf16_dots == "xla"   # float32 compute never takes bf16 dots
  with kernels.use(bf16_dots="xla", top_k="lax"):
    assert not kernels.select("bfloat16").layout_dots and kernels.select().top_k == "lax"
  assert kernels.select("bfloat16").bf16_dots == default and kernels.select().top_k == "blocked"
  # beam search's keys: transposed for float32 dots on CPU, as rows for bf16 ones
  assert kernels.select("float32").beam_keys == "transposed" == kernels.select().beam_keys
  assert kernels.select("bfloat16").beam_keys == "rows"
  with kernels.use(beam_keys="rows"):
    assert kernels.select("float32").beam_keys == "rows"
  with pytest.raises(ValueError, match="unknown kernel choice"):
    with kernels.use(bf16_dots="fast"):
      pass
  info = kernels.describe()
  assert info["jax"] == jax.__version__ and info["bf16_dots"] == default


@pytest.mark.parametrize("backend, version, flags, expect", [
    ("cpu", "0.10.2", {"avx2", "fma"}, "xla"),             # no bf16 units, XLA converts to float32
    ("cpu", "0.12.0.1", {"avx2", "fma"}, "layout"),        # XLA's own bf16 dot: slower than layout
    ("cpu", "0.10.2", {"avx512f", "avx512_bf16"}, "layout"),
    ("cpu", "0.12.0.1", {"amx_bf16"}, "layout"),
    ("cpu", "0.10.2", set(), "layout"),                    # flags unknown: the bf16-unit layout
    ("gpu", "0.10.2", {"avx2"}, "xla"), ("tpu", "0.12.0.1", set(), "xla")])
def test_bf16_dots_policy_by_cpu_and_jax_version(backend, version, flags, expect):
  assert kernels.default_bf16_dots(backend, version, frozenset(flags)) == expect


def test_accelerator_choices(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  chosen = kernels.select("bfloat16")
  assert (chosen.backend, chosen.bf16_dots, chosen.attention_auto, chosen.dropout_mask,
          chosen.top_k, chosen.beam_keys, chosen.argmax) == ("gpu", "xla", "fused", "jax", "lax",
                                                             "rows", "lax")
  assert kernels.resolve_impl("auto") == "fused" and kernels.resolve_impl("reference") == "reference"


@pytest.mark.parametrize("with_mask", [False, True])
def test_bf16_attention_matches_the_formula(with_mask):
  (q, q32), (k, k32), (v, v32) = _bf16(2, 3, 5, 8), _bf16(2, 3, 7, 8), _bf16(2, 3, 7, 8)
  mask = jnp.asarray(RS.rand(2, 1, 5, 7) > 0.3) if with_mask else None
  if with_mask:
    mask = mask.at[0, 0, 1].set(False)   # a fully masked row: zero weights, zero output
  out, weights = jax.jit(bf16.scaled_dot_product_attention)(q, k, v, mask)
  want_out, want_weights = ops.scaled_dot_product_attention(q32, k32, v32, mask)
  assert out.dtype == jnp.bfloat16
  _close(out, want_out)
  _close(weights, want_weights)
  if with_mask:
    assert float(jnp.abs(out[0, :, 1]).max()) == 0.0


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_bf16_feed_forward_matches_the_formula(activation):
  (x, x32), (w1, w132), (w2, w232) = _bf16(2, 4, 16), _bf16(16, 32), _bf16(32, 16)
  (b1, b132), (b2, b232) = _bf16(32), _bf16(16)
  got = jax.jit(bf16.feed_forward, static_argnums=5)(x, w1, b1, w2, b2, activation)
  _close(got, ops.feed_forward(x32, w132, b132, w232, b232, activation=activation))


@pytest.mark.parametrize("activation, use_bias", [("reglu", True), ("geglu", True),
                                                  ("swiglu", True), ("swiglu", False)])
def test_bf16_gated_feed_forward_matches_the_formula(activation, use_bias):
  # (f(x W1 + b1) * (x V + c)) W2 + b2 with bf16 products against the float32 formula on the same
  # (bf16-representable) values: only the kernel's bf16 rounding differs
  (x, x32), (w1, w132), (v, v32), (w2, w232) = (_bf16(2, 4, 16), _bf16(16, 24), _bf16(16, 24),
                                                _bf16(24, 16))
  (b1, b132), (c, c32), (b2, b232) = (_bf16(24), _bf16(24), _bf16(16)) if use_bias else ((None,) * 2,) * 3
  got = jax.jit(bf16.feed_forward, static_argnums=5)(x, w1, b1, w2, b2, activation, v, c)
  assert got.dtype == jnp.bfloat16
  _close(got, ops.feed_forward(x32, w132, b132, w232, b232, activation=activation, w_gate=v32,
                               b_gate=c32))


def _layer_norm_float64(x, gamma, beta, eps):
  """LN in numpy float64: (x - mu) / sqrt(var + eps) * gamma + beta over the last axis."""
  mu = x.mean(axis=-1, keepdims=True)
  return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps) * gamma + beta


def test_layer_norm_kernel_is_the_formula_forward_and_its_gradient_is_the_float64_one():
  # the closed-form gradient against central differences of LN in numpy float64, on a random
  # direction of each input (a wrong term of dx, dgamma or dbeta moves these by O(1))
  rs = np.random.RandomState(0)
  x = rs.randn(3, 5, 16) * 2.0 + 0.5
  gamma, beta, g = rs.randn(16), rs.randn(16), rs.randn(3, 5, 16)
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  y = jax.jit(kernels.norm.layer_norm, static_argnums=3)(f32(x), f32(gamma), f32(beta), 1e-6)
  want = jax.jit(ops.layer_norm, static_argnums=3)(f32(x), f32(gamma), f32(beta), 1e-6)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
  _, vjp = jax.vjp(lambda a, b, c: kernels.norm.layer_norm(a, b, c, 1e-6), f32(x), f32(gamma),
                   f32(beta))
  grads = [np.asarray(d, np.float64) for d in vjp(f32(g))]
  args = [x, gamma, beta]
  for i, grad in enumerate(grads):
    direction = rs.randn(*args[i].shape)
    h = 1e-6
    plus = [a + h * direction if j == i else a for j, a in enumerate(args)]
    minus = [a - h * direction if j == i else a for j, a in enumerate(args)]
    numeric = ((_layer_norm_float64(*plus, 1e-6) - _layer_norm_float64(*minus, 1e-6)) * g).sum() / (2 * h)
    assert abs((grad * direction).sum() - numeric) <= 1e-4 * max(1.0, abs(numeric)), (i, numeric)


def test_layer_norm_dispatch_keeps_float32_on_jaxs_own_gradient():
  # float32 compute never reaches the kernel (its programs, and the default run, stay as they were)
  x = jnp.asarray(np.random.RandomState(1).randn(2, 3, 8), jnp.float32)
  ones, zeros = jnp.ones(8), jnp.zeros(8)
  jaxpr = str(jax.make_jaxpr(lambda a: kernels.layer_norm(a, ones, zeros, 1e-6, jnp.float32))(x))
  assert "custom_vjp" not in jaxpr
  with kernels.use(bf16_dots="layout"):
    jaxpr = str(jax.make_jaxpr(lambda a: kernels.layer_norm(a, ones, zeros, 1e-6, jnp.bfloat16))(x))
  assert "custom_vjp" in jaxpr


def test_bf16_multi_head_attention_matches_the_formula_with_biases_and_a_kv_hook():
  (x, x32), (m, m32) = _bf16(2, 5, 16), _bf16(2, 6, 16)
  ws = [_bf16(16, 4, 4) for _ in range(3)] + [_bf16(4, 4, 16)]
  bs = [_bf16(4, 4) for _ in range(3)] + [_bf16(16)]
  seen = []
  hook = lambda k, v, mask: (seen.append(k.shape) or (k, v, mask))
  got, _ = bf16.multi_head_attention(x, m, *(w for w, _ in ws), 4, None, kv_hook=hook,
                                     biases=tuple(b for b, _ in bs))
  want, _ = ops.multi_head_attention(x32, m32, *(w for _, w in ws), 4, None, kv_hook=hook,
                                     biases=tuple(b for _, b in bs))
  assert seen == [(2, 4, 6, 4)] * 2
  _close(got, want)


def test_bf16_logits_and_dense_match_the_formulas():
  (h, h32), (e, e32), (w, w32) = _bf16(3, 4, 16), _bf16(40, 16), _bf16(16, 40)
  with kernels.use(bf16_dots="layout"):
    logits = kernels.tied_logits(h, e)
    dense = kernels.dense(h, w)
  assert logits.dtype == jnp.float32          # float32 logits from the bf16 products
  _close(logits, ops.tied_logits(h32, e32))
  _close(dense, h32 @ w32)
  with kernels.use(bf16_dots="xla"):
    assert kernels.tied_logits(h, e).dtype == jnp.bfloat16   # the formula itself, in bf16


def test_dropout_kernel_equals_the_formula_bit_for_bit():
  x = jnp.asarray(RS.randn(6, 5, 8), jnp.float32)
  key = jax.random.key(3)
  for dims in [(), (1,), (-1,)]:
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, k: kernels.dropout(a, 0.3, k, dims))(x, key)),
                                  np.asarray(ops.dropout(x, 0.3, key, dims)))


def test_top_k_kernel_equals_lax_top_k():
  x = jnp.asarray(RS.randint(0, 50, (3, 2, 1280)), jnp.float32)   # many ties
  values, ids = kernels.top_k(x, 4)
  want_values, want_ids = jax.lax.top_k(x, 4)
  np.testing.assert_array_equal(np.asarray(values), np.asarray(want_values))
  np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
  with kernels.use(top_k="lax"):
    assert "reduce_max" not in str(jax.make_jaxpr(lambda a: kernels.top_k(a, 4))(x))
  assert "reduce_max" in str(jax.make_jaxpr(lambda a: kernels.top_k(a, 4))(x))


def _numpy_first_argmax(x):
  """The first index of the maximum per row in float64 numpy, a NaN counting as the maximum."""
  x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
  out = []
  for row in x:
    nan = np.flatnonzero(np.isnan(row))
    out.append(int(nan[0]) if len(nan) else int(np.flatnonzero(row == row.max())[0]))
  return np.asarray(out)


def test_argmax_kernel_takes_the_first_maximum_as_numpy_does():
  ties = RS.randint(0, 5, (4, 3, 300)).astype(np.float32)     # every row has ties at its maximum
  special = np.array([[1, 3, 3, 2], [np.nan, 1, np.nan, 5], [1, np.nan, 9, 2],
                      [-np.inf] * 4, [np.inf, 1, np.inf, 0], [-0.0, 0.0, -1, -0.0]], np.float32)
  for x in (ties, special, RS.randn(16, 8000).astype(np.float32)):
    want = _numpy_first_argmax(x).reshape(x.shape[:-1])
    got = np.asarray(jax.jit(kernels.first_argmax)(jnp.asarray(x)))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(jnp.argmax(jnp.asarray(x), -1)), want)  # lax's too
    assert got.dtype == np.int32
  assert kernels.select().argmax == "two-pass"
  with kernels.use(argmax="lax"):
    assert "argmax" in str(jax.make_jaxpr(lambda a: kernels.argmax(a))(jnp.asarray(special)))
  assert "argmax" not in str(jax.make_jaxpr(lambda a: kernels.argmax(a))(jnp.asarray(special)))


def test_greedy_decoding_gives_the_same_ids_with_either_argmax():
  from txf.decode import DecodingSpec
  from txf.decode.decoders import translate_ids
  from txf.models import init_params
  from txf.nn import TransformerConfig
  cfg = TransformerConfig(family="encoder_decoder", vocab_size=64, d_model=32, num_heads=2, d_ff=64,
                          num_encoder_layers=1, num_decoder_layers=1, max_len=24, dropout_rate=0.0)
  params = init_params(cfg, jax.random.key(1), {"inputs": np.ones((1, 8), np.int32),
                                                "targets": np.ones((1, 8), np.int32)})
  sources = [np.append(RS.randint(3, 64, n), 2) for n in (4, 7, 2, 6)]
  fast = translate_ids(cfg, params, sources, 8, 16, DecodingSpec(), batch_size=4, cut=False)
  with kernels.use(argmax="lax"):
    plain = translate_ids(cfg, params, sources, 8, 16, DecodingSpec(), batch_size=4, cut=False,
                          wrap=lambda run: jax.jit(run))  # a new jit: traced under the override
  assert [list(r) for r in fast] == [list(r) for r in plain]


def test_ops_hold_formulas_only():
  # no product hooks in the formulas: the backend's ways of computing them live in txf.kernels
  root = pathlib.Path(ops.__file__).parent
  for path in root.glob("*.py"):
    text = path.read_text()
    assert not re.search(r"\b(matmul|products)\s*[:=]", text), path.name
    assert not re.search(r"^\s*(from|import) txf\.kernels", text, re.M), path.name
