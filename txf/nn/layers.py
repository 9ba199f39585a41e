"""Encoder and decoder layers and stacks (section 3.1), as Flax modules calling txf.ops."""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from txf import kernels, ops
from txf.nn import kv_cache, mup, taps
from txf.nn.attention import HIDDEN_AXES, MultiHeadAttention, constrain, xavier
from txf.nn.config import BOS_ID, PAD_ID, UNK_ID, TransformerConfig, padded_size
from txf.nn.dropout import Dropout
from txf.nn.positional import (POSITIONAL, attention_positions, learned_positions,  # noqa: F401
                               no_positions, sinusoidal_positions)
from txf.nn.stack import apply_layers
from txf.core.variants import Table


class Embed(nn.Module):
  """Token embedding table E [V_pad, d_model]; ``__call__`` gives E[x] * sqrt(d_model), ``attend``
  gives h E^T [..., V_pad].

  ``num_embeddings`` is the real vocabulary V; the table has V_pad = ceil(V / m) * m rows
  (m = ``config.vocab_multiple``, so that a tensor axis divides them). Ids are < V, so the
  padding rows are never looked up; the ``Decoder`` cuts the logits back to V.
  """
  config: TransformerConfig
  num_embeddings: int

  def setup(self):
    # N(0, d^-1/2): after the sqrt(d) scale the embeddings have unit variance, and tied logits
    # start small (muP: N(0, d_0^-1/2) and a sqrt(d_0) scale, txf.nn.mup).
    std = mup.embed_std(self.config) if mup.is_mup(self.config) else self.config.d_model ** -0.5
    self.table = self.param("embedding", nn.with_logical_partitioning(
        nn.initializers.normal(std), ("vocab", "embed")),
                            (padded_size(self.num_embeddings, self.config.vocab_multiple),
                             self.config.d_model))

  def __call__(self, ids: jnp.ndarray) -> jnp.ndarray:
    """ids int [B, L] -> [B, L, d_model] in the residual stream's dtype (``stream_dtype``)."""
    cfg = self.config
    x = ops.embed(ids, self.table.astype(cfg.compute_dtype), scale=cfg.embed_scale)
    if mup.embed_multiplier(cfg) != 1.0:  # muP: E[x] sqrt(d_0)
      x = x * mup.embed_multiplier(cfg)
    return constrain(x.astype(cfg.stream_dtype), HIDDEN_AXES)

  def attend(self, h: jnp.ndarray) -> jnp.ndarray:
    """h [B, L, d_model] -> logits [B, L, V_pad] = h E^T (padding columns included)."""
    return kernels.tied_logits(h, self.table.astype(h.dtype))


class AddPositions(nn.Module):
  """x + PE followed by dropout; PE is ``POSITIONAL[model.positional].embed`` (txf.nn.positional):
  sinusoidal (the paper), learned, or none (also for the encodings that act inside attention).

  BERT's embeddings (both off by default): ``model.type_vocab_size > 0`` adds row 0 of a learned
  token-type table T [type_vocab_size, d_model] (``token_type_embedding``, N(0, 0.02^2) at init;
  txf's inputs are one segment, type 0); ``model.embed_norm`` normalises the sum before the
  dropout: Dropout(LN(E[x] + PE + T[0])) (``embed_norm``, a ``LayerNorm``).

  With ``decode=True`` and ``causal_cache=True`` (the decoder's) the position is read from, and
  advanced in, a cache counter.
  """
  config: TransformerConfig
  causal_cache: bool = False

  @nn.compact
  def __call__(self, x: jnp.ndarray, positions: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    """x [B, L, d_model]; positions int [B, L] (packed rows) or None for 0..L-1."""
    cfg = self.config
    length = x.shape[1]
    if cfg.decode and self.causal_cache:
      initialized = self.has_variable("cache", kv_cache.POSITION)
      counter = self.variable("cache", kv_cache.POSITION, lambda: jnp.array(0, jnp.int32))
      if initialized:
        positions = counter.value + jnp.arange(length)[None, :]
        counter.value = counter.value + length
    if positions is None:
      positions = jnp.arange(length)[None, :]
    x = POSITIONAL[cfg.positional].embed(self, cfg, x, positions)
    if cfg.type_vocab_size:  # every token is of type 0 (one segment)
      types = self.param("token_type_embedding", nn.with_logical_partitioning(
          nn.initializers.normal(0.02), (None, "embed")), (cfg.type_vocab_size, cfg.d_model))
      x = x + types[0].astype(x.dtype)
    if cfg.embed_norm:
      x = LayerNorm(cfg, name="embed_norm")(x)
    return Dropout(cfg.dropout_rate)(x, deterministic=cfg.deterministic)


def layer_norm(module: nn.Module, cfg: TransformerConfig, x: jnp.ndarray) -> jnp.ndarray:
  """LN(v) = gamma * (v - mu) / sqrt(sigma^2 + eps) + beta (txf.ops.layer_norm) with the
  parameters ``scale`` (gamma, 1 at init) and ``bias`` (beta, 0 at init) [d] of ``module`` and
  eps = ``model.layer_norm_eps``. x [..., d] -> [..., d]."""
  d = x.shape[-1]
  return kernels.layer_norm(
      x, module.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)), (d,)),
      module.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)), (d,)),
      cfg.layer_norm_eps, cfg.compute_dtype)


