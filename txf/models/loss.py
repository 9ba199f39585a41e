"""The default training objective: label-smoothed cross-entropy over any family's forward, with the
output head fused into the loss for large target vocabularies."""

from typing import Any, Callable, Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import kernels, ops
from txf.core import families
from txf.models.build import forward, forward_hidden, has_token_head


# A loss: (model, params, batch, dropout rng or None) -> (loss_sum, terms), where loss_sum is a
# scalar summed over the batch's weighted positions (the step divides it by terms["count"]) and
# terms holds the scalar sums "count" (weight total), "nll_sum" (unsmoothed NLL) and "correct".
LossFn = Callable[[nn.Module, Any, Dict[str, jnp.ndarray], Optional[jax.Array]],
                  Tuple[jnp.ndarray, Dict[str, jnp.ndarray]]]


# Target vocabularies from which the default loss fuses the output head (see cross_entropy_loss).
FUSED_HEAD_MIN_VOCAB = 1024


def cross_entropy_loss(label_smoothing: float = 0.0, fused: Optional[bool] = None,
                       chunk_rows: Optional[int] = 512) -> LossFn:
  """The default loss: sum_t w_t * LS-CE_t (label smoothing epsilon_ls), with the unsmoothed NLL
  and the argmax-correct count as terms; w_t = 0 on padding (see ``forward``).

  ``fused``: for a model of a family with a token head (``txf.core.families.Family.token_head``:
  txf's translation, LM and span-corruption models; exactly the family's module class, not a
  subclass), the output projection, the loss terms and their gradients run
  as one op (``txf.kernels.head_cross_entropy``, rows in blocks of ``chunk_rows``: 512 measured best
  at the small and base bench configs); the same maths as the reference path (``forward`` +
  ``txf.ops.label_smoothed_cross_entropy``), taken by every other model and by ``fused=False``,
  up to float32 rounding. ``None`` (default): fused when the target vocabulary has at least
  ``FUSED_HEAD_MIN_VOCAB`` entries, where the [N, V] logits dominate the head's cost; smaller
  heads keep the reference path and its exact rounding.
  """

  def use_fused(model) -> bool:
    if (fused is False or not has_token_head(model) or model.config.logits_bias
        or model.config.mask_special_logits):
      return False  # (the fused head has no logits bias and masks no ids)
    return bool(fused) or model.config.tgt_vocab_size >= FUSED_HEAD_MIN_VOCAB

  def loss_fn(model, params, batch, rng):
    if use_fused(model):
      h, table, targets, weights = forward_hidden(model, params, batch, rng)
      loss_sum, nll_sum, correct, count = kernels.head_cross_entropy(
          h, table, targets, weights, label_smoothing, chunk_rows, model.config.tgt_vocab_size)
      return loss_sum, {"count": count, "nll_sum": nll_sum, "correct": correct}
    logits, targets, weights = forward(model, params, batch, rng)
    loss_sum, count = ops.label_smoothed_cross_entropy(logits, targets, weights, label_smoothing)
    nll_sum, _ = ops.label_smoothed_cross_entropy(logits, targets, weights, 0.0)
    correct, _ = ops.token_accuracy(logits, targets, weights)
    return loss_sum, {"count": count, "nll_sum": nll_sum, "correct": correct}

  return loss_fn


def corruption_rngs(rng: Optional[jax.Array], eval_seed: int) -> Tuple[jax.Array, Optional[jax.Array]]:
  """(corruption rng, dropout rng) of a self-supervised objective's loss: in training the two
  halves of ``jax.random.split(rng)`` (the step's rng, so a resumed run corrupts alike); in
  evaluation (rng None) ``jax.random.key(eval_seed)`` and no dropout (every evaluation scores the
  same corruption)."""
  if rng is None:
    return jax.random.key(eval_seed), None
  corrupt_rng, dropout_rng = jax.random.split(rng)
  return corrupt_rng, dropout_rng


def default_loss(cfg, label_smoothing: float = 0.0) -> LossFn:
  """The objective of ``cfg.family``: its ``txf.core.families`` record's ``loss`` factory called with
  ``label_smoothing``, or (None) ``cross_entropy_loss(label_smoothing)``."""
  make = families.get(cfg.family).loss
  return cross_entropy_loss(label_smoothing) if make is None else families.resolve(make)(label_smoothing)
