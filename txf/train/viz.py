"""Pictures of a model and a run, written as PNG files (matplotlib's Agg canvas; never a display),
and the attention maps of a forward pass that they draw (``attention_maps``).

Figures are built with ``matplotlib.figure.Figure`` on an explicit ``FigureCanvasAgg``, not pyplot,
so nothing here touches matplotlib's global backend or figure registry. Every ``plot_*`` function
writes one PNG and returns its path.
"""

import io
import json
import os
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import dataclasses

import jax
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from txf.runtime import storage
from txf.runtime import workdir as workdir_lib
from txf.models import ModelBuilder, build_model, model_inputs

Rows = Union[str, os.PathLike, Iterable[Dict]]


def new_figure(width: float, height: float) -> Figure:
  """A Figure attached to an Agg canvas (no pyplot state)."""
  fig = Figure(figsize=(width, height), dpi=100)
  FigureCanvasAgg(fig)
  return fig


def save_figure(fig: Figure, path: Union[str, os.PathLike], tight: bool = False) -> str:
  """Write ``fig`` as PNG to ``path`` (creating its folder; local or in a bucket) and return the
  path as a string. ``tight`` crops the canvas to what is drawn (``bbox_inches="tight"``)."""
  path = os.fspath(path)
  folder = storage.wpath(path).parent
  if os.fspath(folder) not in ("", "."):
    folder.mkdir(parents=True, exist_ok=True)
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", **({"bbox_inches": "tight"} if tight else {}))
  storage.wpath(path).write_bytes(buffer.getvalue())
  return path


def attention_maps(model_cfg, params, batch: Dict[str, np.ndarray],
                   build: Optional[ModelBuilder] = None) -> Dict[str, np.ndarray]:
  """Every attention map of one deterministic forward pass, grouped by kind.

  a_{qk} = softmax_k(q_q . k_k / sqrt(d_k) + mask), as each MultiHeadAttention sows it into the
  ``intermediates`` collection ([B, h, L_q, L_k]); the model runs with ``attention_impl='reference'``
  (a fused kernel returns no weights). ``build`` makes the module (default ``build_model``).

  Returns {"encoder_self" | "decoder_self" | "cross": float32 [layers, B, h, L_q, L_k]} for the kinds
  the family has (decoder_lm's causal maps are "decoder_self"); weights on padded keys are 0.
  """
  cfg = dataclasses.replace(model_cfg, attention_impl="reference")
  model = (build or build_model)(cfg, deterministic=True)
  state = jax.jit(lambda p, b: model.apply({"params": p}, **model_inputs(cfg.family, b),
                                           mutable=["intermediates"])[1])(params, batch)
  found: Dict[str, Dict[int, np.ndarray]] = {}

  def walk(tree, path):
    for key, value in tree.items():
      if key == "attention_weights":   # path: (stack, ..., "layer_<n>", "<kind>_attention")
        stack, layer, kind = path[0], int(path[-2].split("_")[-1]), path[-1]
        name = "cross" if kind == "cross_attention" else (
            "encoder_self" if stack == "encoder" else "decoder_self")
        found.setdefault(name, {})[layer] = np.asarray(value[0], np.float32)
      elif hasattr(value, "items"):
        walk(value, path + (key,))

  walk(state["intermediates"], ())
  return {k: np.stack([v[i] for i in sorted(v)]) for k, v in found.items()}


def read_metrics_rows(source: Rows) -> List[Dict]:
  """Rows of a metrics.jsonl file (one JSON object per line, blank lines skipped), or a given list of dicts."""
  if isinstance(source, (str, os.PathLike)):
    return [json.loads(line) for line in storage.read_text(source).splitlines() if line.strip()]
  return list(source)


