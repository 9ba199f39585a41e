"""Scaled dot-product and multi-head attention as pure functions (section 3.2), their masks, the
head projections and the head/beam foldings that grouped-query attention and beam search use.

Mask convention everywhere: boolean, True = may attend. Shapes broadcast to [..., L_q, L_k].
"""

from typing import Callable, Optional, Tuple

import jax
import jax.numpy as jnp


def padding_mask(query_valid: jnp.ndarray, key_valid: jnp.ndarray) -> jnp.ndarray:
  """Mask that lets a real query attend only to real (non-padding) keys.

  M[b, 1, i, j] = query_valid[b, i] and key_valid[b, j]

  Args:
    query_valid: bool [B, L_q] (True = real token).
    key_valid: bool [B, L_k].
  Returns:
    bool [B, 1, L_q, L_k] (the 1 broadcasts over heads).
  """
  return (query_valid[:, None, :, None] & key_valid[:, None, None, :])


def causal_mask(length: int, key_length: Optional[int] = None) -> jnp.ndarray:
  r"""Lower-triangular mask: position i may attend to positions j <= i.

  $$M_{ij} = [\,j \le i\,]$$

  Returns:
    bool [1, 1, L, L_k].
  """
  key_length = length if key_length is None else key_length
  i = jnp.arange(length)[:, None]
  j = jnp.arange(key_length)[None, :]
  return (j <= i)[None, None]


def segment_mask(query_segments: jnp.ndarray, key_segments: jnp.ndarray) -> jnp.ndarray:
  """Mask for packed rows: attend only within the same segment; segment id 0 is padding.

  M[b, 1, i, j] = (s_q[b, i] == s_k[b, j]) and s_q[b, i] != 0 and s_k[b, j] != 0

  Args:
    query_segments: int [B, L_q]; key_segments: int [B, L_k].
  Returns:
    bool [B, 1, L_q, L_k].
  """
  same = query_segments[:, None, :, None] == key_segments[:, None, None, :]
  return same & padding_mask(query_segments != 0, key_segments != 0)


