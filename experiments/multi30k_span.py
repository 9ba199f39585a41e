"""T5's span corruption on Multi30k's training text (English and German sentences as one unlabelled
stream): a pretraining of the Transformer-Tiny shapes of experiments/multi30k_en_de_tiny.py, with
the same data files and tokenizer settings (8000-piece joint BPE sentencepiece) plus 100 sentinels
<extra_id_0..99> as its top ids, so that its parameters (an encoder_decoder's) and tokenizer can be
fine-tuned into the translation model. Run from the repository root with the shared data beside it:

  TXF_DATA=../shared/data txf train --config experiments/multi30k_span.py
  txf generate --workdir runs/multi30k_span --prompt "a man <extra_id_0> a bike ."

Windows of 64 tokens (data.max_input_len) of the train.en + train.de stream, 15% noise in spans of
mean length 3 (T5's): 10 noise tokens in 3 spans, so the encoder reads 58 tokens and the decoder
predicts 14. Only a 30-step smoke run is set (it checks the pipeline, not a measured pretraining);
raise num_train_steps for a real one.
"""

from txf.core.config import base_config


def get_config():
  config = base_config()
  config.name = "multi30k_span"              # workdir defaults to runs/multi30k_span
  config.seed = 0                            # parameters, dropout, data order and corruption
  config.num_train_steps = 30                # a smoke run: raise it for a real pretraining
  config.batch_size = 64                     # rows of the evaluation batches (training rows come from tokens)
  config.log_every = 10                      # train metrics every 10 steps
  config.eval_every = 30                     # val loss / accuracy at the end
  config.eval_batches = 4                    # 4 x 64 windows of the val stream
  config.checkpoint_every = 30               # one checkpoint, at the end
  config.decode_examples = 0                 # span corruption is not decoded in the loop
  config.num_samples = 0                     # no samples printed

  config.model.family = "span_corruption"    # T5's objective on the EncoderDecoder
  config.model.d_model = 128                 # Transformer-Tiny, as experiments/multi30k_en_de_tiny.py
  config.model.num_heads = 4                 # d_k = 32
  config.model.d_ff = 256                    # 2 x d_model
  config.model.num_encoder_layers = 4
  config.model.num_decoder_layers = 4
  config.model.dropout_rate = 0.1            # T5's pretraining dropout
  config.model.share_embeddings = True       # one table for both sides: the vocabulary is joint
  config.model.max_len = 128                 # the translation model's, so the fine-tune keeps the tables

  config.optimizer.warmup_steps = 1000       # the translation model's schedule
  config.optimizer.learning_rate_scale = 0.358  # peak lr 0.001 at step 1000: at the translation
                                             # model's 0.005 the decoder stops reading the
                                             # encoder (its last LayerNorm scale ends at 0.02)
  config.optimizer.label_smoothing = 0.0     # T5 pretrains without smoothing

  config.pretrain.noise_density = 0.15       # T5's
  config.pretrain.mean_span_length = 3.0     # T5's
  config.pretrain.num_sentinels = 100        # <extra_id_0..99>, the top 100 of the 8000 ids

  config.data.source = "text:multi30k"       # $TXF_DATA/multi30k (data.path "" = the TXF_DATA variable)
  config.data.path = ""                      # TXF_DATA decides, e.g. TXF_DATA=../shared/data
  config.data.format = "parallel"            # both sides of each pair, as one text stream
  config.data.file_pattern = "tok/{split}.lc.norm.tok.{lang}"  # the translation model's files
  config.data.src_lang = "en"                # the stream: each pair's English sentence ...
  config.data.tgt_lang = "de"                # ... then its German one
  config.data.train_split = "train"          # 29000 pairs
  config.data.eval_split = "val"             # 1014 pairs
  config.data.test_split = "test_2016_flickr"  # 1000 pairs
  config.data.tokenizer = "sentencepiece"    # trained on train.en + train.de
  config.data.vocab_size = 8000              # 7900 pieces + 100 sentinels
  config.data.spm_model_type = "bpe"         # the translation model's
  config.data.joint_vocab = True             # one vocabulary for both languages
  config.data.max_input_len = 64             # L: raw tokens per window
  config.data.max_target_len = 64            # unused by span corruption (the targets' length follows L)
  config.data.tokens_per_batch = 4096        # 64 windows of 64 tokens per update
  return config
