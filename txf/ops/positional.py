"""Sinusoidal positional encoding (Vaswani et al. 2017, section 3.5)."""

import jax.numpy as jnp
import numpy as np

from txf.variants import Table


def sinusoidal_positional_encoding(length: int, d_model: int, max_timescale: float = 10000.0) -> jnp.ndarray:
  r"""The paper's fixed positional encoding, interleaved.

  $$PE_{(pos,\,2i)} = \sin\big(pos / 10000^{2i/d_\text{model}}\big), \qquad
  PE_{(pos,\,2i+1)} = \cos\big(pos / 10000^{2i/d_\text{model}}\big)$$

  Each sin/cos pair shares one frequency. For odd ``d_model`` the last column is a sine.

  Args:
    length: number of positions L (positions 0..L-1).
    d_model: model width d.
    max_timescale: the 10000 of the formula.
  Returns:
    float32 array [L, d_model].
  """
  if length < 0 or d_model <= 0:
    raise ValueError(f"need length >= 0 and d_model > 0, got length={length}, d_model={d_model}")
  pos = np.arange(length, dtype=np.float64)[:, None]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
  angles = pos / np.power(max_timescale, two_i / d_model)  # [L, ceil(d/2)]
  pe = np.zeros((length, d_model), dtype=np.float64)
  pe[:, 0::2] = np.sin(angles)
  pe[:, 1::2] = np.cos(angles[:, : d_model // 2])
  return jnp.asarray(pe, dtype=jnp.float32)


def interleaved_layout(sin: jnp.ndarray, cos: jnp.ndarray, d_model: int) -> jnp.ndarray:
  """The paper's layout: columns 2i, 2i+1 hold sin, cos of frequency i.

  sin, cos [..., ceil(d/2)] -> [..., d_model]."""
  pe = jnp.stack([sin, cos], axis=-1).reshape(*sin.shape[:-1], -1)  # interleave sin, cos
  return pe[..., :d_model]


def sin_cos_layout(sin: jnp.ndarray, cos: jnp.ndarray, d_model: int) -> jnp.ndarray:
  """Marian's and fairseq's layout: the ceil(d/2) sines first, then the floor(d/2) cosines.

  sin, cos [..., ceil(d/2)] -> [..., d_model]."""
  return jnp.concatenate([sin, cos[..., :d_model // 2]], axis=-1)


# The column layouts of the sinusoidal encoding, the allowed values of model.positional_layout.
LAYOUTS = Table("model.positional_layout", {"interleaved": interleaved_layout,
                                            "sin_cos": sin_cos_layout})


def positional_encoding_at(positions: jnp.ndarray, d_model: int, max_timescale: float = 10000.0,
                           layout: str = "interleaved", offset: int = 0) -> jnp.ndarray:
  """Sinusoidal encoding evaluated at arbitrary (e.g. packed-segment) positions, traceable under jit.

  Same formula as :func:`sinusoidal_positional_encoding`, with ``pos`` = ``positions + offset``.
  ``layout="interleaved"`` (the paper): columns 2i, 2i+1 hold sin, cos of frequency i.
  ``layout="sin_cos"`` (Marian, fairseq): the ceil(d/2) sines first, then the floor(d/2) cosines,
  PE[pos, i] = sin(pos / 10000^(2i/d)), PE[pos, ceil(d/2) + i] = cos(pos / 10000^(2i/d)).

  Args:
    positions: int array [..., L] of positions.
    d_model: model width d.
    layout: a name of ``LAYOUTS``: "interleaved" or "sin_cos"; offset: added to every position.
  Returns:
    float32 array [..., L, d_model].
  """
  arrange = LAYOUTS[layout]
  two_i = jnp.arange(0, d_model, 2, dtype=jnp.float32)
  inv_freq = jnp.power(max_timescale, -two_i / d_model)  # [ceil(d/2)]
  if offset:
    positions = positions + offset
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  return arrange(jnp.sin(angles), jnp.cos(angles), d_model)
