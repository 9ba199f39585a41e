"""Does the best learning rate transfer across widths? The standard parametrization against muP
(model.parametrization=mup, base width 64: docs/mup.md), each at widths 64, 128, 256 and 512 and
seven learning rates a factor 2 apart, 3 seeds each, on Tiny Shakespeare (characters).

Each width scales d_model and d_ff = 4 d_model with 4 heads (d_k = d_model / 4) and 2 decoder
layers, context 128, batch 32; Adam at a constant rate after a 20-step warmup, 300 steps. Under
muP the best rate should stay within one grid step from 64 to 512; in the standard
parametrization it should fall as the width grows. Arms are named PARAM,w=WIDTH,lr=RATE; the
report's table gives each arm's mean final validation loss.

  TXF_DATA=../shared/data txf sweep experiments/sweeps/mup_transfer.py --parallel 2 --pin_cpus
  txf sweep report runs/sweeps/mup_transfer

2 x 4 x 7 arms x 3 seeds = 168 runs: hours on a 2-core CPU, minutes each on a GPU. `--set`
shortens it (e.g. --set num_train_steps=100), and WIDTHS / RATES / SEEDS below select a part.
"""

WIDTHS = (64, 128, 256, 512)
RATES = tuple(2.0 ** -k for k in range(12, 5, -1))   # 2^-12 (2.4e-4) ... 2^-6 (1.6e-2)
SEEDS = 3


def get_sweep():
  arms = {}
  for parametrization in ("standard", "mup"):
    for width in WIDTHS:
      for rate in RATES:
        arms[f"{parametrization},w={width},lr={rate:.3g}"] = {
            "model.parametrization": parametrization, "model.d_model": width,
            "model.d_ff": 4 * width, "optimizer.learning_rate": rate}
  return {
      "config": "experiments/shakespeare_char.py",
      "overrides": {"model.num_heads": 4, "model.num_decoder_layers": 2, "model.max_len": 256,
                    "model.mup_base_width": 64,    # read only by the mup arms
                    "data.max_target_len": 128, "batch_size": 32,
                    "optimizer.schedule": "constant", "optimizer.warmup_steps": 20,
                    "optimizer.cooldown_steps": 0, "time_limit_minutes": 0.0,
                    "eval_every": 300, "checkpoint_every": 300, "eval_batches": 8,
                    "num_samples": 0},
      "arms": arms,
      "baseline": next(iter(arms)),
      "seeds": SEEDS,
      "metric": "eval/loss",
      "mode": "final",
      "steps": 300,
  }
