"""What each attention head is worth: the family's evaluation metrics of a run with one head
removed at a time (``txf ablate-heads``).

For every split batch: the teacher-forced loss (unsmoothed NLL per token, or per example for a
classifier) and accuracy through the family's own loss function; for a translation family, also
greedy decoding (each step a full forward of the prefix, so that the removed head is removed at
every step) with exact match and BLEU against the references.
"""

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from txf.core import families
from txf.core.specials import EOS_ID
from txf.inspect.operations import _params, ablation_masks, list_points
from txf.inspect.points import Hooks, forward, hooked, inspect_config
from txf.models import build_model, default_loss

Progress = Callable[[int, int], None]


def attention_modules(run, batch) -> List[str]:
  """The attention modules of the run's model (``.../self_attention``, ``.../cross_attention``),
  in forward order."""
  return [n[:-len("/heads")] for n in list_points(run, batch) if n.endswith("/heads")]


@functools.lru_cache(maxsize=64)
def _sums_fn(model_cfg, names):
  model = build_model(inspect_config(model_cfg), deterministic=True)
  loss = default_loss(model_cfg, 0.0)

  def run(params, batch, masks):
    _, terms = hooked(Hooks(masks=masks), loss, model, params, batch, None)
    return {k: terms[k] for k in ("nll_sum", "correct", "count")}
  return jax.jit(run)


@functools.lru_cache(maxsize=64)
def _greedy_fn(model_cfg, names):
  def run(params, inputs, length, masks):
    rows = inputs.shape[0]

    def step(t, hyp):
      logits = forward(model_cfg, params, {"inputs": inputs, "targets": hyp}, Hooks(masks=masks))
      token = jnp.argmax(logits[:, t], axis=-1).astype(hyp.dtype)
      ended = jnp.any((hyp == EOS_ID) & (jnp.arange(hyp.shape[1]) < t), axis=1)
      return hyp.at[:, t].set(jnp.where(ended, 0, token))
    return jax.lax.fori_loop(0, length.shape[0], step, jnp.zeros((rows, length.shape[0]), jnp.int32))
  return jax.jit(run)


def greedy_decode(run, batch, masks=None) -> np.ndarray:
  """int [B, T] greedy outputs of a translation model for ``batch["inputs"]`` (T = the targets'
  length), ending at EOS (then 0), with the ablation ``masks`` (txf.inspect.ablation_masks)."""
  masks = masks or {}
  length = jnp.zeros((np.shape(batch["targets"])[1],), jnp.int32)
  return np.asarray(_greedy_fn(run.model_cfg, tuple(sorted(masks)))(
      _params(run), jnp.asarray(batch["inputs"]), length, masks))


def evaluate(run, batches: Sequence[Dict[str, Any]], masks=None, decode: bool = True
             ) -> Dict[str, float]:
  """{loss, accuracy[, exact_match, bleu]} of ``batches`` with the ablation ``masks`` (None:
  the model as trained). ``decode``: greedy decoding metrics for a translation family."""
  masks = masks or {}
  names = tuple(sorted(masks))
  total = None
  hyps: List[str] = []
  refs: List[str] = []
  seq2seq = decode and families.get(run.family).decoding == "seq2seq"
  for batch in batches:
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    sums = _sums_fn(run.model_cfg, names)(_params(run), b, masks)
    total = sums if total is None else jax.tree_util.tree_map(jnp.add, total, sums)
    if seq2seq:
      real = np.asarray(batch["inputs"]).any(-1)
      out = greedy_decode(run, batch, masks)[real]
      hyps += [run.task.decode_target(row) for row in out]
      refs += [run.task.decode_target(row) for row in np.asarray(batch["targets"])[real]]
  total = jax.device_get(total)
  count = max(float(total["count"]), 1.0)
  metrics = {"loss": float(total["nll_sum"]) / count, "accuracy": float(total["correct"]) / count}
  if seq2seq:
    metrics["exact_match"] = float(np.mean([" ".join(h.split()) == " ".join(r.split())
                                            for h, r in zip(hyps, refs)])) if refs else 0.0
    metrics["bleu"] = _bleu(hyps, refs)
  return metrics


def _bleu(hyps, refs) -> float:
  import sacrebleu  # pylint: disable=import-outside-toplevel  (only translation runs need it)
  return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


def head_ablation(run, batches: Sequence[Dict[str, Any]], mode: str = "zero",
                  reference: Optional[Dict[str, Any]] = None, decode: bool = True,
                  progress: Optional[Progress] = None) -> Dict[str, Any]:
  """Each attention head of the run's model removed in turn (its output before W^O set to 0, or
  with ``mode="mean"`` to its mean over the real positions of ``reference``, default the first
  batch), scored on ``batches`` as :func:`evaluate` scores them.

  Returns {"baseline": metrics, "rows": [{"module", "head", metric..., "<metric>_change"}]},
  where ``<metric>_change`` = ablated - baseline. ``progress(done, total)`` after each head.
  """
  batches = list(batches)
  reference = batches[0] if reference is None else reference
  baseline = evaluate(run, batches, None, decode)
  modules = attention_modules(run, batches[0])
  total = len(modules) * run.model_cfg.num_heads
  rows = []
  for module in modules:
    for head in range(run.model_cfg.num_heads):
      masks = ablation_masks(run, batches[0], heads=[(module, head)], mode=mode, reference=reference)
      metrics = evaluate(run, batches, masks, decode)
      row = {"module": module, "head": head, **metrics}
      row.update({f"{k}_change": metrics[k] - baseline[k] for k in metrics})
      rows.append(row)
      if progress is not None:
        progress(len(rows), total)
  return {"baseline": baseline, "rows": rows}
