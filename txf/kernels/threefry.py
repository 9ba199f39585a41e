"""Dropout masks from threefry-2x32 written as straight-line elementwise ops (the
``dropout_mask="threefry-slab"`` kernel of txf.kernels.select).

``jax.random.bernoulli`` with a threefry key lowers on CPU to a rolled 5-trip while loop over the
whole array (the ``threefry2x32`` primitive's CPU lowering): every trip copies the two uint32
state arrays and runs two fusions that each redo the trip's 4 rounds, and every consumer of the
mask then reads both uint32 arrays (8 bytes per element) and rebuilds the float uniform. Here the
20 rounds and the comparison run as one vectorised loop per slab and write a bool mask (1 byte
per element). The mask is identical to ``jax.random.bernoulli``'s for the default configuration
(threefry2x32 keys, ``jax_threefry_partitionable`` on, a float32 ``p``); anything else is handed
to ``jax.random.bernoulli`` itself, and so is every draw on GPU/TPU, where jax's lowering of
threefry is already unrolled.
"""

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from txf.kernels.select import select
from txf.ops.dropout import apply_mask, mask_shape

# Threefry-2x32, 20 rounds (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3").
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
KEY_PARITY = 0x1BD11BDA


def _rotl(v: jnp.ndarray, r: int) -> jnp.ndarray:
  return lax.shift_left(v, np.uint32(r)) | lax.shift_right_logical(v, np.uint32(32 - r))


def threefry2x32(k0, k1, x0, x1):
  """Threefry-2x32 block cipher, 20 rounds: (k0, k1) keys the map (x0, x1) -> (y0, y1), all uint32.

  ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA); x += (ks0, ks1); then 5 groups s = 1..5 of 4 rounds
  (x0 += x1; x1 = rotl(x1, R) ^ x0, with R from (13, 15, 26, 6) for odd s, (17, 29, 16, 24) for
  even s), each group followed by x0 += ks[s mod 3], x1 += ks[(s+1) mod 3] + s.

  Args:
    k0, k1: uint32 scalars; x0, x1: uint32 arrays of one shape (or broadcastable).
  Returns:
    (y0, y1), uint32 arrays of the broadcast shape.
  """
  ks = (k0, k1, k0 ^ k1 ^ np.uint32(KEY_PARITY))
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for s in range(1, 6):
    for r in ROTATIONS[(s - 1) % 2]:
      x0 = x0 + x1
      x1 = _rotl(x1, r) ^ x0
    x0 = x0 + ks[s % 3]
    x1 = x1 + ks[(s + 1) % 3] + np.uint32(s)
  return x0, x1


def flat_index(shape: Sequence[int]) -> jnp.ndarray:
  """uint32 array of ``shape`` holding each element's row-major position (size < 2^32)."""
  strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
  index = jnp.zeros(shape, jnp.uint32)
  for dim, stride in enumerate(strides):
    index = index + lax.broadcasted_iota(jnp.uint32, shape, dim) * np.uint32(stride)
  return index


def _fast_path_ok(key, p, shape) -> bool:
  if select().dropout_mask != "threefry-slab":
    return False  # GPU/TPU lower threefry unrolled (or to a kernel) already: fusible there
  if not isinstance(p, (int, float)) or isinstance(p, bool):
    return False
  if jax.config.jax_enable_x64 or not jax.config.jax_threefry_partitionable:
    return False  # bernoulli would draw float64, or count in the non-partitionable layout
  if not 0 < math.prod(shape) < 2 ** 32:
    return False
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    return key.shape == () and str(jax.random.key_impl(key)) == "threefry2x32"
  return (key.shape == (2,) and key.dtype == jnp.uint32
          and str(jax.config.jax_default_prng_impl) == "threefry2x32")


def uniform_from_bits(bits: jnp.ndarray) -> jnp.ndarray:
  """float32 in [0, 1) from uint32 bits, as ``jax.random.uniform``: u = (bits >> 9) * 2^-23, formed
  as bitcast((bits >> 9) | bits(1.0)) - 1 (exact), then max(0, u * 1 + 0) with the same ops."""
  one = np.array(1.0, np.float32)
  mantissa = lax.shift_right_logical(bits, np.uint32(32 - 23))
  floats = lax.bitcast_convert_type(lax.bitwise_or(mantissa, one.view(np.uint32)), jnp.float32) - one
  lo, hi = np.float32(0.0), np.float32(1.0)
  return lax.max(lo, floats * (hi - lo) + lo)


def bernoulli(key, p: float, shape: Sequence[int]) -> jnp.ndarray:
  """bool [*shape], True with probability p: equal to ``jax.random.bernoulli(key, p, shape)``.

  For a threefry2x32 key (typed or raw uint32[2]) with ``jax_threefry_partitionable`` on, element
  i (row-major) is ``uniform_from_bits(y0 ^ y1) < p`` with (y0, y1) = threefry2x32(key, (0, i));
  otherwise this calls ``jax.random.bernoulli``.

  The rounds and the comparison run as one fused elementwise loop per slab of the first axis,
  inside a while loop that writes the bool mask to memory (1 byte per element). The loop keeps the
  rounds out of the consumers' fusions (fused into a consumer that reduces, as LayerNorm, 20 rounds
  of integer code change how LLVM unrolls the reduction). The consumers still differ from those of
  jax's draw (a bool instead of two uint32 arrays), which under jit can move float rounding at some
  shapes: seen at d_model 16, not in the default run nor in 5 base bench steps.
  """
  shape = tuple(int(d) for d in shape)
  if not _fast_path_ok(key, p, shape):
    return jax.random.bernoulli(key, p, shape)
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  k0, k1 = key[0], key[1]
  trips = next((q for q in range(2, shape[0] + 1) if shape[0] % q == 0), 1)
  slab = (shape[0] // trips, *shape[1:])
  index = flat_index(slab)
  step = np.uint32(math.prod(slab))

  def body(i, mask):
    start = lax.convert_element_type(i, jnp.uint32) * step
    y0, y1 = threefry2x32(k0, k1, jnp.zeros(slab, jnp.uint32), index + start)
    return lax.dynamic_update_slice_in_dim(mask, uniform_from_bits(y0 ^ y1) < p, i * slab[0], axis=0)

  return lax.fori_loop(0, trips, body, jnp.zeros(shape, bool))


def dropout(x: jnp.ndarray, rate: float, key, broadcast_dims: Sequence[int] = ()) -> jnp.ndarray:
  """Inverted dropout (``txf.ops.dropout``: x / (1 - rate) where the keep mask is True, else 0)
  with the keep mask from :func:`bernoulli`: the same output as ``txf.ops.dropout`` for the same key.

  x [...] -> same shape and dtype.
  """
  keep = 1.0 - rate
  return apply_mask(x, bernoulli(key, keep, mask_shape(x.shape, broadcast_dims)), rate)
