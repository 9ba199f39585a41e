# %% [markdown]
# # 03 — Ablations on the built-in translation task
#
# One change at a time from the default experiment (`experiments/default.py`), a few seeds each:
#
# | axis | values | field |
# |---|---|---|
# | heads | 1 / 2 / 4 / 8 (d_k = 128 / h) | `model.num_heads` |
# | positional encoding | sinusoidal / learned / none | `model.positional` |
# | label smoothing | 0 / 0.1 | `optimizer.label_smoothing` |
# | layer norm | post-LN (paper) / pre-LN | `model.pre_ln` |
# | warmup | 50 / 200 / 800 steps | `optimizer.warmup_steps` |
#
# Runs are short (400 steps instead of the default 1200), so this compares **how fast** each variant
# learns as much as where it ends. Each run uses `txf.notebook_utils.fit`: txf's own jit-compiled
# `train_step`/`eval_step`, without workdirs or checkpoints, one compile per configuration shared by
# its seeds. The table reports the held-out **NLL** (plain cross-entropy, comparable across label
# smoothing values), token accuracy and **exact match** (teacher-forced; equal to greedy decoding's,
# checked at the end).
#
# The full grid (10 configurations × 3 seeds) takes tens of minutes on a 2-core CPU.
# `TXF_NOTEBOOK_SMALL=1` keeps three axes with one alternative each, one seed, a 1+1-layer
# d_model=32 model and a few steps: a smoke test of the notebook, not a result.

# %%
import os
import time

from txf import notebook_utils as nu

settings = nu.configure()  # before any JAX computation (small mode: faster XLA compiles)
SMALL, OUT = settings["small"], settings["figures"]
print(settings)

import numpy as np
from IPython.display import Markdown, display

from txf.data import make_task
from txf import inference
from txf.models import model_config_from

# %%
base = nu.load_experiment("default")
STEPS = nu.pick(400, 6)
SEEDS = nu.pick([0, 1, 2], [0])
EVAL_EXAMPLES = nu.pick(500, 32)
LOG_EVERY = nu.pick(20, 2)
if SMALL:
  base.batch_size = 16
  base.model.update(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)
  base.optimizer.warmup_steps = 4
