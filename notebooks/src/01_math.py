# %% [markdown]
# # 01 — The math, step by step
#
# The pieces of *Attention Is All You Need* that need no training, each computed with txf's own
# pure functions (`txf.ops`) and checked against an independent numpy computation:
#
# 1. the sinusoidal positional encoding, and why a fixed offset is a rotation: `PE[pos+k] = M_k PE[pos]`;
# 2. scaled dot-product and multi-head attention on a toy sentence;
# 3. the three masks (padding, causal, cross) drawn, and what they do to the weights;
# 4. the LayerNorm and softmax Jacobians, written out, against `jax.jacobian`.
#
# Figures go to `$TXF_NOTEBOOK_OUT` (default: a temporary folder). `TXF_NOTEBOOK_SMALL=1` shrinks sizes.

# %%
import os
import tempfile

# Small mode (TXF_NOTEBOOK_SMALL=1, what the tests run) shrinks sizes and, before JAX starts, asks
# XLA:CPU to compile fast and run slow: a smoke test, not a measurement.
SMALL = os.environ.get("TXF_NOTEBOOK_SMALL", "").strip().lower() not in ("", "0", "false", "no")
if SMALL:
  from txf.runtime.process import add_xla_flags  # only the flags this jaxlib's XLA knows (an unknown one is fatal)
  add_xla_flags("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
OUT = os.environ.get("TXF_NOTEBOOK_OUT") or tempfile.mkdtemp(prefix="txf-notebook-")
os.makedirs(OUT, exist_ok=True)
# the folder named as set (the site's build sets it), so no machine path is printed
print(f"small mode: {SMALL}; figures in "
      + ("$TXF_NOTEBOOK_OUT" if os.environ.get("TXF_NOTEBOOK_OUT") else OUT))

import jax
import jax.numpy as jnp
import numpy as np
from IPython.display import Image, display

from txf import ops
from txf.train import viz


def pick(full, small):
  return small if SMALL else full


def show(path):
  """Display a PNG written by the notebook."""
  display(Image(filename=path))

# %% [markdown]
# ## 1. Sinusoidal positional encoding
#
# $PE_{pos,\,2i} = \sin(pos\,\omega_i)$, $PE_{pos,\,2i+1} = \cos(pos\,\omega_i)$ with
# $\omega_i = 10000^{-2i/d}$: each (sin, cos) pair shares one frequency, from $\omega_0 = 1$ (period
# $2\pi$ positions) down to $10000^{-(d-2)/d}$ (period $\approx 2\pi \cdot 10000$). txf builds it in
# float64 and stores float32; below it is rebuilt independently.

# %%
L, d = pick((100, 64), (40, 16))
pe = np.asarray(ops.sinusoidal_positional_encoding(L, d))  # [L, d] float32

pos = np.arange(L, dtype=np.float64)[:, None]               # [L, 1]
omega = 10000.0 ** (-np.arange(0, d, 2) / d)                # [d/2]: one frequency per pair
ref = np.zeros((L, d))
ref[:, 0::2], ref[:, 1::2] = np.sin(pos * omega), np.cos(pos * omega)
print(f"PE [{L}, {d}]: max |txf - numpy float64| = {np.abs(pe - ref).max():.2e}")
assert np.abs(pe - ref).max() < 1e-6
show(viz.plot_positional_encoding(pe, os.path.join(OUT, "01_positional_encoding.png"),
                                  title=f"sinusoidal PE, L={L}, d={d}"))

# %% [markdown]
# ### The relative-position property
#
# With $a = pos\,\omega_i$ and $b = k\,\omega_i$, the angle-sum identities give
#
# $$\sin(a + b) = \cos b \sin a + \sin b \cos a, \qquad \cos(a + b) = -\sin b \sin a + \cos b \cos a,$$
#
# so each pair moves by a 2×2 rotation that depends on the offset $k$ and not on $pos$:
#
# $$\begin{pmatrix} PE_{pos+k,\,2i} \\ PE_{pos+k,\,2i+1} \end{pmatrix} =
# \begin{pmatrix} \cos k\omega_i & \sin k\omega_i \\ -\sin k\omega_i & \cos k\omega_i \end{pmatrix}
# \begin{pmatrix} PE_{pos,\,2i} \\ PE_{pos,\,2i+1} \end{pmatrix}.$$
#
# Stacking the $d/2$ blocks on the diagonal gives one matrix $M_k$ with $PE_{pos+k} = M_k\,PE_{pos}$
# for every position: a linear map that a layer can learn once to "look $k$ positions away".
# Consequences checked below: $M_k$ is orthogonal, $M_j M_k = M_{j+k}$, and
# $PE_p \cdot PE_{p+k} = \sum_i \cos(k\,\omega_i)$ depends on $k$ alone (the Gram matrix is Toeplitz).

# %%
def offset_matrix(k: int, omega: np.ndarray) -> np.ndarray:
  """M_k [d, d]: block-diagonal rotations [[cos k w_i, sin k w_i], [-sin k w_i, cos k w_i]]."""
  m = np.zeros((2 * len(omega), 2 * len(omega)))
  for i, w in enumerate(omega):
    c, s = np.cos(k * w), np.sin(k * w)
    m[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, s], [-s, c]]
  return m


