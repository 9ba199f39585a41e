"""The decoding spec: every setting of a search in one frozen record, built once and passed whole.

A run's config holds its decoding settings (``beam_size``, ``alpha``, ``length_penalty``,
``early_stopping``, ``decode_max_extra``, ``decode_length_bucket``); ``txf eval`` and
``txf translate`` may override some from the command line.
``DecodingSpec.from_config(config, beam_size=..., ...)`` makes the record once; the evaluator,
``translate``, the in-loop evaluation and the compiled decoders take it as it is, so no setting is
dropped or bound to the wrong parameter on the way down. The record is
hashable: the compiled decoders are cached by it.

Beam scores: log p(y) / lp(|y|), with lp the ``length_penalty`` kind (txf.decode.beam):
gnmt ``((5 + L) / 6) ** alpha``, power ``L ** alpha`` (Hugging Face's), average ``L``, none ``1``.
"""

import dataclasses
from typing import Any, Mapping, Optional, Tuple

from txf.decode.beam import PENALTIES
from txf.core.config import complete
from txf.core.errors import TxfError


# Where a field of DecodingSpec acts (its metadata's SEARCH key; none: inside every search):
SEARCH = "search"
OUTSIDE = "outside"   # outside the compiled search (batch shapes, sampling): not in its cache key
BEAM = "beam"         # beam search only: greedy's cache key leaves it out


