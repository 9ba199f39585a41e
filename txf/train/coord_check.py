"""The coordinate check (``txf coord-check``): the same experiment at several widths, trained a few
steps on the same batches, with the root-mean-square of each layer's output recorded before every
step. Under muP (``model.parametrization=mup``) these sizes do not depend on the width; in the
standard parametrization they grow with it once the model starts to learn.

A width w sets d_model = w and d_ff = w * (the experiment's d_ff / d_model), with num_heads fixed
(d_k = w / num_heads) and, under muP, ``mup_base_width`` = the experiment's (or, when it is 0, its
d_model: the width it was tuned at). Dropout is off and the layers unscanned. The optimizer is the
experiment's with a constant rate (``--learning_rate``, default the experiment's
``optimizer.learning_rate``) from the first step: a warmup would hide the first steps' updates.

For one layer at one step, with a_w the RMS sqrt(mean(x^2)) of its output at width w:

  spread = max_w a_w / min_w a_w
"""

import dataclasses
import functools
import json
import os
import re
import tempfile
from typing import Dict, List, Sequence

import jax
import ml_collections
import numpy as np

from txf.core import config as config_lib
from txf.data import make_task
from txf.models import build_model, init_params, model_config_from, model_inputs
from txf.train import viz
from txf.train.optimizer import make_optimizer
from txf.train.steps import create_train_state, make_train_step, run_keys

LOGITS = "logits"                      # the model's output, left out of the spread criterion
# the modules whose outputs are recorded (the last name of their path)
_RECORDED = re.compile(r"^(embed|source_embed|target_embed|layer_\d+|self_attention|cross_attention"
                       r"|ffn|final_norm|encoder)$")


@dataclasses.dataclass
class CoordCheck:
  """``rms[layer][width]`` = [RMS of the layer's output before step 1, 2, ..., steps]."""
  widths: List[int]
  steps: int
  parametrization: str
  rms: Dict[str, Dict[int, List[float]]]

  def spread(self, layer: str) -> np.ndarray:
    """[steps] max over widths / min over widths of the layer's RMS at each step."""
    values = np.array([self.rms[layer][w] for w in self.widths])     # [widths, steps]
    return values.max(0) / values.min(0)

  def worst(self, include_logits: bool = False) -> float:
    """The largest spread over layers (the logits only if asked) and steps."""
    layers = [l for l in self.rms if include_logits or l != LOGITS]
    return float(max(self.spread(l).max() for l in layers))


def width_config(config: ml_collections.ConfigDict, width: int) -> ml_collections.ConfigDict:
  """``config`` at width ``width`` (module doc)."""
  out = config_lib.complete(ml_collections.ConfigDict(config.to_dict()))
  m = out.model
  base_d, base_ff = m.d_model, m.d_ff
  if m.parametrization == "mup" and not m.mup_base_width:
    m.mup_base_width = base_d
  m.d_model = int(width)
  m.d_ff = max(1, int(round(base_ff * width / base_d)))
  m.dropout_rate = m.attention_dropout_rate = 0.0
  m.scan_layers = False
  return out


def _rms_of_intermediates(intermediates) -> Dict[str, float]:
  """{module path: RMS of its __call__ output} for the recorded modules (the model's own output:
  ``logits``)."""
  out = {}
  for path, value in jax.tree_util.tree_flatten_with_path(intermediates)[0]:
    keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
    if "__call__" not in keys:
      continue
    owner = keys[:keys.index("__call__")]
    if owner and not _RECORDED.match(owner[-1]):
      continue
    if keys.index("__call__") != len(keys) - 2 or keys[-1] not in ("0",):  # the first output
      continue
    x = np.asarray(value, np.float64)
    if x.dtype.kind != "f" or x.ndim < 2:
      continue
    out["/".join(owner) or LOGITS] = float(np.sqrt(np.mean(x ** 2)))
  return out


def run(config: ml_collections.ConfigDict, widths: Sequence[int], steps: int,
        learning_rate: float = 0.0, seeds: int = 3) -> CoordCheck:
  """Train ``config`` at each width for ``steps`` steps on the same batches and record the RMS
  of every recorded module's output before each step, averaged over ``seeds`` runs (seeds
  config.seed + 0, 1, ...: parameters and batches; the same ones at every width)."""
  rms: Dict[str, Dict[int, List[float]]] = {}
  for width in widths:
    runs = [_one_width(config, width, steps, learning_rate, config.seed + k) for k in range(seeds)]
    for layer in runs[0]:
      rms.setdefault(layer, {})[width] = list(np.mean([r[layer] for r in runs], 0))
  return CoordCheck(list(widths), steps, config.model.parametrization, rms)


