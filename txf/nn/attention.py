"""Multi-head attention as a Flax module: parameters declared here, math in txf.ops.attention
(run through txf.kernels, which picks the backend's way of computing it).

Three kinds share this module: bidirectional self-attention (encoder), causal self-attention
(decoder; with ``decode=True`` it reads and writes a KV cache and takes one position per call), and
encoder-decoder cross-attention (with ``decode=True`` the memory's keys/values are computed once,
when the cache is built, and read back at every step). The cache's entries and layouts are
txf.nn.kv_cache's.
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from txf import ops
from txf.kernels import attend, multi_head_attention
from txf.nn import kv_cache, qk_norm
from txf.nn.config import TransformerConfig
from txf.nn.dropout import Dropout
from txf.nn.positional import POSITIONAL

xavier = nn.initializers.xavier_uniform()
# logical axes of the weights (txf/parallel/sharding.py maps them onto the mesh)
QKV_INIT = nn.with_logical_partitioning(xavier, ("embed", "heads", "kv"))  # W^Q, W^K, W^V [d, h, d_k]
OUT_INIT = nn.with_logical_partitioning(xavier, ("heads", "kv", "embed"))  # W^O [h, d_v, d]
# W^K, W^V [d, h_kv, d_k] of grouped-query attention (model.num_kv_heads < num_heads): their own
# logical head axis, split like "heads" by default or replicated (sharding_rules.kv_heads)
KV_INIT = nn.with_logical_partitioning(xavier, ("embed", "kv_heads", "kv"))


HIDDEN_AXES = ("batch", "length", "act_embed")     # activations [B, L, d_model]
HEADS_AXES = ("batch", "heads", "length", "kv")   # per-head queries, keys, values [B, h, L, d_k]
KV_HEADS_AXES = ("batch", "kv_heads", "length", "kv")  # grouped-query keys, values [B, h_kv, L, d_k]


def constrain(x, names):
  """``nn.with_logical_constraint``: a sharding constraint by logical axis names under a mesh and
  rules (txf.parallel.sharding.step_context); does nothing otherwise."""
  return nn.with_logical_constraint(x, names)




def per_source_attention(attend_fn, q, k, v, mask, bias=None):
  """Attention where each key row serves G consecutive query rows (the G beams of a source).

  q [B*G, h, L, d_k]; k, v [B, h_kv, L_k, d_k]; mask broadcastable to [B, h, G*L, L_k], True = may
  attend; ``attend_fn(q, k, v, mask) -> (out, weights)``. The G query rows of a source are attended
  as G*L query positions of one row (same softmax(Q K^T / sqrt(d_k) + B + M) V per query, each key
  read once per source); ``bias`` B (None: none) is given in that folded layout, broadcastable to
  [B, h, G*L, L_k] (query g*L + p: beam g's p-th). Returns [B*G, h, L, d_v].
  """
  n, h, l, dk = q.shape
  b = k.shape[0]
  g = n // b
  folded = q.reshape(b, g, h, l, dk).transpose(0, 2, 1, 3, 4).reshape(b, h, g * l, dk)
  out, _ = attend_fn(folded, k, v, mask, **({} if bias is None else {"bias": bias}))
  return out.reshape(b, h, g, l, -1).transpose(0, 2, 1, 3, 4).reshape(n, h, l, -1)


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with d_k = d_v = d_model / h, or
  ``model.head_dim`` when set (T5's d_kv: the inner width h d_k need not be d_model).

  Parameters: query/key/value kernels [d_model, h, d_k] (W^Q, W^K, W^V, no bias, as in the paper)
  and out kernel [h, d_v, d_model] (W^O). With ``num_kv_heads`` h_kv < h (grouped-query
  attention) the key/value kernels are [d_model, h_kv, d_k], each shared by h / h_kv query heads,
  and a KV cache holds h_kv heads. With ``qk_norm`` the submodules ``query_norm`` and ``key_norm``
  (txf.nn.qk_norm) normalise each head over d_k before Q K^T.
  """
  config: TransformerConfig
  kind: str  # "self" | "causal" | "cross"

  @nn.compact
  def __call__(self, x: jnp.ndarray, memory: Optional[jnp.ndarray] = None,
               mask: Optional[jnp.ndarray] = None,
               memory_valid: Optional[jnp.ndarray] = None,
               positions: Optional[jnp.ndarray] = None,
               shared_table: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    """Args:
      x: [B, L_q, d_model] queries (and keys/values unless cross).
      memory: [B, L_k, d_model] encoder output, for ``cross`` (None at cached decode steps).
      mask: bool broadcastable to [B, h, L_q, L_k], True = may attend (ignored at cached causal steps).
      memory_valid: bool [B, L_k] real memory positions, for ``cross``.
      positions: int [B|1, L_q] the queries' positions for an encoding inside self-attention
        (``model.positional`` rope | alibi | relative; None: 0..L_q-1, at cached steps the cache's).
      shared_table: [model.relative_buckets, h] the stack's relative bias table
        (``model.relative_shared``); None: the layer's own (positional=relative) or none.
    Returns:
      [B, L_q, d_model].
    """
    cfg = self.config
    h, dk, dt = cfg.num_heads, cfg.d_k, cfg.compute_dtype
    proj = lambda name, shape: self.param(name, OUT_INIT if name == "out" else QKV_INIT, shape).astype(dt)
    hk = cfg.num_kv_heads or h
    kv_proj = proj if hk == h else (
        lambda name, shape: self.param(name, KV_INIT, shape).astype(dt))
    w_q = proj("query", (cfg.d_model, h, dk))
    w_k, w_v = kv_proj("key", (cfg.d_model, hk, dk)), kv_proj("value", (cfg.d_model, hk, dk))
    w_o = proj("out", (h, dk, cfg.d_model))
    biases = None
    if cfg.attention_bias:  # Marian/BART: Q = x W^Q + b_q, ..., out = Concat(...) W^O + b_o
      zeros = nn.initializers.zeros
      bias = lambda name, shape, axes: self.param(
          name, nn.with_logical_partitioning(zeros, axes), shape).astype(dt)
      kv_axes = ("heads", "kv") if hk == h else ("kv_heads", "kv")
      biases = (bias("query_bias", (h, dk), ("heads", "kv")), bias("key_bias", (hk, dk), kv_axes),
                bias("value_bias", (hk, dk), kv_axes), bias("out_bias", (cfg.d_model,), ("norm",)))

    x = x.astype(dt)  # the residual stream may be float32 (model.residual_dtype): project in dt
    x_kv, kv_hook = x, None
    if self.kind == "cross":
      x_kv = None if memory is None else memory.astype(dt)
      if cfg.decode:
        kv_hook = lambda k, v, _: self._cross_cache(k, v, memory_valid)
    elif self.kind == "causal" and cfg.decode:
      kv_hook = self._update_cache

    def attention_fn(q, k, v, mask, bias=None):
      if k.shape[0] != q.shape[0]:  # beam search: a source's keys serve the queries of its beams
        return per_source_attention(
            lambda *a, **kw: attend(*a, cfg.attention_impl, formula=cfg.attention, **kw),
            q, k, v, mask, bias), None
      q = constrain(q, HEADS_AXES)
      k, v = (constrain(t, HEADS_AXES if hk == h else KV_HEADS_AXES) for t in (k, v))
      if cfg.attention_dropout_rate and not cfg.deterministic:
        # dropout on the attention weights needs the weights: the formula's reference path
        # (txf.kernels.ATTENTION's entry), then Dropout(weights) V
        _, weights = attend(q, k, v, mask, "reference", formula=cfg.attention, bias=bias)
        dropped = Dropout(cfg.attention_dropout_rate)(weights, deterministic=False)
        if hk != h:  # each key/value head's value rows serve its group of query heads
          grouped = jnp.einsum("bhqk,bhkd->bhqd", ops.group_heads(dropped, hk), v)
          return ops.ungroup_heads(grouped, h), weights
        return jnp.einsum("bhqk,bhkd->bhqd", dropped, v), weights
      return attend(q, k, v, mask, cfg.attention_impl, causal=self.kind == "causal",
                    formula=cfg.attention, bias=bias)

    if self.kind != "cross" and POSITIONAL[cfg.positional].in_attention:
      kv_hook, attention_fn = self._with_positions(positions, kv_hook, attention_fn, shared_table)

    grouping = {} if hk == h else {"num_kv_heads": hk}  # grouped-query attention
    norms = {} if cfg.qk_norm == "none" else {"qk_hook": qk_norm.qk_hook(cfg)}
    out, weights = multi_head_attention(
        x, x_kv, w_q, w_k, w_v, w_o, h, mask, kv_hook=kv_hook, attention_fn=attention_fn,
        biases=biases, **grouping, **norms)
    if weights is not None:
      self.sow("intermediates", "attention_weights", weights)  # [B, h, L_q, L_k]; free unless mutable
    return constrain(out, HIDDEN_AXES)

  def _update_cache(self, k, v, mask):
    """Write this step's key/value heads at the cache index and attend over positions <= index
    (the layout and the writes: txf.nn.kv_cache).

    At cache creation (the first call, with the full target length) nothing is written: the
    buffers [B, h_kv, max_len, d_k] (h_kv = h unless grouped-query attention) are created as
    zeros and the call behaves as uncached.
    """
    initialized = self.has_variable("cache", kv_cache.CACHED_KEY)
    cached_k = self.variable("cache", kv_cache.CACHED_KEY, jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable("cache", kv_cache.CACHED_VALUE, jnp.zeros, v.shape, v.dtype)
    index = self.variable("cache", kv_cache.CACHE_INDEX, lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return k, v, mask
    if self.has_variable("cache", kv_cache.BEAM_SLOTS):  # beam search's layout
      slots = self.variable("cache", kv_cache.BEAM_SLOTS, None)
      cached_k.value, cached_v.value, slots.value, index.value, step_mask = (
          kv_cache.write_beam_step(cached_k.value, cached_v.value, slots.value, index.value, k, v))
      return kv_cache.beam_keys(cached_k.value), cached_v.value, step_mask
    else:
      cached_k.value, cached_v.value, index.value, step_mask = kv_cache.write_step(
          cached_k.value, cached_v.value, index.value, k, v)
    return cached_k.value, cached_v.value, step_mask

  def _cross_cache(self, k, v, memory_valid):
    """The encoder memory's key/value heads and validity, stored once per source when decoding.

    The first call (cache creation, with the memory) stores them; later calls (memory None) read
    them back. These are per-source entries (:data:`txf.nn.kv_cache.PER_SOURCE`): every beam of a
    source holds the same values.
    """
    if k is None and not self.has_variable("cache", kv_cache.CROSS_KEY):
      raise ValueError("cross-attention cache is empty: build it with the encoder output first")
    k = self.variable("cache", kv_cache.CROSS_KEY, lambda: k).value
    v = self.variable("cache", kv_cache.CROSS_VALUE, lambda: v).value
    valid = self.variable("cache", kv_cache.CROSS_VALID, lambda: memory_valid).value
    return k, v, valid[:, None, None, :]

  def _with_positions(self, positions, kv_hook, attention_fn, shared_table=None):
    """The hooks of self-attention wrapped for an encoding inside attention
    (``POSITIONAL[model.positional]``, txf.nn.positional): the new keys are rotated (RoPE) at
    their positions before ``kv_hook`` (so a decode cache holds rotated keys), the queries at
    theirs, and the score bias (ALiBi, T5) of the query and key positions is passed to
    ``attention_fn``.

    Positions: ``positions`` (packed rows) or 0..L-1; at a cached decode step the queries are at
    cache_index + p and the keys are the cache's slots 0..T-1 (beam search's layout [B, h, G*T,
    d_k]: slot g*T + u holds position u, and the bias is laid out for the G beams' folded queries).
    ``shared_table``: the stack's relative bias table (``model.relative_shared``) or None.
    Returns (kv_hook, attention_fn).
    """
    cfg, entry = self.config, POSITIONAL[self.config.positional]
    cached = (self.kind == "causal" and cfg.decode
              and self.has_variable("cache", kv_cache.CACHED_KEY))
    index = self.get_variable("cache", kv_cache.CACHE_INDEX) if cached else 0  # before the write
    seen = {}

    def positioned_kv_hook(k, v, mask):
      length = k.shape[2]
      seen["q"] = (index + jnp.arange(length)[None, :] if cached or positions is None
                   else positions)
      if entry.rotate is not None:
        k = entry.rotate(cfg, k, seen["q"])
      if kv_hook is not None:
        k, v, mask = kv_hook(k, v, mask)
      seen["k"] = jnp.arange(k.shape[2])[None, :] if cached else seen["q"]
      return k, v, mask

    def positioned_attention_fn(q, k, v, mask):
      q_pos, k_pos = seen["q"], seen["k"]
      if entry.rotate is not None:
        q = entry.rotate(cfg, q, q_pos)
      bias = None
      if entry.bias is not None:
        if k.shape[0] != q.shape[0]:  # beam layout: G beams' queries folded, G slots of T keys
          g = q.shape[0] // k.shape[0]
          q_pos, k_pos = jnp.tile(q_pos, (1, g)), k_pos % (k.shape[2] // g)
        table = {} if shared_table is None else {"table": shared_table}  # T5's shared table
        bias = entry.bias(self, cfg, q_pos, k_pos, self.kind, **table)
      return attention_fn(q, k, v, mask, bias=bias)

    return positioned_kv_hook, positioned_attention_fn