def rms_norm(module: nn.Module, cfg: TransformerConfig, x: jnp.ndarray) -> jnp.ndarray:
  """RMSNorm(v) = gamma * v / sqrt(mean(v^2) + eps) (txf.ops.rms_norm) with the parameter
  ``scale`` (gamma, 1 at init) [d] of ``module`` and eps = ``model.layer_norm_eps``."""
  d = x.shape[-1]
  return ops.rms_norm(x, module.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)), (d,)),
                      cfg.layer_norm_eps)


# The normalisations of Add & Norm (``model.norm``): name -> f(module, cfg, x), which declares its
# parameters in ``module`` and applies its formula of txf.ops.
NORMS = Table("model.norm", {"layer_norm": layer_norm, "rms_norm": rms_norm})


class LayerNorm(nn.Module):
  """The Add & Norm normalisation ``NORMS[model.norm]``; the paper's ``layer_norm``: LN(v) =
  gamma * (v - mu) / sqrt(sigma^2 + eps) + beta (txf.ops.layer_norm); gamma=1, beta=0 at init."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, x):
    return NORMS[self.config.norm](self, self.config, x)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2 (txf.ops.feed_forward; ``activation`` may replace max(0, .),
  or name a gated FFN (f(x W1 + b1) * (x V + c)) W2 + b2 with the gate kernel ``wi_gate`` V).

  Parameters: ``wi`` W1 [d_model, f], ``bi`` b1 [f], (gated: ``wi_gate`` V [d_model, f], ``bi_gate``
  c [f]), ``wo`` W2 [f, d_model], ``bo`` b2 [d_model], f = ``config.ffn_hidden``; with
  ``use_bias=False`` no ``bi``, ``bi_gate``, ``bo``. x [..., d_model] -> [..., d_model].
  """
  config: TransformerConfig
  tap = taps.tap  # the named point hidden [..., f] (txf.inspect reads and replaces it)

  @nn.compact
  def __call__(self, x):
    cfg, dt = self.config, self.config.compute_dtype
    axes = lambda init, *names: nn.with_logical_partitioning(init, names)
    bias = lambda name, size, axis: (self.param(name, axes(nn.initializers.zeros, axis), (size,)).astype(dt)
                                     if cfg.use_bias else None)
    f = cfg.ffn_hidden
    kernel = axes  # muP: hidden init variance / r (txf.nn.mup)
    if mup.is_mup(cfg):
      kernel = lambda init, *names: mup.hidden_init(cfg, init, names)
    w1 = self.param("wi", kernel(xavier, "embed", "mlp"), (cfg.d_model, f)).astype(dt)
    b1 = bias("bi", f, "mlp")
    w_gate = b_gate = None
    if cfg.gated_ffn:
      w_gate = self.param("wi_gate", kernel(xavier, "embed", "mlp"), (cfg.d_model, f)).astype(dt)
      b_gate = bias("bi_gate", f, "mlp")
    w2 = self.param("wo", kernel(xavier, "mlp", "embed"), (f, cfg.d_model)).astype(dt)
    b2 = bias("bo", cfg.d_model, "norm")
    return constrain(kernels.feed_forward(x.astype(dt), w1, b1, w2, b2, activation=cfg.activation,
                                          w_gate=w_gate, b_gate=b_gate,
                                          hidden_fn=lambda z: self.tap("hidden", z)), HIDDEN_AXES)


