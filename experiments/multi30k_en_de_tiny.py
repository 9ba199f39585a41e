"""Multi30k English -> German on the multimodal-MT papers' files: Transformer-Tiny of Wu et al. (2021).

Data: ``text:multi30k`` with ``data.file_pattern = "tok/{split}.lc.norm.tok.{lang}"`` =
``$TXF_DATA/multi30k/tok/{train,val,test_2016_flickr}.lc.norm.tok.{en,de}``: lowercased,
punctuation-normalised, Moses-tokenized text (29000 / 1014 / 1000 line pairs). Run from the
repository root with the shared data beside it:

  TXF_DATA=../shared/data txf train --config experiments/multi30k_en_de_tiny.py
  txf average-checkpoints --workdir runs/multi30k_en_de_tiny --last 10
  txf eval --workdir runs/multi30k_en_de_tiny --split val --beam 5 --alpha 1.0 --bleu tok-lc \
    --params params_avg10.msgpack   # choose on val; then --split test_2016_flickr, once

``bash experiments/known_numbers.sh m30k_tiny`` runs all of it, val choosing among the last 10 or 5
checkpoints and alpha 0.6 or 1.0.

The anchor: 41.02 BLEU on test2016, lowercased tokenized text (multi-bleu.perl), Transformer-Tiny
text-only baseline of Wu et al. 2021 ("Good for Misconceived Reasons", ACL): 4+4 layers, d_model 128,
FFN 256, 4 heads, dropout 0.3, shared embeddings, lr 0.005 (inverse square root, 2000 warmup
steps), at most 8,000 updates, the last 10 epoch checkpoints averaged, beam 5. The paper's
command trains on two GPUs with 4,096 tokens each (fairseq's --max-tokens is per GPU), so an
update sees ~8k tokens a side: 8,192 here. The same model, batch, peak lr and warmup here; the
8,000 updates would take ~2 h 45 min on a 2-core AMD EPYC with AVX512-BF16 (~1.2 s a step), so
the 110-minute limit ends training first, after ~5,500 updates (~100 epochs; the paper's own
run could stop early too, on 10 epochs without a better validation loss). The joint vocabulary
is an 8000-piece sentencepiece BPE trained on the tokenized train.{en,de} (the paper: joint BPE).
Checkpoints every 50 steps (about an epoch), the last 10 kept. Results in the README's
known-numbers table. Compute is float32 on CPU; ``--config.model.dtype=prefer_bfloat16`` takes
bf16 products on a CPU with bf16 units, which at the 4k batch trained the 8,000 updates ~1.2x as
fast and scored 0.25 BLEU lower on test2016 (BENCHMARKS.md, "bf16 products for Transformer-Tiny").
"""

from txf.core.config import base_config


def get_config():
  config = base_config()
  config.name = "multi30k_en_de_tiny"        # workdir defaults to runs/multi30k_en_de_tiny
  config.seed = 0                            # parameters, dropout and data order
  config.num_train_steps = 8000              # the paper's --max-update (the time limit ends it first here)
  config.time_limit_minutes = 110.0          # the 2-hour budget, less averaging and beam decoding
  config.batch_size = 128                    # rows of the evaluation batches (training rows come from tokens)
  config.log_every = 100                     # train metrics every 100 steps
  config.eval_every = 500                    # val loss / accuracy / greedy BLEU every 500 steps
  config.checkpoint_every = 50               # ~1 epoch: the last 10 are averaged as the paper's last 10
  config.keep_checkpoints = 10               # txf average-checkpoints --last 10
  config.decode_examples = 500               # val sentences decoded greedily per evaluation
  config.bleu_protocol = "tok-lc"            # the papers' BLEU: lowercased Moses tokens (multi-bleu.perl)
  config.num_samples = 2                     # sample translations printed per evaluation
  config.beam_size = 1                       # greedy in the loop (beam 5 for the final test score)

  config.model.family = "encoder_decoder"    # translation
  config.model.d_model = 128                 # Transformer-Tiny
  config.model.num_heads = 4                 # d_k = 32
  config.model.d_ff = 256                    # 2 x d_model
  config.model.num_encoder_layers = 4
  config.model.num_decoder_layers = 4
  config.model.dropout_rate = 0.3            # the paper's (heavy: 29k sentence pairs)
  config.model.share_embeddings = True       # one table for en and de: the vocabulary is joint
  config.model.max_len = 128                 # sentences are <= 64 pieces; + decoding room

  config.optimizer.warmup_steps = 2000       # the paper's: 2000 of 8000 updates
  config.optimizer.learning_rate_scale = 2.53  # peak lr = 2.53 * 128^-0.5 * 2000^-0.5 = 0.005 (the paper's)
  config.optimizer.label_smoothing = 0.1     # the paper's epsilon_ls

  config.data.source = "text:multi30k"       # $TXF_DATA/multi30k (data.path "" = the TXF_DATA variable)
  config.data.path = ""                      # TXF_DATA decides, e.g. TXF_DATA=../shared/data
  config.data.format = "parallel"            # line-aligned source / target files
  config.data.file_pattern = "tok/{split}.lc.norm.tok.{lang}"  # the papers' lowercased tokenized files
  config.data.src_lang = "en"                # translate English ...
  config.data.tgt_lang = "de"                # ... into German
  config.data.train_split = "train"          # 29000 pairs
  config.data.eval_split = "val"             # 1014 pairs, evaluated during training: every choice is made here
  config.data.test_split = "test_2016_flickr"  # 1000 pairs, test2016
  config.data.tokenizer = "sentencepiece"    # trained on the tokenized train.en + train.de
  config.data.vocab_size = 8000              # joint vocabulary (specials + 256 byte pieces included)
  config.data.spm_model_type = "bpe"         # BPE as the paper
  config.data.joint_vocab = True             # one vocabulary for both languages
  config.data.max_input_len = 64             # nothing dropped (checked in the run's log)
  config.data.max_target_len = 64
  config.data.packing = True                 # ~4 pairs per row, little padding
  config.data.tokens_per_batch = 8192        # ~8k tokens a side: the paper's 4,096 on each of 2 GPUs
  return config
