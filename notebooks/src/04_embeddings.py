# %% [markdown]
# # 04 — Co-occurrence + PCA embeddings, and do they help the sentiment classifier?
#
# 1. Count which words occur near which in real movie-review sentences (rt-polarity, read from
#    `$TXF_DATA/rt-polarity`), standardise the counts, and take the top-k principal components with
#    power iteration and deflation (`txf.analysis.cooccurrence`).
# 2. Look at the space: nearest neighbours, the analogy probe `a − b + c`, a 2-D map.
# 3. Initialise the sentiment classifier's embedding table with these vectors (`d_model = k`) and
#    compare dev accuracy with random initialisation, training each with `txf.train.train` (the
#    PCA table enters through its `model=` argument), a few seeds each.
#
# The data go through txf's own text pipeline (`data.source = "text:rt-polarity"`, TSV, a
# sentencepiece vocabulary of `experiments/sentiment_seed.py`). Without `$TXF_DATA` the notebook says so and writes a toy
# corpus in the same TSV format instead (sentences of the toy language of `txf.data.synthetic`,
# labelled by whether the subject is plural). `TXF_NOTEBOOK_SMALL=1` shrinks the vocabulary, k, the
# model and the training to seconds.

# %%
import contextlib
import io
import os
import tempfile
import time

# Small mode (TXF_NOTEBOOK_SMALL=1, what the tests run) shrinks everything and, before JAX starts,
# asks XLA:CPU to compile fast and run slow: a smoke test, not a measurement.
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

# The runs below share many computations (a seed changes no program, a variant only some): JAX's
# persistent compilation cache, in a temporary folder, compiles each distinct program once.
jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="txf-notebook-xla-cache-"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import dataclasses

import flax.linen as nn
from absl import logging as absl_logging
import jax.numpy as jnp
import numpy as np
from IPython.display import Image, Markdown, display

from txf.train import viz
from txf.core.config import load_experiment
from txf.data import EOS_ID, UNK_ID, make_task, synthetic
from txf.models import EncoderClassifier
from txf.nn import Embed, Encoder
from txf.analysis import cooccurrence as co
from txf.train import train

absl_logging.set_verbosity("error")   # the data pipeline's notes (how many sentences it truncated)

def pick(full, small):
  return small if SMALL else full


def show(path):
  """Display a PNG written by the notebook."""
  display(Image(filename=path))


