"""The one frozen config every module receives (Flax-example style: no kwarg plumbing)."""

import dataclasses
from typing import Any, Optional

import jax.numpy as jnp

from txf import kernels

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def padded_size(size: int, multiple: int) -> int:
  """ceil(size / multiple) * multiple (``size`` itself for multiple <= 1)."""
  multiple = max(int(multiple or 1), 1)
  return -(-int(size) // multiple) * multiple


def resolve_dtype(name: str, backend: Optional[str] = None) -> str:
  """The compute dtype ``model.dtype`` names: "auto" -> "bfloat16" on TPU and GPU (parameters,
  optimizer state, softmax and loss stay float32), "float32" on CPU; any other name as given.
  ``backend``: "cpu" | "gpu" | "tpu" (default: the running backend, txf.kernels.backend)."""
  if name != "auto":
    return name
  return "float32" if (backend or kernels.backend()) == "cpu" else "bfloat16"


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyper-parameters of one model; eval/decode variants are ``dataclasses.replace`` copies.

  Attributes are those of ``config.model`` in an experiment file (see experiments/default.py for
  what each means), plus the sizes the data decides and the two run-mode switches.
  """
  family: str = "encoder_decoder"      # encoder_decoder | encoder_classifier | decoder_lm
  vocab_size: int = 32                 # source (or only) vocabulary
  target_vocab_size: int = 0           # 0: same vocabulary as the source
  vocab_multiple: int = 1              # embedding/output tables get ceil(V / m) * m rows (padding never predicted)
  num_classes: int = 2                 # encoder_classifier only
  d_model: int = 128
  num_heads: int = 4
  d_ff: int = 512
  num_encoder_layers: int = 2
  num_decoder_layers: int = 2
  dropout_rate: float = 0.1            # residual dropout: every sublayer output, embeddings + PE
  attention_dropout_rate: float = 0.0  # on attention weights (0 in the paper)
  pre_ln: bool = False                 # False: post-LN as the paper, LN(x + Dropout(F(x)))
  share_embeddings: bool = True        # one embedding matrix for source and target
  tie_output: bool = True              # logits = h E^T with the target embedding E
  positional: str = "sinusoidal"       # sinusoidal | learned | none
  max_len: int = 256                   # longest sequence (learned PE table size, decode cache)
  layer_norm_eps: float = 1e-6
  pooling: str = "mean"                # encoder_classifier: mean | first
  attention_impl: str = "auto"         # auto (per backend) | reference (einsum, weights) | fused (jax.nn.dot_product_attention)
  dtype: str = "float32"               # compute dtype (auto: resolve_dtype); parameters stay float32
  # options a Marian (OPUS-MT) checkpoint needs; the defaults are the paper's
  activation: str = "relu"             # FFN activation: relu | gelu | swish
  positional_layout: str = "interleaved"  # sinusoidal PE: interleaved sin/cos | sin_cos (sines, then cosines)
  position_offset: int = 0             # added to every position before the sinusoidal PE
  embed_scale: bool = True             # token embeddings times sqrt(d_model)
  attention_bias: bool = False         # biases on the Q, K, V and output projections
  logits_bias: bool = False            # a learned vector added to the output logits
  decoder_start_id: int = 1            # the id that starts every decoder input (BOS; Marian: its pad)
  forbid_pad: bool = False             # decoding never generates id 0 (PAD)
  remat: str = "none"                  # none | full | a jax.checkpoint_policies name (txf.nn.stack)
  scan_layers: bool = False            # True: each stack is one nn.scan, parameters [N, ...] under "layers"
  deterministic: bool = False          # True disables dropout (eval, decode)
  decode: bool = False                 # True: one position per call with a KV cache

  @property
  def tgt_vocab_size(self) -> int:
    return self.target_vocab_size or self.vocab_size

  @property
  def padded_vocab_size(self) -> int:
    """Rows of the source (or only) embedding table: ``vocab_size`` rounded up to ``vocab_multiple``."""
    return padded_size(self.vocab_size, self.vocab_multiple)

  @property
  def padded_tgt_vocab_size(self) -> int:
    """Rows of the target embedding / columns of the output layer: ``tgt_vocab_size`` rounded up
    to ``vocab_multiple``. Logits are computed over these and cut back to ``tgt_vocab_size``."""
    return padded_size(self.tgt_vocab_size, self.vocab_multiple)

  @property
  def compute_dtype(self) -> Any:
    return jnp.dtype(resolve_dtype(self.dtype))

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads
