"""Accelerator defaults: bf16 compute and fused attention on TPU/GPU, the CPU path unchanged.

The choices are functions of the backend name, so every backend's choice is checked here; the CPU
outputs of the defaults are compared bit for bit with the explicit float32 / reference model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from txf.core.config import base_config
from txf.models import build_model, init_params
from txf.nn import TransformerConfig
from txf.kernels import fused_attention as _fused_attention, fused_kernel, has_bf16_units, resolve_impl
from txf.runtime import machine
from txf.nn.config import resolve_dtype


def test_auto_dtype_is_bf16_on_accelerators_and_float32_on_cpu():
  assert base_config().model.dtype == "auto"
  assert resolve_dtype("auto", "cpu") == "float32"
  assert resolve_dtype("auto", "gpu") == "bfloat16" and resolve_dtype("auto", "tpu") == "bfloat16"
  assert resolve_dtype("float32", "tpu") == "float32" and resolve_dtype("bfloat16", "cpu") == "bfloat16"


def test_prefer_bfloat16_follows_the_bf16_units(monkeypatch):
  assert has_bf16_units("gpu") and has_bf16_units("tpu")
  assert has_bf16_units("cpu", frozenset({"avx2", "avx512f", "avx512_bf16"}))
  assert has_bf16_units("cpu", frozenset({"amx_bf16"})) and has_bf16_units("cpu", frozenset({"bf16"}))
  assert not has_bf16_units("cpu", frozenset({"avx2", "fma", "avx512f"}))
  assert resolve_dtype("prefer_bfloat16", "gpu") == "bfloat16"
  for flags, expected in ((frozenset({"avx2", "avx512_bf16"}), "bfloat16"),
                          (frozenset({"avx2", "fma"}), "float32")):
    monkeypatch.setattr(machine, "cpu_flags", lambda flags=flags: flags)
    assert resolve_dtype("prefer_bfloat16", "cpu") == expected
    cfg = TransformerConfig(vocab_size=13, d_model=16, num_heads=2, d_ff=32, dtype="prefer_bfloat16")
    assert cfg.compute_dtype == jnp.dtype(expected)


def test_fused_attention_kernel_per_backend():
  assert resolve_impl("auto", "cpu") == "reference"
  assert resolve_impl("auto", "gpu") == "fused" and resolve_impl("auto", "tpu") == "fused"
  assert resolve_impl("reference", "gpu") == "reference"
  assert fused_kernel("gpu", jnp.bfloat16, True) == {"implementation": "cudnn", "is_causal": True}
  assert fused_kernel("gpu", jnp.float16, False) == {"implementation": "cudnn", "is_causal": False}
  assert fused_kernel("gpu", jnp.float32, True) == {"implementation": "xla"}  # cuDNN: half only
  assert fused_kernel("tpu", jnp.bfloat16, True) == {"implementation": "xla"}
  assert fused_kernel("cpu", jnp.bfloat16, True) == {"implementation": "xla"}


def test_cpu_defaults_give_the_float32_reference_model_bit_for_bit():
  assert jax.default_backend() == "cpu"
  explicit = TransformerConfig(vocab_size=13, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                               num_decoder_layers=1, dtype="float32", attention_impl="reference")
  auto = dataclasses.replace(explicit, dtype="auto", attention_impl="auto")
  assert auto.compute_dtype == jnp.float32
  batch = {"inputs": jnp.asarray([[5, 6, 7, 2, 0]], jnp.int32), "targets": jnp.asarray([[5, 6, 2, 0]], jnp.int32)}
  params = init_params(explicit, jax.random.key(0), batch)
  outs = [build_model(c, deterministic=True).apply({"params": params}, **batch) for c in (explicit, auto)]
  assert outs[0].dtype == jnp.float32
  np.testing.assert_array_equal(outs[0], outs[1])


def test_fused_attention_on_cpu_ignores_the_causal_flag():
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 5, 2, 4)), jnp.float32) for _ in range(3))
  mask = jnp.tril(jnp.ones((5, 5), bool))[None, None]
  np.testing.assert_array_equal(_fused_attention(q, k, v, mask, causal=True),
                                _fused_attention(q, k, v, mask, causal=False))
