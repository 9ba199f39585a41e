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


GELU_TANH = lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


@pytest.mark.parametrize("activation", ["relu", "gelu", "swish", "gelu_tanh"])
def test_feed_forward_activations(activation):
  x, w1, b1 = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 6)), RNG.normal(size=6)
  w2, b2 = RNG.normal(size=(6, 4)), RNG.normal(size=4)
  z = x @ w1 + b1
  f = {"relu": lambda v: np.maximum(v, 0),
       "gelu": lambda v: v * 0.5 * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
       "swish": lambda v: v / (1 + np.exp(-v)), "gelu_tanh": GELU_TANH}[activation]
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


# --- gated FFNs, model.use_bias, model.ffn_match_params, model.parallel_block -------------------

def _init(module, *args):
  """The module's parameters (plain arrays, the logical-axis boxes removed)."""
  import flax.linen as fnn
  return fnn.unbox(module.init(jax.random.key(0), *args)["params"])


NP_F = {"reglu": lambda v: np.maximum(v, 0),
        "geglu": lambda v: v * 0.5 * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
        "swiglu": lambda v: v / (1 + np.exp(-v)), "geglu_tanh": GELU_TANH}


@pytest.mark.parametrize("activation", ["reglu", "geglu", "swiglu", "geglu_tanh"])
@pytest.mark.parametrize("use_bias", [True, False])
def test_gated_feed_forward_against_numpy(activation, use_bias):
  # (f(x W1 + b1) * (x V + c)) W2 + b2 in float64; without biases (f(x W1) * x V) W2
  x, w1, v, w2 = (RNG.normal(size=s) for s in ((3, 4), (4, 6), (4, 6), (6, 4)))
  b1, c, b2 = (RNG.normal(size=n) if use_bias else np.zeros(n) for n in (6, 6, 4))
  expected = (NP_F[activation](x @ w1 + b1) * (x @ v + c)) @ w2 + b2
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  maybe = lambda a: f32(a) if use_bias else None
  got = ops.feed_forward(f32(x), f32(w1), maybe(b1), f32(w2), maybe(b2), activation=activation,
                         w_gate=f32(v), b_gate=maybe(c))
  np.testing.assert_allclose(got, expected, atol=1e-4)
  with pytest.raises(ValueError, match="needs w_gate"):
    ops.feed_forward(f32(x), f32(w1), None, f32(w2), None, activation=activation)


@pytest.mark.parametrize("activation, use_bias, names", [
    ("relu", False, {"wi", "wo"}),
    ("swiglu", True, {"wi", "bi", "wi_gate", "bi_gate", "wo", "bo"}),
    ("geglu", False, {"wi", "wi_gate", "wo"})])
def test_feed_forward_module_parameters_and_output(activation, use_bias, names):
  from txf.nn import FeedForward
  cfg = small_config(activation=activation, use_bias=use_bias)
  x = RNG.normal(size=(2, 3, 8))
  params = _init(FeedForward(cfg), jnp.asarray(x, jnp.float32))
  assert set(params) == names
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  p.update({k: 0.0 for k in ("bi", "bi_gate", "bo") if k not in p})
  if activation == "relu":
    hidden = np.maximum(x @ p["wi"] + p["bi"], 0)
  else:
    hidden = NP_F[activation](x @ p["wi"] + p["bi"]) * (x @ p["wi_gate"] + p["bi_gate"])
  got = FeedForward(cfg).apply({"params": params}, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(got, hidden @ p["wo"] + p["bo"], atol=1e-5)


@pytest.mark.parametrize("d_ff, hidden", [
    (2048, 1368),  # t = 4096/3 = 1365.33; nearest multiple of 8: 1368 (171*8), 2.67 off <= 13.65 (1%)
    (3072, 2048),  # t = 2048, a multiple of 8
    (400, 264),    # t = 266.67; 264 is 2.67 off = exactly 1% of t: kept (the bound is inclusive)
    (100, 67),     # t = 66.67; 64 is 2.67 off > 0.67 (1%): round(t) = 67
    (16, 11)])     # t = 10.67; 8 is 2.67 off > 0.11: round(t) = 11
def test_ffn_match_params_hidden_size_rule(d_ff, hidden):
  from txf.nn import FeedForward
  assert ops.matched_hidden_size(d_ff) == hidden
  gated = TransformerConfig(d_model=512, d_ff=d_ff, activation="swiglu", ffn_match_params=True)
  assert gated.ffn_hidden == hidden
  assert TransformerConfig(d_ff=d_ff, ffn_match_params=True).ffn_hidden == d_ff  # dense: no effect
  assert TransformerConfig(d_ff=d_ff, activation="swiglu").ffn_hidden == d_ff    # not asked
  count = lambda cfg: sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(jax.eval_shape(
      lambda: FeedForward(cfg).init(jax.random.key(0), jnp.zeros((1, 1, 512))))))
  assert count(gated) == 3 * 512 * hidden + 2 * hidden + 512        # W1, V, W2; b1, c, b2
  dense = 2 * 512 * d_ff + d_ff + 512
  assert count(TransformerConfig(d_model=512, d_ff=d_ff)) == dense
  if d_ff >= 400:  # the multiple-of-8 branch: weights within the rule's 1%
    assert abs(3 * hidden - 2 * d_ff) <= 0.01 * 2 * d_ff
    assert abs(count(gated) / dense - 1) < 0.011


