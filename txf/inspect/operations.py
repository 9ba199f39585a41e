"""Capture, patch and ablate the named points of a loaded run (txf.inspect.points), and the logit
lens: pure functions of (run, batch), each one jit-compiled program.

``run`` is a ``txf.inference.Run`` (``load_run(workdir)``) or anything with its ``model_cfg`` and
``params``; ``batch`` a dict of the family's inputs (``inputs`` and/or ``targets``, int [B, L]).
"""

import functools
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from txf.inspect.points import Hooks, forward, inspect_params, point_shapes

Head = Tuple[str, int]   # (attention module name, e.g. "decoder/layer_0/cross_attention", head)
Unit = Tuple[str, int]   # (FFN module name, e.g. "encoder/layer_1/ffn", hidden unit)


def _params(run):
  """The run's parameters in the unrolled layout, converted once per run."""
  cached = getattr(run, "_inspect_params", None)
  if cached is None:
    cached = inspect_params(run.params)
    try:
      run._inspect_params = cached
    except AttributeError:  # a frozen object: convert each time
      pass
  return cached


def _batch(batch) -> Dict[str, jnp.ndarray]:
  return {k: jnp.asarray(v) for k, v in batch.items()}


def list_points(run, batch) -> Dict[str, Tuple[Tuple[int, ...], str]]:
  """{name: (shape, dtype)} of every point of ``batch``'s forward, in forward order (nothing is
  computed)."""
  signature = tuple(sorted((k, tuple(np.shape(v)), str(np.asarray(v).dtype)) for k, v in batch.items()))
  return dict(_point_shapes(run.model_cfg, signature, _params(run), batch))


_SHAPES: Dict[Any, Dict[str, Tuple[Tuple[int, ...], str]]] = {}


def _point_shapes(model_cfg, signature, params, batch):
  """point_shapes once per (model config, batch signature)."""
  key = (model_cfg, signature)
  if key not in _SHAPES:
    _SHAPES[key] = point_shapes(model_cfg, params, _batch(batch))
  return _SHAPES[key]


@functools.lru_cache(maxsize=64)
def _capture_fn(model_cfg, names: Optional[Tuple[str, ...]]):
  def run(params, batch):
    hooks = Hooks(capture=names)
    logits = forward(model_cfg, params, batch, hooks)
    return logits, hooks.captured
  return jax.jit(run)


def capture(run, batch, names: Optional[Sequence[str]] = None) -> Dict[str, jnp.ndarray]:
  """{name: value} of the points ``names`` (default: every point, ``logits`` included) in the
  deterministic forward of ``batch``. Raises KeyError naming an unknown point."""
  names = None if names is None else tuple(names)
  _check_names(run, batch, names or ())
  return dict(_capture_fn(run.model_cfg, names)(_params(run), _batch(batch))[1])


Patch = Union[Any, Callable[[jnp.ndarray], jnp.ndarray]]


def patch(run, batch, patches: Mapping[str, Patch], capture: Sequence[str] = ()):
  """The logits of ``batch``'s forward with points replaced: ``patches`` {name: array (the new
  value, broadcast to the point's shape) or f(x) -> x'}. With ``capture`` names, returns (logits,
  {name: value after the patches}). A forward is compiled per set of names and functions given
  (the arrays are its arguments)."""
  _check_names(run, batch, tuple(patches) + tuple(capture))
  values = {k: jnp.asarray(v) for k, v in patches.items() if not callable(v)}
  fns = tuple(sorted((k, v) for k, v in patches.items() if callable(v)))
  out, captured = _patch_fn(run.model_cfg, fns, tuple(capture))(_params(run), _batch(batch), values)
  return (out, dict(captured)) if capture else out


@functools.lru_cache(maxsize=64)
def _patch_fn(model_cfg, fns, names):
  def run(params, batch, values):
    hooks = Hooks(values=values, fns=dict(fns), capture=names)
    return forward(model_cfg, params, batch, hooks), hooks.captured
  return jax.jit(run)


def _check_names(run, batch, names) -> None:
  if not names:
    return
  known = list_points(run, batch)
  unknown = [n for n in names if n not in known]
  if unknown:
    raise KeyError(f"no point {unknown[0]!r} in this model (txf inspect --list shows the names; "
                   f"e.g. {', '.join(list(known)[:4])})")


def query_valid(family: str, batch, name: str) -> jnp.ndarray:
  """bool [B, L]: the real query positions of point ``name``'s stack (encoder: inputs != 0;
  decoder: targets != 0)."""
  key = "inputs" if name.startswith("encoder") else "targets"
  if key not in batch:
    key = "inputs" if "inputs" in batch else "targets"
  return jnp.asarray(batch[key]) != 0


