# %% [markdown]
# # 02 — Attention maps of a trained translator
#
# Train the default experiment (`experiments/default.py`: the toy English → "toy-Romance" task, whose
# grammar moves the verb to the end, puts adjectives after the noun and the adverb after the subject)
# briefly with `txf.train.train` in a temporary workdir, then draw **every head of every layer**
# for one held-out sentence: encoder self-attention, decoder causal self-attention, and
# encoder-decoder cross-attention. The cross-attention should show the learned alignment — including
# the reordering — and we measure how often each head's strongest source word is the word being
# translated.
#
# `TXF_NOTEBOOK_SMALL=1`: a tiny model trained for a few steps (the maps are then mostly noise).

# %%
import os
import shutil
import tempfile

# Small mode (TXF_NOTEBOOK_SMALL=1, what the tests run) shrinks the run and, before JAX starts, asks
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

import numpy as np
from IPython.display import Image, Markdown, display

from txf import inference
from txf.train import viz
from txf.core.config import load_experiment
from txf.data import synthetic
from txf.data.base import pad_batch
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

# %% [markdown]
# ## Train
#
# The default experiment runs 1200 steps; 800 are trained here, then the held-out exact match of
# 200 greedy-decoded sentences is printed (and summed up at the end with the alignment measured
# below). Small mode trains a 1+1-layer, d_model=32 model for 20 steps and decodes nothing.

# %%
config = load_experiment("default")
config.num_train_steps = pick(800, 20)
config.eval_every = 0                        # evaluate once, at the end
config.checkpoint_every = 0                  # one checkpoint, at the end
config.log_every = pick(50, 5)
config.decode_examples = pick(200, 0)     # greedy-decoded exact match (skipped in small mode)
config.num_samples = pick(3, 0)
config.eval_batches = pick(0, 1)
if SMALL:
  config.batch_size = 32
  config.model.update(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)
  config.optimizer.warmup_steps = 10
workdir = os.path.join(tempfile.mkdtemp(prefix="txf-notebook-02-"), "run")
final = train(config, workdir)
print({k: round(v, 4) for k, v in final.items()})
shutil.copy(os.path.join(workdir, "loss_curves.png"), os.path.join(OUT, "02_loss_curves.png"))
show(os.path.join(OUT, "02_loss_curves.png"))

# %% [markdown]
# ## One held-out sentence through the model
#
# We pick a held-out sentence with an adverb and an adjective (both move in translation), run the
# trained model once with teacher forcing (`attention_impl='reference'`, the attention weights sown
# into the `intermediates` collection), and collect the maps `[layers, batch, heads, L_q, L_k]`.

# %%
run = inference.load_run(workdir)
task, model_cfg, params = run.task, run.model_cfg, run.params
adverbs = {a for a, _ in synthetic.ADVERBS}
adjectives = {a for a, _ in synthetic.ADJECTIVES}
candidates = task.examples("val", 100)
example = next((e for e in candidates
                if adverbs & set(e.source.split()) and adjectives & set(e.source.split())), candidates[0])


def padded_batch(examples):
  """Held-out examples -> {"inputs" [B, S], "targets" [B, T]} at the task's fixed lengths (one compile)."""
  return {"inputs": pad_batch([e.source_ids for e in examples], task.max_input_len),
          "targets": pad_batch([task.codec.encode(e.reference) for e in examples], task.max_target_len)}


src_tokens = example.source.split() + ["</s>"]
dec_inputs = ["<s>"] + example.reference.split()            # what the decoder reads at each position
dec_outputs = example.reference.split() + ["</s>"]          # what it predicts there
S, T = len(src_tokens), len(dec_outputs)
maps = viz.attention_maps(model_cfg, params, padded_batch([example]))
print({k: v.shape for k, v in maps.items()}, "-> cut to the real lengths S =", S, "T =", T)
maps = {"encoder_self": maps["encoder_self"][..., :S, :S], "decoder_self": maps["decoder_self"][..., :T, :T],
        "cross": maps["cross"][..., :T, :S]}