def _one_width(config, width, steps, learning_rate, seed) -> Dict[str, List[float]]:
  """{layer: [RMS before step 1..steps]} of one run at ``width`` with ``seed``."""
  rms: Dict[str, List[float]] = {}
  cfg = width_config(config, width)
  cfg.seed = seed
  cfg.optimizer.schedule, cfg.optimizer.warmup_steps = "constant", 1
  cfg.optimizer.cooldown_steps = 0
  if learning_rate:
    cfg.optimizer.learning_rate = float(learning_rate)
  with tempfile.TemporaryDirectory() as home:
    task = make_task(cfg, home)
  model_cfg = model_config_from(cfg, task, vocab_multiple=1)
  batches = task.train_iterator(cfg.batch_size, cfg.seed)
  batches = [next(batches) for _ in range(steps)]
  init_rng, dropout_rng = run_keys(cfg.seed)
  tx = make_optimizer(cfg.optimizer, model_cfg.d_model, steps, model_cfg)
  state = create_train_state(init_params(model_cfg, init_rng, batches[0]), tx)
  step = _compiled(model_cfg, tx, cfg.optimizer)
  for i, batch in enumerate(batches):
    for layer, value in _rms_of_intermediates(_capture(model_cfg, state.params, batch)).items():
      rms.setdefault(layer, []).append(value)
    state, _ = step(state, batch, jax.random.fold_in(dropout_rng, i))
  return rms


_STEPS: Dict = {}


def _compiled(model_cfg, tx, opt_cfg):
  """The jitted train step of a (model config, optimizer config) pair, made once per pair (the
  seeds of one width share it)."""
  key = (model_cfg, json.dumps(opt_cfg.to_dict(), sort_keys=True))
  if key not in _STEPS:
    _STEPS[key] = jax.jit(make_train_step(model_cfg, tx, opt_cfg.label_smoothing))
  return _STEPS[key]


@functools.partial(jax.jit, static_argnums=0)
def _capture(model_cfg, params, batch):
  """The model's intermediates (every module's __call__ output) on ``batch``."""
  model = build_model(model_cfg, deterministic=True)
  _, state = model.apply({"params": params}, **model_inputs(model_cfg.family, batch),
                         capture_intermediates=True, mutable=["intermediates"])
  return state["intermediates"]


def table(check: CoordCheck) -> str:
  """Markdown: one row per layer, its RMS at each width at the last step recorded and the largest
  spread over the steps."""
  head = " | ".join(f"w={w}" for w in check.widths)
  lines = [f"coord-check ({check.parametrization}): RMS of each layer's output before step "
           f"{check.steps}, and max over steps 1..{check.steps} of max_w / min_w", "",
           f"| layer | {head} | spread |", "|---|" + "---|" * len(check.widths) + "---|"]
  for layer in check.rms:
    values = " | ".join(f"{check.rms[layer][w][-1]:.4g}" for w in check.widths)
    lines.append(f"| {layer} | {values} | {check.spread(layer).max():.3f} |")
  lines += ["", f"largest spread (logits aside): {check.worst():.3f}"]
  return "\n".join(lines) + "\n"


def plot(check: CoordCheck, path: str) -> str:
  """One panel per step: each layer's RMS against width (log-log), the logits dashed."""
  fig = viz.new_figure(3.2 * check.steps, 3.4)
  axes = np.atleast_1d(fig.subplots(1, check.steps, sharey=True))
  for t, ax in enumerate(axes):
    for i, layer in enumerate(check.rms):
      values = [check.rms[layer][w][t] for w in check.widths]
      ax.plot(check.widths, values, marker="o", markersize=3, color=f"C{i % 10}",
              linestyle="--" if layer == LOGITS else "-", label=layer)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("width d_model")
    ax.set_title(f"{check.parametrization}: before step {t + 1}", fontsize=9)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("RMS of the layer's output")
  axes[-1].legend(fontsize=5, loc="center left", bbox_to_anchor=(1.0, 0.5))
  fig.tight_layout()
  return viz.save_figure(fig, path)


def write(check: CoordCheck, folder: str) -> Dict[str, str]:
  """coord_check.md, coord_check.json and coord_check.png under ``folder``; their paths."""
  os.makedirs(folder, exist_ok=True)
  paths = {kind: os.path.join(folder, f"coord_check.{kind}") for kind in ("md", "json", "png")}
  with open(paths["md"], "w", encoding="utf-8") as f:
    f.write(table(check))
  with open(paths["json"], "w", encoding="utf-8") as f:
    json.dump(dataclasses.asdict(check), f, indent=1)
  plot(check, paths["png"])
  return paths