for k in (1, 5, 17):
  m = offset_matrix(k, omega)
  shifted = ref[:-k] @ m.T                                  # row p: M_k PE[p]
  err64 = np.abs(ref[k:] - shifted).max()                   # exact up to float64 rounding
  err32 = np.abs(pe[k:] - pe[:-k] @ m.T.astype(np.float32)).max()  # txf's float32 table
  print(f"k={k:2d}: max_pos |PE[pos+k] - M_k PE[pos]| = {err64:.1e} (float64), {err32:.1e} (txf float32)")
  assert err64 < 1e-12 and err32 < 1e-5
  assert np.allclose(m @ m.T, np.eye(d), atol=1e-12)       # a rotation
assert np.allclose(offset_matrix(3, omega) @ offset_matrix(4, omega), offset_matrix(7, omega))
gram = ref @ ref.T                                          # [L, L]: PE[p] . PE[q]
for k in (0, 1, 7):
  diag = np.diagonal(gram, offset=k)
  assert np.allclose(diag, np.cos(k * omega).sum()), k      # depends on k only
print("M_k orthogonal, M_3 M_4 = M_7, PE[p].PE[p+k] = sum_i cos(k w_i): all checked")

fig = viz.new_figure(12, 4.5)
ax1, ax2 = fig.subplots(1, 2)
im = ax1.imshow(offset_matrix(5, omega)[:16, :16], cmap="RdBu", vmin=-1, vmax=1)
ax1.set_title("M_5, first 8 blocks: rotations by 5·ω_i")
fig.colorbar(im, ax=ax1, shrink=0.8)
im = ax2.imshow(gram, cmap="viridis")
ax2.set_title("PE[p] · PE[q]: a function of |p - q| only")
ax2.set_xlabel("q")
ax2.set_ylabel("p")
fig.colorbar(im, ax=ax2, shrink=0.8)
show(viz.save_figure(fig, os.path.join(OUT, "01_relative_position.png"), tight=True))

# %% [markdown]
# ## 2. Attention on a toy sentence
#
# $\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\big(QK^\top/\sqrt{d_k}\big)\,V$,
# computed by hand for one sentence, then with `txf.ops.scaled_dot_product_attention`; then two heads
# with `txf.ops.multi_head_attention`,
# $\operatorname{MultiHead} = \operatorname{Concat}(\text{head}_1, \text{head}_2)\,W^O$ with
# $d_k = d_v = d_\text{model}/h$. The embeddings and
# projections are random (seeded): this shows the mechanics, not a trained model.