def table(rows, header):
  """A Markdown table."""
  lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
  return Markdown("\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]))


def mean_and_spread(values):
  """"m ± s" (sample standard deviation over seeds; "m" alone for one value)."""
  v = np.asarray(values, np.float64)
  return f"{v.mean():.3f}" if v.size < 2 else f"{v.mean():.3f} ± {v.std(ddof=1):.3f}"

# %% [markdown]
# ## The data
#
# `$TXF_DATA/rt-polarity/{train,dev}.tsv` (`sentence<TAB>label`), or, when absent, a toy corpus
# written to a temporary folder in the same format.

# %%
root = os.environ.get("TXF_DATA", "")
folder = os.path.join(root, "rt-polarity") if root else ""
if folder and all(os.path.isfile(os.path.join(folder, f"{s}.tsv")) for s in ("train", "dev")):
  NAME = "rt-polarity"
  print(f"real data: {folder}")
else:
  why = (f"{folder} has no train.tsv and dev.tsv" if folder else "TXF_DATA is not set")
  root = tempfile.mkdtemp(prefix="txf-notebook-04-data-")
  NAME = "toy-subject-number"
  print(f"NO REAL DATA: {why}. To use the movie reviews, set TXF_DATA to the folder that holds "
        f"rt-polarity/. Using a toy corpus instead, {NAME}, written to a "
        "temporary folder")
  rng = np.random.default_rng(0)
  os.makedirs(os.path.join(root, NAME))
  for split, n in (("train", pick(8000, 2000)), ("dev", pick(1000, 256))):
    with open(os.path.join(root, NAME, f"{split}.tsv"), "w", encoding="utf-8") as f:
      for _ in range(n):
        source, target = synthetic.translation_pair(rng)
        plural = target.split()[-1].endswith("n")   # the toy verb agrees with a plural subject
        f.write(f"{source}\t{int(plural)}\n")

V, K, WINDOW = pick(2000, 300), pick(51, 12), 2   # V: the most frequent words that get PCA vectors
config = load_experiment("sentiment_seed")
config.data.source = f"text:{NAME}"
config.data.path = root
config.data.data_dir = tempfile.mkdtemp(prefix="txf-notebook-04-prepared-")
config.data.vocab_size = pick(config.data.vocab_size, 1000)   # the experiment's 8000 pieces
config.data.read_threads = 1
with contextlib.redirect_stderr(io.StringIO()):   # tfds's progress bars while it prepares the TSVs
  task = make_task(config)              # trains the sentencepiece vocabulary on the train split
train_texts = [r["text"] for r in task.records("train")]
dev_labels = np.asarray([r["label"] for r in task.records("dev")])
print(f"{NAME}: {len(train_texts)} train / {len(dev_labels)} dev sentences; "
      f"e.g. {train_texts[0]!r} -> {task.records('train', 1)[0]['label']}")

# %% [markdown]
# ## 1. Co-occurrence → standardise → covariance → top-k eigenvectors
#
# Vocabulary: the `V` most frequent pieces of the task's sentencepiece vocabulary (unigram: a
# frequent word is one piece, `▁good`, shown without its `▁`); the other pieces, byte pieces
# included, become `<unk>` here. Specials first.
# `C[i, j]` counts how often word j occurs within `window` positions of word i (sentences never
# mix); each column is standardised ($Z$), $S = Z^\top Z/(V-1)$ is the covariance of the context
# features, and power iteration with deflation $A' = A - \lambda v v^\top$ gives its top-k eigenpairs
# $(\lambda, W_k)$; a word's embedding is its row of $E = Z W_k$ (shape `[V, k]`).
# `k = 51` (= the classifier's d_model, see `experiments/sentiment_seed.py`; small mode: 12).

# %%
tokenizer = task.codec.source
pieces = [np.asarray(tokenizer.encode(t) + [EOS_ID], np.int32) for t in train_texts]  # task ids
frequency = np.bincount(np.concatenate(pieces), minlength=tokenizer.vocab_size)
words = [i for i in np.argsort(-frequency, kind="stable") if i > UNK_ID + 256][:V]   # bytes are 4..259
task_ids = np.asarray([0, 1, EOS_ID, UNK_ID] + words)          # row r of E <-> task id task_ids[r]
to_row = np.full(tokenizer.vocab_size, UNK_ID, np.int32)
to_row[task_ids] = np.arange(len(task_ids))
vocab = ["<pad>", "<s>", "</s>", "<unk>"] + [tokenizer.decode([i]) for i in words]
index = {w: i for i, w in enumerate(vocab)}
sequences = [to_row[p] for p in pieces]
counts = co.cooccurrence_counts(sequences, len(vocab), WINDOW)       # int32 [V, V]
z = co.standardise(counts)                                           # [V, V]
cov = co.covariance(z)                                               # [V, V]
eigenvalues, components = co.top_k_eigenpairs(cov, K, max_iters=pick(1000, 100))  # [K], [V, K]
embeddings = np.asarray(co.project(z, components))                   # [V, K]
unk_share = np.mean(np.concatenate(sequences) == UNK_ID)
byte_share = np.mean((np.concatenate(pieces) > UNK_ID) & (np.concatenate(pieces) <= UNK_ID + 256))
print(f"V={len(vocab)}, {int(counts.sum()):,} co-occurrences (window {WINDOW}); <unk> is {unk_share:.1%} "
      f"of tokens here; the task spells {byte_share:.1%} of its tokens with byte pieces; E: {embeddings.shape}")

# power iteration vs a dense eigensolver (float64 numpy)
exact = np.linalg.eigvalsh(np.asarray(cov, np.float64))[::-1][:K]
rel = np.abs(np.asarray(eigenvalues) - exact) / exact
print(f"top-{K} eigenvalues vs numpy.linalg.eigvalsh: max relative error {rel[:10].max():.1e} over the "
      f"first 10, {rel.max():.1e} over all {K} (close eigenvalues converge slowly)")
share = np.asarray(eigenvalues) / np.trace(np.asarray(cov, np.float64))

fig = viz.new_figure(7, 3.5)
ax = fig.subplots()
ax.bar(range(1, K + 1), share, color="tab:blue")
ax.set_xlabel("component")
ax.set_ylabel("share of total variance")
ax.set_title(f"{K} components explain {share.sum():.0%} of the variance")
show(viz.save_figure(fig, os.path.join(OUT, "04_eigenvalues.png"), tight=True))

# %% [markdown]
# ## 2. Neighbours, analogies, a map
#
# Cosine similarity; the analogy `a − b + c` ranks words by `cos(e_j, e_a − e_b + e_c)` (j ∉ {a, b, c}),
# e.g. `worst − bad + good` should be near `best`. A few thousand short reviews are far too little
# text for good analogies: read the hits and misses as what this corpus supports.

# %%
queries = [w for w in ["good", "bad", "funny", "boring", "film", "actor", "love", "worst", "the",
                       "dog", "cat", "sees", "red"] if w in index]
rows = []
for w in queries[:pick(10, 4)]:
  idx, sims = co.nearest_neighbours(jnp.asarray(embeddings), index[w], 5)
  rows.append((w, ", ".join(f"{vocab[i]} ({s:.2f})" for i, s in zip(np.asarray(idx), np.asarray(sims)))))
display(table(rows, ["word", "5 nearest (cosine)"]))

probes = [("worst", "bad", "good", "best"), ("worse", "bad", "good", "better"),
          ("actress", "woman", "man", "actor"), ("movies", "movie", "film", "films"),
          ("cats", "cat", "dog", "dogs"), ("sees", "dog", "dogs", "see")]
rows, hits, tried = [], 0, 0
for a, b, c, expected in probes:
  if not all(w in index for w in (a, b, c, expected)):
    continue
  idx, _ = co.analogy(jnp.asarray(embeddings), index[a], index[b], index[c], 5)
  top = [vocab[i] for i in np.asarray(idx)]
  tried, hits = tried + 1, hits + (expected in top)
  rows.append((f"{a} − {b} + {c}", expected, ", ".join(top), "yes" if expected in top else "no"))
display(table(rows, ["probe", "expected", "top 5", "hit"]))
print(f"analogy probes: {hits}/{tried} with the expected word in the top 5")

words = [w for w in ["good", "great", "best", "fun", "funny", "beautiful", "bad", "worst", "boring",
                     "dull", "mess", "film", "movie", "story", "actor", "director", "script", "comedy",
                     "drama", "dog", "cat", "sees", "red", "big", "king", "queen"] if w in index]
unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
xy = unit[[index[w] for w in words], :2]   # directions (what cosine similarity compares)
fig = viz.new_figure(7, 6)
ax = fig.subplots()
ax.scatter(xy[:, 0], xy[:, 1], s=12, color="tab:blue")
for (x0, y0), w in zip(xy, words):
  ax.annotate(w, (x0, y0), fontsize=9, xytext=(3, 3), textcoords="offset points")
ax.set_xlabel("component 1")
ax.set_ylabel("component 2")
ax.set_title("word directions (unit-norm rows of E) on the first two components")
show(viz.save_figure(fig, os.path.join(OUT, "04_pca_words.png"), tight=True))

# %% [markdown]
# ## 3. PCA vectors as the classifier's embedding table
#
# The classifier is the encoder-only model of `experiments/sentiment_seed.py`: sentences cut to its
# `data.max_input_len` tokens (`</s>` included), d_model = k = 51, 3 heads of 17, 2 encoder blocks,
# FFN 400, mean pooling, Adam with a constant learning rate of `0.001`, no label smoothing, its
# sentencepiece vocabulary. Two initialisations of its table `[vocab, 51]`, everything else
# identical (same seeds, same batches):
#
# * **random**: txf's default `N(0, d^-1/2)`;
# * **PCA**: `E = Z W_k`, rescaled to the same overall standard deviation `d^-1/2` (the model
#   multiplies by `√d`, so both start with unit-variance inputs), in the rows of `</s>`, `<unk>` and the
#   `V` pieces; the other rows (`<pad>`, `<s>`, byte pieces, rarer pieces) keep their random values.
#
# The PCA run passes `model=` to `txf.train.train`: a classifier built from txf's modules whose
# `Embed` starts from the PCA table. Both tables are trained; dev accuracy is logged every few steps.

# %%
STEPS, SEEDS = pick(600, 8), pick([0, 1, 2], [0])
config.num_train_steps = STEPS
config.batch_size = pick(64, 32)
config.eval_every = config.log_every = pick(50, 4)
config.checkpoint_every = 0
config.best_metric = ""
config.model.d_model = K
config.model.num_heads = 3
config.model.d_ff = pick(400, 48)
config.model.num_encoder_layers = pick(2, 1)
pca_table = embeddings / embeddings.std() * K ** -0.5    # [V, K]


class PCAEmbed(Embed):
  """txf's Embed whose initial table has the PCA vectors in the rows of </s>, <unk> and the V pieces."""

  def setup(self):
    def init(rng, shape):
      random = nn.initializers.normal(self.config.d_model ** -0.5)(rng, shape)
      return random.at[task_ids[2:]].set(jnp.asarray(pca_table[2:], random.dtype))
    self.table = self.param("embedding", nn.with_logical_partitioning(init, ("vocab", "embed")),
                            (self.num_embeddings, self.config.d_model))


class PCAClassifier(EncoderClassifier):
  """txf's EncoderClassifier with a PCAEmbed: same parameter names, so the same random draws
  everywhere else."""

  @nn.compact
  def __call__(self, inputs, inputs_segmentation=None, inputs_position=None):
    cfg = self.config
    embed = PCAEmbed(cfg, cfg.vocab_size, name="embed")
    encoded, valid = Encoder(cfg, embed, name="encoder")(inputs, inputs_segmentation, inputs_position)
    w = valid.astype(encoded.dtype)[..., None]
    pooled = (encoded * w).sum(1) / jnp.maximum(w.sum(1), 1.0)   # mean pooling
    pooled = nn.Dropout(cfg.dropout_rate)(pooled, deterministic=cfg.deterministic)
    classifier = nn.Dense(
        cfg.num_classes, name="classifier",
        kernel_init=nn.with_logical_partitioning(nn.linear.default_kernel_init, ("embed", "classes")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("classes",)))
    return classifier(pooled).astype(jnp.float32)


def pca_model(cfg, deterministic=False, decode=False):
  """A ``model=`` builder for txf.train.train (the signature of txf.models.build_model)."""
  return PCAClassifier(dataclasses.replace(cfg, deterministic=deterministic or decode, decode=decode))


RUNS_DIR = tempfile.mkdtemp(prefix="txf-notebook-04-runs-")
results = {}
for name, model in [("random", None), ("PCA", pca_model)]:
  results[name], started = [], time.time()
  for seed in SEEDS:
    config.seed = seed
    workdir = os.path.join(RUNS_DIR, f"{name}-seed{seed}")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
      train(config, workdir, model=model)
    rows = viz.read_metrics_rows(os.path.join(workdir, "metrics.jsonl"))
    results[name].append([(r["step"], r["accuracy"]) for r in rows if r["split"] == "eval"])
  print(f"{name:6s}: dev accuracy per seed {[round(r[-1][1], 3) for r in results[name]]}, "
        f"{time.time() - started:.0f} s")

# %%
early = len(results["random"][0]) // 3            # an evaluation a third of the way in
early_step = results["random"][0][early][0]
rows, summary = [], {}
for name, runs in results.items():
  summary[name] = {"early": [r[early][1] for r in runs], "best": [max(a for _, a in r) for r in runs],
                   "last": [r[-1][1] for r in runs]}
  rows.append((name, *[mean_and_spread(summary[name][k]) for k in ("early", "best", "last")]))
display(table(rows, ["embedding init", f"dev accuracy at step {early_step}",
                     "best dev accuracy (picked on dev)", f"dev accuracy at step {STEPS}"]))
mean = {n: {k: float(np.mean(v)) for k, v in s.items()} for n, s in summary.items()}
display(Markdown(
    f"On {NAME} ({len(SEEDS)} seed(s), {STEPS} steps): at step {early_step} PCA "
    f"{mean['PCA']['early']:.3f} vs random {mean['random']['early']:.3f}; best "
    f"{mean['PCA']['best']:.3f} vs {mean['random']['best']:.3f}; at the end "
    f"{mean['PCA']['last']:.3f} vs {mean['random']['last']:.3f}. Analogy probes: {hits} of {tried} "
    f"with the expected word in the top 5."))

fig = viz.new_figure(7, 4)
ax = fig.subplots()
for name, runs in results.items():
  steps = [s for s, _ in runs[0]]
  acc = np.array([[a for _, a in r] for r in runs])
  ax.plot(steps, acc.mean(0), marker="o", markersize=3, label=f"{name} ({len(runs)} seed(s))")
  if len(runs) > 1:
    ax.fill_between(steps, acc.min(0), acc.max(0), alpha=0.2)
ax.axhline(max(dev_labels.mean(), 1 - dev_labels.mean()), color="gray", ls=":", label="majority class")
ax.set_xlabel("step")
ax.set_ylabel("dev accuracy")
ax.set_title(f"{NAME}: embedding initialisation")
ax.grid(alpha=0.3)
ax.legend()
show(viz.save_figure(fig, os.path.join(OUT, "04_init_comparison.png"), tight=True))
print("figures written:", sorted(f for f in os.listdir(OUT) if f.startswith("04_")))
