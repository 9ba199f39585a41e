"""Label-smoothed cross-entropy (section 5.4) and token accuracy."""

from typing import Tuple

import jax
import jax.numpy as jnp


def label_smoothed_cross_entropy(logits: jnp.ndarray, targets: jnp.ndarray, weights: jnp.ndarray,
                                 epsilon: float = 0.1) -> Tuple[jnp.ndarray, jnp.ndarray]:
  r"""Cross-entropy against the smoothed distribution q over V classes.

  $$q(k) = \begin{cases} 1 - \epsilon & k = y \\ \frac{\epsilon}{V - 1} & k \ne y \end{cases}
  \qquad \ell_t = -\sum_k q(k) \log p(k \mid t)
  = -(1-\epsilon)\log p(y) - \frac{\epsilon}{V-1}\sum_{k \ne y} \log p(k)$$

  Positions with weight 0 (padding) are excluded.

  Args:
    logits: [..., V]; targets: int [...]; weights: [...] (0 for padding, 1 for real tokens).
    epsilon: smoothing eps in [0, 1).
  Returns:
    (sum over positions of weight * loss_t, sum of weights) — divide for the mean over real tokens.
  """
  vocab = logits.shape[-1]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  if epsilon and vocab > 1:
    others = logp.sum(axis=-1) - target_logp
    loss = -(1.0 - epsilon) * target_logp - (epsilon / (vocab - 1)) * others
  else:
    loss = -target_logp
  weights = weights.astype(jnp.float32)
  return (loss * weights).sum(), weights.sum()


def token_accuracy(logits: jnp.ndarray, targets: jnp.ndarray, weights: jnp.ndarray
                   ) -> Tuple[jnp.ndarray, jnp.ndarray]:
  """(number of weighted positions where argmax(logits) == target, sum of weights)."""
  weights = weights.astype(jnp.float32)
  return ((jnp.argmax(logits, -1) == targets) * weights).sum(), weights.sum()
