"""Pretrain, then fine-tune, against the same classifier from scratch: does BERT's masked-LM
pretraining on SST-2's own training text (experiments/sst2_mlm.py, no labels) help the classifier
of experiments/sst2.py by more than the seeds' spread?

Arms: ``scratch`` (sst2.py as it is), ``pretrained`` (the same fine-tuning, 2450 steps, from
runs/sst2_mlm's encoder and tokenizer: ``init_from``) and ``pretrained_lr`` (that, at a tenth of
the peak learning rate: 7e-5), 3 seeds each (the seed sets the classifier's
new parameters, dropout and data order; the pretraining is one run, seed 0). Metric: dev accuracy
at its best evaluation (the checkpoint txf keeps as best); test is scored once per run afterwards,
with the parameters dev chose (known_numbers.sh sst2_seeds does both).

  TXF_DATA=../shared/data txf train --config experiments/sst2_mlm.py     # runs/sst2_mlm first
  TXF_DATA=../shared/data txf sweep experiments/sweeps/sst2_pretrained.py
  txf sweep report runs/sweeps/sst2_pretrained
"""


def get_sweep():
  return {
      "config": "experiments/sst2.py",
      "overrides": {"time_limit_minutes": 0.0},   # the step count decides, however busy the CPU
      "arms": {"scratch": {},
               "pretrained": {"init_from": "runs/sst2_mlm"},
               "pretrained_lr": {"init_from": "runs/sst2_mlm",   # a tenth of sst2.py's peak lr
                                 "optimizer.learning_rate_scale": 0.025}},
      "baseline": "scratch",
      "seeds": 3,
      "metric": "eval/accuracy",
      "mode": "max",
  }
