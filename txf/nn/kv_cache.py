"""The decode cache's layout, defined once: its entries, which of them are per source, and the
pure functions that write a step into it and lay it out for beam search.

Every attention layer of a decoding model (``TransformerConfig.decode``) owns one ``"cache"``
collection holding some of these entries:

- causal self-attention: ``cached_key`` / ``cached_value`` [B, h_kv, T, d_k] (T = the decode length;
  h_kv the key/value heads: ``model.num_kv_heads``, = h unless grouped-query attention)
  and ``cache_index`` (0-d int32, the next position to write); in beam search's layout (made by
  :func:`expand_for_beams`) ``cached_value`` [B, h_kv, G*T, d_k], ``cached_key`` the same or,
  as the kernel table chooses (:func:`keys_transposed`), [B, h_kv, d_k, G*T], and ``beam_slots``
  int32 [B*G, T];
- cross-attention: ``cross_key`` / ``cross_value`` [B, h_kv, S, d_k] and ``cross_valid`` bool [B, S],
  the encoder memory's, stored once when the cache is built (:data:`PER_SOURCE`);
- the decoder's position embedding: ``position`` (0-d int32).

txf.nn.attention reads and writes these entries through :func:`write_step` and
:func:`write_beam_step`; txf.decode.adapter builds caches and passes :func:`expand_for_beams` and
:func:`reorder_beams` to txf.decode's beam search, which itself knows no layout.
"""

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from txf.kernels import select

CACHED_KEY, CACHED_VALUE = "cached_key", "cached_value"  # causal self-attention K/V [B, h_kv, T, d_k]
CACHE_INDEX = "cache_index"    # 0-d int32: next position to write
BEAM_SLOTS = "beam_slots"      # int32 [B*G, T]: the slot each beam reads each position from
CROSS_KEY, CROSS_VALUE, CROSS_VALID = "cross_key", "cross_value", "cross_valid"  # encoder memory
POSITION = "position"          # 0-d int32: the decoder's position counter (txf.nn.layers)

# Entries that depend only on the source, never on the target prefix: equal for every beam of a
# source, so beam search neither copies them per beam nor reorders them.
PER_SOURCE = (CROSS_KEY, CROSS_VALUE, CROSS_VALID)


def write_step(cached_k, cached_v, index, k, v):
  """Write L new key/value heads at ``index`` into the plain (one row per sequence) layout.

  cached_k, cached_v [B, h_kv, T, d_k]; index 0-d int32; k, v [B, h_kv, L, d_k].
  Returns (keys [B, h_kv, T, d_k], values, new index = index + L, mask bool [1, 1, L, T]) where
  query p (absolute position index + p) may see key position u iff u <= index + p: one step, or
  a causal prompt prefill.
  """
  cached_k = jax.lax.dynamic_update_slice(cached_k, k, (0, 0, index, 0))
  cached_v = jax.lax.dynamic_update_slice(cached_v, v, (0, 0, index, 0))
  max_len = cached_k.shape[2]
  q_pos = index + jnp.arange(k.shape[2])[:, None]
  mask = (jnp.arange(max_len)[None, :] <= q_pos)[None, None]  # [1, 1, L_q, max_len]
  return cached_k, cached_v, index + k.shape[2], mask


def keys_transposed(dtype) -> bool:
  """Whether beam search's layout stores keys of ``dtype`` transposed, [B, h_kv, d_k, G*T]: the
  kernel table's ``beam_keys`` (txf.kernels.select; on CPU in float32). Q K^T is then a plain
  [G*L, d_k] @ [d_k, G*T] product per source and head, which XLA:CPU runs without repacking the
  keys at every step (the [G*T, d_k] rows contracted on their last axis are repacked)."""
  return select(dtype).beam_keys == "transposed"


def beam_keys(cached_k):
  """The keys of beam search's layout as attention reads them, [B, h_kv, G*T, d_k]: ``cached_k``
  as stored, transposed back when :func:`keys_transposed` (a transpose XLA folds into the dot)."""
  return jnp.swapaxes(cached_k, 2, 3) if keys_transposed(cached_k.dtype) else cached_k


