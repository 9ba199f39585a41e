"""Multi-head attention as a Flax module: its parameters and, in one forward, the path from the
input to the output (projections, QK-norm, positions, the KV cache, the score bias, the attention
kernel, W^O). The formulas are txf.ops.attention's; txf.kernels picks the backend's way of
computing them in one call each (:func:`txf.kernels.attend`, ``project_heads``, ``project_output``).

Three kinds share this module: bidirectional self-attention (encoder), causal self-attention
(decoder; with ``decode=True`` it reads and writes a KV cache and takes one position per call), and
encoder-decoder cross-attention (with ``decode=True`` the memory's keys/values are computed once,
when the cache is built, and read back at every step). The cache's entries and layouts are
txf.nn.kv_cache's.
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from txf import kernels, ops
from txf.nn import kv_cache, mup, taps
from txf.nn.config import TransformerConfig
from txf.nn.dropout import Dropout
from txf.nn.positional import POSITIONAL
from txf.nn.qk_norm import HeadNorm

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
  tap = taps.tap  # named points q, k, v, weights, heads (txf.inspect reads and replaces them)

  @nn.compact
  def __call__(self, x: jnp.ndarray, memory: Optional[jnp.ndarray] = None,
               mask: Optional[jnp.ndarray] = None,
               memory_valid: Optional[jnp.ndarray] = None,
               positions: Optional[jnp.ndarray] = None,
               shared_table: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    """Concat(head_1..head_h) W^O, head_i = softmax(Q_i K_g(i)^T / sqrt(d_k) + B + M) V_g(i)
    (``model.attention``'s formula; B the position encoding's score bias, else 0).

    Args:
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
    h, hk = cfg.num_heads, cfg.num_kv_heads or cfg.num_heads
    w_q, w_k, w_v, w_o, (b_q, b_k, b_v, b_o) = self._weights()
    # the positions of an encoding inside self-attention (rope | alibi | relative), before the cache
    position = POSITIONAL[cfg.positional] if self.kind != "cross" else None
    if position is not None and position.in_attention:
      q_pos, k_pos = self._positions(x.shape[1], positions)

    # Q = x W^Q, K = m W^K, V = m W^V (+ biases), split into heads [B, h|h_kv, L, d_k]; m = x, or
    # the encoder memory in cross-attention (None at cached decode steps: K, V from the cache)
    x = x.astype(cfg.compute_dtype)  # the residual stream may be float32 (model.residual_dtype)
    m = x if self.kind != "cross" else None if memory is None else memory.astype(x.dtype)
    q = kernels.project_heads(x, w_q, h, b_q)
    k = v = None
    if m is not None:
      k, v = kernels.project_heads(m, w_k, hk, b_k), kernels.project_heads(m, w_v, hk, b_v)
    if cfg.qk_norm != "none":  # QK-norm: each query and key head normalised over d_k
      q = HeadNorm(cfg, name="query_norm")(q)
      k = None if k is None else HeadNorm(cfg, name="key_norm")(k)
    if position is not None and position.rotate is not None:  # RoPE: this call's keys (at the
      k = position.rotate(cfg, k, q_pos)                      # queries' positions) and the queries
      q = position.rotate(cfg, q, q_pos)
    q = self.tap("q", q)  # [B, h, L_q, d_k]
    k, v = (None, None) if k is None else (self.tap("k", k), self.tap("v", v))  # [B, h_kv, L_k, d_k]
    if mup.attention_multiplier(cfg) != 1.0:  # muP: Q K^T sqrt(d_k,0) / d_k (txf.nn.mup)
      q = q * mup.attention_multiplier(cfg)

    # decoding: the cache stores this call's keys/values and gives back all of them, with their mask
    if cfg.decode and self.kind == "causal":
      k, v, mask = self._update_cache(k, v, mask)
    elif cfg.decode and self.kind == "cross":
      k, v, mask = self._cross_cache(k, v, memory_valid)
    rows, sources = q.shape[0], k.shape[0]
    folded = sources != rows  # beam search: a source's keys serve its G = rows / sources beams

    bias = None  # the score bias B [B|1, h, L_q, L_k] of ALiBi, T5's relative positions
    if position is not None and position.bias is not None:
      if folded:  # beam layout: G beams' queries folded, G slots of T keys each
        g = rows // sources
        q_pos, k_pos = jnp.tile(q_pos, (1, g)), k_pos % (k.shape[2] // g)
      table = {} if shared_table is None else {"table": shared_table}  # T5's one table per stack
      bias = position.bias(self, cfg, q_pos, k_pos, self.kind, **table)

    if folded:  # the G beams of a source as G*L query rows of its keys
      q = ops.fold_beams(q, sources)
    else:
      q = constrain(q, HEADS_AXES)
      k, v = (constrain(t, HEADS_AXES if hk == h else KV_HEADS_AXES) for t in (k, v))
    # dropout on the attention weights needs them: the formula's reference path, then Dropout(w) V
    dropout = bool(cfg.attention_dropout_rate) and not cfg.deterministic and not folded
    out, weights = kernels.attend(  # the kernel: model.attention_impl's (auto: the backend's)
        q, k, v, mask, "reference" if dropout else cfg.attention_impl,
        causal=self.kind == "causal" and not folded, formula=cfg.attention, bias=bias)
    if dropout:  # each key/value head's value rows serve its group of query heads
      dropped = Dropout(cfg.attention_dropout_rate)(weights, deterministic=False)
      out = ops.ungroup_heads(jnp.einsum("bhqk,bhkd->bhqd", ops.group_heads(dropped, hk), v), h)
    if folded:
      out, weights = ops.unfold_beams(out, rows), None
    if weights is not None:
      self.sow("intermediates", "attention_weights", weights)  # [B, h, L_q, L_k]; free unless mutable
      self.tap("weights", weights)  # read-only: the heads' output is already computed
    out = self.tap("heads", out)  # [B, h, L_q, d_v], each head's output before W^O
    return constrain(kernels.project_output(out, w_o, b_o), HIDDEN_AXES)

  def _weights(self):
    """The parameters, cast to the compute dtype: (W^Q [d_model, h, d_k], W^K, W^V [d_model, h_kv,
    d_k], W^O [h, d_v, d_model], (b_q [h, d_k], b_k, b_v [h_kv, d_k], b_o [d_model]) with
    ``model.attention_bias`` (Marian/BART: Q = x W^Q + b_q, ..., out = Concat(...) W^O + b_o;
    b_o None with ``model.attention_out_bias`` False, Qwen2's), else four None)."""
    cfg = self.config
    h, dk, dt = cfg.num_heads, cfg.d_k, cfg.compute_dtype
    hk = cfg.num_kv_heads or h
    kv_init = QKV_INIT if hk == h else KV_INIT
    if mup.is_mup(cfg):  # muP: hidden init variance / r (txf.nn.mup)
      kv_names = ("embed", "heads", "kv") if hk == h else ("embed", "kv_heads", "kv")
      inits = [mup.hidden_init(cfg, xavier, n) for n in (("embed", "heads", "kv"), kv_names,
                                                           ("heads", "kv", "embed"))]
    else:
      inits = [QKV_INIT, kv_init, OUT_INIT]
    w_q = self.param("query", inits[0], (cfg.d_model, h, dk)).astype(dt)
    w_k = self.param("key", inits[1], (cfg.d_model, hk, dk)).astype(dt)
    w_v = self.param("value", inits[1], (cfg.d_model, hk, dk)).astype(dt)
    w_o = self.param("out", inits[2], (h, dk, cfg.d_model)).astype(dt)
    if not cfg.attention_bias:
      return w_q, w_k, w_v, w_o, (None,) * 4
    bias = lambda name, shape, axes: self.param(
        name, nn.with_logical_partitioning(nn.initializers.zeros, axes), shape).astype(dt)
    kv_axes = ("heads", "kv") if hk == h else ("kv_heads", "kv")
    return w_q, w_k, w_v, w_o, (
        bias("query_bias", (h, dk), ("heads", "kv")), bias("key_bias", (hk, dk), kv_axes),
        bias("value_bias", (hk, dk), kv_axes),
        bias("out_bias", (cfg.d_model,), ("norm",)) if cfg.attention_out_bias else None)

  def _positions(self, length, positions):
    """The positions of the queries and of the keys they attend to, int [B|1, L_q] and [B|1, L_k],
    read before the cache is written: ``positions`` (packed rows) or 0..L-1 for both; at a cached
    decode step the queries are at cache_index + p and the keys are the cache's slots 0..T-1
    (beam search's layout: G*T slots, slot g*T + u at position u; the score bias folds them)."""
    if (self.kind == "causal" and self.config.decode
        and self.has_variable("cache", kv_cache.CACHED_KEY)):
      index = self.get_variable("cache", kv_cache.CACHE_INDEX)
      slots = self.get_variable("cache", kv_cache.CACHED_VALUE).shape[2]
      return index + jnp.arange(length)[None, :], jnp.arange(slots)[None, :]
    q_pos = jnp.arange(length)[None, :] if positions is None else positions
    return q_pos, q_pos

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
