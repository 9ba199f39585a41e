"""The one place that chooses kernels for the backend, the jax version and the compute dtype.

Every backend- or version-dependent choice of txf is read from :func:`select` (and the backend from
:func:`backend`, the only call of ``jax.default_backend()`` in the package). The choices are made at
trace time, so a compiled step keeps the kernels it was traced with. :func:`describe` gives the
choices as a dict for ``txf info`` and the bench JSON; :func:`use` overrides them for a block (a
benchmark comparing two kernels; tests comparing a kernel with the formula it replaces).
"""

import contextlib
import dataclasses
import re
from typing import AbstractSet, Dict, Iterator, Optional, Tuple

import jax
import jax.numpy as jnp

from txf.runtime import machine
from txf.core.variants import Table

# The kinds of bf16 matrix product on CPU (see txf.kernels.dots and BENCHMARKS.md):
#   "layout": bf16 operands, float32 accumulation and result, transposed operands as row-major copies;
#   "xla":    XLA's own dot in the operands' dtype (what a plain ``x @ w`` compiles to).
BF16_DOTS = ("layout", "xla")
# CPU flags of native bf16 dot instructions (x86: AVX512-BF16, AMX; ARM: BF16).
BF16_UNITS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
# From this jax version on, XLA:CPU runs a bf16 x bf16 -> bf16 dot as a bf16 kernel; before it,
# the operands are converted and the dot runs in float32 (BENCHMARKS.md, "Kernel choices").
XLA_BF16_DOT_VERSION = (0, 12)
# The ways of running an attention formula, the allowed values of model.attention_impl ("auto":
# the backend's choice, ``Kernels.attention_auto``): name -> run(attention, q, k, v, mask, causal),
# also given ``bias=`` (a score bias [B|1, H, L_q, L_k]) when a position variant has one.
# Its entries ("reference", "fused") are registered beside their code, in txf.kernels.attention.
ATTENTION_IMPLS = Table("model.attention_impl", also=("auto",))
DROPOUT_MASKS = ("threefry-slab", "jax")
TOP_KS = ("blocked", "lax")
# Greedy decoding's argmax over the vocabulary: "two-pass" (a max, then the first index that
# holds it: two vectorised reductions) or "lax" (``jnp.argmax``: XLA's (value, index) reduction,
# which XLA:CPU runs element by element).
ARGMAXES = ("two-pass", "lax")
# How beam search's cache stores the self-attention keys (txf.nn.kv_cache): "rows" [B, h, G*T, d_k]
# or "transposed" [B, h, d_k, G*T], which makes Q K^T a plain product.
BEAM_KEYS = ("rows", "transposed")

# What the CPU runs, measured with `txf bench` (BENCHMARKS.md, "kernel choices"): attention as the
# reference formula (the fused XLA path costs as much or more CPU time at the bench sizes), the
# unrolled threefry dropout mask, beam search's top-k through block maxima; beam search's keys
# transposed in float32 (XLA:CPU repacks [G*T, d_k] keys for every float32 Q K^T; a bf16 dot
# reads them as they are, and the transposed writes only cost: BENCHMARKS.md, "Where a beam-4
# decode call's time goes").
CPU_CHOICES = {"attention_auto": "reference", "dropout_mask": "threefry-slab", "top_k": "blocked",
               "beam_keys": "transposed", "argmax": "two-pass"}
ACCELERATOR_CHOICES = {"attention_auto": "fused", "dropout_mask": "jax", "top_k": "lax",
                       "beam_keys": "rows", "argmax": "lax"}

_overrides: Dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Kernels:
  """The kernels for one compute dtype on one backend.

  Attributes:
    backend: "cpu" | "gpu" | "tpu".
    bf16_dots: for bf16 compute on CPU, ``BF16_DOTS``' "layout" or "xla"; "xla" everywhere else.
    attention_auto: what ``model.attention_impl='auto'`` runs: "reference" (txf.ops's formula) or
      "fused" (``jax.nn.dot_product_attention``: cuDNN flash attention on GPU for bf16/fp16).
    dropout_mask: "threefry-slab" (txf.kernels.threefry's unrolled threefry, equal bits) or "jax"
      (``jax.random.bernoulli``).
    top_k: beam search's top-k: "blocked" (through block maxima, equal result) or "lax".
    beam_keys: how beam search's cache stores the self-attention keys: "rows" [B, h, G*T, d_k]
      or "transposed" [B, h, d_k, G*T] (txf.nn.kv_cache; the same attention either way).
    argmax: greedy decoding's argmax: "two-pass" (txf.kernels.topk.first_argmax, equal result)
      or "lax" (``jnp.argmax``).
  """
  backend: str
  bf16_dots: str
  attention_auto: str
  dropout_mask: str
  top_k: str
  beam_keys: str
  argmax: str

  @property
  def layout_dots(self) -> bool:
    """True when the model's products run through txf.kernels.dots (bf16 compute on CPU)."""
    return self.bf16_dots == "layout"