# %%
sentence = "the big dog sees a small cat".split()
n, d_model, h = len(sentence), 8, 2
rng = np.random.default_rng(0)
vocab = sorted(set(sentence))
table = rng.normal(0, d_model ** -0.5, (len(vocab), d_model))
x = (table[[vocab.index(w) for w in sentence]] * np.sqrt(d_model)            # X = E[x]·√d + PE
     + np.asarray(ops.sinusoidal_positional_encoding(n, d_model), np.float64))
w_q, w_k, w_v, w_o = (rng.normal(0, d_model ** -0.5, (d_model, d_model)) for _ in range(4))

q, k, v = x @ w_q, x @ w_k, x @ w_v                          # [n, d]
scores = q @ k.T / np.sqrt(d_model)                          # [n, n]
weights = np.exp(scores - scores.max(-1, keepdims=True))
weights /= weights.sum(-1, keepdims=True)                    # softmax over keys
out = weights @ v                                            # [n, d]
print("row sums:", weights.sum(-1).round(6))
print("word 'sees' attends most to:", sentence[int(weights[3].argmax())])

txf_out, txf_w = ops.scaled_dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
print(f"single head: max |txf - numpy| = {np.abs(np.asarray(txf_out) - out).max():.1e}")
assert np.allclose(txf_out, out, atol=1e-5) and np.allclose(txf_w, weights, atol=1e-6)

# two heads: head i uses column block i of W^Q, W^K, W^V (d_k = 4)
mh_out, mh_w = ops.multi_head_attention(*(jnp.asarray(a, jnp.float32)[None] for a in (x, x)),
                                        *(jnp.asarray(a, jnp.float32) for a in (w_q, w_k, w_v, w_o)), h)
dk = d_model // h
heads = []
for i in range(h):
  cols = slice(i * dk, (i + 1) * dk)
  s = q[:, cols] @ k[:, cols].T / np.sqrt(dk)
  a = np.exp(s - s.max(-1, keepdims=True))
  heads.append((a / a.sum(-1, keepdims=True)) @ v[:, cols])
ref_mh = np.concatenate(heads, -1) @ w_o                     # Concat(head_1, head_2) W^O
print(f"two heads:   max |txf - numpy| = {np.abs(np.asarray(mh_out[0]) - ref_mh).max():.1e}")
assert np.allclose(mh_out[0], ref_mh, atol=1e-4)
show(viz.plot_attention_heads(np.asarray(mh_w[0])[None], sentence, sentence,
                              "toy sentence: 2 random heads (rows: queries, columns: keys)",
                              os.path.join(OUT, "01_toy_attention.png")))

# %% [markdown]
# ## 3. The three masks
#
# Boolean, **True = may attend**; a masked logit becomes the most negative float, so its weight is
# exactly 0. A batch pads sentences to one length with `<pad>` (id 0):
#
# * **padding** (encoder self-attention): query *i* and key *j* must both be real tokens;
# * **causal** (decoder self-attention): position *i* sees positions `j ≤ i` only, so training with the
#   whole target at once cannot peek at the words it must predict (txf's decoder uses it alone: padded
#   target positions are excluded by the loss weights instead);
# * **cross** (decoder → encoder): every target position may look at every *real* source position.

# %%
src = ["the", "dog", "sees", "a", "cat", "</s>", "<pad>", "<pad>"]
tgt_in = ["<s>", "lo", "hundo", "una", "katta", "vede", "<pad>"]
src_valid = jnp.asarray([[w != "<pad>" for w in src]])
tgt_valid = jnp.asarray([[w != "<pad>" for w in tgt_in]])
masks = {
    "padding (encoder self)": ops.padding_mask(src_valid, src_valid)[0, 0],
    "causal (decoder self)": ops.causal_mask(len(tgt_in))[0, 0],
    "causal & padding": ops.combine_masks(ops.causal_mask(len(tgt_in)),
                                          ops.padding_mask(tgt_valid, tgt_valid))[0, 0],
    "cross (target -> source)": ops.padding_mask(jnp.ones_like(tgt_valid), src_valid)[0, 0],
}
labels = {"padding (encoder self)": (src, src), "causal (decoder self)": (tgt_in, tgt_in),
          "causal & padding": (tgt_in, tgt_in), "cross (target -> source)": (tgt_in, src)}