def combine_masks(*masks: Optional[jnp.ndarray]) -> Optional[jnp.ndarray]:
  """Logical AND of the given masks (None entries are ignored; all None gives None)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0]
  for m in masks[1:]:
    out = out & m
  return out


def attention_weights(logits: jnp.ndarray, mask: Optional[jnp.ndarray], dtype) -> jnp.ndarray:
  r"""softmax(logits + M) over the last axis, computed in float32 and returned in ``dtype``.

  $$w_{ij} = \frac{[M_{ij}]\, e^{s_{ij}}}{\sum_{j'} [M_{ij'}]\, e^{s_{ij'}}}$$

  Masked logits get the most negative finite value, so masked keys get exactly 0 weight; a row
  with every key masked gets zero weights (never NaN).

  Args:
    logits: [..., L_q, L_k]; mask: bool broadcastable to it (True = may attend) or None.
  Returns:
    weights [..., L_q, L_k] in ``dtype``, each unmasked row summing to 1.
  """
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
  weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  if mask is not None:
    weights = jnp.where(mask, weights, 0.0)  # a fully masked row becomes all zeros
  return weights.astype(dtype)


def scaled_dot_product_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                                 mask: Optional[jnp.ndarray] = None,
                                 bias: Optional[jnp.ndarray] = None
                                 ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  r"""Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + B + M) V.

  $$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\Big(\frac{QK^\top}{\sqrt{d_k}} + B + M\Big)V$$

  The softmax is :func:`attention_weights` (float32; masked keys get exactly 0 weight, a row with
  every key masked returns zero weights and a zero output, never NaN). B is an optional additive
  score bias (ALiBi's, T5's relative one: txf.ops.positional); without it (the paper) B = 0 and
  nothing is added.

  Args:
    q: [..., L_q, d_k]; k: [..., L_k, d_k]; v: [..., L_k, d_v].
    mask: bool, broadcastable to [..., L_q, L_k]; True = may attend.
    bias: float, broadcastable to [..., L_q, L_k], or None.
  Returns:
    (output [..., L_q, d_v], weights [..., L_q, L_k]) with each unmasked row of weights summing to 1.
  """
  d_k = q.shape[-1]
  logits = jnp.einsum("...qd,...kd->...qk", q, k) / jnp.sqrt(jnp.asarray(d_k, q.dtype))
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  weights = attention_weights(logits, mask, v.dtype)
  return jnp.einsum("...qk,...kd->...qd", weights, v), weights


def dot_product_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                          mask: Optional[jnp.ndarray] = None,
                          bias: Optional[jnp.ndarray] = None
                          ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  r"""Unscaled attention (T5's, ``model.attention="dot_product"``): softmax(Q K^T + B + M) V.

  $$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\big(QK^\top + B + M\big)V$$

  :func:`scaled_dot_product_attention` without the 1/sqrt(d_k): T5 folds that factor into the
  initialisation of W^Q instead. Same softmax (float32, masked keys exactly 0), shapes and return.
  """
  logits = jnp.einsum("...qd,...kd->...qk", q, k)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  weights = attention_weights(logits, mask, v.dtype)
  return jnp.einsum("...qk,...kd->...qd", weights, v), weights


def split_heads(x: jnp.ndarray, num_heads: int) -> jnp.ndarray:
  """[B, L, H*d_k] -> [B, H, L, d_k]."""
  b, l, d = x.shape
  if d % num_heads:
    raise ValueError(f"width {d} is not divisible by num_heads={num_heads}")
  return x.reshape(b, l, num_heads, d // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x: jnp.ndarray) -> jnp.ndarray:
  """[B, H, L, d_v] -> [B, L, H*d_v] (the Concat of the heads)."""
  b, h, l, d = x.shape
  return x.transpose(0, 2, 1, 3).reshape(b, l, h * d)


def group_heads(x: jnp.ndarray, num_kv_heads: int) -> jnp.ndarray:
  """Fold the query heads that share a key/value head into the length axis: [B, h, L, X] ->
  [B, h_kv, G*L, X] with G = h / h_kv, row g*L + l of group j holding head j*G + g (a reshape, no
  copy). The inverse is :func:`ungroup_heads`."""
  b, h, l = x.shape[:3]
  if h % num_kv_heads:
    raise ValueError(f"{h} query heads do not split into {num_kv_heads} key/value groups")
  return x.reshape((b, num_kv_heads, (h // num_kv_heads) * l) + x.shape[3:])


def ungroup_heads(x: jnp.ndarray, num_heads: int) -> jnp.ndarray:
  """[B, h_kv, G*L, X] -> [B, h, L, X] with h = G * h_kv: the inverse of :func:`group_heads`."""
  b, hk, gl = x.shape[:3]
  return x.reshape((b, num_heads, gl * hk // num_heads) + x.shape[3:])


def group_mask(mask: Optional[jnp.ndarray], num_heads: int, num_kv_heads: int,
               query_length: int) -> Optional[jnp.ndarray]:
  """A mask broadcastable to [B, h, L_q, L_k] as one broadcastable to :func:`group_heads`'s
  [B, h_kv, G*L_q, L_k] (None stays None). A mask with one head row and one query row is kept as
  it is; otherwise its query rows are laid out per head group like the queries."""
  if mask is None:
    return None
  mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
  mb, mh, mq, mk = mask.shape
  if mh == 1 and mq == 1:
    return mask
  g = num_heads // num_kv_heads
  if mh == 1:  # the same rows for every head: G copies of the query rows
    mask = jnp.broadcast_to(mask[:, :, None], (mb, 1, g, query_length, mk))
    return mask.reshape(mb, 1, g * query_length, mk)
  mask = jnp.broadcast_to(mask, (mb, num_heads, query_length, mk))
  return group_heads(mask, num_kv_heads)


def grouped_query_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                            mask: Optional[jnp.ndarray] = None,
                            attention_fn: Callable = scaled_dot_product_attention,
                            bias: Optional[jnp.ndarray] = None
                            ) -> Tuple[jnp.ndarray, Optional[jnp.ndarray]]:
  r"""Grouped-query attention (Ainslie et al. 2023; multi-query for h_kv = 1, Shazeer 2019): the
  G = h / h_kv query heads of group j share key/value head j.

  $$\mathrm{head}_i = \operatorname{Attention}(Q_i, K_{g(i)}, V_{g(i)}),
  \qquad g(i) = \lfloor i / G \rfloor$$

  Computed without repeating K/V: the G query heads of a group are folded into its query rows
  (:func:`group_heads`, q [B, h_kv, G*L_q, d_k]), ``attention_fn`` runs once per key/value head,
  and the rows are unfolded. With h_kv = h this is ``attention_fn(q, k, v, mask)`` itself.

  Args:
    q: [B, h, L_q, d_k]; k: [B, h_kv, L_k, d_k]; v: [B, h_kv, L_k, d_v] (h_kv divides h).
    mask: bool broadcastable to [B, h, L_q, L_k], True = may attend.
    attention_fn: ``(q, k, v, mask) -> (out, weights or None)`` on equal head counts; default
      :func:`scaled_dot_product_attention`. Given ``bias=`` only when ``bias`` is not None.
    bias: an additive score bias B broadcastable to [B, h, L_q, L_k] (ALiBi's, T5's), folded per
      head group like the mask; None: none.
  Returns:
    (out [B, h, L_q, d_v], weights [B, h, L_q, L_k] or None).
  """
  h, hk = q.shape[1], k.shape[1]
  if h != hk:  # the G query heads of a group as G*L_q query rows of its key/value head
    mask = group_mask(mask, h, hk, q.shape[2])
    bias = group_mask(bias, h, hk, q.shape[2])
    q = group_heads(q, hk)
  out, weights = attention_fn(q, k, v, mask, **({} if bias is None else {"bias": bias}))
  if h == hk:
    return out, weights
  return ungroup_heads(out, h), None if weights is None else ungroup_heads(weights, h)


def fold_beams(q: jnp.ndarray, num_sources: int) -> jnp.ndarray:
  """The G = N / B beams of a source as G*L query rows of that source: q [N = B*G, h, L, d_k] ->
  [B, h, G*L, d_k], row g*L + p holding beam g's p-th query (keys stored once per source, as
  beam search's cache and cross-attention memory are, then serve all its beams in one product).
  The inverse is :func:`unfold_beams`."""
  n, h, l, dk = q.shape
  g = n // num_sources
  return q.reshape(num_sources, g, h, l, dk).transpose(0, 2, 1, 3, 4).reshape(
      num_sources, h, g * l, dk)


def unfold_beams(out: jnp.ndarray, num_beams: int) -> jnp.ndarray:
  """[B, h, G*L, d_v] -> [N = B*G, h, L, d_v] with G = N / B: the inverse of :func:`fold_beams`."""
  b, h, gl, dv = out.shape
  g = num_beams // b
  return out.reshape(b, h, g, gl // g, dv).transpose(0, 2, 1, 3, 4).reshape(
      num_beams, h, gl // g, dv)


def _per_head(w: jnp.ndarray, num_heads: int, axis: int) -> jnp.ndarray:
  """A projection as per-head blocks: [d, h*d_k] -> [d, h, d_k] (axis 1) or [h*d_v, d] ->
  [h, d_v, d] (axis 0); per-head shapes pass through."""
  if w.ndim == 3:
    return w
  if axis == 1:
    return w.reshape(w.shape[0], num_heads, w.shape[1] // num_heads)
  return w.reshape(num_heads, w.shape[0] // num_heads, w.shape[1])


def project_heads(x: jnp.ndarray, w: jnp.ndarray, num_heads: int,
                  bias: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """One projection of attention split into heads: x W (+ b), x [B, L, d_model], W [d_model,
  h*d_k] or per-head blocks [d_model, h, d_k], b [h*d_k] or [h, d_k] or None -> [B, h, L, d_k]."""
  b, l, _ = x.shape
  projected = jnp.einsum("bld,dhk->blhk", x, _per_head(w, num_heads, 1)).reshape(b, l, -1)
  if bias is not None:
    projected = projected + bias.reshape(-1)
  return split_heads(projected, num_heads)


def project_output(heads: jnp.ndarray, w_o: jnp.ndarray,
                   bias: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """Concat(head_1, ..., head_h) W^O (+ b_o): heads [B, h, L, d_v], W^O [h*d_v, d_model] or
  [h, d_v, d_model], b_o [d_model] or None -> [B, L, d_model]."""
  concat = merge_heads(heads)  # [B, L, h*d_v]
  w_o = _per_head(w_o, heads.shape[1], 0)
  projected = jnp.einsum("blhk,hkd->bld", concat.reshape(concat.shape[:2] + w_o.shape[:2]), w_o)
  return projected if bias is None else projected + bias


def multi_head_attention(x_q: jnp.ndarray, x_kv: Optional[jnp.ndarray], w_q: jnp.ndarray,
                         w_k: jnp.ndarray, w_v: jnp.ndarray, w_o: jnp.ndarray, num_heads: int,
                         mask: Optional[jnp.ndarray] = None, *,
                         kv_hook: Optional[Callable] = None,
                         attention_fn: Callable = grouped_query_attention,
                         biases: Optional[Tuple[jnp.ndarray, ...]] = None,
                         num_kv_heads: Optional[int] = None,
                         qk_hook: Optional[Callable] = None
                         ) -> Tuple[jnp.ndarray, Optional[jnp.ndarray]]:
  r"""MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

  $$\operatorname{MultiHead}(Q, K, V) = \operatorname{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\,W^O,
  \qquad \mathrm{head}_i = \operatorname{Attention}(QW_i^Q, KW_i^K, VW_i^V)$$

  With d_k = d_v = d_model / h, the per-head projections W_i^Q are the column blocks of ``w_q``
  (given as [d_model, h*d_k], or already as blocks [d_model, h, d_k] with W_i^Q = w_q[:, i]); W^O
  likewise [h*d_v, d_model] or [h, d_v, d_model]. This is the whole formula in one function, with
  two hooks where a KV cache and another attention kernel plug in without changing the maths; the
  model (txf.nn.MultiHeadAttention) runs the same steps in line (:func:`project_heads`, attention,
  :func:`project_output`, each through txf.kernels' choice for the backend). With ``num_kv_heads``
  h_kv < h (grouped-query attention) head_i = Attention(QW_i^Q, KW_{g(i)}^K, VW_{g(i)}^V),
  g(i) = floor(i / (h / h_kv)): see :func:`grouped_query_attention`.

  Args:
    x_q: [B, L_q, d_model] queries; x_kv: [B, L_k, d_model] keys/values (x_q itself for
      self-attention), or None when ``kv_hook`` supplies the keys/values (a cached memory).
    w_q, w_k, w_v: [d_model, h*d_k] or [d_model, h, d_k]; w_o: [h*d_v, d_model] or [h, d_v, d_model].
    num_heads: h.
    mask: bool broadcastable to [B, h, L_q, L_k].
    kv_hook: optional ``(k, v, mask) -> (k, v, mask)`` on heads [B, h_kv, L_k, d_k], called between
      the projections and attention (k = v = None when x_kv is None); e.g. a KV cache that
      appends this step's keys and returns all cached positions with their mask.
    attention_fn: ``(q, k, v, mask) -> (out [B, h, L_q, d_v], weights [B, h, L_q, L_k] or None)``
      on q [B, h, L_q, d_k] and k, v [B, h_kv, L_k, d_k]; default :func:`grouped_query_attention`
      (:func:`scaled_dot_product_attention` when h_kv = h).
    biases: optional (b_q [h*d_k], b_k, b_v [h_kv*d_k], b_o [d_model]) added after each projection
      (Q = x_q W^Q + b_q, ..., output Concat(...) W^O + b_o), as Marian/BART attention has;
      None: no biases, as in the paper.
    num_kv_heads: h_kv, the key/value heads (grouped-query attention: w_k, w_v are
      [d_model, h_kv*d_k] or [d_model, h_kv, d_k], and query head i reads key/value head
      floor(i / (h / h_kv))); None: h (multi-head attention).
    qk_hook: optional ``(q, k) -> (q, k)`` on the heads right after the projections, before
      ``kv_hook`` (k None when x_kv is None); e.g. QK-norm, so a KV cache stores normalised keys.
  Returns:
    (output [B, L_q, d_model], weights [B, h, L_q, L_k] or whatever ``attention_fn`` returns).
  """
  b_q, b_k, b_v, b_o = biases if biases is not None else (None,) * 4
  q = project_heads(x_q, w_q, num_heads, b_q)
  k = v = None
  if x_kv is not None:
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    k, v = project_heads(x_kv, w_k, kv_heads, b_k), project_heads(x_kv, w_v, kv_heads, b_v)
  if qk_hook is not None:
    q, k = qk_hook(q, k)
  if kv_hook is not None:
    k, v, mask = kv_hook(k, v, mask)
  out, weights = attention_fn(q, k, v, mask)
  return project_output(out, w_o, b_o), weights
