"""The model options a Marian (OPUS-MT) checkpoint needs, each against an independent computation
(numpy float64 from the formulas, or a hand-built decoding table), and their paper defaults."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import ops
from txf.data.tokenizer import marian_order
from txf.decode import beam_search, greedy_decode
from txf.models import build_model, init_params
from txf.models.encoder_decoder import shift_right
from txf.decode.adapter import init_cache, make_logits_fn
from txf.nn import TransformerConfig

RNG = np.random.default_rng(3)
EOS = 2


def test_sin_cos_layout_and_offset_elementwise():
  d, offset = 10, 3
  pe = np.asarray(ops.positional_encoding_at(jnp.arange(6)[None], d, layout="sin_cos",
                                             offset=offset))[0]
  for pos in range(6):
    for j in range(d):
      i = j if j < d // 2 else j - d // 2
      angle = (pos + offset) / 10000 ** (2 * i / d)
      expected = math.sin(angle) if j < d // 2 else math.cos(angle)
      assert abs(pe[pos, j] - expected) < 1e-5, (pos, j)


def test_interleaved_stays_the_default():
  at = ops.positional_encoding_at(jnp.arange(9)[None], 8)[0]
  np.testing.assert_allclose(at, ops.sinusoidal_positional_encoding(9, 8), atol=1e-6)
  np.testing.assert_array_equal(
      at, ops.positional_encoding_at(jnp.arange(9)[None], 8, layout="interleaved", offset=0)[0])


@pytest.mark.parametrize("activation", ["relu", "gelu", "swish"])
def test_feed_forward_activations(activation):
  x, w1, b1 = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 6)), RNG.normal(size=6)
  w2, b2 = RNG.normal(size=(6, 4)), RNG.normal(size=4)
  z = x @ w1 + b1
  f = {"relu": lambda v: np.maximum(v, 0),
       "gelu": lambda v: v * 0.5 * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
       "swish": lambda v: v / (1 + np.exp(-v))}[activation]
  expected = f(z) @ w2 + b2
  args = [jnp.asarray(a, jnp.float32) for a in (x, w1, b1, w2, b2)]
  np.testing.assert_allclose(ops.feed_forward(*args, activation=activation), expected, atol=1e-4)


def test_attention_biases_against_numpy():
  b, l, d, h = 2, 3, 8, 2
  x = RNG.normal(size=(b, l, d))
  wq, wk, wv, wo = (RNG.normal(size=(d, d)) for _ in range(4))
  bq, bk, bv, bo = (RNG.normal(size=d) for _ in range(4))
  q, k, v = x @ wq + bq, x @ wk + bk, x @ wv + bv
  heads = []
  for i in range(h):
    s = slice(i * d // h, (i + 1) * d // h)
    logits = q[..., s] @ np.swapaxes(k[..., s], 1, 2) / math.sqrt(d // h)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    heads.append((w / w.sum(-1, keepdims=True)) @ v[..., s])
  expected = np.concatenate(heads, -1) @ wo + bo
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  out, _ = ops.multi_head_attention(f32(x), f32(x), f32(wq), f32(wk), f32(wv), f32(wo), h,
                                    biases=tuple(map(f32, (bq, bk, bv, bo))))
  np.testing.assert_allclose(out, expected, atol=1e-4)


def small_config(**kw):
  base = dict(vocab_size=11, d_model=8, num_heads=2, d_ff=16, num_encoder_layers=1,
              num_decoder_layers=1, dropout_rate=0.0, max_len=16)
  return TransformerConfig(**{**base, **kw})


BATCH = {"inputs": np.array([[4, 5, 6, 2]], np.int32), "targets": np.array([[7, 8, 2, 0]], np.int32)}


def test_logits_bias_adds_its_vector():
  cfg = small_config(logits_bias=True)
  params = init_params(cfg, jax.random.key(0), BATCH)
  bias = RNG.normal(size=11).astype(np.float32)
  model = build_model(cfg, deterministic=True)
  zero = model.apply({"params": params}, **BATCH)
  params["decoder"]["logits_bias"] = jnp.asarray(bias)
  np.testing.assert_allclose(model.apply({"params": params}, **BATCH) - zero,
                             np.broadcast_to(bias, zero.shape), atol=1e-5)


def test_embed_scale_off_and_separate_tables():
  cfg = small_config(embed_scale=False, share_embeddings=False, tie_output=False)
  params = init_params(cfg, jax.random.key(1), BATCH)
  assert {"source_embed", "target_embed"} <= set(params) and "logits_kernel" in params["decoder"]
  enc = build_model(cfg, deterministic=True)
  # with no layers and no PE, the encoder output is LN-free embedding lookup: E[x] unscaled
  bare = small_config(embed_scale=False, share_embeddings=False, num_encoder_layers=0,
                      positional="none")
  out, _ = build_model(bare, deterministic=True).apply({"params": params}, BATCH["inputs"],
                                                        method="encode")
  np.testing.assert_allclose(out[0], np.asarray(params["source_embed"]["embedding"])[BATCH["inputs"][0]],
                             atol=1e-6)
  scaled = small_config(share_embeddings=False, num_encoder_layers=0, positional="none")
  out, _ = build_model(scaled, deterministic=True).apply({"params": params}, BATCH["inputs"],
                                                          method="encode")
  np.testing.assert_allclose(out[0], np.asarray(params["source_embed"]["embedding"])[BATCH["inputs"][0]]
                             * math.sqrt(8), atol=1e-5)
  assert enc.apply({"params": params}, **BATCH).shape == (1, 4, 11)


def test_decoder_start_id_starts_teacher_forcing_and_decoding():
  np.testing.assert_array_equal(shift_right(jnp.array([[7, 8, 2]]), bos_id=0), [[0, 7, 8]])
  cfg = small_config(decoder_start_id=0)
  params = init_params(cfg, jax.random.key(2), BATCH)
  model = build_model(cfg, deterministic=True)
  teacher = model.apply({"params": params}, **BATCH)
  # the first cached step fed the start id 0 gives the teacher-forced first position's logits
  cache = init_cache(cfg, params, 1, 4, jnp.asarray(BATCH["inputs"]))
  logits, _ = make_logits_fn(cfg, params)(jnp.array([[0]]), cache)
  np.testing.assert_allclose(logits[0], teacher[0, 0], atol=1e-5)
  # and not BOS's: the start id matters
  assert not np.allclose(make_logits_fn(cfg, params)(jnp.array([[1]]), cache)[0][0], teacher[0, 0],
                         atol=1e-3)


def test_never_ids_are_never_generated_and_stay_in_the_normaliser():
  # step table: PAD (0) is the most likely token; EOS (2) .3, a (3) .1 -- see step_table_fn
  fn = step_table_fn([{0: .6, 2: .3, 3: .1}])
  cache = {"step": jnp.array(0)}
  assert int(greedy_decode(fn, cache, 1, 3)[0, 0]) == 0
  assert int(greedy_decode(fn, cache, 1, 3, never_ids=(0,))[0, 0]) == 2
  ids, scores = beam_search(fn, cache, 1, 2, 3, length_penalty="power", alpha=1.0,
                            never_ids=(0,))
  # every beam: no PAD among its generated tokens, up to and including its EOS (after it, the rows
  # are filled with PAD by the output format, not generated)
  for row in np.asarray(ids)[0].tolist():
    generated = row[:row.index(2) + 1] if 2 in row else row
    assert 0 not in generated, row
  assert np.asarray(ids)[0, 0, 0] == 2  # the best: EOS (.3), PAD (.6) being banned
  # the score of "EOS" is log .3 (normalised over all ids, PAD included), as Hugging Face's
  # bad-words rule gives, not log(.3 / .4)
  np.testing.assert_allclose(scores[0, 0], math.log(.3), rtol=1e-4)


def test_marian_order_hand_worked():
  # Marian: eos 0, unk 1, pad 6 (last) -> txf: pad 0, eos 2, unk 3, the rest (2, 3, 4, 5) in order
  np.testing.assert_array_equal(marian_order(7, pad=6, eos=0, unk=1), [6, 2, 0, 1, 3, 4, 5])


def step_table_fn(rows):
  """Next-token probabilities by step (the same for every beam): rows[t] = {token: prob}."""
  table = np.full((len(rows), 5), 1e-9)
  for t, probs in enumerate(rows):
    for v, p in probs.items():
      table[t, v] = p
  table = jnp.asarray(np.log(table / table.sum(-1, keepdims=True)), jnp.float32)

  def logits_fn(ids, cache):
    t = jnp.minimum(cache["step"], len(rows) - 1)
    return jnp.broadcast_to(table[t], (ids.shape[0], 5)), {"step": cache["step"] + 1}

  return logits_fn


def test_beam_early_stopping_stops_at_k_finished():
  # tokens: 2 = EOS, 3 = a, 4 = b. Beam 2, lp(L) = L (power, alpha 1).
  # step 0: EOS .5, a .4, b .1 -> "EOS" finishes (score log .5 = -0.693); a, b stay alive.
  # step 1: a .5, EOS .45   -> "a EOS" finishes (log .18 / 2 = -0.857): 2 finished.
  # step 2: EOS .99         -> "a a EOS" would score log(.4 * .5 * .99) / 3 = -0.540, the best.
  fn = step_table_fn([{2: .5, 3: .4, 4: .1}, {3: .5, 2: .45, 4: .05}, {2: .99, 3: .005, 4: .005}])
  cache = {"step": jnp.array(0)}
  ids, scores = beam_search(fn, cache, 1, 2, 5, alpha=1.0, length_penalty="power",
                            early_stopping=True)
  np.testing.assert_array_equal(ids[0, 0], [2, 0, 0, 0, 0])
  np.testing.assert_allclose(scores[0], [math.log(.5), math.log(.4 * .45) / 2], rtol=1e-4)
  ids, scores = beam_search(fn, cache, 1, 2, 5, alpha=1.0, length_penalty="power")
  np.testing.assert_array_equal(ids[0, 0], [3, 3, 2, 0, 0])
  np.testing.assert_allclose(scores[0, 0], math.log(.4 * .5 * .99) / 3, rtol=1e-4)


def _stream_dtypes(cfg, params, batch):
  """The dtypes of every LayerNorm's input (the residual stream x + Sublayer(x)) and of every
  sublayer's output, captured in one forward pass."""
  from txf.nn.layers import FeedForward, LayerNorm
  seen = {"norm_in": set(), "ffn_out": set()}

  def spy(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, LayerNorm) and context.method_name == "__call__":
      seen["norm_in"].add(str(args[0].dtype))
    if isinstance(context.module, FeedForward) and context.method_name == "__call__":
      seen["ffn_out"].add(str(out.dtype))
    return out

  import flax.linen as nn
  model = build_model(cfg, deterministic=True)
  with nn.intercept_methods(spy):
    logits = model.apply({"params": params}, batch["inputs"], batch["targets"])
  return seen, logits


