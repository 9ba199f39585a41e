"""SST-2 sentiment (GLUE): an encoder-only Transformer classifier, 2 classes, CPU-sized.

Data: ``text:sst2`` = ``$TXF_DATA/sst2/{train,dev}.tsv`` (sentence<TAB>label, 1 = positive). Run from
the repository root with the shared data beside it:

  TXF_DATA=../shared/data txf train --config experiments/sst2.py

The standard figure is dev accuracy (872 sentences); train also holds phrases. Never evaluate on
rt-polarity after training here (same Rotten Tomatoes snippets).
"""

from txf.config import base_config


def get_config():
  config = base_config()
  config.name = "sst2"                       # workdir defaults to runs/sst2
  config.num_train_steps = 4000              # ~4 epochs of the 67k training phrases at batch 64
  config.time_limit_minutes = 15.0           # ends here if the 4000 steps take longer (2 cores: ~2450 steps)
  config.batch_size = 64                     # sentences per step
  config.eval_every = 250                    # dev loss / accuracy every 250 steps
  config.checkpoint_every = 250
  config.best_metric = "accuracy"            # also keep the checkpoint with the best dev accuracy
  config.decode_examples = 0                 # nothing to decode: a classifier
  config.num_samples = 0

  config.model.family = "encoder_classifier"  # encoder -> mean pool -> linear over 2 classes
  config.model.d_model = 256                 # small width for a CPU
  config.model.num_heads = 4                 # d_k = 64
  config.model.d_ff = 1024                   # 4 x d_model, the paper's ratio
  config.model.num_encoder_layers = 3        # N = 3
  config.model.num_decoder_layers = 0        # no decoder
  config.model.dropout_rate = 0.2            # from scratch on 67k phrases overfits within ~2 epochs
  config.model.pooling = "mean"              # mean over real tokens
  config.model.max_len = 128                 # covers data.max_input_len

  config.optimizer.warmup_steps = 1000       # short warmup for a short run
  config.optimizer.learning_rate_scale = 0.25  # peak lr 4.9e-4; at 1.0 (2.0e-3) dev accuracy swung by 14 points
  config.optimizer.label_smoothing = 0.0     # plain cross-entropy for 2 classes

  config.data.source = "text:sst2"           # $TXF_DATA/sst2 (data.path "" = the TXF_DATA variable)
  config.data.path = ""                      # TXF_DATA decides, e.g. TXF_DATA=../shared/data
  config.data.format = "tsv"                 # sentence<TAB>label rows
  config.data.train_split = "train"          # train.tsv
  config.data.eval_split = "dev"             # dev.tsv: the standard SST-2 figure
  config.data.test_split = "test"            # absent in the shared copy: skipped with a log line
  config.data.tokenizer = "sentencepiece"    # trained on train.tsv, stored in the run's workdir
  config.data.vocab_size = 8000              # small vocabulary for 67k short phrases
  config.data.spm_model_type = "bpe"         # BPE trains in ~1 s (unigram ~10x slower)
  config.data.max_input_len = 96             # SST-2 sentences are at most ~70 pieces
  config.data.truncate = True                # keep the rare longer sentence, truncated (counted, logged)
  config.data.bucketing = True               # short phrases in short batches: less padding
  return config
