"""A fused kernel for the output head and its loss (the formulas of txf.ops.tied_logits and
txf.ops.label_smoothed_cross_entropy, computed together):  logits = h E^T, label-smoothed cross-entropy, the
unsmoothed NLL and the argmax-correct count, with the gradients w.r.t. h and E computed in the
same pass (a custom VJP), so the [N, V] logits and their gradient are each made once."""

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from txf.kernels import dots
from txf.kernels.select import select


def _chunk_terms(h, table, targets, weights, epsilon: float, grads: bool, vocab: int):
  """Loss terms of one block of rows (and, with ``grads``, the unit-cotangent gradient g of the
  loss sum w.r.t. the logits, and g E, g^T h). h [R, d]; table [V_pad, d]; targets int [R];
  weights [R]; ``vocab``: the real V <= V_pad (rows >= V are padding: logits -inf, q = 0)."""
  rows = table.shape[0]
  bf16 = select(h.dtype).layout_dots  # bf16 compute on CPU: the dot forms of txf.kernels.dots
  z = dots.dot_nt(h, table) if bf16 else jnp.dot(h, table.T).astype(jnp.float32)  # [R, V_pad]
  iota = jnp.arange(rows, dtype=targets.dtype)[None, :]
  real = iota < vocab if vocab < rows else None
  if real is not None:  # padding columns: exp(-inf) = 0 in the softmax, never the argmax
    z = jnp.where(real, z, -jnp.inf)
  m = jnp.max(z, axis=-1)
  e = jnp.exp(z - m[:, None])
  s = jnp.sum(e, axis=-1)
  lse = m + jnp.log(s)
  z_y = jnp.take_along_axis(z, targets[:, None], axis=-1)[:, 0]
  nll = lse - z_y
  smooth = epsilon / (vocab - 1) if epsilon and vocab > 1 else 0.0
  if smooth:
    # -(1-eps)(z_y - lse) - eps/(V-1) sum_{k != y} (z_k - lse)
    z_sum = jnp.sum(z if real is None else jnp.where(real, z, 0.0), axis=-1)
    loss = (1.0 - epsilon) * nll + epsilon * lse - smooth * (z_sum - z_y)
  else:
    loss = nll
  # correct: the target is the first index holding the max (numpy's argmax): z_y = m and no
  # earlier index ties it. The ties are counted as a float32 sum of 0/1 (exact), which XLA:CPU
  # fuses with the softmax's sums; an int32 min-reduce of the first index became a separate
  # reduce-window (about 1% of a base step), a variadic argmax reduce about 3%
  ties_before = jnp.sum(jnp.where((z == m[:, None]) & (iota < targets[:, None]), 1.0, 0.0), axis=-1)
  correct = ((z_y == m) & (ties_before == 0)).astype(jnp.float32)
  terms = (jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(correct * weights))
  if not grads:
    return terms, None
  # d(loss_t)/dz_k = p_k - q_k with q_y = 1 - eps (or 1), q_k = eps / (V - 1) otherwise
  hit = iota == targets[:, None]
  q = jnp.where(hit, 1.0 - epsilon if smooth else 1.0, smooth)
  if real is not None and smooth:
    q = jnp.where(real, q, 0.0)
  g = (weights / s)[:, None] * e - weights[:, None] * q
  g = g.astype(h.dtype)
  if bf16:  # the table's gradient as hᵀ g [d, V_pad] in float32 (dot_tn copies h, not g)
    return terms, (dots.dot_nn(g, table).astype(h.dtype), dots.dot_tn(h, g))
  return terms, (jnp.dot(g, table), jnp.dot(g.T, h))


def _table_grad(acc, table, bf16: bool):
  """The table's gradient [V_pad, d] in its dtype from the blocks' sum: under the bf16 dots
  (``bf16``) that sum is (dL/dE)ᵀ [d, V_pad] in float32, copied transposed and rounded once here."""
  if not bf16:
    return acc
  return dots.transposed(jax.lax.optimization_barrier(acc)).astype(table.dtype)


def _pad_rows(x, rows: int):
  return jnp.pad(x, [(0, rows - x.shape[0])] + [(0, 0)] * (x.ndim - 1))


