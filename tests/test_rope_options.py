"""The RoPE options Hugging Face Llama checkpoints need (``model.rope_layout="half"``,
``model.rope_scaling`` linear | llama3) and Qwen2's attention biases without the output one
(``model.attention_out_bias=False``), against numpy float64 and against models they must equal."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_model_options import small_config
from txf import ops
from txf.core import config as config_lib
from txf.models import build_model, init_params

RNG = np.random.default_rng(0)


def rope_half_np(x, positions, theta):
  """Column i and column i + d/2 of each head as a pair (a + ib), multiplied by e^{i p theta_i}."""
  d = x.shape[-1]
  z = x[..., :d // 2].astype(np.float64) + 1j * x[..., d // 2:].astype(np.float64)
  z = z * np.exp(1j * np.asarray(positions, np.float64)[:, None] * np.asarray(theta, np.float64))
  return np.concatenate([z.real, z.imag], axis=-1)


def llama3_np(d, base, factor, low, high, original):
  """Llama 3.1's frequency rescaling, one frequency at a time in float64."""
  out = []
  for i in range(0, d, 2):
    theta = base ** (-i / d)
    wavelength = 2 * np.pi / theta
    if wavelength < original / high:  # high frequency: kept
      out.append(theta)
    elif wavelength > original / low:  # low frequency: divided by the factor
      out.append(theta / factor)
    else:  # in between: a linear ramp in original / wavelength from theta / factor to theta
      g = (original / wavelength - low) / (high - low)
      out.append((1 - g) * theta / factor + g * theta)
  return np.asarray(out)


def test_rope_half_rotates_column_pairs_as_numpy():
  x = RNG.normal(size=(2, 3, 5, 8)).astype(np.float32)
  positions = np.array([0, 1, 2, 7, 40])
  theta = ops.rope_frequencies(8, 500.0)
  got = ops.rope_half(jnp.asarray(x), jnp.asarray(positions)[None], theta)
  np.testing.assert_allclose(np.asarray(got), rope_half_np(x, positions, theta), atol=2e-5)
  np.testing.assert_allclose(theta, 500.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-6)


@pytest.mark.parametrize("original", [16, 64, 8192])
def test_llama3_frequencies_equal_the_formula(original):
  d, base, factor, low, high = 32, 500000.0, 8.0, 1.0, 4.0
  got = ops.rope_frequencies(d, base, "llama3", factor, low, high, original)
  want = llama3_np(d, base, factor, low, high, original)
  np.testing.assert_allclose(got, want, rtol=2e-6)
  plain = base ** (-np.arange(0, d, 2) / d)
  if original == 8192:  # the highest frequency kept, the lowest divided by the factor
    assert np.isclose(got[0], plain[0]) and np.isclose(got[-1], plain[-1] / factor)
  np.testing.assert_allclose(ops.rope_frequencies(d, base, "linear", 2.5), plain / 2.5, rtol=2e-6)


def _interleave(d):
  """The column order that puts pair (i, i + d/2) at (2i, 2i + 1)."""
  return np.stack([np.arange(d // 2), np.arange(d // 2) + d // 2], axis=1).reshape(-1)


@pytest.mark.parametrize("scaling", ["none", "llama3"])
def test_half_layout_model_equals_the_interleaved_one_with_permuted_columns(scaling):
  """q.k is unchanged when both are permuted alike: a decoder with half-split RoPE equals one with
  interleaved RoPE whose query and key columns are reordered so that the same pairs rotate."""
  kw = dict(positional="rope", rope_scaling=scaling, rope_scaling_factor=4.0,
            rope_original_max_len=8, num_encoder_layers=0, family="decoder_lm", pre_ln=True,
            norm="rms_norm", d_model=16, num_heads=2)
  half, inter = small_config(rope_layout="half", **kw), small_config(**kw)
  targets = {"targets": np.array([[4, 5, 6, 7, 8, 9, 10, 3]], np.int32)}
  params = jax.device_get(init_params(half, jax.random.key(1), targets))
  moved = jax.tree_util.tree_map(np.array, params)
  perm = _interleave(8)
  for layer in (k for k in moved["decoder"] if k.startswith("layer_")):
    att = moved["decoder"][layer]["self_attention"]
    att["query"], att["key"] = att["query"][..., perm], att["key"][..., perm]
  a = build_model(half, deterministic=True).apply({"params": params}, **targets)
  b = build_model(inter, deterministic=True).apply({"params": moved}, **targets)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
  c = build_model(small_config(rope_layout="half", **{**kw, "rope_scaling": "none", "rope_base": 7.0}),
                  deterministic=True).apply({"params": params}, **targets)
  assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3  # the frequencies matter


def test_attention_without_the_output_bias():
  """attention_out_bias=False: Q, K, V biases and no out_bias; equal to the model with all four
  biases whose out_bias is 0."""
  kw = dict(attention_bias=True, family="decoder_lm", num_encoder_layers=0)
  targets = {"targets": np.array([[4, 5, 6, 7]], np.int32)}
  params = jax.device_get(init_params(small_config(attention_out_bias=False, **kw),
                                      jax.random.key(0), targets))
  att = params["decoder"]["layer_0"]["self_attention"]
  assert {"query_bias", "key_bias", "value_bias"} <= set(att) and "out_bias" not in att
  att["query_bias"] = RNG.normal(size=att["query_bias"].shape).astype(np.float32)
  full = jax.tree_util.tree_map(np.array, params)
  full["decoder"]["layer_0"]["self_attention"]["out_bias"] = np.zeros(8, np.float32)
  a = build_model(small_config(attention_out_bias=False, **kw), deterministic=True).apply(
      {"params": params}, **targets)
  b = build_model(small_config(**kw), deterministic=True).apply({"params": full}, **targets)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_config_checks_the_llama3_factors():
  c = config_lib.base_config()
  c.model.positional, c.model.rope_scaling = "rope", "llama3"
  c.model.rope_low_freq_factor, c.model.rope_high_freq_factor = 4.0, 1.0
  from txf.train import tables
  with pytest.raises(config_lib.ConfigError, match="rope_low_freq_factor"):
    tables.validate(c)
  c.model.rope_layout = "diagonal"
  with pytest.raises(config_lib.ConfigError, match="rope_layout"):
    tables.validate(c)
