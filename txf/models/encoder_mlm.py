"""Encoder-only masked language model (BERT's MLM head): encoder -> a prediction per position.

The family ``encoder_mlm`` computes p(token | masked input) at every position; ``txf import-hf``
makes one of a ``BertForMaskedLM`` checkpoint and ``txf export-hf`` writes it back. It trains on
plain text (``txf.data.pretraining.StreamMLMTask``: unmasked windows as ``inputs``); its loss
(``mlm_loss``) masks each batch BERT's way (``txf.ops.mlm_mask``, ``config.pretrain``) and scores
the chosen positions only. A batch that already holds ``targets`` (masked ``inputs``, the
original token at masked positions and 0 elsewhere) is scored as it is.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import kernels, ops
from txf.core.errors import TxfError
from txf.models.loss import corruption_rngs, cross_entropy_loss
from txf.nn import BOS_ID, EOS_ID, Embed, Encoder, LayerNorm, PAD_ID, TransformerConfig, UNK_ID
from txf.nn import mup
from txf.nn.attention import xavier
from txf.ops.feedforward import ACTIVATIONS

# The masking key of every evaluation batch (training derives it from the step's rng instead).
EVAL_MASK_SEED = 0


class EncoderMLM(nn.Module):
  """logits_t = LN(f(h_t W_t + b_t)) E^T + b for every position t of h = Encoder(x).

  W_t [d, d], b_t [d] (``mlm_dense``), f = ``model.activation`` (a dense entry of ``ACTIVATIONS``;
  BERT's gelu), LN (``mlm_norm``), E the input embedding table (``model.tie_output``; else the
  head's own ``logits_kernel`` [d, V]) and the output bias b [V] (``logits_bias``, when
  ``model.logits_bias``): BERT's ``cls.predictions``.
  """
  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs, targets=None, inputs_segmentation=None, inputs_position=None,
               predict_positions=None):
    """inputs int [B, S] (0 = padding) -> logits [B, S, V], or with ``predict_positions`` int
    [B, K] the logits [B, K, V] of those positions only (h gathered before the head: the head's
    [d, V] product runs on K, not S, rows). ``targets`` (the labels of the predicted positions) is
    not read: the loss compares the logits with it (txf.models.forward)."""
    cfg = self.config
    expected = inputs.shape if predict_positions is None else predict_positions.shape
    if targets is not None and targets.shape != expected:
      raise TxfError(f"model.family=encoder_mlm predicts the token at each input position: its "
                     f"targets {tuple(targets.shape)} must have the inputs' shape "
                     f"{tuple(expected)} (data.max_input_len and data.max_target_len must be "
                     f"equal)")
    if cfg.gated_ffn:
      raise ValueError(f"model.activation={cfg.activation!r} is a gated FFN: the MLM head's "
                       f"transform needs a dense activation (gelu, relu, ...)")
    embed = Embed(cfg, cfg.vocab_size, name="embed")
    encoded, _ = Encoder(cfg, embed, name="encoder")(inputs, inputs_segmentation, inputs_position)
    if predict_positions is not None:
      encoded = jnp.take_along_axis(encoded, predict_positions[..., None], axis=1)
    h = nn.Dense(cfg.d_model, name="mlm_dense",
                 kernel_init=nn.with_logical_partitioning(xavier, ("embed", "act_embed")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("norm",))
                 )(encoded.astype(jnp.float32))
    h = LayerNorm(cfg, name="mlm_norm")(ACTIVATIONS[cfg.activation](h))
    h = h.astype(cfg.compute_dtype)
    if mup.output_multiplier(cfg) != 1.0:  # muP: logits = (h d_0 / d_model) W^T
      h = h * mup.output_multiplier(cfg)
    if cfg.tie_output:
      logits = embed.attend(h)
    else:
      w = self.param("logits_kernel", nn.with_logical_partitioning(xavier, ("embed", "vocab")),
                     (cfg.d_model, cfg.padded_vocab_size))
      logits = kernels.dense(h, w.astype(h.dtype))
    logits = logits.astype(jnp.float32)[..., :cfg.vocab_size]
    if cfg.logits_bias:
      logits = logits + self.param("logits_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("vocab",)), (cfg.vocab_size,))
    return logits


def mask_batch(cfg: TransformerConfig, batch, rng: jax.Array):
  """A batch of unmasked ``inputs`` [B, S] (and ``word_starts`` with ``pretrain.whole_word``) ->
  the same batch with ``inputs`` masked (``txf.ops.mlm_mask`` with ``cfg``'s pretrain fields;
  never chosen nor drawn: PAD, BOS, EOS, UNK and ``cfg.mask_id``), ``predict_positions`` int
  [B, K] (``prediction_positions``, K = ``max_predictions``) and ``targets`` [B, K] = the original
  token at each of them (0 past a row's chosen ones). With whole words, ``targets`` [B, S]: the
  original token at the chosen positions, 0 elsewhere, and every position predicted."""
  if not cfg.mask_id:
    raise TxfError("masked-LM training needs the tokenizer's mask token, and this model config has "
                   "none (mask_id=0): train on real text (txf.data.pretraining.StreamMLMTask sets it) or "
                   "give batches already masked, with targets")
  starts = None
  if cfg.whole_word:
    if "word_starts" not in batch:
      raise TxfError("pretrain.whole_word=True needs batches with word_starts (the real-text "
                     "masked-LM task adds them); set pretrain.whole_word=False otherwise")
    starts = batch["word_starts"] != 0
  inputs, targets, _ = ops.mlm_mask(
      batch["inputs"], rng, vocab_size=cfg.vocab_size, mask_id=cfg.mask_id, mask_rate=cfg.mask_rate,
      mask_token_fraction=cfg.mask_token_fraction, random_token_fraction=cfg.random_token_fraction,
      special_ids=(PAD_ID, BOS_ID, EOS_ID, UNK_ID, cfg.mask_id), word_starts=starts)
  if starts is not None:  # whole words: a row's chosen count has no bound below S
    return dict(batch, inputs=inputs, targets=targets)
  positions = prediction_positions(targets, max_predictions(inputs.shape[1], cfg.mask_rate))
  return dict(batch, inputs=inputs, targets=jnp.take_along_axis(targets, positions, axis=1),
              predict_positions=positions)


def max_predictions(length: int, mask_rate: float) -> int:
  """K = max(1, floor(r S + 1/2)): no row of S tokens has more chosen tokens than this
  (``txf.ops.mlm_mask`` chooses max(1, floor(r n + 1/2)) of n <= S eligible ones)."""
  return min(length, max(1, int(mask_rate * length + 0.5)))


def prediction_positions(targets: jnp.ndarray, k: int) -> jnp.ndarray:
  """int32 [B, K]: each row's chosen positions (``targets`` != 0) in order, then unchosen ones
  (whose gathered targets are 0: weight 0) up to K."""
  return jnp.argsort(targets == 0, axis=1, stable=True)[:, :k].astype(jnp.int32)


def mlm_loss(label_smoothing: float = 0.0):
  """The family's objective (a ``txf.models.LossFn``): sum over the chosen positions of the
  label-smoothed cross-entropy, terms count (chosen tokens), nll_sum, correct (argmax = original).

  Training masks with ``split(rng)[0]`` of the step's rng (the other half is dropout's), so a
  resumed run masks as the uninterrupted one; evaluation (rng None) with the fixed key
  ``EVAL_MASK_SEED``, so every evaluation scores the same masks. A batch with ``targets`` is
  already masked and is scored as given."""

  base = cross_entropy_loss(label_smoothing)  # weights: 1 at the chosen positions (targets != 0)

  def loss_fn(model, params, batch, rng):
    dropout_rng = rng
    if "targets" not in batch:
      mask_rng, dropout_rng = corruption_rngs(rng, EVAL_MASK_SEED)
      batch = mask_batch(model.config, batch, mask_rng)
    return base(model, params, batch, dropout_rng)

  return loss_fn
