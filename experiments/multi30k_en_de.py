"""Multi30k English -> German (task 1, raw cased text): a 3+3-layer, d=256 Transformer for a CPU.

Data: ``text:multi30k`` = ``$TXF_DATA/multi30k/{train,val,test_2016_flickr}.{en,de}`` (29000 / 1014 /
1000 line pairs). Run from the repository root with the shared data beside it:

  TXF_DATA=../shared/data txf train --config experiments/multi30k_en_de.py

Training ends after 90 minutes (``time_limit_minutes``) or 4000 steps, whichever comes first; a
step of ~4k source + ~4k target token slots takes ~2 s on both cores, ~3.5 s on one. Reference point: a 3+3, d=256 model reaches about 36.5 BLEU de->en on test2016 (greedy);
en->de is usually a few BLEU lower. A joint 8000-piece BPE vocabulary is trained on train.{en,de}
(about a second) and stored in the run's workdir/tokenizer.

Measured on the 2-core CPU (README, "Known numbers"): 2037 steps in the 90 minutes; sacreBLEU on
test_2016_flickr with beam 4 is 36.6 from the last checkpoint and 37.9 from the average of the last
4 (`txf average-checkpoints --workdir runs/multi30k_en_de --last 4`).
"""

from txf.core.config import base_config


def get_config():
  config = base_config()
  config.name = "multi30k_en_de"             # workdir defaults to runs/multi30k_en_de
  config.seed = 0                            # parameters, dropout and data order
  config.num_train_steps = 4000              # upper bound; ~245 packed sentence pairs (~1/118 epoch) per step
  config.time_limit_minutes = 90.0           # the training budget: ends here, evaluated and saved
  config.batch_size = 128                    # rows of the evaluation batches (training rows come from tokens)
  config.log_every = 50                      # train metrics every 50 steps
  config.eval_every = 300                    # val loss / accuracy / samples every 300 steps
  config.checkpoint_every = 150              # resumable every 150 steps; the last 4 can be averaged
  config.keep_checkpoints = 4                # txf average-checkpoints --last 4
  config.decode_examples = 100               # val sentences decoded greedily per evaluation
  config.num_samples = 3                     # sample translations printed per evaluation
  config.beam_size = 1                       # greedy in the loop (beam 4 for the final test score)

  config.model.family = "encoder_decoder"    # translation
  config.model.d_model = 256                 # width
  config.model.num_heads = 4                 # d_k = 64
  config.model.d_ff = 1024                   # 4 x d_model, the paper's ratio
  config.model.num_encoder_layers = 3        # N = 3 (paper: 6)
  config.model.num_decoder_layers = 3
  config.model.dropout_rate = 0.1            # the paper's P_drop
  config.model.share_embeddings = True       # one table for en and de: the vocabulary is joint
  config.model.max_len = 128                 # sentences are <= 64 pieces; + decoding room

  config.optimizer.warmup_steps = 600        # the paper's 4000 is longer than this whole run
  config.optimizer.learning_rate_scale = 0.5  # peak lr = 0.5 * 256^-0.5 * 600^-0.5 = 1.3e-3
  config.optimizer.label_smoothing = 0.1     # the paper's epsilon_ls

  config.data.source = "text:multi30k"       # $TXF_DATA/multi30k (data.path "" = the TXF_DATA variable)
  config.data.path = ""                      # TXF_DATA decides, e.g. TXF_DATA=../shared/data
  config.data.format = "parallel"            # {split}.en / {split}.de line-aligned files
  config.data.src_lang = "en"                # translate English ...
  config.data.tgt_lang = "de"                # ... into German
  config.data.train_split = "train"          # 29000 pairs
  config.data.eval_split = "val"             # 1014 pairs, evaluated during training
  config.data.test_split = "test_2016_flickr"  # 1000 pairs, the usual test2016 figure
  config.data.tokenizer = "sentencepiece"    # trained on train.en + train.de
  config.data.vocab_size = 8000              # joint vocabulary (specials + 256 byte pieces included)
  config.data.spm_model_type = "bpe"         # BPE as the paper; trains in ~1 s (unigram ~10x slower)
  config.data.joint_vocab = True             # one vocabulary for both languages
  config.data.max_input_len = 64             # longest train source is 49 pieces: nothing dropped
  config.data.max_target_len = 64            # longest train target is 54 pieces
  config.data.packing = True                 # ~4 pairs per row: 6% padding instead of 76% (bench)
  config.data.tokens_per_batch = 4096        # 4096 // 64 = 64 packed rows per step
  return config