def ablation_masks(run, batch, heads: Sequence[Head] = (), units: Sequence[Unit] = (),
                   mode: str = "zero", reference=None) -> Dict[str, Tuple[Any, Any]]:
  """{point: (keep, fill)} that remove ``heads`` (each head's output before W^O) and ``units``
  (FFN hidden units): ``zero`` fills 0; ``mean`` fills the head's (unit's) mean output over the
  real positions of ``reference`` (default ``batch``), per head and feature."""
  if mode not in ("zero", "mean"):
    raise ValueError(f"mode={mode!r}: use 'zero' or 'mean'")
  wanted: Dict[str, list] = {}
  for module, index in heads:
    wanted.setdefault(f"{module}/heads", []).append(int(index))
  for module, index in units:
    wanted.setdefault(f"{module}/hidden", []).append(int(index))
  shapes = list_points(run, batch)
  missing = [n for n in wanted if n not in shapes]
  if missing:
    raise KeyError(f"no point {missing[0]!r}: heads are (attention module, head), units "
                   f"(ffn module, unit); txf inspect --list shows the modules")
  means = {}
  if mode == "mean" and wanted:
    ref = batch if reference is None else reference
    got = capture(run, ref, list(wanted))
    for name, x in got.items():
      valid = query_valid(run.model_cfg.family, ref, name).astype(jnp.float32)
      if name.endswith("/heads"):  # [B, h, L, d_v] -> [1, h, 1, d_v]
        w = valid[:, None, :, None]
        means[name] = (x * w).sum((0, 2), keepdims=True) / jnp.maximum(w.sum((0, 2), keepdims=True), 1)
      else:  # [B, L, f] -> [f]
        w = valid[..., None]
        means[name] = (x * w).sum((0, 1)) / jnp.maximum(w.sum((0, 1)), 1)
  masks = {}
  for name, indices in wanted.items():
    shape, _ = shapes[name]
    axis = 1 if name.endswith("/heads") else len(shape) - 1
    keep = np.ones(shape[axis], bool)
    keep[indices] = False
    keep = keep.reshape((1, -1, 1, 1) if axis == 1 else (-1,))
    masks[name] = (jnp.asarray(keep), means.get(name, jnp.zeros((), jnp.float32)))
  return masks


@functools.lru_cache(maxsize=64)
def _masked_fn(model_cfg, names):
  def run(params, batch, masks):
    return forward(model_cfg, params, batch, Hooks(masks=masks))
  return jax.jit(run)


def ablate(run, batch, heads: Sequence[Head] = (), units: Sequence[Unit] = (), mode: str = "zero",
           reference=None) -> jnp.ndarray:
  """The logits of ``batch`` with attention ``heads`` [(module, head)] and FFN ``units``
  [(module, unit)] removed: their outputs (a head's output before W^O, a unit's activation)
  set to 0 (``mode="zero"``) or to their mean over the real positions of ``reference`` (default
  ``batch``; ``mode="mean"``). With every head of an attention zeroed its output is W^O's bias
  (0 without). One program per set of ablated modules (the heads chosen are its arguments)."""
  masks = ablation_masks(run, batch, heads, units, mode, reference)
  return _masked_fn(run.model_cfg, tuple(sorted(masks)))(_params(run), _batch(batch), masks)


def lens_stack(run, batch) -> str:
  """The stack whose residual stream the logit lens reads: the decoder when the model has one,
  else the encoder."""
  return "decoder" if any(n.startswith("decoder/") for n in list_points(run, batch)) else "encoder"


def num_layers(model_cfg, stack: str) -> int:
  """N of ``stack`` ("encoder" | "decoder")."""
  return model_cfg.num_decoder_layers if stack == "decoder" else model_cfg.num_encoder_layers


@functools.lru_cache(maxsize=16)
def _lens_fn(model_cfg, stack: str):
  def run(params, batch):
    outs = []
    for last in range(-1, num_layers(model_cfg, stack)):
      outs.append(forward(model_cfg, params, batch, Hooks(skip={stack: last})))
    return jnp.stack(outs)
  return jax.jit(run)


def logit_lens(run, batch) -> jnp.ndarray:
  """The logit lens: [N + 1, ...logits shape] where row 0 is the embeddings and row i + 1 layer
  i's residual stream (``<stack>/layer_<i>/resid_out``) sent through the rest of the model's
  head as if the layers after i were not there: the final norm (pre-LN), the output projection
  (and the MLM transform, the pooling and classifier). Row N is the model's logits. The stack is
  the decoder's when the model has one (:func:`lens_stack`)."""
  stack = lens_stack(run, batch)
  return _lens_fn(run.model_cfg, stack)(_params(run), _batch(batch))
