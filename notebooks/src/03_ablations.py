# %% [markdown]
# # 03 — Ablations on the built-in translation task
#
# One change at a time from the default experiment (`experiments/default.py`), a few seeds each:
#
# | axis | values | field |
# |---|---|---|
# | heads | 1 / 4 (d_k = 128 / h) | `model.num_heads` |
# | positional encoding | sinusoidal / learned | `model.positional` |
# | label smoothing | `0` / `0.1` | `optimizer.label_smoothing` |
#
# Runs are short (400 steps instead of the default 1200), so this compares **how fast** each variant
# learns as much as where it ends. Each run is `txf.train.train(config, workdir)` in a temporary
# workdir, the same loop and evaluator as `txf train`; its metrics.jsonl gives the curves. The
# table reports the held-out **NLL** (plain cross-entropy, comparable across label smoothing
# values), token accuracy and **exact match** (greedy decoding of held-out sentences, as the loop
# logs it).
#
# The full grid (4 configurations × 3 seeds, 12 runs) takes tens of minutes on a 2-core CPU. It was
# cut to fit the time of a shared 2-core machine: the warmup and layer-norm axes, 2 and 8 heads and
# the absent positional encoding are not run (add them to `AXES` to run them: for example
# `"layer norm": ("model.pre_ln", [False, True])`).
# `TXF_NOTEBOOK_RUNS=DIR` keeps the runs' workdirs in DIR: a grid stopped part way (Ctrl-C, a
# signal) goes on from where it stopped when the notebook runs again with the same DIR.
# `TXF_NOTEBOOK_SMALL=1` keeps two axes with one alternative each, one seed, a 1+1-layer
# d_model=32 model and a few steps: a smoke test of the notebook, not a result. In that mode the
# tables and figures show the full grid's results as stored in the repository (what the
# documentation site shows, saying when and on what CPU it ran).

# %%
import contextlib
import io
import json
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
AXES = {  # axis -> (config field, values); the base value is in each list
    "heads": ("model.num_heads", pick([1, 4], [1, 2])),
    "positional encoding": ("model.positional", ["sinusoidal", "learned"]),
    "label smoothing": ("optimizer.label_smoothing", [0.0, 0.1]),
}
if SMALL:  # every run costs compiles: keep two axes, three configurations
  for axis in ("positional encoding",):
    print(f"small mode: axis '{axis}' skipped")
    del AXES[axis]
RUNS_DIR = os.environ.get("TXF_NOTEBOOK_RUNS") or tempfile.mkdtemp(prefix="txf-notebook-03-")


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

# this run as a study: the same record whether it is shown now or stored and shown later
grid = {"steps": STEPS, "seeds": SEEDS, "eval_examples": EVAL_EXAMPLES,
        "axes": {axis: [field, values] for axis, (field, values) in AXES.items()},
        "runs": [{"key": list(key), "seed": seed, "seconds": round(r["seconds"], 1),
                  "final": {k: float(v) for k, v in r["final"].items()}, "train_nll": r["train_nll"]}
                 for key, rs in runs.items() for seed, r in zip(SEEDS, rs)]}
SAVE = os.environ.get("TXF_NOTEBOOK_SAVE")  # full mode: store the study as JSON there
if SAVE and not SMALL:
  import datetime
  from txf.runtime.machine import machine_info
  grid.update(finished=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              seconds=round(time.time() - start), machine=machine_info())
  with open(SAVE, "w", encoding="utf-8") as f:
    json.dump(grid, f, indent=1)
  print(f"results stored in {os.path.basename(SAVE)}")

# %% [markdown]
# ## Results
#
# Mean ± standard deviation over seeds at the last step, and each variant's difference in eval NLL
# to the base configuration with its confidence interval and Welch's p-value (the statistics of
# `txf sweep`: a difference whose interval spans zero is within the seeds' noise). The same study as a
# sweep file, run and reported by `txf sweep`, is docs/sweeps.md's subject.
#
# In small mode the notebook shows the full grid's results stored in the repository
# (`docs/results/03_ablations.json`, written by a full run with `TXF_NOTEBOOK_SAVE` set) instead
# of its own reduced run, which only checks the code: that is what the documentation site shows.

# %%
import txf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(txf.__file__)))
STORED = os.path.join(REPO, "docs", "results", "03_ablations.json")
if SMALL and os.path.isfile(STORED):
  with open(STORED, encoding="utf-8") as f:
    study = json.load(f)
else:
  study = grid
study_axes = {axis: (field, values) for axis, (field, values) in study["axes"].items()}
keys = {tuple(r["key"]) for r in study["runs"]}


def study_base(field, values):
  """The axis value of the base configuration: the one without runs of its own."""
  return next(v for v in values if (field, v) not in keys)


def runs_for(field, value):
  """The study's runs (one per seed) of ``field=value``."""
  values = study_axes[next(a for a, (f, _) in study_axes.items() if f == field)][1]
  key = ("base", None) if value == study_base(field, values) else (field, value)
  return [r for r in study["runs"] if tuple(r["key"]) == key]


n_seeds, n_configs = len(study["seeds"]), len(keys)
if study is not grid:  # the site's copy: what the table shows, and the reduced run beside it
  m = study["machine"]
  display(Markdown(
      f"**The full grid, stored**: {n_configs} configurations × {n_seeds} seeds of the default "
      f"experiment trained for {study['steps']} steps each, {len(study['runs'])} runs in "
      f"{study['seconds'] / 60:.0f} min, finished {study['finished']} on {m['cpu']} "
      f"({m['cpu_count']} cores; {', '.join(m['simd'])}: `txf info`), jax {m['jax']}, a machine "
      f"shared with other work (1-minute load {m['load_1min']:.0f} at the end). "
      f"**Reduced run** (`TXF_NOTEBOOK_SMALL=1`, what this page's build executed): "
      f"{len(runs)} configurations of a d_model={base.model.d_model} model for {STEPS} steps, to "
      f"check the code above; its numbers are not shown."))
