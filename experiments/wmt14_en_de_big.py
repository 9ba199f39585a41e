"""WMT14 English -> German, the paper's Transformer (big): 28.4 BLEU on newstest2014 in the paper.

NEEDS A DOWNLOAD AND ACCELERATORS. Prepare the training data (~4.5M pairs) once on a machine with
network access, as for experiments/wmt14_en_de_base.py:

  txf prepare-data wmt14_translate/de-en --data_dir /data/tfds
  txf train --config experiments/wmt14_en_de_big.py --config.data.data_dir=/data/tfds

The paper trained 300k steps on 8 P100 GPUs (3.5 days). This config is the base config
(experiments/wmt14_en_de_base.py, with its notes on the differences from the paper) with the
paper's table 3 row "big": d_model 1024, d_ff 4096, 16 heads, P_drop 0.3, 300k steps. (The paper
averaged the last 20 checkpoints of its big models; this keeps the base's 5: raise
keep_checkpoints to 20 to do the same with `txf average-checkpoints --last 20`.)
"""

from txf.core.config import load_experiment


def get_config():
  config = load_experiment("wmt14_en_de_base")
  config.name = "wmt14_en_de_big"            # workdir defaults to runs/wmt14_en_de_big
  config.num_train_steps = 300000            # the paper's big schedule (base: 100k)
  config.model.d_model = 1024                # the paper's big model (base: 512)
  config.model.num_heads = 16                # d_k = d_v = 64 (base: 8 heads)
  config.model.d_ff = 4096                   # base: 2048
  config.model.dropout_rate = 0.3            # P_drop: EN-DE big used 0.3 (EN-FR big: 0.1)
  return config
