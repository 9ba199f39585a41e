"""Does bfloat16 compute keep Transformer-Tiny's quality? float32 against ``model.dtype=bfloat16``
(bf16 products and activations; parameters, Adam's state, the softmax and the loss in float32,
the residual stream in float32 by default), 3 seeds each, at equal updates.

Multi30k en-de, Transformer-Tiny (experiments/multi30k_en_de_tiny.py) at ~4k tokens a side per
update, shortened as experiments/sweeps/table3.py is (800 updates, the warmup cut to 300 with the
peak learning rate kept at 0.005, a 300-step linear cooldown). Every 200 updates: the val loss,
per-wordpiece perplexity and tok-lc BLEU of greedy decoding of the whole val set (1,014
sentences), so the report's curves (report_curves.csv, report.png) give each arm's mean with its
95% interval at every evaluation; the compared values are those at the last step.

  TXF_DATA=../shared/data txf sweep experiments/sweeps/bf16_quality.py --parallel 2
  txf sweep report runs/sweeps/bf16_quality

On a CPU without bf16 units (no AVX512-BF16 or AMX) the bfloat16 arm is emulated and slow.
"""


def get_sweep():
  return {
      "config": "experiments/multi30k_en_de_tiny.py",
      "overrides": {"optimizer.warmup_steps": 300, "optimizer.learning_rate_scale": 0.98,
                    "optimizer.cooldown_steps": 300,
                    "eval_every": 200, "decode_examples": 1014, "log_every": 100,
                    "checkpoint_every": 200, "keep_checkpoints": 2,
                    "num_samples": 0, "time_limit_minutes": 0.0,
                    "data.tokens_per_batch": 4096},
      "arms": {"float32": {"model.dtype": "float32"},
               "bfloat16": {"model.dtype": "bfloat16"}},
      "baseline": "float32",
      "seeds": 3,
      "metrics": ["eval/bleu", "eval/loss", "eval/perplexity"],
      "mode": "final",
      "steps": 800,
  }
