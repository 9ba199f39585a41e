"""The named intermediates of any txf model, and one forward that reads and replaces them.

A *point* is a value inside the forward pass, named by its module's path and what it is:

- ``<stack>/embeddings`` [B, L, d]: token embedding + positions (the residual stream into layer 0)
- ``<stack>/layer_<i>/resid_in``, ``.../resid_out`` [B, L, d]: the layer's input and output
- ``<stack>/layer_<i>/<attention>/q`` [B, h, L_q, d_k], ``k``, ``v`` [B, h_kv, L_k, d_k]
- ``<stack>/layer_<i>/<attention>/weights`` [B, h, L_q, L_k]: per head (read-only)
- ``<stack>/layer_<i>/<attention>/heads`` [B, h, L_q, d_v]: each head's output, before W^O
- ``<stack>/layer_<i>/<attention>/out`` [B, L_q, d]: the sublayer's output (after W^O)
- ``<stack>/layer_<i>/ffn/hidden`` [B, L, f]: f(x W1 + b1); ``.../ffn/out`` [B, L, d]
- ``<stack>/layer_<i>/norm_<j>/out``, ``<stack>/final_norm/out`` [B, L, d]: the normalisations
- ``logits``: the model's output

``<stack>`` is ``encoder`` or ``decoder``, ``<attention>`` ``self_attention`` (causal in a decoder)
or ``cross_attention``. The points come from flax's method interception
(``flax.linen.intercept_methods``) around the modules' calls and their ``tap`` methods
(txf.nn.taps): no model code is copied, and a forward without an interceptor is unchanged.
"""

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.models import build_model, model_inputs
from txf.nn import layers as nn_layers
from txf.nn.attention import MultiHeadAttention
from txf.nn.stack import LAYERS, unstack_layers

READ_ONLY = ("weights",)  # points whose replacement would not reach the output
_LAYER_CLASSES = (nn_layers.EncoderLayer, nn_layers.DecoderLayer)
_OUT_CLASSES = (MultiHeadAttention, nn_layers.FeedForward, nn_layers.LayerNorm)


def inspect_config(model_cfg):
  """The model config the inspection tools run: deterministic, unrolled layers (one point per
  layer), no rematerialisation (the same values), the reference attention (which returns the
  weights)."""
  return dataclasses.replace(model_cfg, scan_layers=False, remat="none",
                             attention_impl="reference", deterministic=True, decode=False)


def inspect_params(params):
  """Parameters in the unrolled layout (a scanned stack's ``layers`` split into ``layer_<i>``)."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  scanned = any(getattr(k, "key", None) == LAYERS for path, _ in flat for k in path)
  return unstack_layers(params) if scanned else params


@dataclasses.dataclass
class Hooks:
  """What one forward does at the points: ``values`` {name: array} replace a point (broadcast to
  its shape, cast to its dtype); ``fns`` {name: f(x) -> x'} transform it; ``masks`` {name:
  (keep bool, fill)} give where(keep, x, fill) (the ablations); ``capture`` the names to return
  (None: all); ``skip`` {stack: i}: that stack's layers after layer i return their input
  unchanged (the logit lens)."""
  values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  fns: Mapping[str, Callable] = dataclasses.field(default_factory=dict)
  masks: Mapping[str, Tuple[Any, Any]] = dataclasses.field(default_factory=dict)
  capture: Optional[Sequence[str]] = ()
  skip: Mapping[str, int] = dataclasses.field(default_factory=dict)
  captured: Dict[str, Any] = dataclasses.field(default_factory=dict)
  shapes: Dict[str, Tuple[Tuple[int, ...], str]] = dataclasses.field(default_factory=dict)

  def visit(self, name: str, x):
    """The value of point ``name`` after the hooks (and kept if captured)."""
    self.shapes[name] = (tuple(x.shape), str(x.dtype))
    leaf = name.rsplit("/", 1)[-1]
    if leaf in READ_ONLY and (name in self.values or name in self.fns or name in self.masks):
      raise ValueError(f"{name} is read-only (the heads' output is computed with it): patch "
                       f"{name[:-len(leaf)]}heads or q/k instead")
    if name in self.values:
      x = jnp.broadcast_to(jnp.asarray(self.values[name], x.dtype), x.shape)
    if name in self.fns:
      x = self.fns[name](x)
    if name in self.masks:
      keep, fill = self.masks[name]
      x = jnp.where(keep, x, jnp.asarray(fill, x.dtype))
    if self.capture is None or name in self.capture:
      self.captured[name] = x
    return x

  def interceptor(self, next_fun, args, kwargs, context):
    """The ``flax.linen.intercept_methods`` interceptor naming and hooking every point."""
    module, method = context.module, context.method_name
    path = "/".join(module.path)
    if method == "tap":
      name, x = args
      return self.visit(f"{path}/{name}", x)
    if method != "__call__":
      return next_fun(*args, **kwargs)
    if isinstance(module, _LAYER_CLASSES):
      x = self.visit(f"{path}/resid_in", args[0])
      stack, index = module.path[-2] if len(module.path) > 1 else "", int(path.rsplit("_", 1)[-1])
      if stack in self.skip and index > self.skip[stack]:
        out = x
      else:
        out = next_fun(x, *args[1:], **kwargs)
      out = out[0] if module.scanned else out
      out = self.visit(f"{path}/resid_out", out)
      return (out, None) if module.scanned else out
    out = next_fun(*args, **kwargs)
    if isinstance(module, _OUT_CLASSES):
      return self.visit(f"{path}/out", out)
    if isinstance(module, nn_layers.AddPositions):
      return self.visit(f"{module.path[0] if module.path[:-1] else path}/embeddings", out)
    if not module.path and isinstance(out, jnp.ndarray):
      return self.visit("logits", out)
    return out


def hooked(hooks: Hooks, fn: Callable, *args, **kwargs):
  """``fn(*args, **kwargs)`` (which applies a model) with ``hooks`` at every point."""
  with nn.intercept_methods(hooks.interceptor):
    return fn(*args, **kwargs)


def forward(model_cfg, params, batch: Mapping[str, Any], hooks: Hooks):
  """The deterministic model output (logits) of ``batch`` with ``hooks``; traceable. The hooks'
  ``captured`` holds the captured points afterwards."""
  model = build_model(inspect_config(model_cfg), deterministic=True)
  return hooked(hooks, model.apply, {"params": params}, **model_inputs(model_cfg.family, batch))


def point_shapes(model_cfg, params, batch) -> Dict[str, Tuple[Tuple[int, ...], str]]:
  """{name: (shape, dtype)} of every point of ``batch``'s forward, in forward order; nothing is
  computed (``jax.eval_shape``)."""
  hooks = Hooks(capture=())
  jax.eval_shape(lambda p, b: forward(model_cfg, p, b, hooks), params, dict(batch))
  return dict(hooks.shapes)
