"""The position encodings (``model.positional``): the one table that names them, ``POSITIONAL``.

An entry (:class:`Positional`) says what the encoding does at the two places positions enter the
model: ``embed`` adds to the embeddings (in ``txf.nn.layers.AddPositions``: the paper's sinusoids,
a learned table, or nothing), and ``rotate`` / ``bias`` act inside self-attention (in
``txf.nn.attention.MultiHeadAttention``; never in cross-attention): RoPE rotates queries and keys,
ALiBi and T5's relative encoding add a score bias B to softmax(Q K^T / sqrt(d_k) + B + M). Their
formulas are txf.ops.positional's.
"""

import dataclasses
from typing import Callable, Optional

import flax.linen as nn
import jax.numpy as jnp

from txf import ops
from txf.nn.config import TransformerConfig
from txf.core.variants import Table


def sinusoidal_positions(module: nn.Module, cfg: TransformerConfig, x: jnp.ndarray,
                         positions: jnp.ndarray) -> jnp.ndarray:
  """x + PE(positions): the paper's fixed encoding (txf.ops.positional_encoding_at, in the column
  layout ``model.positional_layout``, positions shifted by ``model.position_offset``).

  x [B, L, d_model]; positions int [B|1, L] -> [B, L, d_model]."""
  del module
  return x + ops.positional_encoding_at(positions, cfg.d_model, layout=cfg.positional_layout,
                                        offset=cfg.position_offset).astype(x.dtype)


def learned_positions(module: nn.Module, cfg: TransformerConfig, x: jnp.ndarray,
                      positions: jnp.ndarray) -> jnp.ndarray:
  """x + P[positions] for a learned table P [max_len, d_model] (``pos_embedding`` of ``module``,
  N(0, 0.02^2) at init). x [B, L, d_model]; positions int [B|1, L] -> [B, L, d_model]."""
  table = module.param("pos_embedding", nn.with_logical_partitioning(
      nn.initializers.normal(0.02), ("length", "embed")), (cfg.max_len, cfg.d_model))
  return x + jnp.take(table, positions, axis=0).astype(x.dtype)


def no_positions(module: nn.Module, cfg: TransformerConfig, x: jnp.ndarray,
                 positions: jnp.ndarray) -> jnp.ndarray:
  """x unchanged: no position information added to the embeddings (a bag of tokens, unless the
  encoding acts inside attention)."""
  del module, cfg, positions
  return x


def rope_rotate(cfg: TransformerConfig, x: jnp.ndarray, positions: jnp.ndarray) -> jnp.ndarray:
  """RoPE: the pairs of each head rotated by p * theta_i, theta_i = rope_base^(-2i/d_k).

  ``model.rope_layout`` "interleaved" (the default): pairs (x_2i, x_2i+1) (txf.ops.rope); "half":
  pairs (x_i, x_i+d_k/2) (txf.ops.rope_half, Hugging Face Llama's layout), whose frequencies
  ``model.rope_scaling`` may rescale (txf.ops.rope_frequencies: linear, llama3). x [B, h, L, d_k]
  (queries or keys); positions int [B|1, L] -> [B, h, L, d_k]."""
  if cfg.rope_layout == "interleaved" and cfg.rope_scaling == "none":
    return ops.rope(x, positions, cfg.rope_base)
  theta = ops.rope_frequencies(x.shape[-1], cfg.rope_base, cfg.rope_scaling, cfg.rope_scaling_factor,
                               cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
                               cfg.rope_original_max_len)
  if cfg.rope_layout == "half":
    return ops.rope_half(x, positions, theta)
  return ops.rope(x, positions, theta=theta)


def alibi(module: nn.Module, cfg: TransformerConfig, q_positions: jnp.ndarray,
          k_positions: jnp.ndarray, kind: str) -> jnp.ndarray:
  """ALiBi's bias B[h, i, j] = -m_h |p_i - p_j| (txf.ops.alibi_bias; causal attention sees only
  p_j <= p_i: m_h (p_j - p_i)), slopes m_h = 2^(-8h/H) (txf.ops.alibi_slopes). No parameters.
  q_positions int [B|1, L_q], k_positions int [B|1, L_k] -> float32 [B|1, h, L_q, L_k]."""
  del module, kind
  return ops.alibi_bias(q_positions, k_positions, ops.alibi_slopes(cfg.num_heads))


