"""A sweep: does RMSNorm change the copy task's eval loss? LayerNorm (the paper's) against RMSNorm,
3 seeds each, 150 steps of experiments/copy.py (about 30 s per run on 2 CPU cores).

  txf sweep experiments/sweeps/copy_norm.py --parallel 2
  txf sweep report runs/sweeps/copy_norm
"""


def get_sweep():
  return {
      "config": "experiments/copy.py",         # the base experiment
      "overrides": {"decode_examples": 16,     # every arm
                    "num_samples": 0},
      "arms": {"layer_norm": {},               # the baseline: the experiment as it is
               "rms_norm": {"model.norm": "rms_norm"}},
      "baseline": "layer_norm",
      "seeds": 3,                              # seeds 0, 1, 2
      "metric": "eval/loss",                   # the split/key of metrics.jsonl rows
      "mode": "final",                         # final | min | max
      "steps": 150,                            # num_train_steps of every run
  }
