"""A stack of N identical layers: unrolled (``layer_0`` ... ``layer_{N-1}``) or scanned, with remat.

``model.scan_layers=True`` runs the N layers as one ``nn.scan`` over a single layer: its parameters
are stored once, under ``layers``, with a leading layer axis [N, ...] (logical axis name
``"layers"``, replicated by the sharding rules), and XLA compiles one layer body instead of N.
``model.remat`` recomputes each layer's activations in the backward pass instead of keeping them:
``"full"`` keeps only the layer inputs, a ``jax.checkpoint_policies`` name (``dots_saveable``, ...)
keeps what that policy saves. Neither changes the maths: the loss and gradients equal the plain
stack's to float32 rounding (tests/test_stack.py); ``none`` / ``False`` (the defaults) leave the
model exactly as it was.

:func:`stack_layers` and :func:`unstack_layers` convert parameter trees (or whole train states,
checkpoints: any pytree whose dicts hold the layers) between the two layouts. Decoding always runs
the unrolled stack (its KV cache is per layer): txf.decode.adapter unstacks scanned parameters.
"""

import re
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.core.variants import Table

# The parameter name of a scanned stack, and its logical axis.
LAYERS = "layers"
# The allowed values of ``model.remat``: "none" (no recomputation), then name -> the
# ``jax.checkpoint`` policy: "full" None (save nothing but the layer's inputs), the others the
# jax.checkpoint_policies of that name.
REMAT = Table("model.remat", {"full": None, **{
    name: getattr(jax.checkpoint_policies, name)
    for name in ("dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable",
                 "everything_saveable")}}, also=("none",))
_LAYER_KEY = re.compile(r"^layer_(\d+)$")


def remat_policy(name: str) -> Optional[Any]:
  """The ``jax.checkpoint`` policy a ``model.remat`` name means: None for "full" (save nothing but
  the layer's inputs), ``jax.checkpoint_policies.<name>`` otherwise (the entries of ``REMAT``).
  Raises ValueError for "none" or an unknown name."""
  return REMAT[name]


def apply_layers(layer_cls, cfg, num_layers: int, x: jnp.ndarray, args: Sequence[Any],
                 **attributes) -> jnp.ndarray:
  """x -> layer_{N-1}(... layer_0(x, *args) ..., *args) for N = ``num_layers`` layers of
  ``layer_cls(cfg, **attributes)``; call inside a compact method (the layers become its children).

  ``layer_cls.__call__(x, *args)`` returns the new x; with ``scanned=True`` it returns (x, None),
  the carry form ``nn.scan`` needs. ``args`` are the same for every layer (masks, memory).
  """
  remat = cfg.remat != "none" and not cfg.decode
  if cfg.scan_layers and num_layers > 0:
    if cfg.decode:
      raise ValueError("a scanned stack does not decode: unstack its parameters "
                       "(txf.nn.stack.unstack_layers) and decode with scan_layers=False")
    body = layer_cls
    if remat:  # prevent_cse=False: inside a scan, CSE cannot undo the rematerialisation
      body = nn.remat(body, policy=remat_policy(cfg.remat), prevent_cse=False)
    scan = nn.scan(body, variable_axes={"params": 0, "intermediates": 0},
                   split_rngs={"params": True, "dropout": True},
                   in_axes=(nn.broadcast,) * len(args), length=num_layers,
                   metadata_params={nn.PARTITION_NAME: LAYERS})
    x, _ = scan(cfg, scanned=True, name=LAYERS, **attributes)(x, *args)
    return x
  body = nn.remat(layer_cls, policy=remat_policy(cfg.remat)) if remat else layer_cls
  for i in range(num_layers):
    x = body(cfg, name=f"layer_{i}", **attributes)(x, *args)
  return x


def _layer_indices(tree) -> list:
  if not isinstance(tree, dict):
    return []
  return sorted(int(m.group(1)) for m in map(_LAYER_KEY.match, tree) if m)


def _is_stack(tree) -> bool:
  return bool(_layer_indices(tree)) and all(isinstance(tree[f"layer_{i}"], dict)
                                            for i in _layer_indices(tree))


def stack_layers(tree):
  """Per-layer to scanned layout: every dict holding ``layer_0`` ... ``layer_{N-1}`` gets one
  ``layers`` entry instead, each leaf the N layers' leaves stacked on a new leading axis [N, ...].

  Works on parameters, on a train state (Adam's moments have the parameters' layout) and on a
  restored checkpoint tree. Inverse of :func:`unstack_layers`.
  """
  def convert(node):
    if not _is_stack(node):
      return jax.tree_util.tree_map(convert, node, is_leaf=_is_stack) if isinstance(node, dict) else node
    indices = _layer_indices(node)
    if indices != list(range(len(indices))):
      raise ValueError(f"layers {indices} are not numbered 0..{len(indices) - 1}")
    layers = [node[f"layer_{i}"] for i in indices]
    out = {k: convert(v) for k, v in node.items() if not _LAYER_KEY.match(k)}
    out[LAYERS] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)
    return out
  return jax.tree_util.tree_map(convert, tree, is_leaf=_is_stack)


def _is_stacked(tree) -> bool:
  return isinstance(tree, dict) and isinstance(tree.get(LAYERS), dict)


def unstack_layers(tree):
  """Scanned to per-layer layout: every dict's ``layers`` entry (leaves [N, ...]) becomes
  ``layer_0`` ... ``layer_{N-1}`` (leaf i = the stacked leaf's slice [i]). Inverse of
  :func:`stack_layers`."""
  def convert(node):
    if not _is_stacked(node):
      return node
    stacked = node[LAYERS]
    n = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    out = {k: jax.tree_util.tree_map(convert, v, is_leaf=_is_stacked)
           for k, v in node.items() if k != LAYERS}
    for i in range(n):
      out[f"layer_{i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i], stacked)
    return out
  return jax.tree_util.tree_map(convert, tree, is_leaf=_is_stacked)
