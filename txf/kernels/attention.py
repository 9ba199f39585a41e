"""Attention kernels and the one dispatch the model calls: the reference formula (txf.ops), its
bf16 CPU restatement (txf.kernels.bf16), or a fused ``jax.nn.dot_product_attention`` (cuDNN flash
attention on GPU, XLA's own elsewhere)."""

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from txf import ops
from txf.kernels import bf16
from txf.kernels.select import ATTENTION_IMPLS, backend, select
from txf.core.variants import Table


def resolve_impl(impl: str, backend_name: Optional[str] = None) -> str:
  """``model.attention_impl``: "auto" -> the backend's choice (:func:`txf.kernels.select`'s
  ``attention_auto``: "fused" on GPU/TPU, "reference" on CPU); any other name as given.

  ``backend_name``: "cpu" | "gpu" | "tpu" (default: the running backend)."""
  if impl != "auto":
    return impl
  return select(None, backend_name).attention_auto


def fused_kernel(backend_name: str, dtype, causal: bool) -> dict:
  """The keyword arguments of ``jax.nn.dot_product_attention`` for the fused path on ``backend_name``.

  GPU with bf16/fp16 inputs: ``implementation="cudnn"`` (flash attention), with ``is_causal`` for
  causal self-attention (the padding/segment mask is passed beside it); everything else, TPU
  included: ``implementation="xla"``, XLA's own fused attention, the mask alone. The CPU path is
  the XLA one (tests/test_accelerator_defaults.py). Both take keys/values with fewer heads than
  the queries (grouped-query attention, query head i reading key/value head i // (N / K)).
  """
  if backend_name == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
    return {"implementation": "cudnn", "is_causal": bool(causal)}
  return {"implementation": "xla"}


def fused_attention(q, k, v, mask, causal: bool = False, bias=None, scale=None):
  """softmax(s Q K^T + B + M) V, s = ``scale`` (None: 1 / sqrt(d_k)), by
  ``jax.nn.dot_product_attention`` on q [B, L, H, d_k]
  and k, v [B, L_k, H_kv, d_k] (H_kv divides H: grouped-query attention, natively): cuDNN on GPU
  for the half-precision inputs it supports, XLA otherwise. ``bias`` B [B|1, H, L_q, L_k] (heads
  before positions, as that function takes it) or None (B = 0).

  A query row whose keys are all masked gets a zero output, as on the reference path (XLA's
  softmax would average V there instead). Returns [B, L_q, H, d_v].
  """
  if mask is not None:
    mask = jnp.broadcast_to(mask, (q.shape[0], q.shape[2], q.shape[1], k.shape[1]))
  out = None
  extra = {} if bias is None else {"bias": bias.astype(q.dtype)}
  if scale is not None:  # the unscaled formula (dot_product): scale 1
    extra["scale"] = scale
  kernel = fused_kernel(backend(), q.dtype, causal and q.shape[1] == k.shape[1])
  if kernel["implementation"] == "cudnn":
    try:
      out = jax.nn.dot_product_attention(q, k, v, mask=mask, **extra, **kernel)
    except Exception:  # pylint: disable=broad-except  # cuDNN rejects this shape/GPU at trace time
      out = None
  if out is None:
    out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla", **extra)
  if mask is not None:
    out = out * mask.any(-1).transpose(0, 2, 1)[..., None].astype(out.dtype)
  return out


def fused_unscaled_attention(q, k, v, mask, causal: bool = False, bias=None):
  """softmax(Q K^T + B + M) V (``model.attention="dot_product"``, T5's): :func:`fused_attention`
  with scale 1. Shapes as that function's."""
  return fused_attention(q, k, v, mask, causal, bias=bias, scale=1.0)


@dataclasses.dataclass(frozen=True)
class Attention:
  """One attention formula and the kernels that compute it, on heads [B, H, L, d_k].

  Attributes:
    formula: txf.ops's ``(q, k, v, mask) -> (out [B, H, L_q, d_v], weights [B, H, L_q, L_k])``;
      called with ``bias=`` (an additive score bias [B|1, H, L_q, L_k]) only when a position
      variant gives one (``model.positional``: alibi, relative), so a formula without that
      keyword runs with every other variant.
    bf16: its restatement with txf.kernels.dots products, run where :func:`select` says
      ``layout`` dots (bf16 compute on CPU); None: the formula there too.
    fused: ``(q, k, v, mask, causal) -> out`` on [B, L, H, d_k], a fused kernel computing the
      formula (no weights); None: ``model.attention_impl="fused"`` runs the formula.
  """
  formula: Callable
  bf16: Optional[Callable] = None
  fused: Optional[Callable] = None


