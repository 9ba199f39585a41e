"""Matrix products for bfloat16 compute on CPU, laid out for the CPU's bf16 dot units (the
``bf16_dots="layout"`` kernels of txf.kernels.select).

XLA:CPU (jaxlib 0.10.2) runs a dot on YNNPACK's bf16 kernels (AVX512-BF16 where the CPU has it)
only when (measured, and read in the compiled HLO; BENCHMARKS.md):

* both operands are bf16 and the result is **float32** (``preferred_element_type``): a dot with a
  bf16 result has both operands converted to f32 first, and runs at the f32 rate;
* the lhs is contracted on its last dimension, row-major: ``x W`` ("NN") and ``g Wᵀ`` ("NT", the
  rhs contracted on its last dimension) qualify, ``xᵀ g`` ("TN", a weight gradient) does not;
* no operand is a transpose that XLA may turn into a layout change: a plain ``x.T`` becomes a
  column-major view, which again sends the dot to f32. A transposed copy pinned to row-major with
  ``with_layout_constraint`` is kept as a real copy, and the dot on it runs in bf16.

:func:`dense`, :func:`dense_nt` (tied output projection), :func:`scores` and :func:`weighted`
(attention's Q Kᵀ and P V) compute the same products as ``x @ w``, ``h @ e.T`` and the attention
einsums with every dot of the forward and the backward pass in one of the accepted forms: float32
accumulation, results rounded to the compute dtype (logits, of the output and of attention, stay
float32). A transposed dot *result* is never used: XLA rewrites ``(a b)ᵀ`` into a dot that
contracts the lhs on dim 0 after it has decided the dtypes, and that bf16 dot then fails at run
time (``Unsupported element type for DotThunk``).
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.layout import Layout, with_layout_constraint

NN = ((1,), (0,))  # contract lhs dim 1 with rhs dim 0: a @ b
NT = ((1,), (1,))  # contract lhs dim 1 with rhs dim 1: a @ b.T


def transposed(x: jnp.ndarray) -> jnp.ndarray:
  """xᵀ of a matrix [a, b] as a row-major [b, a] array (a real copy that XLA keeps)."""
  return with_layout_constraint(x.T, Layout(major_to_minor=(0, 1)))


def _dot(a: jnp.ndarray, b: jnp.ndarray, contract) -> jnp.ndarray:
  """Matrix product of 2-d a and b over the ``contract`` dims, accumulated and returned in f32."""
  return lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


def _weight_grad(x2: jnp.ndarray, g2: jnp.ndarray) -> jnp.ndarray:
  """xᵀ g for x [N, K], g [N, M] -> [K, M] f32: an NN dot on a transposed copy of x, or, where
  that copy is the larger cost, (gᵀ x)ᵀ: an NN dot on a transposed copy of g, then the [M, K]
  float32 result copied transposed.

  The choice counts elements copied: N K of bf16 against N M of bf16 plus K M of float32 (twice
  the bytes). A FFN's W2 ([d_ff, d_model] from the hidden [N, d_ff]) and the tied output table
  ([V, d_model] from the logit gradient [N, V]) take the second form. The barrier keeps XLA from
  folding the transpose into the dot (a dot contracting its lhs on dim 0, which bf16 does not run).
  """
  n, k = x2.shape
  m = g2.shape[1]
  if n * m + 2 * k * m < n * k:
    return transposed(lax.optimization_barrier(_dot(transposed(g2), x2, NN)))
  return _dot(transposed(x2), g2, NN)


def dot_nn(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """a b for a [N, K], b [K, M] -> float32 [N, M] (an NN dot)."""
  return _dot(a, b, NN)


def dot_nt(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """a bᵀ for a [N, K], b [M, K] -> float32 [N, M] (an NT dot)."""
  return _dot(a, b, NT)


def dot_tn(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """aᵀ b for a [N, K], b [N, M] -> float32 [K, M] (an NN dot on a transposed copy of the side
  that costs less to copy: :func:`_weight_grad`)."""
  return _weight_grad(a, b)


@jax.custom_vjp
def dense(x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
  """y = x W, accumulated in float32, returned in x's dtype.

  Args:
    x: [..., K]; w: [K, M] (same dtype as x).
  Returns:
    [..., M]. Gradients: dx = g Wᵀ (an NT dot), dW = xᵀ g (an NN dot on a transposed copy).
  """
  y = _dot(x.reshape(-1, x.shape[-1]), w, NN)
  return y.astype(x.dtype).reshape(*x.shape[:-1], w.shape[1])


def _dense_fwd(x, w):
  return dense(x, w), (x, w)


def _dense_bwd(res, g):
  x, w = res
  x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]).astype(x.dtype)
  dx = _dot(g2, w, NT).astype(x.dtype).reshape(x.shape)
  return dx, _weight_grad(x2, g2).astype(w.dtype)


dense.defvjp(_dense_fwd, _dense_bwd)


@jax.custom_vjp
def add_bias(y: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """y + b, b broadcast over y's leading dimensions, in y's dtype.

  Args:
    y: [..., M]; b: [M] (same dtype as y).
  Returns:
    [..., M]. Gradients: dy = g; db = sum of g over the leading dimensions, accumulated in float32
    and rounded once to b's dtype. (Differentiated as a plain add, the bias's gradient is a sum
    of the bf16 cotangent, which XLA:CPU (jaxlib 0.10.2) returns about 20 times further from the
    float64 sum than one rounding, through a ``reduce-window`` that took 16% of the base bf16 step:
    docs/benchmarks.md.)
  """
  return y + b


def _add_bias_fwd(y, b):
  return y + b, None


def _add_bias_bwd(_, g):
  db = jnp.sum(g.reshape(-1, g.shape[-1]).astype(jnp.float32), axis=0)
  return g, db.astype(g.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


@jax.custom_vjp
def dense_nt(h: jnp.ndarray, e: jnp.ndarray) -> jnp.ndarray:
  """logits = h Eᵀ (the tied output projection), accumulated and returned in float32.

  Args:
    h: [..., d]; e: E, [V, d] (same dtype as h).
  Returns:
    float32 [..., V]. Gradients: dh = g E (NN), dE = gᵀ h (NN on a transposed copy of g; the
    cheaper (hᵀ g)ᵀ is not used: XLA rewrites a transposed dot result into a TN dot, which it
    then cannot run in bf16).
  """
  y = _dot(h.reshape(-1, h.shape[-1]), e, NT)
  return y.reshape(*h.shape[:-1], e.shape[0])


def _dense_nt_fwd(h, e):
  return dense_nt(h, e), (h, e)


def _dense_nt_bwd(res, g):
  h, e = res
  h2, g2 = h.reshape(-1, h.shape[-1]), g.reshape(-1, g.shape[-1]).astype(h.dtype)
  dh = _dot(g2, e, NN).astype(h.dtype).reshape(h.shape)
  return dh, _weight_grad(g2, h2).astype(e.dtype)


dense_nt.defvjp(_dense_nt_fwd, _dense_nt_bwd)


def _bdot(a: jnp.ndarray, b: jnp.ndarray, contract) -> jnp.ndarray:
  """Batched matrix product of 3-d a, b (batch dim 0) over ``contract``, f32 accumulation and result."""
  return lax.dot_general(a, b, (contract, ((0,), (0,))), preferred_element_type=jnp.float32)


def _btransposed(x: jnp.ndarray) -> jnp.ndarray:
  """[n, a, b] -> [n, b, a] as a row-major copy (see :func:`transposed`)."""
  return with_layout_constraint(jnp.swapaxes(x, 1, 2), Layout(major_to_minor=(0, 1, 2)))


_BNN = ((2,), (1,))  # [n, a, k] x [n, k, b]
_BNT = ((2,), (2,))  # [n, a, k] x [n, b, k]


def _flat3(x: jnp.ndarray) -> jnp.ndarray:
  return x.reshape(-1, *x.shape[-2:])


@jax.custom_vjp
def scores(q: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
  """S = Q Kᵀ per leading index: q [..., L_q, d], k [..., L_k, d] -> float32 [..., L_q, L_k].

  Gradients: dQ = g K (NN), dK = gᵀ Q (NN on a transposed copy of g); q's dtype.
  """
  s = _bdot(_flat3(q), _flat3(k), _BNT)
  return s.reshape(*q.shape[:-1], k.shape[-2])


def _scores_fwd(q, k):
  return scores(q, k), (q, k)


def _scores_bwd(res, g):
  q, k = res
  g3 = _flat3(g).astype(q.dtype)
  dq = _bdot(g3, _flat3(k), _BNN).astype(q.dtype).reshape(q.shape)
  dk = _bdot(_btransposed(g3), _flat3(q), _BNN).astype(k.dtype).reshape(k.shape)
  return dq, dk


scores.defvjp(_scores_fwd, _scores_bwd)


@jax.custom_vjp
def weighted(p: jnp.ndarray, v: jnp.ndarray) -> jnp.ndarray:
  """O = P V per leading index: p [..., L_q, L_k], v [..., L_k, d] -> [..., L_q, d] in v's dtype.

  Gradients: dP = g Vᵀ (NT), dV = Pᵀ g (NN on a transposed copy of P).
  """
  o = _bdot(_flat3(p), _flat3(v), _BNN)
  return o.astype(v.dtype).reshape(*p.shape[:-1], v.shape[-1])


def _weighted_fwd(p, v):
  return weighted(p, v), (p, v)


def _weighted_bwd(res, g):
  p, v = res
  g3 = _flat3(g).astype(v.dtype)
  dp = _bdot(g3, _flat3(v), _BNT).astype(p.dtype).reshape(p.shape)
  dv = _bdot(_btransposed(_flat3(p)), g3, _BNN).astype(v.dtype).reshape(v.shape)
  return dp, dv


weighted.defvjp(_weighted_fwd, _weighted_bwd)