elif SMALL:  # no stored study beside this txf (an installed copy): the reduced run, said so
  display(Markdown(
      f"**Reduced run** (`TXF_NOTEBOOK_SMALL=1`): {STEPS} steps of a d_model={base.model.d_model} "
      f"model, {len(SEEDS)} seed(s), {len(runs)} configurations: it shows what the notebook "
      "computes and draws, not a result. Run the notebook without `TXF_NOTEBOOK_SMALL` for the grid."))

rows = []
for axis, (field, values) in study_axes.items():
  base_nll = [r["final"]["nll"] for r in runs_for(field, study_base(field, values))]
  for value in values:
    finals = [r["final"] for r in runs_for(field, value)]
    mark = " (base)" if value == study_base(field, values) else ""
    rows.append((axis, f"`{field.split('.')[1]}={value}`{mark}",
                 mean_and_spread([f["nll"] for f in finals]),
                 "" if mark else against_base([f["nll"] for f in finals], base_nll),
                 mean_and_spread([f["accuracy"] for f in finals]),
                 mean_and_spread([f["exact_match"] for f in finals])))
display(table(rows, ["axis", "setting", "eval NLL", "Δ NLL vs base [95%], Welch p", "token accuracy",
                     "exact match"]))

# %%
label = "" if study is not grid or not SMALL else "reduced run: "
fig = viz.new_figure(4.2 * len(study_axes), 3.8)
for ax, (axis, (field, values)) in zip(fig.subplots(1, len(study_axes), sharey=True), study_axes.items()):
  for value in values:
    curves = [r["train_nll"] for r in runs_for(field, value)]
    steps = [s for s, _ in curves[0]]
    mean = np.mean([[nll for _, nll in c] for c in curves], axis=0)
    ax.plot(steps, mean, label=f"{value}" + (" (base)" if value == study_base(field, values) else ""))
  ax.set_title(axis)
  ax.set_xlabel("step")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
fig.axes[0].set_ylabel(f"train NLL (mean of {n_seeds} seed(s))")
show(viz.save_figure(fig, os.path.join(OUT, "03_loss_curves.png"), tight=True))

fig = viz.new_figure(10, 4)
ax = fig.subplots()
labels, means, spreads = [], [], []
for axis, (field, values) in study_axes.items():
  for value in values:
    em = [r["final"]["exact_match"] for r in runs_for(field, value)]
    labels.append(f"{field.split('.')[1]}={value}")
    means.append(np.mean(em))
    spreads.append(np.std(em, ddof=1) if len(em) > 1 else 0.0)
ax.bar(range(len(labels)), means, yerr=spreads, color="tab:blue", alpha=0.8, capsize=3)
ax.set_xticks(range(len(labels)))
ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
ax.set_ylabel("held-out exact match")
ax.set_title(label + f"after {study['steps']} steps ({n_seeds} seed(s); base configuration repeated per axis)")
show(viz.save_figure(fig, os.path.join(OUT, "03_exact_match.png"), tight=True))

# %% [markdown]
# ## What this grid measured
#
# Per axis, the setting with the highest mean exact match, against the base configuration.

# %%
lines = []
for axis, (field, values) in study_axes.items():
  em = {v: np.mean([r["final"]["exact_match"] for r in runs_for(field, v)]) for v in values}
  best = max(values, key=lambda v: em[v])
  worst = min(values, key=lambda v: em[v])
  lines.append(f"* **{axis}**: best `{field.split('.')[1]}={best}` ({em[best]:.2f}), worst "
               f"`{worst}` ({em[worst]:.2f}); base {em[study_base(field, values)]:.2f}")
display(Markdown(("**Reduced run**, not a result. " if label else "")
                 + f"After {study['steps']} steps, {n_seeds} seed(s), exact match on "
                 f"{study['eval_examples']} held-out sentences:\n\n" + "\n".join(lines)))
print("figures written:", sorted(f for f in os.listdir(OUT) if f.startswith("03_")))

# %% [markdown]
# ## A measured study: gated FFNs on Tiny Shakespeare
#
# Beside the grid above, a study run in full with `txf sweep` (`experiments/sweeps/shakespeare_glu.py`): ReLU against SwiGLU and GeGLU
# at equal parameter count, five seeds each, scored by the validation loss in nats per character.
# Its report is on the Sweeps page of the documentation (`docs/sweeps.md`, "A published direction,
# reproduced with its noise"); the cell below shows that table and figure as the repository holds
# them (they are read, not recomputed here).

# %%
SWEEPS_PAGE = os.path.join(REPO, "docs", "sweeps.md")
STUDY_FIGURE = os.path.join(REPO, "docs", "figures", "sweep_shakespeare_glu.png")
if os.path.isfile(SWEEPS_PAGE) and os.path.isfile(STUDY_FIGURE):
  with open(SWEEPS_PAGE, encoding="utf-8") as f:
    page = f.read().split("## A published direction", 1)[1].split("\n## ", 1)[0]
  display(Markdown("\n".join(line for line in page.splitlines() if line.startswith("|"))))
  show(STUDY_FIGURE)
else:
  print("docs/sweeps.md is not beside this txf (an installed copy): see the Sweeps page of the site")