@pytest.mark.parametrize("residual, stream", [
    pytest.param("float32", "float32", marks=pytest.mark.slow),  # 8 s of compiles; the other stays quick
    ("compute", "bfloat16")])
def test_residual_stream_dtype_under_bf16_compute(residual, stream):
  kw = dict(vocab_size=40, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
            num_decoder_layers=1, max_len=16, vocab_multiple=1)
  batch = {"inputs": jnp.asarray(RNG.integers(3, 40, (2, 6)), jnp.int32),
           "targets": jnp.asarray(RNG.integers(3, 40, (2, 5)), jnp.int32)}
  f32 = TransformerConfig(dtype="float32", **kw)
  params = init_params(f32, jax.random.key(0), batch)
  seen, logits = _stream_dtypes(TransformerConfig(dtype="bfloat16", residual_dtype=residual, **kw),
                                params, batch)
  assert seen == {"norm_in": {stream}, "ffn_out": {"bfloat16"}}   # sublayers compute in bf16
  _, want = _stream_dtypes(f32, params, batch)
  assert logits.dtype == jnp.float32
  err = float(jnp.abs(logits - want).max() / jnp.abs(want).max())
  assert err < 0.05, err   # bf16 rounding of the same model


def test_rms_norm_replaces_every_layer_norm_of_the_model():
  """model.norm=rms_norm: every Add & Norm (and the final norms) holds one gamma and computes
  gamma * v / sqrt(mean(v^2) + eps), checked in numpy float64 on each norm's captured input."""
  import flax.linen as fnn
  from txf.nn import LayerNorm
  cfg = TransformerConfig(family="encoder_decoder", vocab_size=20, d_model=16, num_heads=2, d_ff=32,
                          num_encoder_layers=1, num_decoder_layers=1, max_len=12, norm="rms_norm")
  rng = np.random.default_rng(0)
  batch = {"inputs": jnp.asarray(rng.integers(3, 20, (2, 7)), jnp.int32),
           "targets": jnp.asarray(rng.integers(3, 20, (2, 5)), jnp.int32)}
  params = init_params(cfg, jax.random.key(0), batch)
  seen = []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, LayerNorm) and context.method_name == "__call__":
      assert set(context.module.variables["params"]) == {"scale"}   # gamma only, no beta
      seen.append((args[0], out, context.module.variables["params"]["scale"]))
    return out

  with fnn.intercept_methods(record):
    build_model(cfg, deterministic=True).apply({"params": params}, **batch)
  assert len(seen) >= 5   # encoder: 2 sublayers; decoder: 3 sublayers
  for x, out, g in seen:
    x, g = np.asarray(x, np.float64), np.asarray(g, np.float64)
    want = g * x / np.sqrt((x ** 2).mean(-1, keepdims=True) + cfg.layer_norm_eps)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