@dataclasses.dataclass(frozen=True)
class DecodingSpec:
  """How to search.

  beam_size: 1 = greedy, K > 1 = beam search with K beams.
  alpha: the length penalty's exponent (gnmt and power).
  length_penalty: gnmt | power | average | none (see the module doc).
  early_stopping: beam search ends when K hypotheses are finished (Hugging Face's
    ``early_stopping=True``); False: when no live beam can still beat the K finished.
  max_extra: each output has at most its source length (EOS counted) + this many tokens.
  length_bucket: translation batches (txf.decode.decoders.translate_ids) take sources longest
    first, each batch padded to its longest source rounded up to a multiple of this and decoded
    into a buffer of that + ``max_extra`` tokens (one compile per bucket); 0 = every batch in the
    data's order at the full input length and buffer (one compile).
  banned_ids: ids never generated (beside PAD for a model with ``forbid_pad``).
  temperature, top_k, top_p: sampling (language models): 0 temperature = greedy; top_k 0 and
    top_p 1 = no filtering.
  weights_dtype: "" decodes with the run's own weights and compute dtype; "bfloat16" (or
    "float32") casts the weights to it once per call and computes in it (LayerNorm statistics,
    softmax and the matmuls' accumulation stay float32): on a CPU with AVX512-BF16 the matmuls run
    on its bf16 units (txf.decode.adapter.cast_for_decoding).
  """
  beam_size: int = dataclasses.field(default=1, metadata={SEARCH: BEAM})
  alpha: float = dataclasses.field(default=0.6, metadata={SEARCH: BEAM})
  length_penalty: str = dataclasses.field(default="gnmt", metadata={SEARCH: BEAM})
  early_stopping: bool = dataclasses.field(default=False, metadata={SEARCH: BEAM})
  max_extra: int = dataclasses.field(default=50, metadata={SEARCH: OUTSIDE})
  length_bucket: int = dataclasses.field(default=8, metadata={SEARCH: OUTSIDE})
  banned_ids: Tuple[int, ...] = ()
  temperature: float = dataclasses.field(default=1.0, metadata={SEARCH: OUTSIDE})
  top_k: int = dataclasses.field(default=0, metadata={SEARCH: OUTSIDE})
  top_p: float = dataclasses.field(default=1.0, metadata={SEARCH: OUTSIDE})
  weights_dtype: str = ""

  def __post_init__(self):
    # normalise types so equal settings hash equal (0.6 from a flag, 0.6 from a config)
    object.__setattr__(self, "beam_size", int(self.beam_size))
    object.__setattr__(self, "alpha", float(self.alpha))
    object.__setattr__(self, "early_stopping", bool(self.early_stopping))
    object.__setattr__(self, "max_extra", int(self.max_extra))
    object.__setattr__(self, "length_bucket", int(self.length_bucket))
    object.__setattr__(self, "banned_ids", tuple(int(i) for i in self.banned_ids))
    object.__setattr__(self, "temperature", float(self.temperature))
    object.__setattr__(self, "top_k", int(self.top_k))
    object.__setattr__(self, "top_p", float(self.top_p))
    object.__setattr__(self, "weights_dtype", str(self.weights_dtype or ""))

  @property
  def greedy(self) -> bool:
    """Whether the search keeps one hypothesis (``beam_size`` 1)."""
    return self.beam_size == 1

  @property
  def strategy(self) -> str:
    """The name of the search that runs this spec in ``txf.decode.decoders.SEARCHES``: "greedy"
    or "beam" (a subclass with a search of its own names it here)."""
    return "greedy" if self.greedy else "beam"

  def check(self) -> "DecodingSpec":
    """TxfError naming the setting that cannot work (and the flag that sets it); returns self."""
    if self.beam_size < 1:
      raise TxfError(f"--beam={self.beam_size}: the beam size must be >= 1 (1 = greedy)")
    if self.max_extra < 0:
      raise TxfError(f"--max_extra={self.max_extra} must be >= 0")
    if self.length_bucket < 0:
      raise TxfError(f"--length_bucket={self.length_bucket} (config.decode_length_bucket) must be "
                     f">= 0 (0 = one fixed shape)")
    if self.length_penalty not in PENALTIES:
      raise TxfError(f"length_penalty={self.length_penalty!r}: use one of {', '.join(PENALTIES)}")
    if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
      raise TxfError(f"sampling settings temperature={self.temperature}, top_k={self.top_k}, "
                     f"top_p={self.top_p}: need temperature >= 0, top_k >= 0, 0 < top_p <= 1")
    if self.weights_dtype not in WEIGHTS_DTYPES:
      raise TxfError(f"decode_dtype={self.weights_dtype!r} (--decode_dtype): use one of "
                     f"{', '.join(d for d in WEIGHTS_DTYPES if d)} (or leave it out: the run's own)")
    return self

  def search_settings(self) -> "DecodingSpec":
    """The settings a compiled translation search depends on, the others at their defaults.

    Each field says in its metadata (``SEARCH``) where it acts: ``OUTSIDE`` the program
    (``max_extra`` and ``length_bucket`` shape the batches; the sampling settings are not a
    search's), dropped here; ``BEAM`` (the beam size, the length penalty, ``early_stopping``),
    kept by beam search only; any other field, a new one included, is kept. Specs that differ
    only in what is dropped share one compiled program (txf.decode.decoders keys its cache on
    this).
    """
    kept = {}
    for field in dataclasses.fields(self):
      where = field.metadata.get(SEARCH)
      if where is None or (where == BEAM and not self.greedy):
        kept[field.name] = getattr(self, field.name)
    return dataclasses.replace(type(self)(), **kept)

  def replace(self, **changes: Any) -> "DecodingSpec":
    """A copy with ``changes``; a None value keeps the field (a flag that was not given)."""
    return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

  def describe(self) -> str:
    """One phrase for logs: ``greedy`` or ``beam 4, gnmt alpha 0.6, early stopping`` (and
    ``, bfloat16 weights`` with a ``weights_dtype``)."""
    weights = f", {self.weights_dtype} weights" if self.weights_dtype else ""
    if self.greedy:
      return "greedy" + weights
    stop = ", early stopping" if self.early_stopping else ""
    penalty = self.length_penalty if self.length_penalty in ("average", "none") else \
        f"{self.length_penalty} alpha {self.alpha:g}"
    return f"beam {self.beam_size}, {penalty}{stop}{weights}"

  def as_dict(self) -> dict:
    """The fields as plain JSON values (reports, exports)."""
    out = dataclasses.asdict(self)
    out["banned_ids"] = list(self.banned_ids)
    return out

  @classmethod
  def from_config(cls, config: Optional[Mapping[str, Any]], **overrides: Any) -> "DecodingSpec":
    """The spec of a run's config (its top-level decoding fields; a config without them, such as a
    hand-made run's, gets the defaults), then ``overrides`` whose value is not None: ``beam_size``,
    ``alpha``, ``max_extra``, ... (a command line's flags)."""
    c = complete(dict(config or {}))  # a copy: the defaults are base_config's
    base = cls(beam_size=c.beam_size, alpha=c.alpha, length_penalty=c.length_penalty,
               early_stopping=c.early_stopping, max_extra=c.decode_max_extra,
               length_bucket=c.decode_length_bucket, weights_dtype=c.decode_dtype)
    return base.replace(**overrides)


# What DecodingSpec.weights_dtype may be: "" = the run's own dtype
WEIGHTS_DTYPES = ("", "float32", "bfloat16")

# What ``txf generate`` and ``txf.inference.sample_texts`` draw with unless told otherwise.
SAMPLING = DecodingSpec(temperature=0.8, top_p=0.95)
