# %% [markdown]
# # 05 — Inside the trained Transformer: capture, patch, ablate
#
# `txf.inspect` names every intermediate of a model (the embeddings, each layer's residual stream in
# and out, each attention's queries, keys, weights per head and heads' outputs before W^O, the FFN
# hidden activations, the norms, the logits) and offers three jit-compiled functions over a loaded
# run: `capture(run, batch, names)`, `patch(run, batch, {name: value or fn})` and
# `ablate(run, batch, heads=..., units=..., mode="zero"|"mean")`, plus the logit lens. Three
# studies use them:
#
# 1. the default toy translation run: which cross-attention heads carry the reordering (exact match
#    lost when each head is removed);
# 2. induction heads: a 2-layer attention-only language model on sequences `x x` (a random string
#    repeated) finds the earlier copy of the current token and predicts the token after it; a
#    per-head prefix-matching score finds the head that does it, and ablating it is compared with
#    ablating every other head;
# 3. the logit lens on a short Tiny Shakespeare run (needs `TXF_DATA`).
#
# `TXF_NOTEBOOK_SMALL=1` trains tiny models for a few steps (a smoke test of the notebook, not a
# result) and skips Tiny Shakespeare when `TXF_DATA` is unset.

# %%
import os
import tempfile

SMALL = os.environ.get("TXF_NOTEBOOK_SMALL", "").strip().lower() not in ("", "0", "false", "no")
if SMALL:
  from txf.runtime.process import add_xla_flags  # only the flags this jaxlib's XLA knows (an unknown one is fatal)
  add_xla_flags("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
OUT = os.environ.get("TXF_NOTEBOOK_OUT") or tempfile.mkdtemp(prefix="txf-notebook-")
os.makedirs(OUT, exist_ok=True)
print(f"small mode: {SMALL}; figures in "
      + ("$TXF_NOTEBOOK_OUT" if os.environ.get("TXF_NOTEBOOK_OUT") else OUT))

import jax
import numpy as np
from IPython.display import Image, Markdown, display

from txf import inference
from txf import inspect as ti
from txf.core.config import load_experiment
from txf.inspect import heads as heads_lib
from txf.train import train, viz


def pick(full, small):
  return small if SMALL else full


def show(path):
  """Display a PNG written by the notebook."""
  display(Image(filename=path))


def table(rows, header):
  """A Markdown table."""
  lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
  return Markdown("\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]))


def fresh_workdir(name):
  return os.path.join(tempfile.mkdtemp(prefix=f"txf-notebook-05-{name}-"), "run")

# %% [markdown]
# ## 1. The toy translation run: one cross-attention head at a time
#
# The default experiment (`txf train`, 1200 steps) is trained, then every cross-attention head is
# removed in turn (its output before W^O set to zero) and the held-out split is decoded greedily,
# each step a full forward of the prefix with the head removed (`txf.inspect.heads`, what
# `txf ablate-heads` runs for every head). Small mode: a 1+1-layer model, 20 steps, 20 sentences.

# %%
config = load_experiment("default")
config.eval_every = 0
config.checkpoint_every = 0
config.num_samples = 0
config.decode_examples = pick(500, 0)
if SMALL:
  config.num_train_steps, config.batch_size, config.log_every = 20, 32, 10
  config.model.update(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)
  config.optimizer.warmup_steps = 10
workdir = fresh_workdir("default")
print({k: round(v, 4) for k, v in train(config, workdir).items()})
run = inference.load_run(workdir)
batches = list(run.task.eval_batches("val", 100, pick(500, 20)))
baseline = heads_lib.evaluate(run, batches)
cross = [m for m in heads_lib.attention_modules(run, batches[0]) if m.endswith("cross_attention")]
rows, grid = [], []
for module in cross:
  line = []
  for head in range(run.model_cfg.num_heads):
    masks = ti.ablation_masks(run, batches[0], heads=[(module, head)])
    m = heads_lib.evaluate(run, batches, masks)
    lost = baseline["exact_match"] - m["exact_match"]
    line.append(lost)
    rows.append([module, head, f"{m['exact_match']:.3f}", f"{lost:+.3f}",
                 f"{m['loss'] - baseline['loss']:+.3f}"])
  grid.append(line)
print(f"baseline: exact match {baseline['exact_match']:.3f}, loss {baseline['loss']:.4f}, "
      f"BLEU {baseline['bleu']:.2f} on {sum(int(np.asarray(b['inputs']).any(-1).sum()) for b in batches)} "
      f"held-out sentences")
display(table(rows, ["module", "head", "exact match", "exact match lost", "loss added"]))
show(viz.plot_head_table(np.array(grid), cross, "exact match lost when one cross-attention head "
                         "is removed", os.path.join(OUT, "05_cross_heads.png"), "exact match lost"))

# %% [markdown]
# ## 2. Induction heads
#
# `experiments/induction.py`: a decoder-only model with two attention-only layers (`model.d_ff=0`:
# no FFN sublayer) and ALiBi positions, trained on `synthetic:repeat`, sequences `x x EOS` with `x`
# 8 to 16 symbols drawn from 64. The second copy is predictable only by looking back. For a query at position `p`
# of the second copy whose current token first occurred at position `j`, an induction head
# attends to `j + 1`, the token that followed it: the **prefix-matching score** of a head is its
# mean attention weight on that position. The **repeated-half loss** is the mean NLL of the second
# copy's tokens after its first (the first is not predictable). Small mode: 30 steps.

# %%
config = load_experiment("induction")
if SMALL:
  config.num_train_steps, config.log_every, config.checkpoint_every = 30, 10, 0
workdir = fresh_workdir("induction")
print({k: round(v, 4) for k, v in train(config, workdir).items()})
run = inference.load_run(workdir)
batch = run.task.eval_batches("val", 200, 200)[0]
targets = np.asarray(batch["targets"])
n = ((targets != 0).sum(1) - 1) // 2                   # each row: x x EOS, |x| = n
position = np.arange(targets.shape[1])[None, :]
repeated = (position > n[:, None]) & (position < 2 * n[:, None])  # x_2 .. x_n of the second copy
rows_i, queries = np.nonzero(repeated)  # query p reads input p = target p - 1 and predicts target p


def repeated_loss(logits):
  """Mean NLL (nats) of the repeated half's predictable tokens."""
  logp = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float64), -1))
  picked = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  return float(-(picked * repeated).sum() / repeated.sum())