# -- positions inside self-attention (model.positional = rope | alibi | relative) ----------------

PACKED = {  # two rows: row 0 packs two examples per side, row 1 one example then padding
    "inputs": np.array([[4, 5, 6, 7, 8, 9, 5], [6, 4, 9, 5, 7, 0, 0]], np.int32),
    "inputs_segmentation": np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0]], np.int32),
    "inputs_position": np.array([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 0, 0]], np.int32),
    "targets": np.array([[7, 8, 5, 9, 6, 4], [9, 7, 8, 6, 0, 0]], np.int32),
    "targets_segmentation": np.array([[1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 0, 0]], np.int32),
    "targets_position": np.array([[0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 0, 0]], np.int32)}


def _self_attention_weights(cfg, params, batch):
  """{module path: (kind, input x [B, L, d], attention weights [B, h, L, L])} of every
  self-attention of one forward pass (the weights the module sows)."""
  import flax.linen as fnn
  from txf.nn import MultiHeadAttention
  inputs = {}

  def record(next_fun, args, kwargs, context):
    module = context.module
    if (isinstance(module, MultiHeadAttention) and context.method_name == "__call__"
        and module.kind != "cross"):
      inputs[module.path] = (module.kind, np.asarray(args[0], np.float64))
    return next_fun(*args, **kwargs)

  with fnn.intercept_methods(record):
    _, state = build_model(cfg, deterministic=True).apply({"params": params}, **batch,
                                                          mutable=["intermediates"])
  out = {}
  for path, (kind, x) in inputs.items():
    node = state["intermediates"]
    for name in path:
      node = node[name]
    out[path] = (kind, x, np.asarray(node["attention_weights"][0], np.float64))
  return out