def residual(cfg: TransformerConfig, norm: LayerNorm, sublayer, x: jnp.ndarray) -> jnp.ndarray:
  """Add & Norm around one sublayer (call inside a compact method).

  post-LN (paper): LayerNorm(x + Dropout(Sublayer(x)));  pre-LN: x + Dropout(Sublayer(LayerNorm(x))).
  """
  y = sublayer(norm(x) if cfg.pre_ln else x)
  y = Dropout(cfg.dropout_rate)(y, deterministic=cfg.deterministic)
  return x + y if cfg.pre_ln else norm(x + y)


def parallel_residual(cfg: TransformerConfig, norm: LayerNorm, sublayers, x: jnp.ndarray) -> jnp.ndarray:
  """The parallel block (GPT-J, PaLM; ``model.parallel_block``): sublayers (self-attention, FFN)
  reading the same input, one shared norm (call inside a compact method).

  pre-LN: x + Dropout(Attn(Norm(x))) + Dropout(FFN(Norm(x)));
  post-LN: Norm(x + Dropout(Attn(x)) + Dropout(FFN(x))).  x [B, L, d_model] -> [B, L, d_model].
  """
  h = norm(x) if cfg.pre_ln else x
  for sublayer in sublayers:
    x = x + Dropout(cfg.dropout_rate)(sublayer(h), deterministic=cfg.deterministic)
  return x if cfg.pre_ln else norm(x)