print("source:    ", example.source)
print("reference: ", example.reference)
if not SMALL:
  print("model:     ", inference.translate_texts(model_cfg, params, task, [example.source_ids])[0])

# %%
show(viz.plot_attention_heads(maps["encoder_self"][:, 0], src_tokens, src_tokens,
                              "encoder self-attention (rows: queries, columns: keys)",
                              os.path.join(OUT, "02_encoder_self.png")))
show(viz.plot_attention_heads(maps["decoder_self"][:, 0], dec_inputs, dec_inputs,
                              "decoder causal self-attention (nothing above the diagonal)",
                              os.path.join(OUT, "02_decoder_self.png")))
show(viz.plot_attention_heads(maps["cross"][:, 0], dec_outputs, src_tokens,
                              "cross-attention (rows: the target word being predicted)",
                              os.path.join(OUT, "02_cross.png")))
assert np.allclose(np.triu(maps["decoder_self"][:, 0], k=1), 0.0)  # causal: no look-ahead

# %% [markdown]
# ## Does cross-attention align words?
#
# The toy language has a lexicon (`txf.data.synthetic`): every target content word (noun,
# adjective, verb, adverb) translates one source word. For each held-out sentence and each such
# target word whose source word occurs once, the row of the cross-attention map that predicts it
# "aligns" correctly when its largest weight falls on that source word. A monotone aligner (target
# position *t* → source position *t*) is the baseline: the grammar reorders, so it scores low.

# %%
lexicon = {}
for src_sg, src_pl, stem, _ in synthetic.NOUNS:
  lexicon.update({stem + e: {src_sg, src_pl} for e in synthetic.ENDINGS.values()})
for src, stem in synthetic.ADJECTIVES:
  lexicon.update({stem + e: {src} for e in synthetic.ENDINGS.values()})
for sg, pl, tgt in synthetic.VERBS:
  lexicon.update({tgt: {sg, pl}, tgt + "n": {sg, pl}})
lexicon.update({tgt: {src} for src, tgt in synthetic.ADVERBS})

held_out = task.examples("val", pick(200, 16))
n_layers, n_heads = maps["cross"].shape[0], maps["cross"].shape[2]
hits, monotone, total = np.zeros((n_layers, n_heads)), 0, 0
all_cross = viz.attention_maps(model_cfg, params, padded_batch(held_out))["cross"]  # [l, B, h, T, S]
for b, e in enumerate(held_out):
  cross = all_cross[:, b]
  src_words = e.source.split()
  for t, word in enumerate(e.reference.split()):
    gold = [i for i, w in enumerate(src_words) if w in lexicon.get(word, ())]
    if len(gold) != 1:
      continue
    total += 1
    monotone += int(t == gold[0])
    hits += cross[:, :, t, :].argmax(-1) == gold[0]           # [layers, heads]
rate = hits / max(total, 1)
rows = [(f"layer {l}", *[f"{rate[l, h]:.0%}" for h in range(n_heads)]) for l in range(n_layers)]
display(table(rows, ["cross-attention", *[f"head {h}" for h in range(n_heads)]]))
best = np.unravel_index(rate.argmax(), rate.shape)
print(f"{total} content words in {len(held_out)} held-out sentences; best head: layer {best[0]} "
      f"head {best[1]} aligns {rate[best]:.0%}; a monotone aligner {monotone / max(total, 1):.0%}")

# %% [markdown]
# ## What this run measured

# %%
decoded = (f"greedy decoding reproduces {final['exact_match']:.0%} of {config.decode_examples} "
           f"held-out sentences exactly (BLEU {final['bleu']:.1f})" if "exact_match" in final
           else "nothing was decoded (small mode)")
display(Markdown(
    f"After {config.num_train_steps} steps (held-out loss {final['loss']:.3f}), {decoded}. The best "
    f"cross-attention head, layer {best[0]} head {best[1]}, puts its largest weight on the source word "
    f"being translated for {rate[best]:.0%} of {total} content words; a monotone aligner scores "
    f"{monotone / max(total, 1):.0%}."))
print("figures written:", sorted(f for f in os.listdir(OUT) if f.startswith("02_")))