@pytest.mark.parametrize("positional", ["rope", "alibi", "relative"])
def test_positions_inside_attention_give_numpy_weights_on_packed_rows(positional):
  """Every self-attention's weights equal softmax(q'k'^T / sqrt(d_k) + B + M) in numpy float64,
  with q', k' RoPE's rotations and B ALiBi's / T5's bias at the packed rows' own positions
  (restarting at 0 in each example): the encoder's bidirectional, the decoder's causal. (All three
  depend on p_j - p_i only, which packing keeps within an example: shifted positions give the
  same scores.)"""
  from tests.test_positions import bucket_np, rope_np
  cfg = small_config(d_model=16, num_heads=4, positional=positional, relative_buckets=8,
                     relative_max_distance=16)
  batch = {k: jnp.asarray(v) for k, v in PACKED.items()}
  params = init_params(cfg, jax.random.key(4), batch)
  seen = _self_attention_weights(cfg, params, batch)
  assert sorted(kind for kind, _, _ in seen.values()) == ["causal", "self"]
  slopes = 2.0 ** (-8.0 * np.arange(1, 5) / 4)
  for path, (kind, x, weights) in seen.items():
    p = params
    for name in path:
      p = p[name]
    side = "inputs" if kind == "self" else "targets"
    seg, pos = PACKED[f"{side}_segmentation"], PACKED[f"{side}_position"]
    for b in range(2):
      q = np.einsum("ld,dhk->hlk", x[b], np.asarray(p["query"], np.float64))
      k = np.einsum("ld,dhk->hlk", x[b], np.asarray(p["key"], np.float64))
      if positional == "rope":
        q, k = rope_np(q, pos[b]), rope_np(k, pos[b])
      rel = pos[b][None, :] - pos[b][:, None]  # [i, j] = p_j - p_i
      if positional == "alibi":
        bias = -slopes[:, None, None] * np.abs(rel)[None]
      elif positional == "relative":
        table = np.asarray(p["relative_bias"], np.float64)
        bias = np.stack([[table[bucket_np(int(r), kind == "self", 8, 16)] for r in row]
                         for row in rel]).transpose(2, 0, 1)
      else:
        bias = 0.0
      mask = (seg[b][:, None] == seg[b][None, :]) & (seg[b][:, None] != 0)
      if kind == "causal":
        mask &= np.tri(len(pos[b]), dtype=bool)
      s = np.where(mask, q @ k.transpose(0, 2, 1) / 2.0 + bias, -np.inf)  # sqrt(d_k) = 2
      rows = mask.any(-1)
      w = np.exp(s[:, rows] - s[:, rows].max(-1, keepdims=True))
      np.testing.assert_allclose(weights[b][:, rows], w / w.sum(-1, keepdims=True), atol=1e-5,
                                 err_msg=f"{path} row {b}")


