"""Top-k over the last axis for beam search: ``jax.lax.top_k``, or on CPU the same result through
block maxima (the ``top_k="blocked"`` kernel of txf.kernels.select); and greedy decoding's argmax,
``jnp.argmax``, or on CPU the same index in two reductions (``argmax="two-pass"``)."""

from typing import Tuple

import jax
import jax.numpy as jnp

from txf.kernels.select import select


def blocked_top_k(x: jnp.ndarray, n: int, block: int) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """``jax.lax.top_k(x, n)`` over the last axis through block maxima: the same values and ids.

  x [..., V] with V = M * block, M >= n. The n largest entries lie in the n blocks of largest
  maximum (a block holding one of them has a maximum at least the n-th largest value, and at most n
  blocks do, ties going to the lower index as in top_k); so: maxima of the M blocks, the n best
  blocks (put back in index order, keeping top_k's rule that equal values rank by index), then
  top-n of their n * block entries. Costs one vectorised pass over x instead of a per-row
  partial sort of V entries.
  """
  *lead, vocab = x.shape
  blocks = x.reshape(*lead, vocab // block, block)
  _, best = jax.lax.top_k(jnp.max(blocks, axis=-1), n)  # [..., n]
  best = jnp.sort(best, axis=-1)
  kept = jnp.take_along_axis(blocks, best[..., None], axis=-2).reshape(*lead, n * block)
  values, at = jax.lax.top_k(kept, n)
  return values, jnp.take_along_axis(best, at // block, axis=-1) * block + at % block


def _block_size(vocab: int, n: int) -> int:
  """A block length for :func:`blocked_top_k` over ``vocab`` entries (0: use plain top_k)."""
  for block in (128, 125, 100, 96, 80, 64, 50, 40, 32):
    if vocab % block == 0 and vocab // block >= 4 * n:
      return block
  return 0


def top_k(x: jnp.ndarray, n: int) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """The n largest entries of x [..., V] over the last axis and their indices, best first (ties
  to the lower index): ``jax.lax.top_k(x, n)``'s values and ids, through :func:`blocked_top_k`
  where :func:`select` says ``blocked`` and a block length divides V."""
  block = _block_size(x.shape[-1], n) if select().top_k == "blocked" else 0
  return blocked_top_k(x, n, block) if block else jax.lax.top_k(x, n)


def first_argmax(x: jnp.ndarray) -> jnp.ndarray:
  """``jnp.argmax(x, axis=-1)`` in two vectorised reductions: x [..., V] -> int32 [...].

  argmax_v x_v = min {v : x_v = max_u x_u}, the first index holding the maximum (ties to the lower
  index); a NaN counts as the maximum (the first NaN's index), as in ``jnp.argmax``. One max
  reduction, then one min reduction over the indices, instead of XLA's reduction of (value, index)
  pairs, which XLA:CPU does not vectorise.
  """
  peak = jnp.max(x, axis=-1, keepdims=True)
  hit = (x == peak) | jnp.isnan(x)
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  return jnp.min(jnp.where(hit, index, x.shape[-1]), axis=-1)


def argmax(x: jnp.ndarray) -> jnp.ndarray:
  """The index of the largest entry of x [..., V] over the last axis, int32 [...] (ties to the lower
  index, NaN as the largest): :func:`first_argmax` where :func:`select` says ``two-pass``, else
  ``jnp.argmax``."""
  if select().argmax == "two-pass":
    return first_argmax(x)
  return jnp.argmax(x, axis=-1).astype(jnp.int32)
