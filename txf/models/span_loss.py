"""The span_corruption family's objective: T5's span corruption (txf.ops.span_corruption) of each
batch, then the label-smoothed cross-entropy of the EncoderDecoder on the corrupted pair."""

from txf.models.loss import LossFn, corruption_rngs, cross_entropy_loss
from txf.ops.span_corruption import span_corrupt

EVAL_KEY_SEED = 0  # evaluation corrupts with jax.random.key(EVAL_KEY_SEED): the same pairs every time


def span_corruption_loss(label_smoothing: float = 0.0) -> LossFn:
  """loss(model, params, batch, rng): ``batch["inputs"]`` int [B, L] raw tokens ->
  (x, y) = span_corrupt(inputs, r_c, cfg.noise_density, cfg.mean_span_length,
  cfg.first_sentinel) with cfg = model.config, then ``cross_entropy_loss(label_smoothing)`` on
  {inputs: x, targets: y} (sum_t w_t LS-CE_t over y's real tokens, sentinels and EOS included).

  r_c: in training the first half of ``jax.random.split(rng)`` (the step's rng, so a resumed run
  corrupts alike), the second half being the dropout rng; in evaluation (rng None) a fixed key.
  ``batch["targets"]`` (zeros: the task's placeholder) is not read.
  """
  base = cross_entropy_loss(label_smoothing)

  def loss_fn(model, params, batch, rng):
    cfg = model.config
    corrupt_rng, dropout_rng = corruption_rngs(rng, EVAL_KEY_SEED)
    inputs, targets = span_corrupt(batch["inputs"], corrupt_rng, cfg.noise_density,
                                   cfg.mean_span_length, cfg.first_sentinel)
    return base(model, params, {"inputs": inputs, "targets": targets}, dropout_rng)

  return loss_fn