class EncoderLayer(nn.Module):
  """Self-attention, Add & Norm, FFN, Add & Norm (``model.d_ff=0``: no FFN, attention only); with
  ``parallel_block`` x + Attn(N(x)) + FFN(N(x))
  (pre-LN) or N(x + Attn(x) + FFN(x)) (post-LN), one norm ``norm_1``."""
  config: TransformerConfig
  scanned: bool = False                # True: return (x, None), the carry form of nn.scan

  @nn.compact
  def __call__(self, x: jnp.ndarray, mask: Optional[jnp.ndarray],
               positions: Optional[jnp.ndarray] = None,
               shared_table: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    """x [B, S, d_model]; mask bool [B, 1, S, S]; positions int [B, S] for an encoding inside
    attention (None: 0..S-1); shared_table the stack's relative bias table
    (``model.relative_shared``) or None."""
    cfg = self.config
    attention = MultiHeadAttention(cfg, "self", name="self_attention")
    attend = lambda h: attention(h, mask=mask, positions=positions, shared_table=shared_table)
    ffn = (FeedForward(cfg, name="ffn"),) if cfg.d_ff else ()  # d_ff = 0: attention only
    if cfg.parallel_block:  # x + Attn(N(x)) + FFN(N(x)), one norm
      x = parallel_residual(cfg, LayerNorm(cfg, name="norm_1"), (attend,) + ffn, x)
    else:
      x = residual(cfg, LayerNorm(cfg, name="norm_1"), attend, x)
      for sublayer in ffn:
        x = residual(cfg, LayerNorm(cfg, name="norm_2"), sublayer, x)
    return (x, None) if self.scanned else x


class DecoderLayer(nn.Module):
  """Causal self-attention, Add & Norm, cross-attention (if a memory), Add & Norm, FFN, Add & Norm
  (``model.d_ff=0``: no FFN, attention only).

  With ``parallel_block``: cross-attention (if a memory) and its Add & Norm (``norm_2``) first, then
  causal self-attention and FFN in parallel on one norm (``norm_1``, :func:`parallel_residual`);
  no ``norm_3``. Cross-attention goes first so that the layer's FFN sees what it read."""
  config: TransformerConfig
  cross: bool = True
  scanned: bool = False                # True: return (y, None), the carry form of nn.scan

  @nn.compact
  def __call__(self, y, self_mask, memory=None, cross_mask=None, memory_valid=None, positions=None,
               shared_table=None):
    """y [B, T, d_model]; self_mask bool [B|1, 1, T, T]; memory [B, S, d_model]; cross_mask [B, 1, T, S];
    positions int [B, T] for an encoding inside self-attention (None: 0..T-1, or the cache's);
    shared_table the stack's relative bias table (``model.relative_shared``) or None."""
    cfg = self.config
    causal = MultiHeadAttention(cfg, "causal", name="self_attention")
    self_attention = lambda h, **kw: causal(h, **kw, shared_table=shared_table)

    def add_cross(y):  # cross-attention and its Add & Norm (norm_2)
      attend = MultiHeadAttention(cfg, "cross", name="cross_attention")
      return residual(cfg, LayerNorm(cfg, name="norm_2"),
                      lambda h: attend(h, memory=memory, mask=cross_mask, memory_valid=memory_valid), y)

    ffn = (FeedForward(cfg, name="ffn"),) if cfg.d_ff else ()  # d_ff = 0: attention only
    if cfg.parallel_block:  # cross-attention (if a memory) first, then y + Attn(N(y)) + FFN(N(y))
      y = add_cross(y) if self.cross else y
      y = parallel_residual(cfg, LayerNorm(cfg, name="norm_1"),
                            (lambda h: self_attention(h, mask=self_mask, positions=positions),)
                            + ffn, y)
      return (y, None) if self.scanned else y
    y = residual(cfg, LayerNorm(cfg, name="norm_1"),
                 lambda h: self_attention(h, mask=self_mask, positions=positions), y)
    if self.cross:
      y = add_cross(y)
    for sublayer in ffn:
      y = residual(cfg, LayerNorm(cfg, name="norm_3"), sublayer, y)
    return (y, None) if self.scanned else y


class Encoder(nn.Module):
  """Embedding (+PE, dropout) and N encoder layers; a final LayerNorm when pre-LN."""
  config: TransformerConfig
  embed: nn.Module

  @nn.compact
  def __call__(self, inputs, segmentation=None, positions=None):
    """inputs int [B, S] (0 = padding) -> (encoded [B, S, d_model], valid bool [B, S])."""
    cfg = self.config
    valid = inputs != 0 if segmentation is None else segmentation != 0
    mask = (ops.padding_mask(valid, valid) if segmentation is None
            else ops.segment_mask(segmentation, segmentation))
    x = AddPositions(cfg, name="positions")(self.embed(inputs), positions)
    x = apply_layers(EncoderLayer, cfg, cfg.num_encoder_layers, x,
                     (mask,) + attention_positions(cfg, positions, self))
    if cfg.pre_ln:
      x = LayerNorm(cfg, name="final_norm")(x)
    return x, valid


def tied_head(module: nn.Module, cfg: TransformerConfig, y: jnp.ndarray, project: bool):
  """logits = h E^T with the target embedding table E [V_pad, d_model] (``module.embed``, the
  paper's sharing; txf.kernels.tied_logits). y [B, T, d_model] -> logits [B, T, V_pad], or with
  ``project=False`` (y, E)."""
  del cfg
  if not project:
    return y, module.embed.table.astype(y.dtype)
  return module.embed.attend(y)


def untied_head(module: nn.Module, cfg: TransformerConfig, y: jnp.ndarray, project: bool):
  """logits = h W with the output layer's own kernel W [d_model, V_pad] (``logits_kernel`` of
  ``module``, Xavier-uniform at init; txf.kernels.dense). y [B, T, d_model] -> logits
  [B, T, V_pad], or with ``project=False`` (y, W^T)."""
  w = module.param("logits_kernel", nn.with_logical_partitioning(xavier, ("embed", "vocab")),
                   (cfg.d_model, cfg.padded_tgt_vocab_size))
  if not project:
    return y, w.astype(y.dtype).T
  return kernels.dense(y, w.astype(y.dtype))


# ``model.mask_special_logits``: these ids' logits are set to this value (exp underflows to 0 in
# float32, yet a weight-0 padding target keeps a finite loss term, unlike -inf).
MASKED_IDS = (PAD_ID, BOS_ID, UNK_ID)
MASKED_LOGIT = -1e9


# The output heads (the pre-softmax linear layer), name -> f(decoder, cfg, h, project); the
# config's ``model.tie_output`` (a bool) picks "tied" (True) or "untied" (False).
HEADS = Table(None, {"tied": tied_head, "untied": untied_head})


class Decoder(nn.Module):
  """Embedding (+PE, dropout), N decoder layers, final linear (``HEADS``: tied h E^T, or its own
  kernel) of the final states times ``model.logits_scale`` (when not 1)."""
  config: TransformerConfig
  embed: nn.Module
  cross: bool = True

  @nn.compact
  def __call__(self, decoder_inputs, memory=None, memory_valid=None, segmentation=None,
               positions=None, memory_segmentation=None, project: bool = True):
    """decoder_inputs int [B, T] (already shifted right) -> logits [B, T, V_target] (the real
    vocabulary: a padded table's extra columns are cut off).

    memory [B, S, d_model] and memory_valid bool [B, S] for cross-attention (None at cached steps).
    ``project=False``: (final hidden states h [B, T, d_model], output table W [V_pad, d_model],
    padding rows included: the loss must ignore rows >= V_target) instead, logits = h W^T (for a
    loss that fuses the projection, ``txf.kernels.head_cross_entropy``).
    """
    cfg = self.config
    length = decoder_inputs.shape[1]
    self_mask = ops.causal_mask(length)
    cross_mask = None
    if segmentation is not None:
      self_mask = ops.combine_masks(self_mask, ops.segment_mask(segmentation, segmentation))
      if memory_segmentation is not None:
        cross_mask = ops.segment_mask(segmentation, memory_segmentation)
    elif memory_valid is not None:
      cross_mask = ops.padding_mask(jnp.ones(decoder_inputs.shape, bool), memory_valid)
    y = AddPositions(cfg, causal_cache=True, name="positions")(self.embed(decoder_inputs), positions)
    y = apply_layers(DecoderLayer, cfg, cfg.num_decoder_layers, y,
                     (self_mask, memory, cross_mask, memory_valid)
                     + attention_positions(cfg, positions, self), cross=self.cross)
    if cfg.pre_ln:
      y = LayerNorm(cfg, name="final_norm")(y)
    if cfg.logits_scale != 1.0:  # T5's tied head: logits = (d_model^-0.5 h) E^T
      y = y * cfg.logits_scale
    if mup.output_multiplier(cfg) != 1.0:  # muP: logits = (h d_0 / d_model) W^T
      y = y * mup.output_multiplier(cfg)
    y = y.astype(cfg.compute_dtype)  # the output projection runs in the compute dtype
    head = HEADS["tied" if cfg.tie_output else "untied"](self, cfg, y, project)
    if not project:
      return head  # (h, W)
    logits = constrain(head.astype(jnp.float32), ("batch", "length", "vocab"))
    # the padding columns of a padded vocabulary (model.vocab_multiple) are cut off: never predicted
    if logits.shape[-1] > cfg.tgt_vocab_size:
      logits = logits[..., :cfg.tgt_vocab_size]
    if cfg.logits_bias:  # Marian's final_logits_bias: logits = h W^T + b
      logits = logits + self.param("logits_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("vocab",)), (cfg.tgt_vocab_size,))
    if cfg.mask_special_logits:  # an imported GPT-2: txf's extra PAD/BOS/UNK rows get no mass
      logits = logits.at[..., jnp.asarray(MASKED_IDS)].set(MASKED_LOGIT)
    return logits
