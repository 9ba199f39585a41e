"""The one frozen config every module receives (Flax-example style: no kwarg plumbing)."""

import dataclasses
from typing import Any, Optional

import jax.numpy as jnp

from txf import kernels, ops
from txf.core.config import base_config

from txf.core.specials import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: F401  (re-exported)


def padded_size(size: int, multiple: int) -> int:
  """ceil(size / multiple) * multiple (``size`` itself for multiple <= 1)."""
  multiple = max(int(multiple or 1), 1)
  return -(-int(size) // multiple) * multiple


def resolve_dtype(name: str, backend: Optional[str] = None) -> str:
  """The compute dtype ``model.dtype`` names: "auto" -> "bfloat16" on TPU and GPU, "float32" on CPU;
  "prefer_bfloat16" -> "bfloat16" wherever bf16 products run faster than float32 ones (TPU, GPU, a
  CPU with bf16 dot units: txf.kernels.has_bf16_units), "float32" on other CPUs; any other name as
  given. Parameters, optimizer state, softmax and loss stay float32 in every case.
  ``backend``: "cpu" | "gpu" | "tpu" (default: the running backend, txf.kernels.backend)."""
  if name == "prefer_bfloat16":
    return "bfloat16" if kernels.has_bf16_units(backend) else "float32"
  if name != "auto":
    return name
  return "float32" if (backend or kernels.backend()) == "cpu" else "bfloat16"


# The fields the data and the run mode decide, which an experiment's ``config.model`` does not hold.
# Every other field of TransformerConfig, with its type and default, is a ``config.model`` field of
# ``txf.core.config.base_config()`` (declared there only, with what it means).
SIZE_FIELDS = (
    ("vocab_size", int, 32),                # source (or only) vocabulary
    ("target_vocab_size", int, 0),          # 0: same vocabulary as the source
    ("num_classes", int, 2),                # encoder_classifier only
    ("deterministic", bool, False),         # True disables dropout (eval, decode)
    ("decode", bool, False),                # True: one position per call with a KV cache
    ("mask_id", int, 0),                    # encoder_mlm training: the tokenizer's mask token (0: none)
    ("first_sentinel", int, 0),             # span_corruption: the tokenizer's <extra_id_0> id (else 0)
)


class _TransformerConfigBase:
  """Hyper-parameters of one model; eval/decode variants are ``dataclasses.replace`` copies.

  Attributes are those of ``config.model`` (``txf.core.config.base_config``: the paper's base model,
  ``dtype="auto"``, ``vocab_multiple=0`` = no padding rows), those of ``config.pretrain`` (the
  self-supervised objectives' settings, read by their losses), plus ``SIZE_FIELDS``: the sizes
  and ids the data decides and the two run-mode switches.
  """

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
  def stream_dtype(self) -> Any:
    """The residual stream's dtype: float32 (``residual_dtype="float32"``, the default: with bf16
    compute the sublayers run in bf16 and the sums x + Sublayer(x) and LayerNorm stay float32), or
    the compute dtype (``"compute"``)."""
    return jnp.dtype(jnp.float32) if self.residual_dtype == "float32" else self.compute_dtype

  @property
  def gated_ffn(self) -> bool:
    """True when ``activation`` names a gated FFN (reglu, geglu, swiglu: ``txf.ops.is_gated``)."""
    return ops.is_gated(self.activation)

  @property
  def ffn_hidden(self) -> int:
    """The FFN's hidden size, what sizes W1 [d_model, ffn_hidden] (and V, W2): ``d_ff``, or for a
    gated FFN with ``ffn_match_params`` ``txf.ops.matched_hidden_size(d_ff)`` (~2 d_ff / 3)."""
    if self.ffn_match_params and self.gated_ffn:
      return ops.matched_hidden_size(self.d_ff)
    return self.d_ff

  @property
  def d_k(self) -> int:
    """The width d_k = d_v of one attention head: ``head_dim`` when set (> 0), else
    d_model / num_heads (the paper's)."""
    return self.head_dim or self.d_model // self.num_heads


TransformerConfig = dataclasses.make_dataclass(
    "TransformerConfig",
    [(name, type(value), dataclasses.field(default=value))
     for name, value in base_config().model.items()]
    + [(name, type(value), dataclasses.field(default=value))
       for name, value in base_config().pretrain.items()]
    + [(name, kind, dataclasses.field(default=value)) for name, kind, value in SIZE_FIELDS],
    bases=(_TransformerConfigBase,), frozen=True, namespace={"__module__": __name__})
TransformerConfig.__doc__ = _TransformerConfigBase.__doc__
