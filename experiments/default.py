"""The default experiment: the built-in toy translation task (reordering + agreement), CPU-sized.

`txf train` with no flags runs this. About 2-3 minutes on a 2-core CPU; held-out exact match
should pass 95%. Every field is documented in txf/core/config.py; the ones set here are commented.
"""

from txf.core.config import base_config


def get_config():
  config = base_config()
  config.name = "default"                    # workdir defaults to runs/default
  config.seed = 0                            # parameters, dropout and data order
  config.num_train_steps = 1200              # optimizer steps
  config.batch_size = 64                     # sentence pairs per step
  config.log_every = 50                      # train metrics every 50 steps
  config.eval_every = 400                    # held-out loss, exact match, samples every 400 steps
  config.checkpoint_every = 400              # checkpoints every 400 steps
  config.decode_examples = 500               # held-out sentences decoded for exact match
  config.num_samples = 4                     # sample translations printed per evaluation

  config.model.family = "encoder_decoder"    # translation
  config.model.d_model = 128                 # small width for a CPU
  config.model.num_heads = 4                 # d_k = 32
  config.model.d_ff = 512                    # 4 x d_model, as in the paper's ratio
  config.model.num_encoder_layers = 2        # N = 2 (paper: 6)
  config.model.num_decoder_layers = 2
  config.model.dropout_rate = 0.1            # the paper's P_drop
  config.model.max_len = 64                  # longest sequence (toy sentences are at most 11 tokens)

  config.optimizer.warmup_steps = 200        # short warmup for a short run
  config.optimizer.learning_rate_scale = 1.0  # peak lr = (128 * 200)^-0.5 = 0.00625
  config.optimizer.label_smoothing = 0.1     # the paper's epsilon_ls

  config.data.source = "synthetic:translate"  # the built-in toy language pair (txf/data/synthetic.py)
  config.data.tokenizer = "word"             # whitespace words over the toy vocabulary
  config.data.max_input_len = 16             # source tokens incl. EOS
  config.data.max_target_len = 16            # target tokens incl. EOS
  return config
