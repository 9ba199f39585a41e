"""T5's span corruption (Raffel et al. 2020, section 3.1.4): pure jax, static shapes.

A row of L tokens gets a noise mask of ``n = round(L * density)`` tokens (clipped to [1, L - 1]) in
``k = max(1, round(n / mean_span_length))`` spans; the inputs keep the other tokens with each noise
span replaced by one sentinel, the targets list each sentinel followed by its span:

    tokens   a b c d e f g h          (noise: c d, g)
    inputs   a b <S0> e f <S1> h EOS
    targets  <S0> c d <S1> g EOS

Sentinel i is ``<extra_id_i>``, whose id is ``first_sentinel - i`` (T5's and txf's convention: the
sentinels are the top ids of the vocabulary, ``<extra_id_0>`` the highest).
"""

import functools
from typing import Tuple

import jax
import jax.numpy as jnp

from txf.core.objectives import corrupted_lengths, span_counts  # noqa: F401  (re-exported here)

EOS = 2  # txf's EOS id (txf.nn.config.EOS_ID; ops import nothing from the layers above)


def random_segmentation(num_items: int, num_segments: int, rng: jax.Array) -> jnp.ndarray:
  """The lengths int32 [num_segments] of a uniformly random split of ``num_items`` items into
  ``num_segments`` non-empty consecutive segments (the segment boundaries are a random
  (num_segments - 1)-subset of the num_items - 1 gaps)."""
  gaps = jnp.arange(num_items - 1) < num_segments - 1        # which gaps start a new segment
  starts = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                            jax.random.permutation(rng, gaps).astype(jnp.int32)])
  segment = jnp.cumsum(starts)
  return jnp.zeros((num_segments,), jnp.int32).at[segment].add(1)


def noise_mask(length: int, rng: jax.Array, noise_density: float = 0.15,
               mean_span_length: float = 3.0) -> jnp.ndarray:
  """bool [length]: True on the noise tokens. The noise tokens form ``num_spans`` non-empty spans
  and the other tokens ``num_spans`` non-empty spans (``random_segmentation`` each), interleaved
  starting with a non-noise span: non-noise_0 noise_0 non-noise_1 noise_1 ... (``span_counts``)."""
  num_noise, num_spans = span_counts(length, noise_density, mean_span_length)
  if num_spans > length - num_noise:
    raise ValueError(f"{num_spans} noise spans need as many non-noise spans, but a row of {length} "
                     f"tokens has only {length - num_noise} non-noise tokens")
  noise_rng, keep_rng = jax.random.split(rng)
  noise_lengths = random_segmentation(num_noise, num_spans, noise_rng)
  keep_lengths = random_segmentation(length - num_noise, num_spans, keep_rng)
  interleaved = jnp.stack([keep_lengths, noise_lengths], axis=1).reshape(-1)  # [2k]
  span_starts = jnp.cumsum(interleaved)[:-1]
  span_number = jnp.cumsum(jnp.zeros((length,), jnp.int32).at[span_starts].add(1))
  return span_number % 2 == 1


def corrupt_row(tokens: jnp.ndarray, mask: jnp.ndarray, first_sentinel,
                input_len: int, target_len: int) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """One row's (inputs int32 [input_len], targets int32 [target_len]) from its tokens [L] and noise
  mask [L]. PAD (0) tokens (a short row's tail) are dropped from both sides, and a span of PAD
  only gets no sentinel; the k-th span that has a real token gets sentinel ``first_sentinel - k``.
  Outputs end with EOS and are PAD-padded on the right."""
  real = tokens != 0
  prev = jnp.concatenate([jnp.zeros((1,), bool), mask[:-1]])
  starts = mask & ~prev & real                      # the first token of a (kept) noise span
  sentinel = (first_sentinel - (jnp.cumsum(starts) - 1)).astype(jnp.int32)
  keep = ~mask & real
  # inputs: each kept token, and each span's sentinel in place of its first token
  emit = keep | starts
  slot = jnp.where(emit, jnp.cumsum(emit) - 1, input_len)
  inputs = jnp.zeros((input_len,), jnp.int32).at[slot].set(
      jnp.where(starts, sentinel, tokens).astype(jnp.int32), mode="drop")
  inputs = inputs.at[jnp.sum(emit)].set(EOS, mode="drop")
  # targets: each span's sentinel, then each of its real tokens
  noise = mask & real
  count = noise.astype(jnp.int32) + starts.astype(jnp.int32)
  offset = jnp.cumsum(count) - count
  targets = jnp.zeros((target_len,), jnp.int32)
  targets = targets.at[jnp.where(starts, offset, target_len)].set(sentinel, mode="drop")
  targets = targets.at[jnp.where(noise, offset + starts, target_len)].set(
      tokens.astype(jnp.int32), mode="drop")
  targets = targets.at[jnp.sum(count)].set(EOS, mode="drop")
  return inputs, targets


def span_corrupt(tokens: jnp.ndarray, rng: jax.Array, noise_density: float = 0.15,
                 mean_span_length: float = 3.0, first_sentinel=None
                 ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """Span-corrupt full rows: tokens int [B, L] -> (inputs int32 [B, input_len], targets int32
  [B, target_len]) (``corrupted_lengths``). Row b's noise mask is ``noise_mask(L, rng_b)`` with
  rng_b the b-th of ``jax.random.split(rng, B)``: a pure function of (tokens, rng).
  ``first_sentinel``: the id of ``<extra_id_0>`` (sentinel i is first_sentinel - i); required."""
  if first_sentinel is None:
    raise ValueError("span_corrupt needs first_sentinel, the id of <extra_id_0>")
  return _span_corrupt(jnp.asarray(tokens), rng, float(noise_density), float(mean_span_length),
                       jnp.asarray(first_sentinel, jnp.int32))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _span_corrupt(tokens, rng, noise_density, mean_span_length, first_sentinel):
  """``span_corrupt`` compiled once per (shape, density, mean span length)."""
  batch, length = tokens.shape
  input_len, target_len = corrupted_lengths(length, noise_density, mean_span_length)
  rngs = jax.random.split(rng, batch)
  masks = jax.vmap(lambda r: noise_mask(length, r, noise_density, mean_span_length))(rngs)
  return jax.vmap(lambda t, m: corrupt_row(t, m, first_sentinel, input_len, target_len))(
      tokens, masks)
