"""The README's figures, from txf's own commands and functions, written to docs/figures/*.png.

    python docs/tools/figures.py                          # trains the default run into runs/figures-default
    python docs/tools/figures.py --workdir runs/default   # or draws from a default run already trained

1. positional_encoding.png: the sinusoidal PE table of the default model (``txf.ops``), as a heatmap.
2. loss_curves.png: the default run's train and eval loss (``txf train``'s metrics.jsonl).
3. cross_attention.png: every cross-attention head of that run for one held-out sentence with an
   adverb and an adjective (both move in translation), by ``txf.train.viz.attention_maps``.
4. benchmark_ratios.png: txf and the peers' tokens/s relative to the best float32 peer, read from
   the first table after "### The figures" in BENCHMARKS.md (train step and beam-4 decoding).
5. bf16_loss_curves.png: the default run in float32 beside the same run with
   ``--config.model.dtype=bfloat16`` (trained into ``--bf16_workdir`` when it is not there).

The default run is deterministic (same metrics and parameters on every machine of one kind), so a
run trained earlier gives the same pictures. ``--steps N`` trains a shorter run instead.
"""

import argparse
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "docs", "figures")
MAX_BYTES = 150_000


def train_default(workdir, steps=None, overrides=()):
  """``txf train --workdir W --progress=false`` (the default experiment, with ``overrides`` such as
  ``--config.model.dtype=bfloat16``) unless W holds a finished run."""
  if os.path.exists(os.path.join(workdir, "params.msgpack")):
    print(f"figures: drawing from the finished run in {workdir}")
    return
  command = [sys.executable, "-m", "txf.cli", "train", "--workdir", workdir, "--progress=false"]
  if steps:
    command.append(f"--config.num_train_steps={steps}")
  command += list(overrides)
  print("figures:", " ".join(command[2:]))
  subprocess.run(command, check=True, cwd=ROOT)


def positional_encoding(path):
  from txf import ops
  from txf.train import viz
  from txf.core.config import load_experiment
  model = load_experiment("default").model
  pe = np.asarray(ops.sinusoidal_positional_encoding(model.max_len, model.d_model))
  return viz.plot_positional_encoding(
      pe, path, title=f"sinusoidal positional encoding, {model.max_len} positions x d_model {model.d_model}")


def loss_curves(workdir, path):
  from txf.train import viz
  return viz.plot_loss_curves(os.path.join(workdir, "metrics.jsonl"), path,
                              title="the default run (txf train): loss per token")


def cross_attention(workdir, path):
  """Every cross-attention head of the run for one held-out sentence that has an adverb and an adjective."""
  from txf import inference
  from txf.train import viz
  from txf.data import synthetic
  from txf.data.base import pad_batch
  run = inference.load_run(workdir)
  task = run.task
  movers = {a for a, _ in synthetic.ADVERBS} | {a for a, _ in synthetic.ADJECTIVES}
  examples = task.examples("val", 100)
  example = next((e for e in examples if len(movers & set(e.source.split())) >= 2), examples[0])
  batch = {"inputs": pad_batch([example.source_ids], task.max_input_len),
           "targets": pad_batch([task.codec.encode(example.reference)], task.max_target_len)}
  src = example.source.split() + ["</s>"]
  out = example.reference.split() + ["</s>"]
  maps = viz.attention_maps(run.model_cfg, run.params, batch)["cross"][:, 0, :, :len(out), :len(src)]
  return viz.plot_attention_heads(maps, out, src, "cross-attention of the default run: target words (rows) "
                                  "attend to source words (columns)", path)


def bf16_curves(workdir32, workdir16, path):
  """Train and eval loss of the default run in float32 and in bfloat16 compute, on one axis, with
  each run's final eval exact match in the legend."""
  from txf.train import viz
  fig = viz.new_figure(7, 4)
  ax = fig.subplots()
  for workdir, dtype, color in ((workdir32, "float32", "C0"), (workdir16, "bfloat16", "C1")):
    rows = viz.read_metrics_rows(os.path.join(workdir, "metrics.jsonl"))
    final = [r for r in rows if r.get("split") == "eval" and "exact_match" in r][-1]
    for split, style in (("train", {}), ("eval", dict(marker="o", markersize=3, linestyle="--"))):
      steps, values = viz._series(rows, "loss", split)  # pylint: disable=protected-access
      label = f"{dtype} {split} loss" + (f" (final exact match {final['exact_match']:.3f})"
                                         if split == "eval" else "")
      ax.plot(steps, values, color=color, label=label, **style)
  ax.set_xlabel("step")
  ax.set_ylabel("loss (nats per token)")
  ax.set_title("the default run in float32 and in bfloat16 compute")
  ax.grid(alpha=0.3)
  ax.legend()
  return viz.save_figure(fig, path)


