"""Dropout as a Flax module: flax's ``nn.Dropout`` with the mask drawn by txf.kernels.threefry."""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from txf import kernels


class Dropout(nn.Dropout):
  """flax ``nn.Dropout`` with the mask from ``txf.kernels.bernoulli``: the same bits and output
  for the same key, computed as one fusible elementwise loop instead of jax's rolled threefry loop
  on CPU. The class keeps flax's name, so its auto-name (``Dropout_0``, ...) and hence its
  ``dropout`` RNG stream are those of ``nn.Dropout`` at the same place in a model."""

  @nn.compact
  def __call__(self, inputs, deterministic: Optional[bool] = None, rng=None):
    """inputs [...] -> inputs / (1 - rate) where the keep mask is True, else 0 (or inputs when
    deterministic)."""
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:
      return jnp.zeros_like(inputs)
    if rng is None:
      rng = self.make_rng(self.rng_collection)
    return kernels.dropout(inputs, self.rate, rng, self.broadcast_dims)
