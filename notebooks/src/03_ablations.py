# %% [markdown]
# # 03 — Ablations on the built-in translation task
#
# One change at a time from the default experiment (`experiments/default.py`), a few seeds each:
#
# | axis | values | field |
# |---|---|---|
# | heads | 1 / 2 / 4 / 8 (d_k = 128 / h) | `model.num_heads` |
# | positional encoding | sinusoidal / learned / none | `model.positional` |
# | label smoothing | `0` / `0.1` | `optimizer.label_smoothing` |
# | layer norm | post-LN (paper) / pre-LN | `model.pre_ln` |
# | warmup | 50 / 200 / 800 steps | `optimizer.warmup_steps` |
#
# Runs are short (400 steps instead of the default 1200), so this compares **how fast** each variant
# learns as much as where it ends. Each run is `txf.train.train(config, workdir)` in a temporary
# workdir, the same loop and evaluator as `txf train`; its metrics.jsonl gives the curves. The
# table reports the held-out **NLL** (plain cross-entropy, comparable across label smoothing
# values), token accuracy and **exact match** (greedy decoding of held-out sentences, as the loop
# logs it).
#
# The full grid (10 configurations × 3 seeds) takes tens of minutes on a 2-core CPU.
# `TXF_NOTEBOOK_SMALL=1` keeps two axes with one alternative each, one seed, a 1+1-layer
# d_model=32 model and a few steps: a smoke test of the notebook, not a result.

# %%
import contextlib
import io
import os
import tempfile
import time

# Small mode (TXF_NOTEBOOK_SMALL=1, what the tests run) shrinks the grid and, before JAX starts, asks
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

# The runs below share many computations (a seed changes no program, a variant only some): JAX's
# persistent compilation cache, in a temporary folder, compiles each distinct program once.
jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="txf-notebook-xla-cache-"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import numpy as np
from IPython.display import Image, Markdown, display

from txf.train import viz
from txf.core.config import load_experiment
from txf.sweep import stats
from txf.train import train


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
  """"m ± s" (sample standard deviation over seeds; "m" alone for one value), by the statistics
  `txf sweep` reports (txf.sweep.stats)."""
  summary = stats.summarize(values)
  return f"{summary.mean:.3f}" if summary.n < 2 else f"{summary.mean:.3f} ± {summary.std:.3f}"


def against_base(values, base_values):
  """Welch's t-test of a variant's values against the base configuration's (txf.sweep.stats):
  "Δ [95% interval], p", or "—" where either has fewer than two seeds."""
  test = stats.welch(values, base_values)
  if not np.isfinite(test.p):
    return "—"
  return f"{test.diff:+.3f} [{test.ci_low:+.3f}, {test.ci_high:+.3f}], p = {test.p:.2f}"

# %%
base = load_experiment("default")
STEPS = pick(400, 6)
SEEDS = pick([0, 1, 2], [0])
EVAL_EXAMPLES = pick(512, 16)      # held-out sentences: teacher-forced metrics and greedy decoding
base.num_train_steps = STEPS
base.log_every = pick(20, 2)
base.eval_every = 0                # evaluate once, at the end
base.checkpoint_every = 0          # one checkpoint, at the end
base.num_samples = 0
if SMALL:
  base.batch_size = 16
  base.model.update(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)
  base.optimizer.warmup_steps = 4
