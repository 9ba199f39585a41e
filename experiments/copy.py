"""A tiny model on the copy task: the smoke test of the whole pipeline (well under a minute)."""

from txf.core.config import base_config


def get_config():
  config = base_config()
  config.name = "copy"
  config.num_train_steps = 300               # enough for a tiny model to copy
  config.batch_size = 32
  config.log_every = 25
  config.eval_every = 0                      # evaluate at the end only
  config.checkpoint_every = 100
  config.decode_examples = 100
  config.num_samples = 2

  config.model.d_model = 64                  # tiny
  config.model.num_heads = 2
  config.model.d_ff = 128
  config.model.num_encoder_layers = 1
  config.model.num_decoder_layers = 1
  config.model.dropout_rate = 0.0            # no regularisation needed to copy
  config.model.max_len = 32

  config.optimizer.warmup_steps = 50
  config.optimizer.learning_rate_scale = 0.3   # peak lr = 0.3 * (64 * 50)^-0.5 = 0.0053
  config.optimizer.label_smoothing = 0.0

  config.data.source = "synthetic:copy"      # target = source
  config.data.synthetic_min_len = 3
  config.data.synthetic_max_len = 8
  config.data.synthetic_vocab = 10
  config.data.max_input_len = 10
  config.data.max_target_len = 10
  return config
