"""The paper's formulas restated with the bf16 CPU products of txf.kernels.dots.

Each function computes the same maths as its txf.ops counterpart (tests/test_kernels.py checks each
against it), with every matrix product a :mod:`txf.kernels.dots` product: bf16 operands, float32
accumulation, results rounded to the compute dtype (attention logits and output logits float32).
"""

from typing import Callable, Optional, Tuple

import jax.numpy as jnp

from txf.kernels import dots
from txf.ops.attention import (attention_weights, grouped_query_attention, merge_heads,
                               split_heads)
from txf.ops.feedforward import ACTIVATIONS, Gated


def scaled_dot_product_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                                 mask: Optional[jnp.ndarray] = None,
                                 bias: Optional[jnp.ndarray] = None
                                 ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """softmax(Q K^T / sqrt(d_k) + B + M) V (``txf.ops.scaled_dot_product_attention``) with float32
  logits from :func:`txf.kernels.dots.scores` and the output from :func:`~txf.kernels.dots.weighted`.

  q [..., L_q, d_k]; k [..., L_k, d_k]; v [..., L_k, d_v]; bias broadcastable to
  [..., L_q, L_k] or None (B = 0) -> (out [..., L_q, d_v], weights).
  """
  logits = dots.scores(q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  weights = attention_weights(logits, mask, v.dtype)
  return dots.weighted(weights, v), weights


def dot_product_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                          mask: Optional[jnp.ndarray] = None,
                          bias: Optional[jnp.ndarray] = None
                          ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """softmax(Q K^T + B + M) V (``txf.ops.dot_product_attention``, T5's unscaled attention) with
  float32 logits from :func:`txf.kernels.dots.scores` and the output from
  :func:`~txf.kernels.dots.weighted`. Shapes as :func:`scaled_dot_product_attention`."""
  logits = dots.scores(q, k)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  weights = attention_weights(logits, mask, v.dtype)
  return dots.weighted(weights, v), weights


def grouped_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                      mask: Optional[jnp.ndarray] = None
                      ) -> Tuple[jnp.ndarray, Optional[jnp.ndarray]]:
  """:func:`scaled_dot_product_attention` with k, v [B, h_kv, L_k, d_k] shared by groups of the
  h query heads (``txf.ops.grouped_query_attention``); h_kv = h: that function itself."""
  return grouped_query_attention(q, k, v, mask, scaled_dot_product_attention)


def feed_forward(x: jnp.ndarray, w1: jnp.ndarray, b1: Optional[jnp.ndarray], w2: jnp.ndarray,
                 b2: Optional[jnp.ndarray], activation: str = "relu",
                 w_gate: Optional[jnp.ndarray] = None,
                 b_gate: Optional[jnp.ndarray] = None,
                 hidden_fn: Optional[Callable] = None) -> jnp.ndarray:
  """FFN(x) = f(x W1 + b1) W2 + b2, or the gated (f(x W1 + b1) * (x V + c)) W2 + b2 for a gated
  ``activation`` (``txf.ops.feed_forward``, same arguments) with :func:`txf.kernels.dots.dense`
  products; a bias that is None is left out.

  x [..., d_model]; w1, w_gate [d_model, d_ff]; w2 [d_ff, d_model] -> [..., d_model].
  """
  entry = ACTIVATIONS[activation]
  add = lambda z, b: z if b is None else dots.add_bias(z, b)
  if isinstance(entry, Gated):
    if w_gate is None:
      raise ValueError(f"activation={activation!r} is a gated FFN: it needs w_gate [d_model, d_ff]")
    hidden = entry.f(add(dots.dense(x, w1), b1)) * add(dots.dense(x, w_gate), b_gate)
  else:
    hidden = entry(add(dots.dense(x, w1), b1))
  if hidden_fn is not None:
    hidden = hidden_fn(hidden)
  return add(dots.dense(hidden, w2), b2)


def project_heads(x: jnp.ndarray, w: jnp.ndarray, num_heads: int,
                  bias: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """x W (+ b) split into heads (``txf.ops.project_heads``) as a :func:`txf.kernels.dots.dense`
  product on the flattened kernel [d_model, h*d_k]: x [B, L, d_model] -> [B, h, L, d_k]."""
  projected = dots.dense(x, w.reshape(w.shape[0], -1))
  return split_heads(projected if bias is None else dots.add_bias(projected, bias.reshape(-1)),
                     num_heads)


def project_output(heads: jnp.ndarray, w_o: jnp.ndarray,
                   bias: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """Concat(head_1..head_h) W^O (+ b_o) (``txf.ops.project_output``) as a
  :func:`txf.kernels.dots.dense` product on the flattened W^O [h*d_v, d_model]: heads
  [B, h, L, d_v] -> [B, L, d_model]."""
  projected = dots.dense(merge_heads(heads), w_o.reshape(-1, w_o.shape[-1]))
  return projected if bias is None else dots.add_bias(projected, bias)


def multi_head_attention(x_q: jnp.ndarray, x_kv: Optional[jnp.ndarray], w_q: jnp.ndarray,
                         w_k: jnp.ndarray, w_v: jnp.ndarray, w_o: jnp.ndarray, num_heads: int,
                         mask: Optional[jnp.ndarray] = None, *,
                         kv_hook: Optional[Callable] = None,
                         attention_fn: Callable = grouped_attention,
                         biases: Optional[Tuple[jnp.ndarray, ...]] = None,
                         num_kv_heads: Optional[int] = None,
                         qk_hook: Optional[Callable] = None
                         ) -> Tuple[jnp.ndarray, Optional[jnp.ndarray]]:
  """Concat(head_1..head_h) W^O (``txf.ops.multi_head_attention``, same arguments and hooks) with
  the projections as :func:`txf.kernels.dots.dense` products on the flattened kernels
  [d_model, h*d_k] ([d_model, h_kv*d_k] for the keys/values) and [h*d_v, d_model]
  (:func:`project_heads`, :func:`project_output`).

  x_q [B, L_q, d_model]; x_kv [B, L_k, d_model] or None -> (out [B, L_q, d_model], weights).
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


def tied_logits(h: jnp.ndarray, table: jnp.ndarray) -> jnp.ndarray:
  """h E^T (``txf.ops.tied_logits``) as float32 logits: h [..., d], E [V, d] -> [..., V]."""
  return dots.dense_nt(h, table)


def dense(x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
  """x W in x's dtype (float32 accumulation): x [..., K], w [K, M] -> [..., M]."""
  return dots.dense(x, w)