def test_train_flops_count_three_ffn_matmuls_when_gated():
  from txf.models.flops import model_train_flops
  # decoder_lm, N_d = 2, d = 8, h = 11 (d_ff 16 matched), B = 3, T = 5: the gate V adds one
  # [d, h] matmul per token and layer, 2 d h FLOPs forward, x 3 for training
  kw = dict(family="decoder_lm", d_model=8, num_heads=2, num_decoder_layers=2, vocab_size=11)
  gated = TransformerConfig(d_ff=16, activation="swiglu", ffn_match_params=True, **kw)
  dense = TransformerConfig(d_ff=11, **kw)
  extra = 3 * 3 * 5 * 2 * (2 * 8 * 11)
  assert model_train_flops(gated, 3, 0, 5) - model_train_flops(dense, 3, 0, 5) == extra == 15840


def _np_norm(x, p, eps=1e-6):
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (np.asarray(p["scale"], np.float64) * (x - mu) / np.sqrt(var + eps)
          + np.asarray(p["bias"], np.float64))


@pytest.mark.parametrize("layer, pre_ln", [("encoder", False), ("encoder", True),
                                           ("decoder_cross", False), ("decoder_cross", True),
                                           ("decoder", True)])
def test_parallel_block_composes_its_own_sublayers(layer, pre_ln):
  """parallel_block: pre-LN x + Attn(N(x)) + FFN(N(x)), post-LN N(x + Attn(x) + FFN(x)) with one
  norm (norm_1); a decoder layer with cross-attention first adds it sequentially (its own norm_2).
  Reference: the layer's sublayer modules applied separately to its parameters, composed in numpy."""
  from txf.nn import DecoderLayer, EncoderLayer, FeedForward, MultiHeadAttention
  cfg = small_config(parallel_block=True, pre_ln=pre_ln, deterministic=True)
  x = RNG.normal(size=(2, 5, 8))
  memory = jnp.asarray(RNG.normal(size=(2, 4, 8)), jnp.float32)
  cross = layer == "decoder_cross"
  if layer == "encoder":
    valid = jnp.asarray([[True] * 3 + [False] * 2, [True] * 5])   # row 0: 2 padding positions
    module, kind, mask = EncoderLayer(cfg), "self", ops.padding_mask(valid, valid)
    args = (mask,)
  else:
    module, kind, mask = DecoderLayer(cfg, cross=cross), "causal", ops.causal_mask(5)
    args = (mask, memory) if cross else (mask,)
  params = _init(module, jnp.asarray(x, jnp.float32), *args)
  assert set(params) == {"self_attention", "ffn", "norm_1"} | (
      {"cross_attention", "norm_2"} if cross else set())
  got = module.apply({"params": params}, jnp.asarray(x, jnp.float32), *args)
  run = lambda m, name, h, **kw: np.asarray(m.apply({"params": params[name]}, jnp.asarray(h, jnp.float32),
                                                    **kw), np.float64)
  if cross:  # the sequential cross-attention sublayer, pre- or post-LN
    attend = lambda h: run(MultiHeadAttention(cfg, "cross"), "cross_attention", h, memory=memory)
    n2 = lambda v: _np_norm(v, params["norm_2"])
    x = x + attend(n2(x)) if pre_ln else n2(x + attend(x))
  attn = lambda h: run(MultiHeadAttention(cfg, kind), "self_attention", h, mask=mask)
  ffn = lambda h: run(FeedForward(cfg), "ffn", h)
  n1 = lambda v: _np_norm(v, params["norm_1"])
  want = x + attn(n1(x)) + ffn(n1(x)) if pre_ln else n1(x + attn(x) + ffn(x))
  np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("field, value, words", [
    ("activation", "swiglu", "model.activation='swiglu'"), ("use_bias", False, "model.use_bias=False"),
    ("parallel_block", True, "model.parallel_block=True")])
def test_marian_export_names_the_ffn_and_block_variants(field, value, words):
  from txf.core.config import base_config
  from txf.hf import marian
  config = base_config()
  assert not [p for p in marian.export_problems(config, None) if "model." in p and "FFN" in p]
  setattr(config.model, field, value)
  assert any(words in p for p in marian.export_problems(config, None))