W = base.optimizer.warmup_steps
AXES = {  # axis -> (config field, values); the base value is in each list
    "heads": ("model.num_heads", nu.pick([1, 2, 4, 8], [1, 2])),
    "positional encoding": ("model.positional", ["sinusoidal", "learned", "none"]),
    "label smoothing": ("optimizer.label_smoothing", [0.0, 0.1]),
    "layer norm": ("model.pre_ln", [False, True]),
    "warmup": ("optimizer.warmup_steps", nu.pick([W // 4, W, 4 * W], [W // 4, W])),
}
if SMALL:  # every new model structure costs compiles: keep three axes, four configurations
  for axis in ("positional encoding", "layer norm"):
    print(f"small mode: axis '{axis}' skipped")
    del AXES[axis]


def variant(field, value):
  """The base config with one field changed."""
  config = base.copy_and_resolve_references()
  section, name = field.split(".")
  config[section][name] = value
  return config


def base_value(field):
  section, name = field.split(".")
  return base[section][name]


runs = {}  # (field, value) -> [Run per seed]; the base configuration is run once and shared
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
      runs[key].append(nu.quick_train(config, STEPS, EVAL_EXAMPLES, LOG_EVERY))
    final = runs[key][-1].final
    print(f"{str(key):48s} {len(SEEDS)} seed(s), {sum(r.seconds for r in runs[key]):6.1f} s; "
          f"last seed: nll {final['nll']:.3f}, exact match {final['exact_match']:.3f}")
print(f"{len(runs)} configurations x {len(SEEDS)} seeds in {time.time() - start:.0f} s")

# %% [markdown]
# ## Results
#
# Mean ± standard deviation over seeds at the last step.

# %%
def runs_for(field, value):
  return runs[("base", None) if value == base_value(field) else (field, value)]


rows = []
for axis, (field, values) in AXES.items():
  for value in values:
    finals = [r.final for r in runs_for(field, value)]
    mark = " (base)" if value == base_value(field) else ""
    rows.append((axis, f"`{field.split('.')[1]}={value}`{mark}",
                 nu.mean_and_spread([f["nll"] for f in finals]),
                 nu.mean_and_spread([f["accuracy"] for f in finals]),
                 nu.mean_and_spread([f["exact_match"] for f in finals])))
display(Markdown(nu.table(rows, ["axis", "setting", "eval NLL", "token accuracy", "exact match"])))

# %%
fig = nu.new_figure(4.2 * len(AXES), 3.8)
for ax, (axis, (field, values)) in zip(fig.subplots(1, len(AXES), sharey=True), AXES.items()):
  for value in values:
    curves = [r.train_nll for r in runs_for(field, value)]
    steps = [s for s, _ in curves[0]]
    mean = np.mean([[loss for _, loss in c] for c in curves], axis=0)
    ax.plot(steps, mean, label=f"{value}" + (" (base)" if value == base_value(field) else ""))
  ax.set_title(axis)
  ax.set_xlabel("step")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
fig.axes[0].set_ylabel(f"train NLL (mean of {len(SEEDS)} seed(s))")
nu.show(nu.save_figure(fig, "03_loss_curves.png"))

fig = nu.new_figure(10, 4)
ax = fig.subplots()
labels, means, spreads = [], [], []
for axis, (field, values) in AXES.items():
  for value in values:
    em = [r.final["exact_match"] for r in runs_for(field, value)]
    labels.append(f"{field.split('.')[1]}={value}")
    means.append(np.mean(em))
    spreads.append(np.std(em, ddof=1) if len(em) > 1 else 0.0)
ax.bar(range(len(labels)), means, yerr=spreads, color="tab:blue", alpha=0.8, capsize=3)
ax.set_xticks(range(len(labels)))
ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
ax.set_ylabel("held-out exact match")
ax.set_title(f"after {STEPS} steps ({len(SEEDS)} seed(s); base configuration repeated per axis)")
nu.show(nu.save_figure(fig, "03_exact_match.png"))

# %% [markdown]
# **One recorded full run** (3 seeds × 400 steps, 500 held-out sentences; 50 min on a shared 2-core
# CPU), exact match mean ± sd: heads 1 / 2 / 4 / 8: 0.33 ± 0.36 / 0.65 ± 0.20 / 0.79 ± 0.16 /
# 0.83 ± 0.06; PE sinusoidal / learned / none: 0.79 / 0.76 ± 0.10 / 0.15 ± 0.02; label smoothing
# 0 / 0.1: 0.76 ± 0.10 / 0.79; pre-LN: 0.96 ± 0.04 (post-LN 0.79); warmup 50 / 200 / 800: 0.00
# (stuck at NLL 2.2: the peak rate (128·50)^-0.5 = 0.0125 is too high) / 0.79 / 0.96 ± 0.04. At
# this short horizon the base's peak rate of 0.00625 at step 200 makes post-LN runs seed-sensitive;
# pre-LN and a gentler warmup both remove most of that. Greedy vs teacher-forced exact match on
# 200 sentences: 0.900 and 0.900.

# %% [markdown]
# ## Check: teacher-forced exact match = greedy-decoding exact match
#
# Greedy decoding feeds back its own argmax; it reproduces the reference exactly when every
# teacher-forced argmax (EOS included) is the reference token. So the number in the table is what
# `txf.inference.translate_texts` (the loop's greedy decoder, with its KV cache) would give.

# %%
config = variant("model.num_heads", base.model.num_heads)
task = make_task(config)
model_cfg = model_config_from(config, task)
run = runs[("base", None)][0]
examples = task.examples(config.data.eval_split, nu.pick(200, 16))
hyps = inference.translate_texts(model_cfg, run.params, task, [e.source_ids for e in examples])
greedy = inference.exact_match(hyps, [e.reference for e in examples])
evaluator = nu.make_evaluator(model_cfg, config.optimizer.label_smoothing)
forced = nu.evaluate(evaluator, run.params, task.eval_batches(config.data.eval_split, len(examples),
                                                              len(examples)))["exact_match"]
print(f"base model, seed 0, {len(examples)} held-out sentences: greedy {greedy:.3f}, teacher-forced {forced:.3f}")
assert abs(greedy - forced) < 1e-9
print("figures in", OUT, ":", sorted(f for f in os.listdir(OUT) if f.startswith("03_")))
