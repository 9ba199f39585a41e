"""Multi-head attention as a Flax module: parameters declared here, math in txf.ops.attention
(run through txf.kernels, which picks the backend's way of computing it).

Three kinds share this module: bidirectional self-attention (encoder), causal self-attention
(decoder; with ``decode=True`` it keeps a KV cache and takes one position per call), and
encoder-decoder cross-attention (with ``decode=True`` the memory's keys/values are computed once,
when the cache is built, and read back at every step).
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.kernels import attend, multi_head_attention
from txf.nn.config import TransformerConfig
from txf.nn.dropout import Dropout

xavier = nn.initializers.xavier_uniform()
# logical axes of the weights (txf/parallel/sharding.py maps them onto the mesh)
QKV_INIT = nn.with_logical_partitioning(xavier, ("embed", "heads", "kv"))  # W^Q, W^K, W^V [d, h, d_k]
OUT_INIT = nn.with_logical_partitioning(xavier, ("heads", "kv", "embed"))  # W^O [h, d_v, d]


HIDDEN_AXES = ("batch", "length", "act_embed")     # activations [B, L, d_model]
HEADS_AXES = ("batch", "heads", "length", "kv")   # per-head queries, keys, values [B, h, L, d_k]


def constrain(x, names):
  """``nn.with_logical_constraint``: a sharding constraint by logical axis names under a mesh and
  rules (txf.parallel.sharding.step_context); does nothing otherwise."""
  return nn.with_logical_constraint(x, names)


# Cache entries that depend only on the source, never on the target prefix: equal for all beams of
# a source, so beam search need not reorder them (txf.models.inference.reorder_cache).
PER_SOURCE_CACHE = ("cross_key", "cross_value", "cross_valid")


def per_source_attention(attend_fn, q, k, v, mask):
  """Attention where each key row serves G consecutive query rows (the G beams of a source).

  q [B*G, h, L, d_k]; k, v [B, h, L_k, d_k]; mask broadcastable to [B, h, G*L, L_k], True = may
  attend; ``attend_fn(q, k, v, mask) -> (out, weights)``. The G query rows of a source are attended
  as G*L query positions of one row (same softmax(Q K^T / sqrt(d_k) + M) V per query, each key
  read once per source). Returns [B*G, h, L, d_v].
  """
  n, h, l, dk = q.shape
  b = k.shape[0]
  g = n // b
  folded = q.reshape(b, g, h, l, dk).transpose(0, 2, 1, 3, 4).reshape(b, h, g * l, dk)
  out, _ = attend_fn(folded, k, v, mask)
  return out.reshape(b, h, g, l, -1).transpose(0, 2, 1, 3, 4).reshape(n, h, l, -1)


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with d_k = d_v = d_model / h.

  Parameters: query/key/value kernels [d_model, h, d_k] (W^Q, W^K, W^V, no bias, as in the paper)
  and out kernel [h, d_v, d_model] (W^O).
  """
  config: TransformerConfig
  kind: str  # "self" | "causal" | "cross"

  @nn.compact
  def __call__(self, x: jnp.ndarray, memory: Optional[jnp.ndarray] = None,
               mask: Optional[jnp.ndarray] = None,
               memory_valid: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    """Args:
      x: [B, L_q, d_model] queries (and keys/values unless cross).
      memory: [B, L_k, d_model] encoder output, for ``cross`` (None at cached decode steps).
      mask: bool broadcastable to [B, h, L_q, L_k], True = may attend (ignored at cached causal steps).
      memory_valid: bool [B, L_k] real memory positions, for ``cross``.
    Returns:
      [B, L_q, d_model].
    """
    cfg = self.config
    h, dk, dt = cfg.num_heads, cfg.head_dim, cfg.compute_dtype
    proj = lambda name, shape: self.param(name, OUT_INIT if name == "out" else QKV_INIT, shape).astype(dt)
    w_q = proj("query", (cfg.d_model, h, dk))
    w_k, w_v = proj("key", (cfg.d_model, h, dk)), proj("value", (cfg.d_model, h, dk))
    w_o = proj("out", (h, dk, cfg.d_model))
    biases = None
    if cfg.attention_bias:  # Marian/BART: Q = x W^Q + b_q, ..., out = Concat(...) W^O + b_o
      zeros = nn.initializers.zeros
      bias = lambda name, shape, axes: self.param(
          name, nn.with_logical_partitioning(zeros, axes), shape).astype(dt)
      biases = (bias("query_bias", (h, dk), ("heads", "kv")), bias("key_bias", (h, dk), ("heads", "kv")),
                bias("value_bias", (h, dk), ("heads", "kv")), bias("out_bias", (cfg.d_model,), ("norm",)))

    x_kv, kv_hook = x, None
    if self.kind == "cross":
      x_kv = None if memory is None else memory.astype(dt)
      if cfg.decode:
        kv_hook = lambda k, v, _: self._cross_cache(k, v, memory_valid)
    elif self.kind == "causal" and cfg.decode:
      kv_hook = self._update_cache

    def attention_fn(q, k, v, mask):
      if k.shape[0] != q.shape[0]:  # beam search: a source's keys serve the queries of its beams
        return per_source_attention(lambda *a: attend(*a, cfg.attention_impl), q, k, v, mask), None
      q, k, v = (constrain(t, HEADS_AXES) for t in (q, k, v))
      if cfg.attention_dropout_rate and not cfg.deterministic:
        # dropout on the attention weights needs the weights: reference path
        _, weights = attend(q, k, v, mask, "reference")
        dropped = Dropout(cfg.attention_dropout_rate)(weights, deterministic=False)
        return jnp.einsum("bhqk,bhkd->bhqd", dropped, v), weights
      return attend(q, k, v, mask, cfg.attention_impl, causal=self.kind == "causal")

    out, weights = multi_head_attention(
        x.astype(dt), x_kv, w_q, w_k, w_v, w_o, h, mask, kv_hook=kv_hook, attention_fn=attention_fn,
        biases=biases)
    if weights is not None:
      self.sow("intermediates", "attention_weights", weights)  # [B, h, L_q, L_k]; free unless mutable
    return constrain(out, HIDDEN_AXES)

  def _update_cache(self, k, v, mask):
    """Write this step's key/value heads at ``cache_index`` and attend over positions <= index.

    At cache creation (the first call, with the full target length) nothing is written: the
    buffers [B, h, max_len, d_k] are created as zeros and the call behaves as uncached.
    """
    initialized = self.has_variable("cache", "cached_key")
    cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return k, v, mask
    if self.has_variable("cache", "beam_slots"):
      return self._update_beam_cache(k, v, cached_k, cached_v, index)
    i = index.value
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, (0, 0, i, 0))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, (0, 0, i, 0))
    index.value = i + k.shape[2]
    max_len = cached_k.value.shape[2]
    # query q (absolute position i + q) may see keys 0..i+q: one step, or a causal prompt prefill
    q_pos = i + jnp.arange(k.shape[2])[:, None]
    step_mask = (jnp.arange(max_len)[None, :] <= q_pos)[None, None]  # [1, 1, L_q, max_len]
    return cached_k.value, cached_v.value, step_mask

  def _update_beam_cache(self, k, v, cached_k, cached_v, index):
    """The cache in beam search's layout (made by txf.models.inference.expand_cache), never reordered.

    The G beams of a source keep their keys/values side by side in the source's row,
    [B, h, G*T, d_k] (beam slot g holds positions g*T .. g*T + T - 1), and ``beam_slots`` int
    [B*G, T] says, for each beam, which slot holds each position of its history: beam search
    reorders that table only. This step's keys/values [B*G, h, L, d_k] go to each beam's own slot at
    ``cache_index``; returns the source's keys/values and the mask [B, 1, G*L, G*T] by which beam
    q's query at position i + p sees slot s at position u iff u <= i + p and beam_slots[q, u] == s
    (the keys of the gather-reordered cache, at the same positions).
    """
    slots = self.variable("cache", "beam_slots", None)
    n, l = k.shape[0], k.shape[2]
    b, t = cached_k.value.shape[0], slots.value.shape[1]
    g, i = n // b, index.value

    def write(buffer, x):  # x [B*G, h, L, d] into buffer [B, h, G*T, d] at slot g, positions i..
      x = x.reshape((b, g) + x.shape[1:]).transpose(0, 2, 1, 3, 4).astype(buffer.dtype)
      grouped = buffer.reshape(b, buffer.shape[1], g, t, buffer.shape[3])
      return jax.lax.dynamic_update_slice(grouped, x, (0, 0, 0, i, 0)).reshape(buffer.shape)

    cached_k.value, cached_v.value = write(cached_k.value, k), write(cached_v.value, v)
    own = jnp.broadcast_to((jnp.arange(n) % g)[:, None], (n, l)).astype(slots.value.dtype)
    slots.value = jax.lax.dynamic_update_slice(slots.value, own, (0, i))
    index.value = i + l
    seen = jnp.arange(t)[None, :] <= i + jnp.arange(l)[:, None]  # [L, T]
    owner = slots.value.reshape(b, g, 1, 1, t) == jnp.arange(g)[:, None]  # [B, G, 1, G, T]
    mask = owner & seen[None, None, :, None, :]  # [B, G (query beam), L, G (slot), T]
    return cached_k.value, cached_v.value, mask.reshape(b, 1, g * l, g * t)

  def _cross_cache(self, k, v, memory_valid):
    """The encoder memory's key/value heads and validity, stored once per source when decoding.

    The first call (cache creation, with the memory) stores them; later calls (memory None) read
    them back. These are per-source entries (:data:`PER_SOURCE_CACHE`): every beam of a source
    holds the same values.
    """
    if k is None and not self.has_variable("cache", "cross_key"):
      raise ValueError("cross-attention cache is empty: build it with the encoder output first")
    k = self.variable("cache", "cross_key", lambda: k).value
    v = self.variable("cache", "cross_value", lambda: v).value
    valid = self.variable("cache", "cross_valid", lambda: memory_valid).value
    return k, v, valid[:, None, None, :]
