"""WMT14 English -> German with a 1.0B-parameter Transformer: a model that needs a mesh.

NEEDS A DOWNLOAD AND ACCELERATORS (data as experiments/wmt14_en_de_base.py). d_model 2048, 8+8
layers, d_ff 8192, 16 heads, 32k shared vocabulary: 1.005B parameters. Its float32 parameters and
Adam moments alone are 12 GB, 16 GB with the gradients: it cannot train on one 16 GB device.
With FSDP over 64 devices (``mesh_shape=(1, -1, 1)``) each holds 1/64 of them; size it first:

  txf plan --config experiments/wmt14_en_de_1b.py --devices 64

(The wider 24+24-layer variant, ``--config.model.num_encoder_layers=24
--config.model.num_decoder_layers=24``, has 2.9B parameters.) Not tuned: a sizing example, with the
big model's recipe.
"""

from txf.config import base_config


def get_config():
  config = base_config()
  config.name = "wmt14_en_de_1b"             # workdir defaults to runs/wmt14_en_de_1b
  config.seed = 0
  config.num_train_steps = 300000            # the paper's big schedule (base: 100k)
  config.batch_size = 256                    # rows of the evaluation batches (training rows come from tokens)
  config.log_every = 100
  config.eval_every = 5000                   # newstest2013 loss and BLEU every 5000 steps
  config.checkpoint_every = 2000             # the paper saved every 10 minutes
  config.keep_checkpoints = 5                # the last 5 (the paper averaged them)
  config.decode_examples = 500               # newstest2013 sentences decoded per evaluation
  config.beam_size = 4                       # the paper's beam
  config.alpha = 0.6                         # the paper's length penalty
  config.decode_max_extra = 50               # output length <= input length + 50, as the paper
  config.parallelism = "mesh"                # jit over a device mesh ...
  config.mesh_shape = (1, -1, 1)             # ... FSDP over every device: params and Adam state sharded 1/N

  config.model.family = "encoder_decoder"    # translation
  config.model.d_model = 2048                # big: 1024
  config.model.num_heads = 16                # d_k = d_v = 128
  config.model.d_ff = 8192                   # big: 4096
  config.model.num_encoder_layers = 8        # big: 6
  config.model.num_decoder_layers = 8
  config.model.dropout_rate = 0.3            # as big
  config.model.dtype = "bfloat16"            # bf16 compute, float32 parameters and Adam state
  config.model.share_embeddings = True       # shared source/target embedding (joint vocabulary)
  config.model.tie_output = True             # pre-softmax linear = the embedding, as the paper
  config.model.max_len = 512                 # 256-piece sentences + decoding room

  config.optimizer.warmup_steps = 8000       # a longer warmup for the deeper, wider model
  config.optimizer.learning_rate_scale = 1.0  # lr = d_model^-0.5 * min(step^-0.5, step * 4000^-1.5)
  config.optimizer.label_smoothing = 0.1     # epsilon_ls

  config.data.source = "tfds:wmt14_translate/de-en"  # the tfds catalog builder (both directions)
  config.data.data_dir = ""                  # prepared data: "" = $TXF_DATA_DIR or ~/.cache/txf/tfds
  config.data.path = ""                      # unused by tfds sources (TXF_DATA=../shared/data for text:)
  config.data.src_lang = "en"                # English ...
  config.data.tgt_lang = "de"                # ... into German
  config.data.train_split = "train"          # europarl, commoncrawl, news commentary (~4.5M pairs)
  config.data.eval_split = "validation"      # newstest2013
  config.data.test_split = "test"            # newstest2014: the paper's table
  config.data.tokenizer = "sentencepiece"    # joint BPE, trained on a 1M-sentence even sample
  config.data.vocab_size = 32000             # the paper: 37000 BPE (shared)
  config.data.spm_model_type = "bpe"         # byte-pair encoding, as the paper
  config.data.joint_vocab = True             # one vocabulary for both languages
  config.data.spm_input_sentences = 1000000  # sentences sampled for tokenizer training
  config.data.max_input_len = 256            # longer pairs are dropped (counted and logged)
  config.data.max_target_len = 256
  config.data.bucketing = True               # "batched together by approximate sequence length"
  config.data.num_buckets = 8                # 8 shapes: 32, 64, ..., 256 pieces
  config.data.tokens_per_batch = 65536       # 256 rows of 256 pieces: rows divide over 64 devices
  config.data.read_threads = 8               # tokenizing 4.5M pairs per epoch needs several cores
  return config
