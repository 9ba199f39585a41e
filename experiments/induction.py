"""Induction heads: a 2-layer attention-only decoder LM on sequences that repeat a random half.

Each sequence is x x for a random string x of 8 to 16 symbols (``synthetic:repeat``): the first
half is unpredictable, the second is predictable only by finding the earlier occurrence of the
current token and copying the token after it, what a previous-token head (layer 0) composed with
an induction head (layer 1) does. Positions are ALiBi's (a fixed linear penalty on each head's
attention logits by distance, steepest in head 0): with no absolute position in the residual
stream, the model cannot find the earlier copy by an offset and learns the content-matching
circuit. About 2 minutes on a quiet 2-core CPU. notebooks/05_inside scores each head and removes
it; docs/inspect.md has the numbers.
"""

from txf.core.config import base_config


def get_config():
  config = base_config()
  config.name = "induction"
  config.seed = 0
  config.num_train_steps = 10000
  config.batch_size = 32
  config.log_every = 250
  config.eval_every = 0                      # evaluate at the end only
  config.checkpoint_every = 1000
  config.num_samples = 0

  config.model.family = "decoder_lm"
  config.model.d_model = 64
  config.model.num_heads = 4                 # d_k = 16
  config.model.d_ff = 0                      # attention only: no FFN sublayer
  config.model.num_encoder_layers = 0
  config.model.num_decoder_layers = 2
  config.model.dropout_rate = 0.0
  config.model.pre_ln = True
  config.model.positional = "alibi"          # relative only: no offset shortcut to the earlier copy
  config.model.max_len = 40

  config.optimizer.warmup_steps = 100
  config.optimizer.learning_rate_scale = 1.0
  config.optimizer.label_smoothing = 0.0

  config.data.source = "synthetic:repeat"    # x x, x 8 to 16 random symbols of 64
  config.data.synthetic_min_len = 8        # lengths vary: no fixed offset finds the earlier copy
  config.data.synthetic_max_len = 16
  config.data.synthetic_vocab = 64
  config.data.max_target_len = 33            # 2 x 16 + EOS
  return config