def _run(h, table, targets, weights, epsilon: float, chunk_rows: Optional[int], grads: bool,
         vocab: int):
  """Terms (and gradients) over all rows, in one block or a scan over blocks of ``chunk_rows``.

  Block b holds the rows b, b + blocks, b + 2 blocks, ... (strided): rows sharded over devices
  (contiguous shards of the batch) then stay sharded within every block, so each device runs
  its own rows of each block and no device gathers the rows of another (a scan over contiguous
  blocks would split the scanned axis and make GSPMD gather all rows onto every device)."""
  n = h.shape[0]
  bf16 = select(h.dtype).layout_dots
  if not chunk_rows or chunk_rows >= n:
    terms, g = _chunk_terms(h, table, targets, weights, epsilon, grads, vocab)
    return terms, None if g is None else (g[0], _table_grad(g[1], table, bf16))
  blocks = -(-n // chunk_rows)
  rows = blocks * chunk_rows
  split = lambda x: jnp.swapaxes(
      _pad_rows(x, rows).reshape(chunk_rows, blocks, *x.shape[1:]), 0, 1)
  zero = jnp.zeros((), jnp.float32)

  def body(carry, xs):
    terms, dtable = carry
    new, g = _chunk_terms(*xs[:1], table, *xs[1:], epsilon, grads, vocab)
    terms = tuple(a + b for a, b in zip(terms, new))
    if not grads:
      return (terms, dtable), None
    return (terms, dtable + g[1]), g[0]

  acc = None
  if grads:  # the blocks' table gradients are summed in float32 ([d, V_pad] under the bf16 dots)
    acc = jnp.zeros(table.shape[::-1], jnp.float32) if bf16 else jnp.zeros_like(table)
  (terms, dtable), dh = jax.lax.scan(body, ((zero, zero, zero), acc),
                                     (split(h), split(targets), split(weights)))
  if not grads:
    return terms, None
  return terms, (jnp.swapaxes(dh, 0, 1).reshape(rows, -1)[:n], _table_grad(dtable, table, bf16))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _head(h, table, targets, weights, epsilon, chunk_rows, vocab):
  return _run(h, table, targets, weights, epsilon, chunk_rows, False, vocab)[0]


def _head_fwd(h, table, targets, weights, epsilon, chunk_rows, vocab):
  terms, (dh, dtable) = _run(h, table, targets, weights, epsilon, chunk_rows, True, vocab)
  return terms, (dh, dtable, targets, weights)


def _head_bwd(epsilon, chunk_rows, vocab, res, cotangents):
  dh, dtable, targets, weights = res
  ct = cotangents[0]
  # only the loss sum is differentiable: the NLL and correct-count sums are metrics
  return (ct.astype(dh.dtype) * dh, ct.astype(dtable.dtype) * dtable,
          None, jnp.zeros_like(weights))


_head.defvjp(_head_fwd, _head_bwd)


def head_cross_entropy(h: jnp.ndarray, table: jnp.ndarray, targets: jnp.ndarray,
                       weights: jnp.ndarray, epsilon: float = 0.0,
                       chunk_rows: Optional[int] = None, vocab_size: Optional[int] = None
                       ) -> Tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """Label-smoothed cross-entropy of the logits z = h E^T (E: the tied embedding or the output
  kernel transposed), without handing z back.

  With p = softmax(z_t), lse_t = log sum_k exp z_tk and q as in ``label_smoothed_cross_entropy``
  (q_y = 1 - eps, q_k = eps / (V - 1) otherwise):

    loss_t = -sum_k q_k log p_k = lse_t - (1 - eps) z_ty - eps / (V - 1) (sum_k z_tk - z_ty)
    nll_t  = lse_t - z_ty,     correct_t = [argmax_k z_tk == y_t]

  The gradient of sum_t w_t loss_t is computed in the forward pass: G = w (p - q) [N, V],
  dL/dh = G E, dL/dE = G^T h, and the backward pass scales them by the loss's cotangent. Only the
  loss sum is differentiable: the NLL and correct sums get no gradient (they are metrics).
  ``chunk_rows`` runs the rows in blocks (a scan) so that only one block's logits exist at a time.

  Args:
    h: [..., d] final hidden states; table: E, [V, d] (the logits' dtype is h's; the loss is
      computed in float32); targets: int [...]; weights: [...] (0 for padding).
    epsilon: label smoothing eps in [0, 1).
    chunk_rows: rows per block, or None for one block.
    vocab_size: the real vocabulary V when ``table`` has extra padding rows (V_pad > V, see
      ``model.vocab_multiple``): their logits are excluded (-inf in the softmax, never the argmax,
      q = 0, eps / (V - 1) with the real V) and their gradient is 0. None: every row is real.
  Returns:
    (sum_t w_t loss_t, sum_t w_t nll_t, sum_t w_t correct_t, sum_t w_t), float32 scalars.
  """
  d = h.shape[-1]
  weights = weights.astype(jnp.float32).reshape(-1)
  loss_sum, nll_sum, correct = _head(h.reshape(-1, d), table.astype(h.dtype), targets.reshape(-1),
                                     weights, float(epsilon), chunk_rows,
                                     int(vocab_size or table.shape[0]))
  return loss_sum, jax.lax.stop_gradient(nll_sum), jax.lax.stop_gradient(correct), weights.sum()