fig = viz.new_figure(16, 4.6)
for ax, (name, m) in zip(fig.subplots(1, 4), masks.items()):
  rows, cols = labels[name]
  ax.imshow(np.asarray(m), cmap="Greens", vmin=0, vmax=1.3)
  ax.set_xticks(range(len(cols)))
  ax.set_xticklabels(cols, rotation=90, fontsize=8)
  ax.set_yticks(range(len(rows)))
  ax.set_yticklabels(rows, fontsize=8)
  ax.set_title(f"{name}\n(green = may attend)", fontsize=9)
show(viz.save_figure(fig, os.path.join(OUT, "01_masks.png"), tight=True))

# What a mask does: masked weights are exactly 0, every real query row still sums to 1.
rng = np.random.default_rng(1)
qs, ks, vs = (jnp.asarray(rng.normal(size=(1, 1, len(src), 4)), jnp.float32) for _ in range(3))
_, w = ops.scaled_dot_product_attention(qs, ks, vs, masks["padding (encoder self)"])
w = np.asarray(w[0, 0])
assert (w[:, ~np.asarray(src_valid[0])] == 0).all()
print("padding: weight on <pad> keys =", w[:, 6:].max(), "| real rows sum to", w[:6].sum(-1).round(6),
      "| <pad> query rows (fully masked) are all 0:", w[6:].sum(-1))
# Causality: changing the last target token changes no earlier output.
qt, kt, vt = (jnp.asarray(rng.normal(size=(1, 1, len(tgt_in), 4)), jnp.float32) for _ in range(3))
o1, _ = ops.scaled_dot_product_attention(qt, kt, vt, ops.causal_mask(len(tgt_in)))
o2, _ = ops.scaled_dot_product_attention(qt, kt.at[..., -1, :].set(9.0), vt.at[..., -1, :].set(9.0),
                                         ops.causal_mask(len(tgt_in)))
assert np.allclose(o1[..., :-1, :], o2[..., :-1, :]) and not np.allclose(o1[..., -1, :], o2[..., -1, :])
print("causal: outputs before the changed position are identical; the last one changed")

# %% [markdown]
# ## 4. The normalisation and softmax Jacobians
#
# For the normalisation $n(x) = (x - \mu)/s$, $s = \sqrt{\sigma^2 + \varepsilon}$:
#
# $$J = \frac{N I - \mathbf{1}\mathbf{1}^\top}{N s} - \frac{(x - \mu)(x - \mu)^\top}{N s^3}$$
#
# ($s = \sigma$ when $\varepsilon = 0$), and for softmax
# $\partial w_j/\partial x_k = w_j(\delta_{jk} - w_k)$, i.e. $\operatorname{diag}(w) - w w^\top$.
# `jax.jacobian` must agree.

# %%
from txf.analysis import jacobians

xv = jnp.asarray(np.random.default_rng(2).normal(size=pick(8, 5)), jnp.float32)
for eps in (0.0, 1e-6):
  auto = jax.jacobian(lambda t: jacobians.normalise(t, eps))(xv)
  err = float(jnp.abs(jacobians.normalisation_jacobian(xv, eps) - auto).max())
  print(f"normalisation Jacobian (eps={eps}): max |analytic - jax.jacobian| = {err:.1e}")
  assert err < 1e-4
auto = jax.jacobian(jax.nn.softmax)(xv)
err = float(jnp.abs(jacobians.softmax_jacobian(xv) - auto).max())
print(f"softmax Jacobian: max |diag(w) - w wT - jax.jacobian| = {err:.1e}")
assert err < 1e-6
print("figures written:", sorted(f for f in os.listdir(OUT) if f.startswith("01_")))
