"""Runs ``txf inspect``; its usage text and flags are declared in txf.commands.declared.inspect
(``txf inspect --help``), which txf/cli.py parses before importing this module."""

import os
import sys

import numpy as np
from absl import flags

from txf import inspect as ti
from txf.commands import terminal
from txf.core.errors import TxfError
from txf.train import viz


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}: give the text with --input \"...\"")
  f = flags.FLAGS
  if not f.list and not f.input:
    raise TxfError("txf inspect needs --input \"TEXT\" (or --list to print the points' names)")
  run = terminal.load_run(f.workdir, f.params)
  batch, src, tgt = ti.encode_text(run, f.input or "a")
  if f.list:
    for name, (shape, dtype) in ti.list_points(run, batch).items():
      print(f"{name}\t{list(shape)}\t{dtype}")
    return
  out = f.output or os.path.join(f.workdir, "inspect")
  os.makedirs(out, exist_ok=True)
  captured = {k: np.asarray(v) for k, v in ti.capture(run, batch).items()}
  np.savez(os.path.join(out, "intermediates.npz"), **captured)
  written = [os.path.join(out, "intermediates.npz")]
  maps = {}
  for name, value in captured.items():
    if name.endswith("/weights"):
      stack, layer, kind = name.split("/")[:3]
      key = f"{stack}_{kind}" if kind != "cross_attention" else "cross_attention"
      maps.setdefault(key, []).append(value[0])
  for key, layers in maps.items():
    queries = src if key.startswith("encoder") else tgt
    keys = src if key.startswith("encoder") or key == "cross_attention" else tgt
    written.append(viz.plot_attention_heads(layers, queries, keys, title=key.replace("_", " "),
                                            path=os.path.join(out, f"attention_{key}.png")))
  lens = np.asarray(ti.logit_lens(run, batch))[:, 0]
  stack = ti.lens_stack(run, batch)
  if lens.ndim == 3:  # [N + 1, L, V]: the lens of each position
    written.append(viz.plot_logit_lens(lens, tgt if stack == "decoder" else src,
                                       lambda i: run.task.decode_target([int(i)]) or f"<{int(i)}>",
                                       os.path.join(out, "logit_lens.png")))
  else:  # a classifier: [N + 1, classes]
    written.append(viz.plot_logit_lens(lens[:, None], ["pooled"], str,
                                       os.path.join(out, "logit_lens.png")))
  print("\n".join(written))
  print(f"txf inspect: {len(captured)} intermediates of {run.family} ({stack} lens) in {out}",
        file=sys.stderr)
