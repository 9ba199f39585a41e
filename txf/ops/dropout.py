"""Dropout (section 5.4): inverted dropout with a Bernoulli keep mask."""

from typing import Sequence, Tuple

import jax
import jax.numpy as jnp
from jax import lax


def mask_shape(shape: Sequence[int], broadcast_dims: Sequence[int] = ()) -> Tuple[int, ...]:
  """The keep mask's shape for an input of ``shape``: 1 on the ``broadcast_dims`` (negative
  indices allowed), the input's size elsewhere."""
  n = len(shape)
  return tuple(1 if i in broadcast_dims or i - n in broadcast_dims else int(d)
               for i, d in enumerate(shape))


def apply_mask(x: jnp.ndarray, keep: jnp.ndarray, rate: float) -> jnp.ndarray:
  r"""Inverted dropout with a given keep mask: x / (1 - rate) where ``keep``, else 0.

  $$\operatorname{dropout}(x)_i = \frac{m_i\, x_i}{1 - p}, \qquad m_i \sim \operatorname{Bernoulli}(1 - p)$$

  Args:
    x: [...]; keep: bool broadcastable to x's shape; rate: p, 0 <= p < 1.
  Returns:
    same shape and dtype as x (E[output] = x).
  """
  keep = jnp.broadcast_to(keep, x.shape)
  return lax.select(keep, x / (1.0 - rate), jnp.zeros_like(x))


def dropout(x: jnp.ndarray, rate: float, key, broadcast_dims: Sequence[int] = ()) -> jnp.ndarray:
  """Inverted dropout: :func:`apply_mask` with m = ``jax.random.bernoulli(key, 1 - rate,
  mask_shape)`` (equal to flax's ``nn.Dropout(rate, broadcast_dims)`` with this key).

  Args:
    x: [...]; rate: the drop probability, 0 <= rate < 1; key: a PRNG key;
    broadcast_dims: axes of x that share one mask value (the mask has size 1 there).
  Returns:
    same shape and dtype as x.
  """
  return apply_mask(x, jax.random.bernoulli(key, 1.0 - rate, mask_shape(x.shape, broadcast_dims)), rate)
