"""A scaling ladder for `txf sweep --fit`: 4 widths x 3 token budgets on Tiny Shakespeare
(characters), 3 seeds each, fitted to L(N) = E + A N^-alpha, L(D) = E + B D^-beta and
L(N, D) = E + A N^-alpha + B D^-beta with 90% bootstrap intervals (docs/sweeps.md).

Widths d_model 32, 64, 128, 256 (d_ff = 4 d_model, 4 heads, 2 decoder layers: N = 24 d_model^2
non-embedding parameters, 25k to 1.6M); 250, 500 and 1000 steps of 32 windows of 128 characters
(D = 1.0M, 2.0M, 4.1M tokens), each with its own warmup + cosine schedule to 10% of the peak
rate at its end. Metric: the final validation loss (nats per character, 16 x 32 windows).

The widths train under muP with base width 32 (model.parametrization=mup: docs/mup.md), so the
peak rate 3e-3 set at width 32 holds at every width. In the standard parametrization at that rate
the 256-wide runs stall on the unigram plateau (3.3 nats) for hundreds of steps and end 1.98 to
3.3 by seed: the ladder's largest width would measure its learning rate, not its size.

  TXF_DATA=../shared/data txf sweep experiments/sweeps/ladder.py --parallel 2 --fit
  txf sweep report runs/sweeps/ladder --fit --holdout w=256,steps=1000

The second command fits the laws without the largest run and checks their prediction against it.
"""

WIDTHS = (32, 64, 128, 256)
STEPS = (250, 500, 1000)


def get_sweep():
  arms = {f"w={w},steps={s}": {"model.d_model": w, "model.d_ff": 4 * w, "num_train_steps": s}
          for w in WIDTHS for s in STEPS}
  return {
      "config": "experiments/shakespeare_char.py",
      "overrides": {"model.parametrization": "mup", "model.mup_base_width": 32,
                    "model.num_heads": 4, "model.num_decoder_layers": 2, "model.max_len": 256,
                    "data.max_target_len": 128, "batch_size": 32,
                    "optimizer.schedule": "cosine", "optimizer.learning_rate": 3e-3,
                    "optimizer.warmup_steps": 20, "optimizer.final_lr_fraction": 0.1,
                    "optimizer.cooldown_steps": 0, "time_limit_minutes": 0.0,
                    "eval_every": 0, "checkpoint_every": 0, "eval_batches": 16,
                    "num_samples": 0},
      "arms": arms,
      "seeds": 3,
      "metric": "eval/loss",
      "mode": "final",
  }