def relative_table(module: nn.Module, cfg: TransformerConfig) -> jnp.ndarray:
  """T5's learned bias table T [model.relative_buckets, h]: the parameter ``relative_bias`` of
  ``module`` (a self-attention layer's own, or with ``model.relative_shared`` the stack's: the
  encoder's / decoder's), N(0, d_model^-1) at init as T5's."""
  return module.param("relative_bias", nn.with_logical_partitioning(
      nn.initializers.normal(cfg.d_model ** -0.5), (None, "heads")),
                      (cfg.relative_buckets, cfg.num_heads))


def relative_bias(module: nn.Module, cfg: TransformerConfig, q_positions: jnp.ndarray,
                  k_positions: jnp.ndarray, kind: str, table: Optional[jnp.ndarray] = None
                  ) -> jnp.ndarray:
  """T5's learned bias B[h, i, j] = T[bucket(p_j - p_i), h] (txf.ops.relative_position_bias):
  bidirectional buckets for the encoder's self-attention, unidirectional for the decoder's causal
  one. The table T [model.relative_buckets, h] is ``table`` when given (``model.relative_shared``:
  the stack's one table, T5's layout), else a parameter of ``module`` (:func:`relative_table`:
  each self-attention layer its own). q_positions int [B|1, L_q], k_positions int [B|1, L_k] ->
  [B|1, h, L_q, L_k]."""
  if table is None:
    table = relative_table(module, cfg)
  return ops.relative_position_bias(table, q_positions, k_positions, bidirectional=kind == "self",
                                    max_distance=cfg.relative_max_distance)


@dataclasses.dataclass(frozen=True)
class Positional:
  """One position encoding, by where it acts.

  Attributes:
    embed: ``(module, cfg, x [B, L, d_model], positions int [B|1, L]) -> x``, added to the
      embeddings in ``AddPositions`` (whose parameters it declares in ``module``).
    rotate: None, or ``(cfg, x [B, h, L, d_k], positions int [B|1, L]) -> x``, applied to the
      queries and to the keys of self-attention at their own positions (keys before they enter
      the decode cache).
    bias: None, or ``(module, cfg, q_positions [B|1, L_q], k_positions [B|1, L_k], kind) ->
      B [B|1, h, L_q, L_k]``, the additive score bias of self-attention (``kind`` "self" for the
      encoder, "causal" for the decoder; parameters declared in the attention ``module``).
  """
  embed: Callable
  rotate: Optional[Callable] = None
  bias: Optional[Callable] = None

  @property
  def in_attention(self) -> bool:
    """Whether self-attention needs the positions (rotate or bias)."""
    return self.rotate is not None or self.bias is not None


# The position encodings, the allowed values of model.positional: name -> Positional. The first
# three add to the embeddings (sinusoidal: the paper's); the others act inside self-attention.
POSITIONAL = Table("model.positional", {
    "sinusoidal": Positional(sinusoidal_positions),
    "learned": Positional(learned_positions),
    "none": Positional(no_positions),
    "rope": Positional(no_positions, rotate=rope_rotate),
    "alibi": Positional(no_positions, bias=alibi),
    "relative": Positional(no_positions, bias=relative_bias),
})


def attention_positions(cfg: TransformerConfig, positions: Optional[jnp.ndarray],
                        stack: Optional[nn.Module] = None) -> tuple:
  """The extra arguments a stack's layers take for the position encoding: (positions,) (int
  [B, L], or None for 0..L-1) when ``model.positional`` acts inside attention, () otherwise (the
  layers' calls then stay as they were); with ``model.relative_shared`` (positions, T) where T is
  the stack's one relative bias table (:func:`relative_table` of ``stack``, the calling Encoder or
  Decoder), read by every layer's self-attention."""
  if not POSITIONAL[cfg.positional].in_attention:
    return ()
  if cfg.relative_shared and cfg.positional == "relative":
    return (positions, relative_table(stack, cfg))
  return (positions,)