# The attention formulas (``model.attention``), name -> Attention: the formula of txf.ops and, where
# one exists, its bf16 restatement and fused kernel.
ATTENTION = Table("model.attention", {
    "scaled_dot_product": Attention(ops.scaled_dot_product_attention,
                                    bf16=bf16.scaled_dot_product_attention, fused=fused_attention),
    # T5's: no 1/sqrt(d_k), softmax(Q K^T + B + M) V
    "dot_product": Attention(ops.dot_product_attention, bf16=bf16.dot_product_attention,
                             fused=fused_unscaled_attention),
})


def _with_bias(bias) -> dict:
  """The keyword arguments that pass a score bias on: none without one (the formula's own call)."""
  return {} if bias is None else {"bias": bias}


def reference_attention(attention: Attention, q, k, v, mask, causal: bool = False, bias=None):
  """``model.attention_impl="reference"``: the formula (its bf16 restatement where :func:`select`
  says ``layout`` dots); returns (out, weights). ``causal`` is unused (the mask says it); ``bias``
  an additive score bias [B|1, H, L_q, L_k] or None. Keys and values with fewer heads than q
  (grouped-query attention) run the formula once per key/value head on its group's queries
  (``txf.ops.grouped_query_attention``; the bias folded like the mask)."""
  del causal
  formula = attention.formula
  if attention.bf16 is not None and select(q.dtype).layout_dots:
    formula = attention.bf16
  return ops.grouped_query_attention(q, k, v, mask, formula, bias=bias)


def fused_impl(attention: Attention, q, k, v, mask, causal: bool = False, bias=None):
  """``model.attention_impl="fused"``: the formula's fused kernel on [B, L, H, d_k] (the formula
  where it has none); returns (out, None). ``bias`` as :func:`reference_attention`'s."""
  if attention.fused is None:
    return reference_attention(attention, q, k, v, mask, bias=bias)
  t = lambda x: x.transpose(0, 2, 1, 3)
  return t(attention.fused(t(q), t(k), t(v), mask, causal, **_with_bias(bias))), None


ATTENTION_IMPLS.register("reference", reference_attention)
ATTENTION_IMPLS.register("fused", fused_impl)


def attend(q, k, v, mask, impl: str, causal: bool = False, formula: str = "scaled_dot_product",
           bias=None):
  """Attention ``formula`` (a name of ``ATTENTION``; the default softmax(Q K^T / sqrt(d_k) + M) V)
  on heads q [B, H, L, d_k], k, v [B, H_kv, L_k, d_k] (H_kv = H, or a divisor of it: grouped-query
  attention); returns ([B, H, L_q, d_v], weights or None). ``bias``: an additive score bias
  B [B|1, H, L_q, L_k] (softmax(Q K^T / sqrt(d_k) + B + M) V) or None.

  ``impl`` (a name of ``ATTENTION_IMPLS``): ``reference`` runs the formula of txf.ops (its bf16
  CPU restatement where :func:`select` says ``layout`` dots; weights returned for inspection);
  ``fused`` its fused kernel (:func:`fused_attention` for the default; no weights); ``auto`` picks
  per backend (:func:`resolve_impl`). Both agree to float32 rounding (tests/test_attention_impl.py).
  """
  return ATTENTION_IMPLS[resolve_impl(impl)](ATTENTION[formula], q, k, v, mask, causal,
                                             **_with_bias(bias))


def scaled_dot_product_attention(q, k, v, mask=None):
  """The reference attention formula for q's dtype: txf.ops's, or txf.kernels.bf16's where
  :func:`select` says ``layout`` dots. Shapes as ``txf.ops.scaled_dot_product_attention``."""
  return reference_attention(ATTENTION["scaled_dot_product"], q, k, v, mask)


def project_heads(x, w, num_heads: int, bias=None):
  """x W (+ b) split into heads, ``txf.ops.project_heads`` (x [B, L, d_model], W [d_model, h, d_k]
  -> [B, h, L, d_k]), or its bf16 CPU restatement where :func:`select` says ``layout`` dots for
  x's dtype."""
  if select(x.dtype).layout_dots:
    return bf16.project_heads(x, w, num_heads, bias)
  return ops.project_heads(x, w, num_heads, bias)


def project_output(heads, w_o, bias=None):
  """Concat(head_1..head_h) W^O (+ b_o), ``txf.ops.project_output`` (heads [B, h, L, d_v], W^O
  [h, d_v, d_model] -> [B, L, d_model]), or its bf16 CPU restatement where :func:`select` says
  ``layout`` dots for W^O's dtype (the compute dtype)."""
  if select(w_o.dtype).layout_dots:
    return bf16.project_output(heads, w_o, bias)
  return ops.project_output(heads, w_o, bias)
