"""A published direction, reproduced with its noise: multi-head against grouped-query and
multi-query attention (Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need";
Ainslie et al. 2023, "GQA"): fewer K/V heads cost little quality and shrink the decoding cache.

Multi30k en-de, Transformer-Tiny (experiments/multi30k_en_de_tiny.py: 4+4 layers, d_model 128,
4 heads, FFN 256, dropout 0.3), at ~4k tokens a side per update, shortened to fit this 2-core CPU:
800 updates instead of the paper's ~8,000, the warmup cut to 300 with the peak learning rate kept
at the paper's 0.005 (learning_rate_scale 0.98), a 300-step linear cooldown, 3 seeds per arm.
Arms: ``num_kv_heads`` 4 (multi-head), 2 (grouped-query, 2 query heads per K/V head), 1
(multi-query). Metric: tok-lc BLEU of greedy decoding of the whole val set (1,014 sentences)
at the last step; test2016 is not scored in a study.

  TXF_DATA=../shared/data txf sweep experiments/sweeps/multi30k_kv_heads.py
  txf sweep report runs/sweeps/multi30k_kv_heads
  python -m bench.decode --config transformer_tiny --beam 5 --num_kv_heads 4 2 1
"""


def get_sweep():
  return {
      "config": "experiments/multi30k_en_de_tiny.py",
      "overrides": {"optimizer.warmup_steps": 300, "optimizer.learning_rate_scale": 0.98,
                    "optimizer.cooldown_steps": 300,
                    "eval_every": 800, "decode_examples": 1014, "log_every": 100,
                    "checkpoint_every": 200, "keep_checkpoints": 2,
                    "num_samples": 0, "time_limit_minutes": 0.0,
                    "data.tokens_per_batch": 4096},
      "arms": {"mha": {"model.num_kv_heads": 0},
               "gqa2": {"model.num_kv_heads": 2},
               "mqa": {"model.num_kv_heads": 1}},
      "baseline": "mha",
      "seeds": 3,
      "metric": "eval/bleu",
      "mode": "final",
      "steps": 800,
  }