def _after_table(text):
  """Rows (dicts by column name) of the first Markdown table after the peers section's
  '### The figures' heading."""
  start = re.search(r"^### The figures$", text, re.M)
  if not start:
    raise ValueError("BENCHMARKS.md has no '### The figures' section")
  rows, header = [], None
  for line in text[start.end():].splitlines():
    if line.startswith("|"):
      cells = [c.strip() for c in line.strip().strip("|").split("|")]
      if header is None:
        header = cells
      elif not set("".join(cells)) <= set("-: "):
        rows.append(dict(zip(header, cells)))
    elif header is not None:
      break
  return rows


def benchmark_ratios(path, benchmarks=os.path.join(ROOT, "BENCHMARKS.md")):
  """Bars of tokens/s / the best float32 peer's, per config, for the train step and beam-4 decoding."""
  from txf.train import viz
  with open(benchmarks, encoding="utf-8") as f:
    rows = _after_table(f.read())
  peers = ("flax-wmt", "torch-eager", "marian")  # the float32 peers ("best peer" of BENCHMARKS.md)
  columns = {"train step": "target tok/s", "beam-4 decoding": "beam-4 decode tok/s"}
  configs = list(dict.fromkeys(r["config"] for r in rows))
  fig = viz.new_figure(9, 3.6)
  axes = fig.subplots(1, len(columns), squeeze=False)[0]
  for ax, (what, column) in zip(axes, columns.items()):
    systems = [s for s in dict.fromkeys(r["system"] for r in rows)
               if s != "txf-before" and any(r["system"] == s and r[column] not in ("-", "") for r in rows)]
    width = 0.8 / len(configs)
    for c, config in enumerate(configs):
      value = {r["system"]: float(r[column]) for r in rows
               if r["config"] == config and r[column] not in ("-", "")}
      best = max(value[p] for p in peers if p in value)
      ratios = [value.get(s, np.nan) / best for s in systems]
      bars = ax.bar(np.arange(len(systems)) + (c - (len(configs) - 1) / 2) * width, ratios, width,
                    label=config)
      ax.bar_label(bars, labels=[f"{r:.2f}" if np.isfinite(r) else "" for r in ratios], fontsize=6)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(systems)))
    ax.set_xticklabels(systems, rotation=30, ha="right", fontsize=8)
    ax.set_title(f"{what}: tokens/s / the best float32 peer's", fontsize=9)
    ax.legend(fontsize=8)
  fig.suptitle("txf beside its peers (BENCHMARKS.md, one sitting, 2-core CPU)", fontsize=10)
  fig.tight_layout()
  return viz.save_figure(fig, path)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default=os.path.join(ROOT, "runs", "figures-default"),
                      help="a default run (trained here when it has no params.msgpack)")
  parser.add_argument("--steps", type=int, default=None, help="train a shorter run (num_train_steps)")
  parser.add_argument("--bf16_workdir", default=os.path.join(ROOT, "runs", "figures-default-bf16"),
                      help="the default run with model.dtype=bfloat16 (trained here when missing)")
  args = parser.parse_args(argv)
  os.makedirs(OUT, exist_ok=True)
  written = [positional_encoding(os.path.join(OUT, "positional_encoding.png")),
             benchmark_ratios(os.path.join(OUT, "benchmark_ratios.png"))]
  train_default(args.workdir, args.steps)
  written += [loss_curves(args.workdir, os.path.join(OUT, "loss_curves.png")),
              cross_attention(args.workdir, os.path.join(OUT, "cross_attention.png"))]
  train_default(args.bf16_workdir, args.steps, ["--config.model.dtype=bfloat16"])
  written.append(bf16_curves(args.workdir, args.bf16_workdir, os.path.join(OUT, "bf16_loss_curves.png")))
  for path in written:
    size = os.path.getsize(path)
    print(f"figures: {os.path.relpath(path, ROOT)} ({size // 1000} KB)")
    if size > MAX_BYTES:
      raise SystemExit(f"figures: {path} is {size} bytes, over {MAX_BYTES}: make it smaller")


if __name__ == "__main__":
  main()