@pytest.mark.parametrize("positional", ["rope", "alibi", "relative"])
def test_positions_inside_attention_packed_rows_equal_separate_rows(positional):
  """decoder_lm: a row packing two examples (positions restarting at 0) gives each example the
  logits it gets alone; encoder_classifier: a padded row gives the class logits of the unpadded."""
  cfg = small_config(family="decoder_lm", num_heads=4, positional=positional,
                     relative_buckets=8, relative_max_distance=16)
  a, b = [5, 7, 9], [8, 4, 6, 10]
  packed = {"targets": jnp.asarray([a + b]),
            "targets_segmentation": jnp.asarray([[1] * 3 + [2] * 4]),
            "targets_position": jnp.asarray([[0, 1, 2, 0, 1, 2, 3]])}
  params = init_params(cfg, jax.random.key(5), packed)
  model = build_model(cfg, deterministic=True)
  together = model.apply({"params": params}, **packed)[0]
  alone = model.apply({"params": params}, jnp.asarray([a + [0] * 4, b + [0] * 3]))
  np.testing.assert_allclose(together[:3], alone[0, :3], atol=1e-5)
  np.testing.assert_allclose(together[3:], alone[1, :4], atol=1e-5)
  cls = small_config(family="encoder_classifier", num_heads=4, positional=positional,
                     relative_buckets=8, relative_max_distance=16)
  inputs = jnp.asarray([[5, 7, 9, 4, 0, 0]])
  params = init_params(cls, jax.random.key(6), {"inputs": inputs})
  model = build_model(cls, deterministic=True)
  np.testing.assert_allclose(model.apply({"params": params}, inputs),
                             model.apply({"params": params}, inputs[:, :4]), atol=1e-5)


def test_positions_inside_attention_under_bf16_compute():
  """model.dtype=bfloat16 (CPU: the bf16 restatement, the bias added to its float32 logits) stays
  within bf16 rounding of the float32 model, for each encoding inside attention."""
  rng = np.random.default_rng(8)
  batch = {"inputs": jnp.asarray(rng.integers(3, 11, (2, 6)), jnp.int32),
           "targets": jnp.asarray(rng.integers(3, 11, (2, 5)), jnp.int32)}
  for positional in ("rope", "alibi", "relative"):
    cfg = small_config(d_model=16, num_heads=4, positional=positional, dtype="float32")
    params = init_params(cfg, jax.random.key(9), batch)
    want = build_model(cfg, deterministic=True).apply({"params": params}, **batch)
    bf = TransformerConfig(**{**cfg.__dict__, "dtype": "bfloat16"})
    got = build_model(bf, deterministic=True).apply({"params": params}, **batch)
    err = float(jnp.abs(got - want).max() / jnp.abs(want).max())
    assert 0 < err < 0.05, (positional, err)


def test_only_relative_adds_parameters_one_table_per_self_attention():
  """rope and alibi add no parameters (the tree of positional=none); relative adds exactly a
  [relative_buckets, h] table to each self-attention (encoder and decoder), none to cross."""
  def leaves(**kw):
    cfg = small_config(num_encoder_layers=2, num_decoder_layers=3, **kw)
    shapes = jax.eval_shape(lambda r: init_params(cfg, r, BATCH), jax.random.key(0))
    return {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_flatten_with_path(shapes)[0]}
  none = leaves(positional="none")
  assert leaves(positional="rope") == none and leaves(positional="alibi") == none
  relative = leaves(positional="relative", relative_buckets=12)
  extra = {k: v for k, v in relative.items() if k not in none}
  assert {k: v for k, v in relative.items() if k in none} == none
  want = {f"['{stack}']['layer_{i}']['self_attention']['relative_bias']": (12, 2)
          for stack, n in (("encoder", 2), ("decoder", 3)) for i in range(n)}
  assert extra == want