base.eval_batches = -(-EVAL_EXAMPLES // base.batch_size)
base.decode_examples = EVAL_EXAMPLES
W = base.optimizer.warmup_steps
AXES = {  # axis -> (config field, values); the base value is in each list
    "heads": ("model.num_heads", pick([1, 2, 4, 8], [1, 2])),
    "positional encoding": ("model.positional", ["sinusoidal", "learned", "none"]),
    "label smoothing": ("optimizer.label_smoothing", [0.0, 0.1]),
    "layer norm": ("model.pre_ln", [False, True]),
    "warmup": ("optimizer.warmup_steps", pick([W // 4, W, 4 * W], [W // 4, W])),
}
if SMALL:  # every run costs compiles: keep two axes, three configurations
  for axis in ("positional encoding", "layer norm", "warmup"):
    print(f"small mode: axis '{axis}' skipped")
    del AXES[axis]
RUNS_DIR = tempfile.mkdtemp(prefix="txf-notebook-03-")


def variant(field, value):
  """The base config with one field changed."""
  config = base.copy_and_resolve_references()
  section, name = field.split(".")
  config[section][name] = value
  return config


def base_value(field):
  section, name = field.split(".")
  return base[section][name]


def run(config, name):
  """Train ``config`` in RUNS_DIR/name (the loop's own lines are kept out of the notebook):
  the final eval metrics, the train NLL curve [(step, nll)] and the seconds it took."""
  workdir, started = os.path.join(RUNS_DIR, name), time.time()
  with contextlib.redirect_stdout(io.StringIO()):
    final = train(config, workdir)
  rows = viz.read_metrics_rows(os.path.join(workdir, "metrics.jsonl"))
  curve = [(r["step"], r["nll"]) for r in rows if r["split"] == "train"]
  return {"final": final, "train_nll": curve, "seconds": time.time() - started}


runs = {}  # (field, value) -> [run per seed]; the base configuration is run once and shared
start = time.time()
for axis, (field, values) in AXES.items():
  for value in values:
    key = ("base", None) if value == base_value(field) else (field, value)
    if key in runs:
      continue
    runs[key] = []
    for seed in SEEDS:
      config = variant(field, value)
      config.seed = seed
      runs[key].append(run(config, f"{key[0]}={key[1]}-seed{seed}"))
    final = runs[key][-1]["final"]
    print(f"{str(key):48s} {len(SEEDS)} seed(s), {sum(r['seconds'] for r in runs[key]):6.1f} s; "
          f"last seed: nll {final['nll']:.3f}, exact match {final['exact_match']:.3f}")
print(f"{len(runs)} configurations x {len(SEEDS)} seeds in {time.time() - start:.0f} s")

# %% [markdown]
# ## Results
#
# Mean ± standard deviation over seeds at the last step, and each variant's difference in eval NLL
# to the base configuration with its confidence interval and Welch's p-value (the statistics of
# `txf sweep`: a difference whose interval spans zero is within the seeds' noise). The same study as a
# sweep file, run and reported by `txf sweep`, is docs/sweeps.md's subject.

# %%
def runs_for(field, value):
  return runs[("base", None) if value == base_value(field) else (field, value)]


all_em = [r["final"]["exact_match"] for rs in runs.values() for r in rs]
if SMALL:  # the site's copy: say what this run is before its table
  display(Markdown(
      f"**Reduced run** (`TXF_NOTEBOOK_SMALL=1`, the copy the documentation site shows): {STEPS} steps "
      f"of a d_model={base.model.d_model}, {base.model.num_encoder_layers}+{base.model.num_decoder_layers}"
      f"-layer model, {len(SEEDS)} seed(s), {len(runs)} configurations. "
      + ("Too short to learn the task: exact match is zero in every arm, so the bar chart is empty. "
         if not any(all_em) else "Far too short to compare the arms. ")
      + "It shows what the notebook computes and draws, not a result: run the notebook without "
        "`TXF_NOTEBOOK_SMALL` for the full grid. A study that was run in full is shown at the end "
        "(*A measured study*)."))

rows = []
for axis, (field, values) in AXES.items():
  for value in values:
    finals = [r["final"] for r in runs_for(field, value)]
    mark = " (base)" if value == base_value(field) else ""
    base_nll = [r["final"]["nll"] for r in runs[("base", None)]]
    rows.append((axis, f"`{field.split('.')[1]}={value}`{mark}",
                 mean_and_spread([f["nll"] for f in finals]),
                 "" if mark else against_base([f["nll"] for f in finals], base_nll),
                 mean_and_spread([f["accuracy"] for f in finals]),
                 mean_and_spread([f["exact_match"] for f in finals])))
display(table(rows, ["axis", "setting", "eval NLL", "Δ NLL vs base [95%], Welch p", "token accuracy",
                     "exact match"]))

# %%
fig = viz.new_figure(4.2 * len(AXES), 3.8)
for ax, (axis, (field, values)) in zip(fig.subplots(1, len(AXES), sharey=True), AXES.items()):
  for value in values:
    curves = [r["train_nll"] for r in runs_for(field, value)]
    steps = [s for s, _ in curves[0]]
    mean = np.mean([[nll for _, nll in c] for c in curves], axis=0)
    ax.plot(steps, mean, label=f"{value}" + (" (base)" if value == base_value(field) else ""))
  ax.set_title(axis)
  ax.set_xlabel("step")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
fig.axes[0].set_ylabel(f"train NLL (mean of {len(SEEDS)} seed(s))")
show(viz.save_figure(fig, os.path.join(OUT, "03_loss_curves.png"), tight=True))

fig = viz.new_figure(10, 4)
ax = fig.subplots()
labels, means, spreads = [], [], []
for axis, (field, values) in AXES.items():
  for value in values:
    em = [r["final"]["exact_match"] for r in runs_for(field, value)]
    labels.append(f"{field.split('.')[1]}={value}")
    means.append(np.mean(em))
    spreads.append(np.std(em, ddof=1) if len(em) > 1 else 0.0)
ax.bar(range(len(labels)), means, yerr=spreads, color="tab:blue", alpha=0.8, capsize=3)
ax.set_xticks(range(len(labels)))
ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
ax.set_ylabel("held-out exact match")
ax.set_title(("reduced run: " if SMALL else "") +
             f"after {STEPS} steps ({len(SEEDS)} seed(s); base configuration repeated per axis)")
show(viz.save_figure(fig, os.path.join(OUT, "03_exact_match.png"), tight=True))

# %% [markdown]
# ## What this grid measured
#
# Per axis, the setting with the highest mean exact match, against the base configuration.

# %%
base_em = np.mean([r["final"]["exact_match"] for r in runs[("base", None)]])
lines = []
for axis, (field, values) in AXES.items():
  em = {v: np.mean([r["final"]["exact_match"] for r in runs_for(field, v)]) for v in values}
  best = max(values, key=lambda v: em[v])
  worst = min(values, key=lambda v: em[v])
  lines.append(f"* **{axis}**: best `{field.split('.')[1]}={best}` ({em[best]:.2f}), worst "
               f"`{worst}` ({em[worst]:.2f}); base {base_em:.2f}")
display(Markdown(("**Reduced run**, not a result. " if SMALL else "")
                 + f"After {STEPS} steps, {len(SEEDS)} seed(s), exact match on {EVAL_EXAMPLES} held-out "
                 f"sentences:\n\n" + "\n".join(lines)))
print("figures written:", sorted(f for f in os.listdir(OUT) if f.startswith("03_")))

# %% [markdown]
# ## A measured study: gated FFNs on Tiny Shakespeare
#
# The grid above, run in full, takes tens of minutes, and the site shows its reduced run. A study run
# in full with `txf sweep` (`experiments/sweeps/shakespeare_glu.py`): ReLU against SwiGLU and GeGLU
# at equal parameter count, five seeds each, scored by the validation loss in nats per character.
# Its report is on the Sweeps page of the documentation (`docs/sweeps.md`, "A published direction,
# reproduced with its noise"); the cell below shows that table and figure as the repository holds
# them (they are read, not recomputed here).

# %%
import txf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(txf.__file__)))
SWEEPS_PAGE = os.path.join(REPO, "docs", "sweeps.md")
STUDY_FIGURE = os.path.join(REPO, "docs", "figures", "sweep_shakespeare_glu.png")
if os.path.isfile(SWEEPS_PAGE) and os.path.isfile(STUDY_FIGURE):
  with open(SWEEPS_PAGE, encoding="utf-8") as f:
    page = f.read().split("## A published direction", 1)[1].split("\n## ", 1)[0]
  display(Markdown("\n".join(line for line in page.splitlines() if line.startswith("|"))))
  show(STUDY_FIGURE)
else:
  print("docs/sweeps.md is not beside this txf (an installed copy): see the Sweeps page of the site")