def backend() -> str:
  """The default backend's platform name: "cpu", "gpu" or "tpu" (``jax.default_backend()``)."""
  return jax.default_backend()


def _version(text: str) -> Tuple[int, ...]:
  return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def default_bf16_dots(backend_name: str, jax_version: Optional[str] = None,
                      cpu_flags: Optional[AbstractSet[str]] = None) -> str:
  """The bf16 product kind for ``backend_name``, measured per CPU and jax version (BENCHMARKS.md,
  "Kernel choices"): "xla" on GPU/TPU; on CPU "layout" (txf.kernels.dots: XLA:CPU runs a bf16 dot
  on bf16 units only with float32 accumulation and row-major operands), except on a CPU without
  bf16 units (``BF16_UNITS``) under jax < 0.12, where XLA's own dot (converted to float32, the
  float32 rate) is faster than the layout copies. ``jax_version`` and ``cpu_flags`` default to
  this process's."""
  if backend_name != "cpu":
    return "xla"
  flags = machine.cpu_flags() if cpu_flags is None else cpu_flags
  old_xla = _version(jax_version or jax.__version__) < XLA_BF16_DOT_VERSION
  return "xla" if flags and not has_bf16_units("cpu", flags) and old_xla else "layout"


def has_bf16_units(backend_name: Optional[str] = None,
                   cpu_flags: Optional[AbstractSet[str]] = None) -> bool:
  """True where bf16 products run faster than float32 ones: on GPU and TPU always, on CPU when
  its flags name bf16 dot instructions (``BF16_UNITS``: AVX512-BF16, AMX, ARM BF16). ``backend_name``
  defaults to :func:`backend`, ``cpu_flags`` to this machine's."""
  if (backend_name or backend()) != "cpu":
    return True
  flags = machine.cpu_flags() if cpu_flags is None else cpu_flags
  return bool(flags & BF16_UNITS)


def select(dtype=None, backend_name: Optional[str] = None) -> Kernels:
  """The kernels for compute ``dtype`` (None: float32) on ``backend_name`` (None: :func:`backend`),
  with any :func:`use` override applied."""
  name = backend_name or backend()
  choices = dict(CPU_CHOICES if name == "cpu" else ACCELERATOR_CHOICES)
  bf16 = dtype is not None and jnp.dtype(dtype) == jnp.bfloat16
  choices["bf16_dots"] = default_bf16_dots(name) if bf16 else "xla"
  if dtype is not None and jnp.dtype(dtype) != jnp.float32:
    choices["beam_keys"] = "rows"  # the transposed keys pay off for float32 dots only
  for key, value in _overrides.items():
    if key != "bf16_dots" or bf16:
      choices[key] = value
  return Kernels(backend=name, **choices)


def describe(dtype=None) -> Dict[str, str]:
  """The choices of :func:`select` for ``dtype`` (default bfloat16, where they differ most) with
  the jax version, as a flat dict: ``txf info`` prints it, the bench JSON records it."""
  chosen = dataclasses.asdict(select(jnp.bfloat16 if dtype is None else dtype))
  return {"jax": jax.__version__, **chosen}


@contextlib.contextmanager
def use(**choices: str) -> Iterator[None]:
  """Within the block, :func:`select` returns these choices (fields of :class:`Kernels` other than
  ``backend``; ``bf16_dots`` applies to bf16 compute only). Trace inside the block."""
  allowed = {"bf16_dots": BF16_DOTS, "attention_auto": ATTENTION_IMPLS,
             "dropout_mask": DROPOUT_MASKS, "top_k": TOP_KS, "beam_keys": BEAM_KEYS,
             "argmax": ARGMAXES}
  for key, value in choices.items():
    if key not in allowed or value not in allowed[key]:
      raise ValueError(f"unknown kernel choice {key}={value!r}; choose from {allowed}")
  saved = dict(_overrides)
  _overrides.update(choices)
  try:
    yield
  finally:
    _overrides.clear()
    _overrides.update(saved)