modules = heads_lib.attention_modules(run, batch)
weights = ti.capture(run, batch, [f"{m}/weights" for m in modules])
base = repeated_loss(ti.capture(run, batch, ["logits"])["logits"])
study = []
for module in modules:
  w = np.asarray(weights[f"{module}/weights"])
  for head in range(run.model_cfg.num_heads):
    score = float(w[rows_i, head, queries, queries - n[rows_i] + 1].mean())
    previous = float(w[rows_i, head, queries, queries - 1].mean())
    ratio = repeated_loss(ti.ablate(run, batch, heads=[(module, head)])) / base
    study.append((module, head, score, previous, ratio))
display(table([[m, h, f"{s:.3f}", f"{p:.3f}", f"{r:.2f}x"] for m, h, s, p, r in study],
              ["module", "head", "prefix matching", "previous token", "repeated-half loss, ablated"]))
best = max(study, key=lambda r: r[2])
partner = max((r for r in study if r[0] == modules[0]), key=lambda r: r[3])
others = max(r[4] for r in study if r[:2] not in (best[:2], partner[:2]))
print(f"repeated-half loss {base:.4f} nats; the induction head is {best[0]} head {best[1]} "
      f"(prefix matching {best[2]:.3f}); ablating it multiplies the loss by {best[4]:.1f}; its "
      f"previous-token partner {partner[0]} head {partner[1]} by {partner[4]:.1f}; any other head "
      f"by at most {others:.2f}")
print("one head carries it (ablated: at least 5x the loss; any other head: under 1.5x):",
      best[4] >= 5.0 and max(others, partner[4]) < 1.5)
layer = int(best[0].split("/")[1].split("_")[1])
example = int(np.argmax(n))
length = 2 * n[example] + 1
labels = ["<s>"] + [run.task.decode_target([int(i)]) for i in targets[example, :length - 1]]
show(viz.plot_attention_heads(
    [np.asarray(weights[f"{m}/weights"])[example][:, :length, :length] for m in modules],
    labels, labels, "attention of each head on one repeated sequence (the induction head's "
    "stripe sits one after the diagonal's earlier copy)", os.path.join(OUT, "05_induction_attention.png")))
show(viz.plot_head_table(
    np.array([[r[2] for r in study if r[0] == m] for m in modules]), modules,
    "prefix-matching score per head", os.path.join(OUT, "05_induction_scores.png"), "score"))

# %% [markdown]
# ## 3. The logit lens on Tiny Shakespeare
#
# A short character-level run of `experiments/shakespeare_char.py` (400 steps, context 128,
# instead of 1500 steps at 256), then each layer's residual stream sent through the final norm
# and the tied output head (`txf.inspect.logit_lens`): which next character each layer would
# predict, and the mean NLL of the validation text at each depth. Needs the data
# (`TXF_DATA=/path/to/data`, with `tinyshakespeare/input.txt`); skipped without it.

# %%
if os.environ.get("TXF_DATA") and os.path.isfile(
    os.path.join(os.environ["TXF_DATA"], "tinyshakespeare", "input.txt")):
  config = load_experiment("shakespeare_char")
  config.num_train_steps = pick(400, 10)
  config.optimizer.warmup_steps = pick(100, 5)
  config.optimizer.cooldown_steps = pick(100, 2)
  config.data.max_target_len = pick(128, 32)
  config.eval_every, config.checkpoint_every, config.num_samples = 0, 0, 0
  if SMALL:
    config.model.update(d_model=32, num_heads=2, d_ff=64, num_decoder_layers=2)
  workdir = fresh_workdir("shakespeare")
  print({k: round(v, 4) for k, v in train(config, workdir).items()})
  run = inference.load_run(workdir)
  batch = run.task.eval_batches("val", 16, 16)[0]
  lens = np.asarray(ti.logit_lens(run, batch), np.float64)       # [N + 1, B, T, V]
  targets = np.asarray(batch["targets"])
  logp = lens - lens.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, np.broadcast_to(targets[None, ..., None], logp.shape[:-1] + (1,)),
                            -1)[..., 0]
  real = targets != 0
  depth = ["embeddings"] + [f"layer {i}" for i in range(lens.shape[0] - 1)]
  display(table([[d, f"{(nll[i] * real).sum() / real.sum():.3f}"] for i, d in enumerate(depth)],
                ["residual stream after", "validation NLL through the head (nats/char)"]))
  text = targets[0, :40]
  show(viz.plot_logit_lens(lens[:, 0, :40], ["<s>"] + [run.task.decode_target([int(i)]) or "?"
                                                       for i in text[:-1]],
                           lambda i: repr(run.task.decode_target([i]))[1:-1] or "?",
                           os.path.join(OUT, "05_logit_lens.png")))
else:
  print("TXF_DATA is not set (or holds no tinyshakespeare/input.txt): the logit lens study is skipped")
