"""Model FLOPs of a training step, counted from the model's shape (``txf plan``, ``txf bench``, MFU)."""

from txf.core import families
from txf.nn import TransformerConfig


def model_train_flops(cfg: TransformerConfig, batch: int, source_len: int, target_len: int) -> float:
  """Model FLOPs of one training step (forward + backward = 3 x forward), matmuls only.

  With d = d_model, f = the FFN's hidden size (``cfg.ffn_hidden``: d_ff, or ~2 d_ff / 3 for a gated
  FFN with ffn_match_params), S/T source/target length, N_e/N_d layers, V the target vocabulary,
  d_q = h d_k the width of the query/output projections and of the scores (d itself unless
  ``model.head_dim`` sets d_k), d_kv = h_kv d_k the width of the key/value projections (d_q unless
  grouped-query attention, ``model.num_kv_heads``), counting 2 FLOPs per multiply-add and full
  (unmasked) attention score matrices:

    FFN, per token and layer:  F = 4 d f (W1, W2); gated (reglu/geglu/swiglu): F = 6 d f (W1, V, W2)
    encoder, per source token and layer:  4 d d_q (Q,O) + 4 d d_kv (K,V) + F + 4 S d_q (QK^T and AV)
    decoder, per target token and layer:  4 d d_q + 4 d d_kv (self Q,O,K,V) + 4 d d_q (cross Q,O)
                                          + F + 4 T d_q (self scores) + 4 S d_q (cross scores)
    decoder cross K,V, per source token and layer: 4 d d_kv
    output projection, per target token: 2 d V (tied: h E^T)

    forward = B [S N_e (4d d_q + 4d d_kv + F + 4S d_q) + T N_d (8d d_q + 4d d_kv + F + 4T d_q
                 + 4S d_q) + S N_d 4d d_kv + 2 T d V]
    train   = 3 x forward   (the backward pass costs two matmuls per forward matmul)

  Embedding lookups, LayerNorm (and QK-norm), softmax, dropout, the loss and Adam are not counted
  (they are in the compiled program's ``cost_analysis`` figure). This equals the familiar 6 N D for
  the weight matmuls (N weights excluding embeddings + the output projection, D tokens) plus the
  attention terms 12 L^2 d per layer and sequence (the scores keep all h query heads: grouping
  the keys/values does not shrink them).
  """
  d, f, s, t = cfg.d_model, cfg.ffn_hidden, source_len, target_len
  ffn = (6 if cfg.gated_ffn else 4) * d * f  # F: the FFN's matmuls per token and layer
  dq = cfg.num_heads * cfg.d_k  # Q/O projection width and score width (d unless model.head_dim)
  dkv = (cfg.num_kv_heads or cfg.num_heads) * cfg.d_k  # K/V projection width (dq unless GQA)
  ne, nd, v = cfg.num_encoder_layers, cfg.num_decoder_layers, cfg.tgt_vocab_size
  encoder = families.get(cfg.family).encoder
  if not encoder:
    ne, s = 0, 0
    decoder_token = 4 * d * dq + 4 * d * dkv + ffn + 4 * t * dq
  else:
    decoder_token = 8 * d * dq + 4 * d * dkv + ffn + 4 * t * dq + 4 * s * dq
  forward = (s * ne * (4 * d * dq + 4 * d * dkv + ffn + 4 * s * dq) + t * nd * decoder_token
             + s * nd * 4 * d * dkv * encoder + 2 * t * d * v)
  return 3.0 * batch * forward
