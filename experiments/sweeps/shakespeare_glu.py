"""A published direction, reproduced with its noise: gated FFNs against ReLU at equal parameter
count (Shazeer 2020, "GLU Variants Improve Transformer"; Narang et al. 2021 found the gated FFNs
among the few modifications that survive a fair comparison).

Tiny Shakespeare, character level (experiments/shakespeare_char.py), shortened to fit this 2-core
CPU: d_model 128, 2 decoder layers, d_ff 512, context 128, 600 steps (the paper's warmup 200, a
200-step cooldown), 5 seeds per arm. The gated FFNs keep the dense FFN's parameter count
(``model.ffn_match_params``: hidden size 2 d_ff / 3 = 344 for d_ff 512). Metric: the validation
loss in nats per character at the last step (eval_batches 16 x 32 windows).

  TXF_DATA=../shared/data txf sweep experiments/sweeps/shakespeare_glu.py --parallel 2
  txf sweep report runs/sweeps/shakespeare_glu
"""


def get_sweep():
  return {
      "config": "experiments/shakespeare_char.py",
      "overrides": {"model.d_model": 128, "model.num_decoder_layers": 2, "model.d_ff": 512,
                    "model.max_len": 256, "data.max_target_len": 128,
                    "optimizer.warmup_steps": 200, "optimizer.cooldown_steps": 200,
                    "eval_every": 200, "checkpoint_every": 200, "eval_batches": 16,
                    "num_samples": 0, "time_limit_minutes": 0.0},
      "arms": {"relu": {},
               "swiglu": {"model.activation": "swiglu", "model.ffn_match_params": True},
               "geglu": {"model.activation": "geglu", "model.ffn_match_params": True}},
      "baseline": "relu",
      "seeds": 5,
      "metric": "eval/loss",
      "mode": "final",
      "steps": 600,
  }
