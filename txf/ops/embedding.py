"""Token embeddings and the tied output projection (section 3.4)."""

import jax.numpy as jnp


def embed(ids: jnp.ndarray, table: jnp.ndarray, scale: bool = True) -> jnp.ndarray:
  r"""X = E[x] * sqrt(d_model).

  $$X = E_{x}\,\sqrt{d_\text{model}}$$

  Args:
    ids: int [...]; table: E, [V, d_model].
    scale: multiply by sqrt(d_model) as in the paper.
  Returns:
    [..., d_model].
  """
  x = jnp.take(table, ids, axis=0)
  return x * jnp.sqrt(jnp.asarray(table.shape[-1], x.dtype)) if scale else x


def tied_logits(h: jnp.ndarray, table: jnp.ndarray) -> jnp.ndarray:
  r"""Pre-softmax linear with weights shared with the embedding: logits = h E^T.

  $$\text{logits} = h E^\top$$

  Args:
    h: [..., d_model]; table: E, [V, d_model].
  Returns:
    [..., V].
  """
  # One [N, d] @ [d, V] matmul over the flattened positions: with h kept [B, L, d], the gradient
  # of E contracts over two axes and XLA:CPU materialised a transposed [V, B*L] copy of the
  # logits' gradient for it (~35% of this head's fwd+bwd time at the base config; BENCHMARKS.md).
  return (h.reshape(-1, h.shape[-1]) @ table.T).reshape(*h.shape[:-1], table.shape[0])