def _series(rows: Sequence[Dict], key: str, split: Optional[str] = None) -> Tuple[np.ndarray, np.ndarray]:
  """(steps, values) of ``key`` over rows of ``split`` (any split if None), sorted by step; a re-logged
  step (e.g. after a resume) keeps its last value."""
  points = {}
  for r in rows:
    if key in r and r.get("step") is not None and (split is None or r.get("split") == split):
      value = r[key]
      if isinstance(value, (int, float)) and not isinstance(value, bool):
        points[int(r["step"])] = float(value)
  steps = np.array(sorted(points), dtype=np.int64)
  return steps, np.array([points[s] for s in steps], dtype=np.float64)


def plot_attention_heads(weights, query_tokens: Sequence[str], key_tokens: Sequence[str],
                         title: str = "attention", path: Union[str, os.PathLike] = "attention.png") -> str:
  """A grid of attention maps, rows = layers, columns = heads; cell (q, k) is the weight a_{qk}.

  a_{qk} = softmax_k(q_q . k_k / sqrt(d_k) + mask): each row of a map sums to 1 (0 if fully masked).

  Args:
    weights: [layers, heads, L_q, L_k] array, or a list over layers of [heads, L_q, L_k] arrays
      (a single [heads, L_q, L_k] array is taken as one layer).
    query_tokens: L_q labels for the rows; key_tokens: L_k labels for the columns.
    title: figure title; path: where the PNG goes.
  Returns:
    path.
  """
  layers = [np.asarray(w, dtype=np.float32) for w in (weights if isinstance(weights, (list, tuple))
                                                       else np.asarray(weights))]
  if layers and layers[0].ndim == 2:  # a single [heads, L_q, L_k] array was given
    layers = [np.stack(layers)]
  if not layers or any(w.ndim != 3 for w in layers):
    raise ValueError("weights must be [layers, heads, L_q, L_k] or a list of [heads, L_q, L_k]")
  num_layers, num_heads = len(layers), max(w.shape[0] for w in layers)
  lq, lk = layers[0].shape[1:]
  if len(query_tokens) != lq or len(key_tokens) != lk:
    raise ValueError(f"got {len(query_tokens)} query / {len(key_tokens)} key labels for maps of {lq}x{lk}")
  cell = max(1.6, 0.28 * max(lq, lk))
  fig = new_figure(cell * num_heads + 1.0, cell * num_layers + 0.8)
  axes = fig.subplots(num_layers, num_heads, squeeze=False)
  image = None
  for layer, w in enumerate(layers):
    for head in range(num_heads):
      ax = axes[layer][head]
      if head >= w.shape[0]:
        ax.axis("off")
        continue
      image = ax.imshow(w[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
      ax.set_xticks(range(lk))
      ax.set_yticks(range(lq))
      ax.set_xticklabels(key_tokens if layer == num_layers - 1 else [], rotation=90, fontsize=7)
      ax.set_yticklabels(query_tokens if head == 0 else [], fontsize=7)
      if layer == 0:
        ax.set_title(f"head {head}", fontsize=8)
      if head == 0:
        ax.set_ylabel(f"layer {layer}", fontsize=8)
  fig.suptitle(title)
  if image is not None:
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
  return save_figure(fig, path)


def plot_positional_encoding(pe, path: Union[str, os.PathLike] = "positional_encoding.png",
                             title: str = "sinusoidal positional encoding") -> str:
  """Heatmap of PE[pos, i] (positions down, dimensions across).

  PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)); values in [-1, 1].

  Args:
    pe: [L, d]; path: where the PNG goes.
  Returns:
    path.
  """
  pe = np.asarray(pe, dtype=np.float32)
  if pe.ndim != 2:
    raise ValueError(f"pe must be [L, d], got shape {pe.shape}")
  fig = new_figure(8, 5)
  ax = fig.subplots()
  image = ax.imshow(pe, cmap="RdBu", vmin=-1.0, vmax=1.0, aspect="auto", interpolation="nearest")
  ax.set_xlabel("dimension i")
  ax.set_ylabel("position")
  ax.set_title(title)
  fig.colorbar(image, ax=ax)
  return save_figure(fig, path)


def plot_learning_rate(schedule: Union[Callable, Tuple[Sequence[int], Sequence[float]]],
                       path: Union[str, os.PathLike] = "learning_rate.png", num_steps: int = 10000,
                       title: str = "learning rate") -> str:
  """Learning rate against step, e.g. lr(step) = d_model^-0.5 min(step^-0.5, step warmup^-1.5).

  Args:
    schedule: an optax-style ``step -> lr`` function (evaluated on steps 0..num_steps, vectorised if it
      accepts an array), or a pair (steps, values) such as the logged ``learning_rate`` column.
    path: where the PNG goes; num_steps: the range for a function.
  Returns:
    path.
  """
  if callable(schedule):
    steps = np.arange(num_steps + 1)
    try:
      values = np.asarray(schedule(steps), dtype=np.float64).reshape(-1)
      if values.shape != steps.shape:
        raise ValueError
    except Exception:  # a schedule written for scalar steps only
      values = np.array([float(schedule(int(s))) for s in steps])
  else:
    steps, values = (np.asarray(a, dtype=np.float64).reshape(-1) for a in schedule)
    if steps.shape != values.shape:
      raise ValueError(f"{steps.size} steps but {values.size} values")
  if steps.size == 0:
    raise ValueError("no learning-rate points to plot")
  fig = new_figure(7, 4)
  ax = fig.subplots()
  ax.plot(steps, values, color="tab:blue")
  finite = values[np.isfinite(values)]
  if finite.size:
    peak = int(np.argmax(np.where(np.isfinite(values), values, -np.inf)))
    ax.annotate(f"peak {values[peak]:.3g} at step {int(steps[peak])}", (steps[peak], values[peak]),
                textcoords="offset points", xytext=(10, -12), fontsize=8)
  ax.set_xlabel("step")
  ax.set_ylabel("learning rate")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  return save_figure(fig, path)


def plot_loss_curves(metrics: Rows, path: Union[str, os.PathLike] = "loss_curves.png",
                     title: str = "loss") -> str:
  """Train and eval loss against step from txf's metrics.jsonl rows {"step", "split", "loss", ...}.

  One solid line per split that logged a ``loss`` (the training objective, label-smoothed when
  label_smoothing > 0) and, beside it in the same colour, a dashed line of its ``nll`` (the
  unsmoothed cross-entropy, -mean log p(y_t)) when logged. Train is drawn as lines, eval with
  markers.

  Args:
    metrics: the path of a metrics.jsonl file, or its rows as dicts.
    path: where the PNG goes.
  Returns:
    path.
  Raises:
    ValueError: no row has a loss.
  """
  rows = read_metrics_rows(metrics)
  splits = sorted({r.get("split") for r in rows if "loss" in r}, key=lambda s: (s != "train", str(s)))
  if not splits:
    raise ValueError("no row with a 'loss' to plot")
  fig = new_figure(7, 4)
  ax = fig.subplots()
  for i, split in enumerate(splits):
    color = f"C{i}"
    steps, values = _series(rows, "loss", split)
    style = dict(marker="o", markersize=3) if split != "train" or steps.size == 1 else {}
    ax.plot(steps, values, label=f"{split} loss", color=color, **style)
    steps, values = _series(rows, "nll", split)
    if steps.size:
      ax.plot(steps, values, label=f"{split} nll", color=color, linestyle="--", **style)
  ax.set_xlabel("step")
  ax.set_ylabel("loss (nats per token)")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  return save_figure(fig, path)


def write_run_plots(workdir: Union[str, os.PathLike]) -> List[str]:
  """Read workdir/metrics.jsonl and write loss_curves.png and learning_rate.png beside it.

  The learning-rate plot uses the logged ``learning_rate`` values (any split). A plot whose data
  are absent (no loss, or no learning_rate logged) is skipped.

  Args:
    workdir: a run's folder holding metrics.jsonl.
  Returns:
    the paths written (possibly empty).
  Raises:
    FileNotFoundError: workdir/metrics.jsonl does not exist.
  """
  workdir = os.fspath(workdir)
  rows = read_metrics_rows(workdir_lib.path_of(workdir, workdir_lib.METRICS_FILE))
  written = []
  if any("loss" in r for r in rows):
    written.append(plot_loss_curves(rows, workdir_lib.path_of(workdir, workdir_lib.LOSS_PLOT)))
  steps, values = _series(rows, "learning_rate")
  if steps.size:
    written.append(plot_learning_rate((steps, values), workdir_lib.path_of(workdir, workdir_lib.LR_PLOT)))
  return written


def plot_logit_lens(lens, position_labels: Sequence[str], token_label: Callable[[int], str],
                    path: Union[str, os.PathLike] = "logit_lens.png",
                    title: str = "logit lens: top token and its probability") -> str:
  """The logit lens as a grid, rows = the embeddings then each layer, columns = positions; cell
  (l, t) is coloured by p_max = max_v softmax(z_{l,t})_v and labelled with that token.

  Args:
    lens: [N + 1, L, V] logits (txf.inspect.logit_lens of one example).
    position_labels: L labels (the input token at each position); token_label(id) -> text.
  Returns:
    path.
  """
  z = np.asarray(lens, np.float64)
  if z.ndim != 3 or z.shape[1] != len(position_labels):
    raise ValueError(f"lens must be [layers + 1, L, V] with L = {len(position_labels)} labels")
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  top, prob = p.argmax(-1), p.max(-1)
  rows, cols = prob.shape
  fig = new_figure(max(4.0, 0.7 * cols + 1.5), max(2.0, 0.45 * rows + 1.2))
  ax = fig.subplots()
  image = ax.imshow(prob, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
  for r in range(rows):
    for c in range(cols):
      ax.text(c, r, token_label(int(top[r, c])), ha="center", va="center", fontsize=6,
              color="white" if prob[r, c] < 0.6 else "black")
  ax.set_xticks(range(cols))
  ax.set_xticklabels(position_labels, rotation=90, fontsize=7)
  ax.set_yticks(range(rows))
  ax.set_yticklabels(["embeddings"] + [f"layer {i}" for i in range(rows - 1)], fontsize=7)
  ax.set_title(title, fontsize=9)
  fig.colorbar(image, ax=ax, shrink=0.8)
  return save_figure(fig, path, tight=True)


def plot_head_table(values, row_labels: Sequence[str], title: str,
                    path: Union[str, os.PathLike] = "head_ablation.png",
                    label: str = "change") -> str:
  """A heatmap of one number per attention head: rows = attention modules, columns = heads,
  each cell annotated with its value (e.g. the loss a head's ablation adds).

  values: [modules, heads]; row_labels: one per module. Returns path."""
  v = np.asarray(values, np.float64)
  if v.ndim != 2 or v.shape[0] != len(row_labels):
    raise ValueError(f"values must be [modules, heads] with {len(row_labels)} module labels")
  fig = new_figure(1.2 * v.shape[1] + 4.0, 0.5 * v.shape[0] + 1.5)
  ax = fig.subplots()
  bound = max(float(np.abs(v).max()), 1e-12)
  image = ax.imshow(v, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
  for r in range(v.shape[0]):
    for c in range(v.shape[1]):
      ax.text(c, r, f"{v[r, c]:.3g}", ha="center", va="center", fontsize=7,
              color="white" if abs(v[r, c]) > 0.6 * bound else "black")
  ax.set_xticks(range(v.shape[1]))
  ax.set_xticklabels([f"head {h}" for h in range(v.shape[1])], fontsize=7)
  ax.set_yticks(range(v.shape[0]))
  ax.set_yticklabels(row_labels, fontsize=7)
  ax.set_title(title, fontsize=9)
  fig.colorbar(image, ax=ax, shrink=0.8, label=label)
  return save_figure(fig, path, tight=True)
