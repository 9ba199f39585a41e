"""Position-wise feed-forward network (section 3.3) and its gated variants (Shazeer 2020)."""

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from txf.core.variants import Table


class Gated(NamedTuple):
  """A gated FFN's entry of ``ACTIVATIONS``: FFN(x) = (f(x W1 + b1) * (x V + c)) W2 + b2 with this
  ``f`` (Shazeer 2020, "GLU Variants Improve Transformer")."""
  f: Callable


# The FFN variants, the allowed values of model.activation: name -> f, the activation of the dense
# FFN(x) = f(x W1 + b1) W2 + b2, or Gated(f), the gated FFN (f(x W1 + b1) * (x V + c)) W2 + b2 with
# the extra kernel V [d_model, d_ff] (and bias c). Dense: relu (the paper), gelu (exact, erf),
# swish = silu (z * sigmoid(z), Marian/OPUS-MT), gelu_tanh (0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715
# z^3))), GPT-2's and T5 v1.1's "gelu_new"). Gated: reglu (f = relu), geglu (f = the same exact gelu),
# swiglu (f = swish), geglu_tanh (f = gelu_tanh: Shazeer's GeGLU and T5 v1.1's "gated-gelu"). One table, not a second field
# model.ffn = dense | gated: the literature names the pair (ReGLU, GeGLU, SwiGLU), one field cannot
# name a combination txf lacks, and every check (validate, Marian import/export) reads one field.
# The bf16 CPU kernel (txf.kernels.bf16.feed_forward) applies the same f. jax.nn.relu = max(0, .)
# with the gradient select(z > 0, g, 0); jnp.maximum's gradient splits ties with compares and a
# divide, which made the FFN's backward ~25% slower on CPU (BENCHMARKS.md).
ACTIVATIONS = Table("model.activation", {
    "relu": jax.nn.relu,
    "gelu": lambda z: jax.nn.gelu(z, approximate=False),
    "swish": jax.nn.silu,
    "reglu": Gated(jax.nn.relu),
    "geglu": Gated(lambda z: jax.nn.gelu(z, approximate=False)),
    "swiglu": Gated(jax.nn.silu),
    "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True),
    "geglu_tanh": Gated(lambda z: jax.nn.gelu(z, approximate=True)),
})


def is_gated(activation: str) -> bool:
  """True when ``ACTIVATIONS[activation]`` is a gated FFN (a :class:`Gated` entry)."""
  return isinstance(ACTIVATIONS[activation], Gated)


def matched_hidden_size(d_ff: int) -> int:
  """The hidden size h of a gated FFN with the parameter count of a dense FFN of width ``d_ff``
  (``model.ffn_match_params``): 3 d h ~= 2 d d_ff, i.e. h ~= t = 2 d_ff / 3.

  Rule: m = the multiple of 8 nearest t (8 * floor(d_ff / 12 + 1/2)); h = m if m > 0 and
  |m - t| <= t / 100 (within 1%), else h = round(t) = floor(t + 1/2). Exact integer arithmetic.
  E.g. d_ff 2048: t = 1365.33, m = 1368 (0.2% off) -> 1368; d_ff 16: t = 10.67, m = 8 (25% off)
  -> 11.
  """
  d_ff = int(d_ff)
  m = 8 * ((d_ff + 6) // 12)
  if m > 0 and 100 * abs(3 * m - 2 * d_ff) <= 2 * d_ff:   # |m - t| <= t / 100, times 300
    return m
  return (4 * d_ff + 3) // 6


def feed_forward(x: jnp.ndarray, w1: jnp.ndarray, b1: Optional[jnp.ndarray], w2: jnp.ndarray,
                 b2: Optional[jnp.ndarray], activation: str = "relu",
                 w_gate: Optional[jnp.ndarray] = None,
                 b_gate: Optional[jnp.ndarray] = None,
                 hidden_fn: Optional[Callable] = None) -> jnp.ndarray:
  r"""FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately.

  $$\operatorname{FFN}(x) = \max(0,\, xW_1 + b_1)\,W_2 + b_2$$

  ``activation`` replaces max(0, .) by another f of ``ACTIVATIONS``: gelu(z) = z Phi(z) (the
  exact, erf form), swish(z) = z sigmoid(z). A gated entry (reglu, geglu, swiglu) computes

  $$\operatorname{FFN}_\text{GLU}(x) = \big(f(xW_1 + b_1) \odot (xV + c)\big)\,W_2 + b_2$$

  with V = ``w_gate`` and c = ``b_gate``. A bias that is None is left out (``model.use_bias=False``).
  ``hidden_fn`` (None: nothing) is applied to the hidden activations before W2 (txf.inspect's tap).

  Args:
    x: [..., d_model]; w1: [d_model, d_ff]; b1: [d_ff] or None; w2: [d_ff, d_model];
    b2: [d_model] or None; w_gate: [d_model, d_ff] (gated entries only); b_gate: [d_ff] or None.
  Returns:
    [..., d_model].
  """
  entry = ACTIVATIONS[activation]
  add = lambda z, b: z if b is None else z + b
  if isinstance(entry, Gated):
    if w_gate is None:
      raise ValueError(f"activation={activation!r} is a gated FFN: it needs w_gate [d_model, d_ff]")
    hidden = entry.f(add(x @ w1, b1)) * add(x @ w_gate, b_gate)
  else:
    hidden = entry(add(x @ w1, b1))
  if hidden_fn is not None:
    hidden = hidden_fn(hidden)
  return add(hidden @ w2, b2)
