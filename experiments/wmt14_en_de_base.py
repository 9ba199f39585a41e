"""WMT14 English -> German, the paper's Transformer (base): 27.3 BLEU on newstest2014 in the paper.

NEEDS A DOWNLOAD AND ACCELERATORS. The training data (~4.5M sentence pairs, several GB) is not in
../shared/data (only newstest2014 is); prepare it once on a machine with network access:

  txf prepare-data wmt14_translate/de-en --data_dir /data/tfds
  txf train --config experiments/wmt14_en_de_base.py --config.data.data_dir=/data/tfds

Offline, an unprepared dataset fails in seconds with these instructions. The paper trained 100k
steps on 8 P100 GPUs (~12 hours); on a 2-core CPU one step of this model takes minutes.
Paper settings kept: d_model 512, 6+6 layers, 8 heads, d_ff 2048, P_drop 0.1, label smoothing 0.1,
Adam(0.9, 0.98, 1e-9), warmup 4000, ~25k source + ~25k target tokens per batch, beam 4, alpha 0.6.
The paper averaged the last 5 checkpoints: `txf average-checkpoints --workdir runs/wmt14_en_de_base
--last 5` writes that average (keep_checkpoints is 5), `txf eval --params params_avg5.msgpack` scores it.
Differences: a 32k joint SentencePiece BPE (the paper: 37k BPE), checkpoints every 2000 steps (the
paper: every 10 minutes), BLEU by sacrebleu on detokenized text (the paper: tokenized BLEU), so
expect a point or so lower.
"""

from txf.core.config import base_config


def get_config():
  config = base_config()
  config.name = "wmt14_en_de_base"           # workdir defaults to runs/wmt14_en_de_base
  config.seed = 0
  config.num_train_steps = 100000            # the paper's base schedule
  config.batch_size = 256                    # rows of the evaluation batches (training rows come from tokens)
  config.log_every = 100
  config.eval_every = 5000                   # newstest2013 loss and BLEU every 5000 steps
  config.checkpoint_every = 2000             # the paper saved every 10 minutes
  config.keep_checkpoints = 5                # the last 5 (the paper averaged them)
  config.decode_examples = 500               # newstest2013 sentences decoded per evaluation
  config.beam_size = 4                       # the paper's beam
  config.alpha = 0.6                         # the paper's length penalty
  config.decode_max_extra = 50               # output length <= input length + 50, as the paper
  config.parallelism = "pmap"                # data parallel over the accelerators

  config.model.family = "encoder_decoder"    # translation
  config.model.d_model = 512                 # the paper's base model
  config.model.num_heads = 8                 # d_k = d_v = 64
  config.model.d_ff = 2048                   # inner FFN width
  config.model.num_encoder_layers = 6        # N = 6
  config.model.num_decoder_layers = 6
  config.model.dropout_rate = 0.1            # P_drop
  config.model.share_embeddings = True       # shared source/target embedding (joint vocabulary)
  config.model.tie_output = True             # pre-softmax linear = the embedding, as the paper
  config.model.max_len = 512                 # 256-piece sentences + decoding room

  config.optimizer.warmup_steps = 4000       # the paper's warmup
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
  config.data.tokens_per_batch = 25000       # ~25k source and ~25k target token slots per step
  return config
