"""Position encodings: the sinusoidal one added to the embeddings (Vaswani et al. 2017, section
3.5), and those acting inside attention: RoPE's rotation of queries and keys, ALiBi's and T5's
relative score biases."""

import jax.numpy as jnp
import numpy as np

from txf.core.variants import Table


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


# --- positions inside attention: RoPE, ALiBi, T5's relative bias -----------------------------

def rope_frequencies(d_k: int, base: float = 10000.0, scaling: str = "none", factor: float = 1.0,
                     low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                     original_max_len: int = 8192) -> np.ndarray:
  r"""RoPE's frequencies theta_i = 1 / base^(2i/d_k), i < d_k/2, float32 [d_k/2] (computed in
  float32 as Hugging Face does), rescaled by ``scaling``:

  * "none": as they are;
  * "linear": theta_i / s (s = ``factor``), the same as positions divided by s;
  * "llama3": with wavelength lambda_i = 2 pi / theta_i, C = ``original_max_len``,
    l = ``low_freq_factor``, u = ``high_freq_factor``: theta_i / s where lambda_i > C / l; theta_i
    where lambda_i < C / u; between them (1 - g) theta_i / s + g theta_i with the ramp
    g = (C / lambda_i - l) / (u - l).
  """
  half = np.arange(0, d_k, 2, dtype=np.int64).astype(np.float32) / np.float32(d_k)
  theta = (np.float32(1.0) / np.power(np.float32(base), half)).astype(np.float32)
  if scaling == "none":
    return theta
  if scaling == "linear":
    return (theta / np.float32(factor)).astype(np.float32)
  if scaling != "llama3":
    raise ValueError(f"unknown RoPE scaling {scaling!r} (none, linear, llama3)")
  wavelength = np.float32(2 * np.pi) / theta
  low_wavelength = np.float32(original_max_len / low_freq_factor)
  high_wavelength = np.float32(original_max_len / high_freq_factor)
  scaled = np.where(wavelength > low_wavelength, theta / np.float32(factor), theta)
  ramp = ((np.float32(original_max_len) / wavelength - np.float32(low_freq_factor))
          / np.float32(high_freq_factor - low_freq_factor))
  smoothed = (1 - ramp) * scaled / np.float32(factor) + ramp * scaled
  medium = ~(wavelength < high_wavelength) & ~(wavelength > low_wavelength)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_half(x: jnp.ndarray, positions: jnp.ndarray, theta: np.ndarray) -> jnp.ndarray:
  r"""RoPE with the half-split pairs (GPT-NeoX's and Hugging Face Llama's ``rotate_half``): column
  i and column i + d_k/2 of a head form the pair rotated by p * theta_i:

  $$x'_i = x_i \cos p\theta_i - x_{i+d_k/2} \sin p\theta_i, \qquad
  x'_{i+d_k/2} = x_{i+d_k/2} \cos p\theta_i + x_i \sin p\theta_i$$

  x [B, H, L, d_k] (d_k even); positions int [B|1, L]; theta float32 [d_k/2] (``rope_frequencies``)
  -> [B, H, L, d_k] in x's dtype (angles and rotation in float32)."""
  d_k = x.shape[-1]
  if d_k % 2:
    raise ValueError(f"RoPE rotates pairs of columns: d_k={d_k} must be even")
  angles = positions.astype(jnp.float32)[:, None, :, None] * jnp.asarray(theta, jnp.float32)
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  xf = x.astype(jnp.float32)
  first, second = xf[..., :d_k // 2], xf[..., d_k // 2:]
  return jnp.concatenate([first * cos - second * sin, second * cos + first * sin],
                         axis=-1).astype(x.dtype)


def rope(x: jnp.ndarray, positions: jnp.ndarray, base: float = 10000.0,
         theta=None) -> jnp.ndarray:
  r"""Rotary position embedding (Su et al. 2021), interleaved pairs: each pair of columns
  (x_{2i}, x_{2i+1}) of a head is rotated by the angle p * theta_i of its position p.

  $$\begin{pmatrix} x'_{2i} \\ x'_{2i+1} \end{pmatrix} =
  \begin{pmatrix} \cos p\theta_i & -\sin p\theta_i \\ \sin p\theta_i & \cos p\theta_i \end{pmatrix}
  \begin{pmatrix} x_{2i} \\ x_{2i+1} \end{pmatrix}, \qquad \theta_i = \text{base}^{-2i/d_k}$$

  The pairs are adjacent columns (the paper's and GPT-J's convention, not GPT-NeoX's / HF Llama's
  half split). Rotating q at its position m and k at n makes q'_m . k'_n depend on m - n only.

  Args:
    x: [B, H, L, d_k] per-head queries or keys (d_k even).
    positions: int [B|1, L] absolute positions p.
    base: the base of theta_i (``model.rope_base``; 10000 in the paper).
    theta: None, or the frequencies float32 [d_k/2] to use instead (``rope_frequencies``, rescaled).
  Returns:
    [B, H, L, d_k] in x's dtype (the angles and the rotation computed in float32).
  """
  d_k = x.shape[-1]
  if d_k % 2:
    raise ValueError(f"RoPE rotates pairs of columns: d_k={d_k} must be even")
  if theta is None:
    theta = jnp.power(jnp.float32(base), -jnp.arange(0, d_k, 2, dtype=jnp.float32) / d_k)  # [d_k/2]
  theta = jnp.asarray(theta, jnp.float32)
  angles = positions.astype(jnp.float32)[:, None, :, None] * theta  # [B|1, 1, L, d_k/2]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  pairs = x.astype(jnp.float32).reshape(x.shape[:-1] + (d_k // 2, 2))
  even, odd = pairs[..., 0], pairs[..., 1]
  rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
  return rotated.reshape(x.shape).astype(x.dtype)


def alibi_slopes(num_heads: int) -> np.ndarray:
  r"""ALiBi's head slopes (Press et al. 2022): for H a power of 2 the geometric sequence

  $$m_h = 2^{-8h/H}, \qquad h = 1, \dots, H$$

  (H = 8: 1/2, 1/4, ..., 1/256); for other H the paper's interpolation: the H' slopes of the
  largest power of 2 H' < H, then every other slope of 2H' (the odd ones: 2^{-8(2j-1)/(2H')})
  up to H slopes. Returns float64 [H].
  """
  if num_heads < 1:
    raise ValueError(f"ALiBi needs num_heads >= 1, got {num_heads}")
  geometric = lambda n: [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
  closest = 2 ** int(np.floor(np.log2(num_heads)))
  slopes = geometric(closest)
  if closest != num_heads:
    slopes += geometric(2 * closest)[0::2][:num_heads - closest]
  return np.asarray(slopes, np.float64)


def alibi_bias(q_positions: jnp.ndarray, k_positions: jnp.ndarray,
               slopes: jnp.ndarray) -> jnp.ndarray:
  r"""ALiBi's additive score bias: minus each head's slope times the distance of query and key.

  $$B_{h,i,j} = -m_h\,|p_i - p_j|$$

  Bidirectional (the encoder) as written; for causal attention the visible keys have p_j <= p_i,
  where this is the paper's m_h (p_j - p_i) (the keys after the query are masked).

  Args:
    q_positions: int [B|1, L_q]; k_positions: int [B|1, L_k]; slopes: [H] (:func:`alibi_slopes`).
  Returns:
    float32 [B|1, H, L_q, L_k].
  """
  distance = jnp.abs(k_positions[:, None, :] - q_positions[:, :, None]).astype(jnp.float32)
  return -jnp.asarray(slopes, jnp.float32)[None, :, None, None] * distance[:, None]


def relative_position_bucket(relative: jnp.ndarray, bidirectional: bool, num_buckets: int = 32,
                             max_distance: int = 128) -> jnp.ndarray:
  r"""T5's bucket of a relative position r = j - i (key minus query; Raffel et al. 2020).

  Bidirectional (encoder): half the buckets per sign, r > 0 in the upper half, n = |r|;
  unidirectional (decoder): n = max(-r, 0) (keys after the query all share bucket 0). With N the
  buckets of that side and E = N / 2: exact buckets for small distances, logarithmic ones beyond,

  $$b(n) = \begin{cases} n & n < E \\ \min\big(N - 1,\ E + \big\lfloor \frac{\ln(n / E)}
  {\ln(\text{max\_distance} / E)} (N - E) \big\rfloor\big) & n \ge E \end{cases}$$

  (every n >= max_distance lands in the last bucket N - 1), computed in float32 as T5's code does.

  Args:
    relative: int [...] relative positions j - i.
    bidirectional: True for the encoder, False for causal attention.
    num_buckets: ``model.relative_buckets``; max_distance: ``model.relative_max_distance``.
  Returns:
    int32 [...] buckets in 0 .. num_buckets - 1.
  """
  relative = relative.astype(jnp.int32)
  offset = jnp.zeros_like(relative)
  if bidirectional:
    num_buckets //= 2
    offset = jnp.where(relative > 0, num_buckets, 0)
    n = jnp.abs(relative)
  else:
    n = jnp.maximum(-relative, 0)
  max_exact = num_buckets // 2
  log_ratio = (jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact)
               / np.log(max_distance / max_exact) * (num_buckets - max_exact))
  large = jnp.minimum(max_exact + log_ratio.astype(jnp.int32), num_buckets - 1)
  return offset + jnp.where(n < max_exact, n, large)


def relative_position_bias(table: jnp.ndarray, q_positions: jnp.ndarray,
                           k_positions: jnp.ndarray, bidirectional: bool,
                           max_distance: int = 128) -> jnp.ndarray:
  r"""T5's learned score bias: per head, the table's entry of the bucket of p_j - p_i.

  $$B_{h,i,j} = T\big[b(p_j - p_i),\ h\big]$$

  with b :func:`relative_position_bucket` (num_buckets = the table's rows).

  Args:
    table: [num_buckets, H] learned biases; q_positions int [B|1, L_q]; k_positions int [B|1, L_k].
    bidirectional: True for the encoder, False for causal attention.
  Returns:
    [B|1, H, L_q, L_k] in the table's dtype.
  """
  relative = k_positions[:, None, :] - q_positions[:, :, None]  # [B|1, L_q, L_k]
  buckets = relative_position_bucket(relative, bidirectional, table.shape[0], max_distance)
  return jnp.take(table, buckets, axis=0).transpose(0, 3, 1, 2)
