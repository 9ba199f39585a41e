"""Masked-LM pretraining (BERT's objective) on SST-2's training text, labels ignored: the encoder
that experiments/sst2.py fine-tunes into a classifier.

Data: ``text:sst2``'s train.tsv read as unlabelled text (its sentence column; txf.data.real's
StreamMLMTask cuts the phrases, in order, into windows of data.max_input_len tokens). Each batch is
masked by the family's loss (txf.models.encoder_mlm.mlm_loss): 15% of the tokens chosen, 80% of
those replaced by <mask>, 10% by a random token, 10% kept; the loss and accuracy are over the
chosen tokens only. Run from the repository root with the shared data beside it:

  TXF_DATA=../shared/data txf train --config experiments/sst2_mlm.py
  txf generate --workdir runs/sst2_mlm --prompt "a <mask> movie" --top_k 5

The encoder (d_model, heads, d_ff, layers, max_len) and the tokenizer settings are sst2.py's, so
its parameters fit the classifier's encoder; the tokenizer has one more piece, <mask> (txf trains
it for model.family=encoder_mlm), so the classifier must reuse this run's tokenizer/.
Measured (AMD EPYC, 2 cores, one seed): 8000 steps in about 32 min; masked-token accuracy on dev's
text 27.9% (perplexity 126) at learning_rate_scale 1.0, against 19.6% (296) at sst2.py's 0.25.
"""

from txf.core.config import load_experiment


def get_config():
  config = load_experiment("sst2")           # its encoder, tokenizer and data settings
  config.name = "sst2_mlm"                   # workdir defaults to runs/sst2_mlm
  config.num_train_steps = 8000              # ~3.6 steps/s on 2 cores: about 37 minutes
  config.time_limit_minutes = 40.0           # a guard
  config.best_metric = "accuracy"            # masked-token accuracy on dev's text
  config.model.family = "encoder_mlm"        # encoder -> BERT's MLM head over the vocabulary
  config.model.dropout_rate = 0.1            # BERT's
  config.model.pooling = "mean"              # unused by the MLM head (kept: the classifier's)
  config.optimizer.learning_rate_scale = 1.0  # peak lr 128^-0.5 * 1000^-0.5 = 2.8e-3 (0.25: slower, 19.6% vs 27.9%)
  config.optimizer.label_smoothing = 0.0     # BERT: plain cross-entropy on the chosen tokens
  config.optimizer.weight_decay = 0.01       # BERT's
  config.optimizer.cooldown_steps = 1000     # linearly to 0 over the last 1000 steps
  config.pretrain.mask_rate = 0.15           # BERT's 15% of the tokens
  config.pretrain.mask_token_fraction = 0.8  # 80% of them -> <mask>
  config.pretrain.random_token_fraction = 0.1  # 10% -> a random token, 10% unchanged
  config.pretrain.whole_word = False         # single pieces (True: every piece of a chosen word)
  config.data.bucketing = False              # full windows of max_input_len tokens: nothing to bucket
  return config