def write_beam_step(cached_k, cached_v, slots, index, k, v):
  """Write L new key/value heads at ``index`` into beam search's layout, never reordered.

  The G beams of a source keep their keys/values side by side in the source's row: cached_v
  [B, h_kv, G*T, d_k] (beam slot g holds positions g*T .. g*T + T - 1), cached_k the same or
  [B, h_kv, d_k, G*T] when :func:`keys_transposed`, and ``slots`` int [B*G, T] says, for each
  beam, which slot holds each position of its history (beam search reorders that table only).
  k, v [B*G, h_kv, L, d_k] go to each beam's own slot at ``index``.

  Returns (keys as stored (:func:`beam_keys` reads them), values [B, h_kv, G*T, d_k], slots,
  index + L, mask bool [B, 1, G*L, G*T]) where beam q's query at position index + p sees slot s at position u
  iff u <= index + p and slots[q, u] == s (the keys of the gather-reordered cache, at the same
  positions).
  """
  n, l = k.shape[0], k.shape[2]
  b, t = cached_k.shape[0], slots.shape[1]
  g = n // b
  h, d = cached_v.shape[1], cached_v.shape[3]

  def write(buffer, x):  # x [B*G, h, L, d] into [B, h, G*T, d] at slot g, positions index..
    x = x.reshape(b, g, h, l, d).transpose(0, 2, 1, 3, 4).astype(buffer.dtype)
    grouped = buffer.reshape(b, h, g, t, d)
    return jax.lax.dynamic_update_slice(grouped, x, (0, 0, 0, index, 0)).reshape(buffer.shape)

  def write_transposed(buffer, x):  # x [B*G, h, L, d] into [B, h, d, G*T] at slot g, index..
    x = x.reshape(b, g, h, l, d).transpose(0, 2, 4, 1, 3).astype(buffer.dtype)
    grouped = buffer.reshape(b, h, d, g, t)
    return jax.lax.dynamic_update_slice(grouped, x, (0, 0, 0, 0, index)).reshape(buffer.shape)

  cached_k = (write_transposed if keys_transposed(cached_k.dtype) else write)(cached_k, k)
  cached_v = write(cached_v, v)
  own = jnp.broadcast_to((jnp.arange(n) % g)[:, None], (n, l)).astype(slots.dtype)
  slots = jax.lax.dynamic_update_slice(slots, own, (0, index))
  seen = jnp.arange(t)[None, :] <= index + jnp.arange(l)[:, None]  # [L, T]
  owner = slots.reshape(b, g, 1, 1, t) == jnp.arange(g)[:, None]  # [B, G, 1, G, T]
  mask = owner & seen[None, None, :, None, :]  # [B, G (query beam), L, G (slot), T]
  return cached_k, cached_v, slots, index + l, mask.reshape(b, 1, g * l, g * t)


def expand_for_beams(cache, beam: int):
  """Beam search's initial cache: the cache of B sources laid out for B*beam beams.

  - Causal self-attention buffers [B, h_kv, T, d_k] become [B, h_kv, beam*T, d_k] (keys
    [B, h_kv, d_k, beam*T] when :func:`keys_transposed`), one slot of T positions per beam (each
    a copy of the source's), with ``beam_slots`` int32 [B*beam, T] (beam k of a source reads every
    position from slot k): the layout of :func:`write_beam_step`, where
    beams read the slots their history was written in and :func:`reorder_beams` reorders that
    table instead of copying the buffers.
  - Per-source entries (:data:`PER_SOURCE`) stay at B rows: each is read once per source for all
    its beams.
  - Any other per-row leaf is repeated (as ``txf.decode.expand_to_beams``); 0-d leaves kept.
  """
  def expand(tree):
    if not isinstance(tree, Mapping):
      return jnp.repeat(tree, beam, axis=0) if tree.ndim >= 1 else tree
    if CACHED_KEY not in tree:
      return {name: value if name in PER_SOURCE else expand(value)
              for name, value in tree.items()}
    out = dict(tree)
    for name in (CACHED_KEY, CACHED_VALUE):
      b, h, t, d = tree[name].shape
      out[name] = jnp.broadcast_to(tree[name][:, :, None], (b, h, beam, t, d)).reshape(
          b, h, beam * t, d)
    if keys_transposed(out[CACHED_KEY].dtype):
      out[CACHED_KEY] = jnp.swapaxes(out[CACHED_KEY], 2, 3)  # [B, h_kv, d_k, beam*T]
    rows = jnp.arange(b * beam, dtype=jnp.int32) % beam
    out[BEAM_SLOTS] = jnp.broadcast_to(rows[:, None], (b * beam, t))
    return out

  return expand(cache)


def reorder_beams(cache, rows: jnp.ndarray):
  """Beam search's cache reorder: out[i] = cache[rows[i]] for every per-row leaf [N, ...] except
  the per-source entries (:data:`PER_SOURCE`, equal for every beam of a source, so the gather
  would copy them for nothing). 0-d leaves (counters) and leaves of another leading size (the
  per-source rows of :func:`expand_for_beams`'s layout, whose ``beam_slots`` tables are
  reordered instead) are unchanged. rows: int [N].
  """
  n = rows.shape[0]

  def gather(path, x):
    names = {str(getattr(p, "key", "")) for p in path}
    if x.ndim == 0 or x.shape[0] != n or names & set(PER_SOURCE):
      return x
    return jnp.take(x, rows, axis=0)

  return jax.tree_util.tree_map_with_path(gather, cache)
