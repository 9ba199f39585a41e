"""The KV cache of the real models: cached decoding equals full recomputation.

References are the teacher-forced forward pass (all positions at once) and the uncached callback
txf.decode.adapter.make_uncached_logits_fn, which recomputes the whole prefix at every step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import kernels
from txf.decode import beam_rows, beam_search, expand_to_beams, gather_rows, greedy_decode, sample
from txf.decode.adapter import (OUTPUT_KERNEL, cast_for_decoding, expand_cache, init_cache,
                                init_uncached_cache, make_logits_fn, make_uncached_logits_fn,
                                prepare_for_decoding, reorder_cache)
from txf.models import build_model, init_params
from txf.nn import TransformerConfig, kv_cache

BOS, EOS = 1, 2
VOCAB = 13


def small_config(family, layers=1, **overrides):
  """A tiny model (XLA compile time dominates these tests: one layer unless the test needs two)."""
  fields = dict(family=family, vocab_size=VOCAB, d_model=16, num_heads=2, d_ff=32,
                num_encoder_layers=layers, num_decoder_layers=layers, max_len=16)
  return TransformerConfig(**{**fields, **overrides})


def setup_model(cfg, seed=0):
  """Random parameters N(0, 0.3^2) (LayerNorm scales 1 + N(0, 0.1^2)) in the model's tree.

  Only the shapes come from init_params (jax.eval_shape, nothing compiled): compiling the real
  initialisers (threefry) costs more CPU than every decode in this file.
  """
  example = {"targets": jnp.ones((1, 4), jnp.int32)}
  if cfg.family == "encoder_decoder":
    example["inputs"] = jnp.ones((1, 4), jnp.int32)
  shapes = jax.eval_shape(lambda rng: init_params(cfg, rng, example), jax.random.key(0))
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    noise = rng.normal(0, 0.3, leaf.shape)
    if jax.tree_util.keystr(path).endswith("['scale']"):
      noise = 1 + noise / 3
    return jnp.asarray(noise, jnp.float32)
  return jax.tree_util.tree_map_with_path(fill, shapes)


LENGTHS = [3, 5, 3]  # rows 0 and 2 padded (decoded alone they share one compiled shape)


def sources():
  """int [3, 5]: real lengths LENGTHS, PAD (0) after."""
  rng = np.random.default_rng(1)
  src = rng.integers(3, VOCAB, (3, max(LENGTHS))).astype(np.int32)
  for row, length in enumerate(LENGTHS):
    src[row, length:] = 0
  return jnp.asarray(src)


# two layers where a per-layer cache mix-up could hide; one elsewhere
VARIANTS = [("encoder_decoder", dict(layers=2)),
            ("encoder_decoder", dict(positional="learned", pre_ln=True, tie_output=False)),
            ("decoder_lm", {}),
            ("decoder_lm", dict(positional="learned", pre_ln=True, layers=2, norm="rms_norm")),
            # the FFN and block variants (cached logits only): a gated FFN without biases, the
            # parallel block (pre-LN; post-LN with cross-attention first in the decoder layers)
            ("decoder_lm", dict(activation="swiglu", ffn_match_params=True, use_bias=False)),
            ("decoder_lm", dict(parallel_block=True, pre_ln=True, layers=2)),
            ("encoder_decoder", dict(parallel_block=True, activation="swiglu", use_bias=False)),
            # grouped-query (h_kv = 2 of 4 heads) and multi-query (h_kv = 1) attention, QK-norm
            ("encoder_decoder", dict(num_heads=4, num_kv_heads=2, qk_norm="layer_norm")),
            ("encoder_decoder", dict(num_heads=4, num_kv_heads=1)),
            ("decoder_lm", dict(num_heads=4, num_kv_heads=1, qk_norm="rms_norm")),
            ("decoder_lm", dict(num_heads=4, num_kv_heads=2, pre_ln=True)),
            # positions inside self-attention; 8 relative buckets so that short decodes reach the
            # logarithmic ones, 4 heads so that ALiBi's steepest slope is 1/4
            ("encoder_decoder", dict(positional="rope", layers=2)),
            ("encoder_decoder", dict(positional="alibi", num_heads=4, pre_ln=True)),
            ("encoder_decoder", dict(positional="relative", relative_buckets=8,
                                     relative_max_distance=16)),
            ("decoder_lm", dict(positional="rope")),
            ("decoder_lm", dict(positional="alibi", num_heads=4, layers=2)),
            ("decoder_lm", dict(positional="relative", relative_buckets=8, relative_max_distance=16,
                                layers=2)),
            # a score bias with grouped-query heads: folded per head group like the mask
            ("encoder_decoder", dict(positional="alibi", num_heads=4, num_kv_heads=2)),
            ("decoder_lm", dict(positional="relative", num_heads=4, num_kv_heads=1,
                                relative_buckets=8, relative_max_distance=16)),
            # T5's layout: one relative table per stack, unscaled attention, heads of d_k = 8 wider
            # than d_model / h (3 heads: inner width 24 != 16), pre-LN RMSNorm without biases,
            # the tied head's logits scale; with a gated tanh-GELU FFN (T5 v1.1) in the LM
            ("encoder_decoder", dict(positional="relative", relative_shared=True, relative_buckets=8,
                                     relative_max_distance=16, attention="dot_product",
                                     num_heads=3, head_dim=8, pre_ln=True, norm="rms_norm",
                                     use_bias=False, logits_scale=0.25, layers=2)),
            ("decoder_lm", dict(positional="relative", relative_shared=True, relative_buckets=8,
                                relative_max_distance=16, attention="dot_product", num_heads=3,
                                head_dim=8, pre_ln=True, norm="rms_norm", use_bias=False,
                                activation="geglu_tanh", layers=2))]


# The paper's model and its first variants in the quick tier; the ablation bench's variants (FFN,
# heads, positions) in the end-to-end tier (`pytest -m slow`), each compiling a model of its own.
QUICK = 4
CASES = VARIANTS[:QUICK] + [pytest.param(*v, marks=pytest.mark.slow) for v in VARIANTS[QUICK:]]
BEAM_CASES = (VARIANTS[:2] + VARIANTS[3:4]
              + [pytest.param(*v, marks=pytest.mark.slow) for v in VARIANTS[7:8] + VARIANTS[9:10] + VARIANTS[11:]])


def jit_cache(cfg, params, batch, max_len, inputs=None):
  """init_cache under jit (eager Flax is slow op by op)."""
  return jax.jit(lambda src: init_cache(cfg, params, batch, max_len, src))(inputs)


@pytest.mark.parametrize("family,overrides", CASES)
def test_cached_logits_equal_full_forward_at_every_position(family, overrides):
  cfg = small_config(family, **overrides)
  params = setup_model(cfg)
  targets = jnp.asarray(np.random.default_rng(2).integers(3, VOCAB, (3, 6)), jnp.int32)
  model = build_model(cfg, deterministic=True)
  inputs = sources() if family == "encoder_decoder" else None
  fed = jnp.concatenate([jnp.full((3, 1), BOS, jnp.int32), targets[:, :-1]], axis=1)

  @jax.jit
  def run(src, tgt):
    # teacher-forced logits [B, T, V] over [BOS, y_1 .. y_{T-1}], all positions in one pass
    full = model.apply({"params": params}, *([tgt] if src is None else [src, tgt]))
    step = make_logits_fn(cfg, params)
    one_position = lambda cache, ids: step(ids[:, None], cache)[::-1]  # (cache, logits [B, V])
    _, cached = jax.lax.scan(one_position, init_cache(cfg, params, 3, 6, src), fed.T)
    cached = [cached.transpose(1, 0, 2)]  # [B, T, V]
    if family == "decoder_lm":  # a prefill of 4 positions in one call, then single steps
      logits, cache = step(fed[:, :4], init_cache(cfg, params, 3, 6))
      _, rest = jax.lax.scan(one_position, cache, fed[:, 4:].T)
      cached += [logits[:, None], rest.transpose(1, 0, 2)]
    return full, jnp.concatenate(cached, axis=1)

  full, cached = run(inputs, targets)
  np.testing.assert_allclose(cached[:, :6], full, atol=1e-5, rtol=1e-5)
  if family == "decoder_lm":
    np.testing.assert_allclose(cached[:, 6:], full[:, 3:], atol=1e-5, rtol=1e-5)


def uncached_greedy(cfg, params, batch, max_len, inputs=None):
  """Step-by-step greedy, each step a full forward over the whole prefix: [B, max_len], PAD after EOS.

  The loop is unrolled under one jit (the prefix grows: every step has its own shape); each step
  feeds the whole prefix to the uncached callback with a fresh state."""
  fn = make_uncached_logits_fn(cfg, params)

  @jax.jit
  def run():
    prefix = jnp.full((batch, 1), BOS, jnp.int32)
    done = jnp.zeros(batch, bool)
    for _ in range(max_len):
      logits, _ = fn(prefix, init_uncached_cache(cfg, params, batch, max_len + 1, inputs))
      token = jnp.where(done, 0, jnp.argmax(logits, -1)).astype(jnp.int32)
      done |= token == EOS
      prefix = jnp.concatenate([prefix, token[:, None]], axis=1)
    return prefix[:, 1:]
  return run()


def varied(ids):
  """Guard against a trivial model: the decoded rows are not all one repeated token."""
  return len(np.unique(np.asarray(ids))) >= 2


MAX_LEN, BEAM = 6, 2


@pytest.fixture(scope="module")
def translation():
  """One encoder-decoder, its jit'd cached decoder and its outputs on the padded batch, shared by
  the tests below (each compile of a model decode costs seconds of CPU)."""
  cfg = small_config("encoder_decoder", tie_output=False)
  params = setup_model(cfg, seed=6)
  fn = make_logits_fn(cfg, params)

  @jax.jit
  def decode(src):
    """src [N, S] -> (greedy [N, MAX_LEN], beam ids [N, BEAM, MAX_LEN], beam scores [N, BEAM])."""
    batch = src.shape[0]
    cache = init_cache(cfg, params, batch, MAX_LEN, src)  # a pytree: both decoders start from it
    greedy = greedy_decode(fn, cache, batch, MAX_LEN)
    ids, scores = beam_search(fn, cache, batch, BEAM, MAX_LEN, expand_cache=expand_cache,
                              reorder_cache=reorder_cache)
    return greedy, ids, scores

  outputs = decode(sources())
  assert len({tuple(np.asarray(g)) for g in outputs[0]}) >= 2  # the rows really differ
  return dict(cfg=cfg, params=params, decode=decode, outputs=outputs)


def test_cached_greedy_equals_uncached_greedy_translation(translation):
  # greedy is prefix-consistent: its first 4 tokens are those of a 4-step greedy loop
  cfg, params = translation["cfg"], translation["params"]
  expected = uncached_greedy(cfg, params, 3, 4, sources())
  assert varied(expected)
  np.testing.assert_array_equal(translation["outputs"][0][:, :4], expected)


def test_cached_greedy_equals_uncached_greedy_lm():
  cfg = small_config("decoder_lm", tie_output=False, positional="learned")
  params = setup_model(cfg, seed=3)
  got = jax.jit(lambda c: greedy_decode(make_logits_fn(cfg, params), c, 3, 4))(
      jit_cache(cfg, params, 3, 4))
  expected = uncached_greedy(cfg, params, 3, 4)
  assert varied(expected)
  np.testing.assert_array_equal(got, expected)


def test_lm_sampling_at_temperature_zero_continues_prompt_greedily():
  # greedy continuation <=> every generated token is the argmax of the full (uncached, teacher-
  # forced) forward over [BOS, prompt, generated] at the position before it
  cfg = small_config("decoder_lm", tie_output=False)
  params = setup_model(cfg, seed=8)
  prompt = jnp.asarray([[5, 6, 7], [8, 8, 9]], jnp.int32)
  got = jax.jit(lambda c: sample(make_logits_fn(cfg, params), c, prompt, jax.random.key(0), 5,
                                 temperature=0.0, eos_id=-1))(jit_cache(cfg, params, 2, 3 + 5))
  assert varied(got)
  model = build_model(cfg, deterministic=True)
  full = jax.jit(lambda t: model.apply({"params": params}, t))(jnp.concatenate([prompt, got], 1))
  np.testing.assert_array_equal(np.argmax(full[:, 3:], -1), got)


def test_cached_beam_equals_recomputing_beam(translation):
  # the uncached callback, every cache leaf reordered (the default), against the KV cache in the
  # beam layout (expand_cache: per-source entries at one row per source, self-attention buffers
  # never reordered, only their slot tables): ids and scores must agree
  cfg, params = translation["cfg"], translation["params"]
  recompute = jax.jit(lambda src: beam_search(
      make_uncached_logits_fn(cfg, params), init_uncached_cache(cfg, params, 3, MAX_LEN, src),
      3, BEAM, MAX_LEN))(sources())
  _, ids, scores = translation["outputs"]
  assert varied(ids)
  np.testing.assert_array_equal(ids, recompute[0])
  np.testing.assert_allclose(scores, recompute[1], atol=1e-5)


def test_padded_batch_decodes_each_row_as_if_alone(translation):
  greedy, ids, scores = translation["outputs"]
  inputs = sources()
  for row in (0, 2):  # the padded rows, each decoded alone from its real tokens only
    alone = translation["decode"](inputs[row:row + 1, :LENGTHS[row]])
    np.testing.assert_array_equal(greedy[row], alone[0][0])
    np.testing.assert_array_equal(ids[row], alone[1][0])
    np.testing.assert_allclose(scores[row], alone[2][0], atol=1e-5)


def test_reorder_cache_skips_only_per_source_entries():
  # txf's cache reorder equals the generic gather of every per-row leaf on the real cache: the
  # entries it skips (cross-attention K/V and mask) are equal for every beam of a source
  cfg = small_config("encoder_decoder", layers=2)
  params = setup_model(cfg, seed=4)
  cache = expand_to_beams(jit_cache(cfg, params, 3, MAX_LEN, sources()), BEAM, 3)
  cache = jax.tree_util.tree_map(  # make the self-attention buffers differ between rows
      lambda x: x + jnp.arange(x.shape[0]).reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)
      if x.ndim == 4 and x.shape[2] == MAX_LEN else x, cache)
  rows = beam_rows(jnp.array([[1, 1], [1, 0], [0, 0]]), BEAM)
  np.testing.assert_array_equal(rows, [1, 1, 3, 2, 4, 4])
  fast, generic = reorder_cache(cache, rows), gather_rows(cache, rows)
  paths = jax.tree_util.tree_flatten_with_path(cache)[0]
  skipped = [jax.tree_util.keystr(p) for p, _ in paths if "cross_" in jax.tree_util.keystr(p)]
  assert len(skipped) == 2 * 3  # two decoder layers x (cross_key, cross_value, cross_valid)
  for (path, before), a, b in zip(paths, jax.tree_util.tree_leaves(fast),
                                  jax.tree_util.tree_leaves(generic)):
    np.testing.assert_array_equal(a, b)
    if "cached_key" in jax.tree_util.keystr(path):
      np.testing.assert_array_equal(a, np.asarray(before)[np.asarray(rows)])
      assert not np.array_equal(a, before)


def test_bfloat16_decode_weights_give_the_float32_logits_to_bf16_rounding():
  # cast_for_decoding rounds the weights (and activations) to bfloat16 once; the cached step's
  # logits stay within bf16 rounding of the float32 model's, and the cache buffers follow the dtype
  cfg = small_config("encoder_decoder", tie_output=True)
  params = setup_model(cfg, seed=5)
  cfg16, params16 = cast_for_decoding(cfg, params)
  assert cfg16.dtype == "bfloat16"
  assert {x.dtype for x in jax.tree_util.tree_leaves(params16)} == {jnp.dtype(jnp.bfloat16)}
  ids = jnp.asarray([[BOS], [4], [7]], jnp.int32)

  @jax.jit
  def step(src):
    out = []
    for c, p in ((cfg, params), (cfg16, params16)):
      cache = init_cache(c, p, 3, MAX_LEN, src)
      logits, cache = make_logits_fn(c, p)(ids, cache)
      out += [logits.astype(jnp.float32), cache["decoder"]["layer_0"]["self_attention"]["cached_key"]]
    return out

  l32, k32, l16, k16 = step(sources())
  assert k32.dtype == jnp.float32 and k16.dtype == jnp.bfloat16
  scale = float(jnp.abs(l32).max())
  np.testing.assert_allclose(l16, l32, atol=0.05 * scale)
  assert not np.array_equal(l16, l32)  # the rounding is real


@pytest.mark.parametrize("family,overrides", BEAM_CASES)
def test_beam_layout_cache_equals_gathered_cache(family, overrides):
  # expand_cache's layout (slots per beam + reordered slot tables, per-source memory) against the
  # generic cache (every per-row leaf repeated, then gathered per step): same ids, same scores;
  # beam 1 of the beam layout is greedy
  cfg = small_config(family, **overrides)
  params = setup_model(cfg, seed=12)
  inputs = sources() if family == "encoder_decoder" else None

  @jax.jit
  def run(src):
    cache, fn = init_cache(cfg, params, 3, MAX_LEN, src), make_logits_fn(cfg, params)
    generic = beam_search(fn, cache, 3, 3, MAX_LEN, reorder_cache=gather_rows)
    layout = beam_search(fn, cache, 3, 3, MAX_LEN, expand_cache=expand_cache,
                         reorder_cache=reorder_cache)
    one = beam_search(fn, cache, 3, 1, MAX_LEN, length_penalty="none", expand_cache=expand_cache,
                      reorder_cache=reorder_cache)[0][:, 0]
    return generic, layout, one, greedy_decode(fn, cache, 3, MAX_LEN)

  generic, layout, one, greedy = run(inputs)
  assert varied(generic[0]) and len({tuple(r) for r in np.asarray(generic[0]).reshape(9, -1)}) >= 3
  np.testing.assert_array_equal(layout[0], generic[0])
  np.testing.assert_allclose(layout[1], generic[1], atol=1e-5)
  np.testing.assert_array_equal(one, greedy)


def test_expand_cache_layout_and_reorder():
  # the self-attention buffers get one slot of T positions per beam (copies of the source's),
  # the per-source entries keep one row per source, and reorder_cache moves only the slot tables
  cfg = small_config("encoder_decoder", layers=2)
  params = setup_model(cfg, seed=4)
  cache = jit_cache(cfg, params, 3, MAX_LEN, sources())
  cache = jax.tree_util.tree_map(  # make the self-attention buffers differ between rows
      lambda x: x + jnp.arange(x.shape[0]).reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)
      if x.ndim == 4 and x.shape[2] == MAX_LEN else x, cache)
  beams = expand_cache(cache, BEAM)
  for layer in ("layer_0", "layer_1"):
    before, after = cache["decoder"][layer], beams["decoder"][layer]
    for name in ("cached_key", "cached_value"):
      plain = np.asarray(before["self_attention"][name])  # [3, h, T, d]
      got = np.asarray(after["self_attention"][name])  # values [3, h, 2T, d], keys [3, h, d, 2T]
      if name == "cached_key" and kv_cache.keys_transposed(got.dtype):  # float32 on CPU
        assert got.shape == (3, plain.shape[1], plain.shape[3], BEAM * MAX_LEN)
        got = got.transpose(0, 1, 3, 2)
      assert got.shape == (3, plain.shape[1], BEAM * MAX_LEN, plain.shape[3])
      for slot in range(BEAM):
        np.testing.assert_array_equal(got[:, :, slot * MAX_LEN:(slot + 1) * MAX_LEN], plain)
    np.testing.assert_array_equal(after["self_attention"]["beam_slots"],
                                  np.tile(np.arange(BEAM), 3)[:, None].repeat(MAX_LEN, 1))
    for name in ("cross_key", "cross_value", "cross_valid"):
      np.testing.assert_array_equal(after["cross_attention"][name],
                                    before["cross_attention"][name])
  rows = beam_rows(jnp.array([[1, 1], [1, 0], [0, 0]]), BEAM)
  slots = beams["decoder"]["layer_0"]["self_attention"]["beam_slots"].at[:, 0].set(jnp.arange(6))
  beams["decoder"]["layer_0"]["self_attention"]["beam_slots"] = slots
  moved = reorder_cache(beams, rows)
  np.testing.assert_array_equal(moved["decoder"]["layer_0"]["self_attention"]["beam_slots"][:, 0],
                                [1, 1, 3, 2, 4, 4])
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(beams)[0],
                          jax.tree_util.tree_leaves(moved)):
    if "beam_slots" not in jax.tree_util.keystr(path):
      assert a is b  # nothing else is copied


def test_the_models_cache_holds_only_the_declared_layout():
  # every entry a decoding model creates is one that txf.nn.kv_cache declares (the layout is
  # defined there once); the beam layout adds the slot tables and keeps the per-source entries
  # at one row per source
  cfg = small_config("encoder_decoder")
  cache = jit_cache(cfg, setup_model(cfg), 3, MAX_LEN, sources())
  entries = lambda tree: {str(path[-1].key): leaf
                          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  declared = {kv_cache.CACHED_KEY, kv_cache.CACHED_VALUE, kv_cache.CACHE_INDEX, kv_cache.POSITION,
              *kv_cache.PER_SOURCE}
  assert set(entries(cache)) == declared == {"cached_key", "cached_value", "cache_index", "position",
                                             "cross_key", "cross_value", "cross_valid"}
  beams = expand_cache(cache, BEAM)
  assert set(entries(beams)) == declared | {kv_cache.BEAM_SLOTS}
  for name in kv_cache.PER_SOURCE:
    assert entries(beams)[name].shape[0] == 3
  assert entries(beams)[kv_cache.BEAM_SLOTS].shape == (3 * BEAM, MAX_LEN)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_the_cache_holds_only_the_key_value_heads(kv_heads):
  # grouped-query attention: self- and cross-attention caches hold h_kv heads, not h, in the
  # plain layout and in beam search's [B, h_kv, G*T, d_k]; the keys stored are the QK-normed ones
  cfg = small_config("encoder_decoder", num_heads=4, num_kv_heads=kv_heads, qk_norm="rms_norm")
  params = setup_model(cfg)
  cache = jit_cache(cfg, params, 3, MAX_LEN, sources())
  layer = cache["decoder"]["layer_0"]
  dk = cfg.d_model // 4
  for name in ("cached_key", "cached_value"):
    assert layer["self_attention"][name].shape == (3, kv_heads, MAX_LEN, dk)
  for name in ("cross_key", "cross_value"):
    assert layer["cross_attention"][name].shape == (3, kv_heads, max(LENGTHS), dk)
  beams = expand_cache(cache, BEAM)["decoder"]["layer_0"]["self_attention"]
  assert kv_cache.keys_transposed(jnp.float32)  # float32 keys are stored transposed on CPU
  assert beams["cached_key"].shape == (3, kv_heads, dk, BEAM * MAX_LEN)
  assert beams["cached_value"].shape == (3, kv_heads, BEAM * MAX_LEN, dk)
  key = np.asarray(layer["cross_attention"]["cross_key"], np.float64)  # RMS-normed, gain g
  gain = np.asarray(params["decoder"]["layer_0"]["cross_attention"]["key_norm"]["scale"])
  np.testing.assert_allclose(np.sqrt(((key / gain) ** 2).mean(-1)), 1.0, rtol=1e-4)


@pytest.mark.parametrize("tie", [True, False])
def test_prepared_parameters_give_the_model_logits(tie):
  # prepare_for_decoding adds E^T [d, V] for a tied output layer (nothing otherwise); the first
  # cached step's logits with it equal those of the model's own parameters and those of the
  # teacher-forced forward pass at position 0 (fed BOS)
  cfg = small_config("encoder_decoder", tie_output=tie)
  params = setup_model(cfg, seed=7)
  cfg2, prepared = prepare_for_decoding(cfg, params)
  assert cfg2 == cfg
  if not tie:
    assert OUTPUT_KERNEL not in prepared
    return
  np.testing.assert_array_equal(prepared[OUTPUT_KERNEL], np.asarray(params["embed"]["embedding"]).T)
  model = build_model(cfg, deterministic=True)
  bos = jnp.full((3, 1), BOS, jnp.int32)

  @jax.jit
  def step(src):
    out = [model.apply({"params": params}, src, jnp.ones((3, 2), jnp.int32))[:, 0]]
    for p in (params, prepared):
      out.append(make_logits_fn(cfg, p)(bos, init_cache(cfg, p, 3, MAX_LEN, src))[0])
    return out

  full, plain, fast = step(sources())
  assert not np.allclose(full[0], full[1], atol=1e-3)  # the rows see different sources
  np.testing.assert_allclose(fast, full, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["transposed", "rows"])
def test_a_beam_step_writes_each_beams_keys_and_values_into_its_own_slot(layout):
  # write_beam_step against numpy: B=2 sources, G=3 beams, T=4 positions, 2 heads of d_k=5; the
  # keys land as rows [B, h, G*T, d_k] or transposed [B, h, d_k, G*T] (the kernel table's
  # beam_keys), the values as rows, each beam's at its slot g, position index
  b, g, t, h, d, index = 2, 3, 4, 2, 5, 2
  rs = np.random.RandomState(0)
  f32 = lambda *shape: rs.randn(*shape).astype(np.float32)
  keys, values, k, v = f32(b, h, g * t, d), f32(b, h, g * t, d), f32(b * g, h, 1, d), f32(b * g, h, 1, d)
  slots = np.tile(np.arange(g), b)[:, None].repeat(t, 1)
  slots[:, :index] = rs.randint(0, g, (b * g, index))  # reordered history
  stored = keys.transpose(0, 1, 3, 2).copy() if layout == "transposed" else keys
  with kernels.use(beam_keys=layout):
    got_k, got_v, got_slots, new_index, mask = kv_cache.write_beam_step(
        jnp.asarray(stored), jnp.asarray(values), jnp.asarray(slots), jnp.array(index),
        jnp.asarray(k), jnp.asarray(v))
    read_k = np.asarray(kv_cache.beam_keys(got_k))
  want_k, want_v, want_slots = keys.copy(), values.copy(), slots.copy()
  for row in range(b * g):
    source, beam = divmod(row, g)
    want_k[source, :, beam * t + index] = k[row, :, 0]
    want_v[source, :, beam * t + index] = v[row, :, 0]
    want_slots[row, index] = beam
  assert got_k.shape == stored.shape
  np.testing.assert_array_equal(read_k, want_k)
  np.testing.assert_array_equal(np.asarray(got_v), want_v)
  np.testing.assert_array_equal(np.asarray(got_slots), want_slots)
  assert int(new_index) == index + 1
  # beam q sees slot s at position u iff u <= index and its history is in slot s at u
  want_mask = np.zeros((b, 1, g, g * t), bool)
  for row in range(b * g):
    source, beam = divmod(row, g)
    for u in range(index + 1):
      want_mask[source, 0, beam, want_slots[row, u] * t + u] = True
  np.testing.assert_array_equal(np.asarray(mask), want_mask)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_beam_search_decodes_alike_with_keys_as_rows_or_transposed(dtype):
  # the two layouts of beam search's keys hold the same keys: the same ids and scores
  cfg = small_config("encoder_decoder", dtype=dtype)
  params = setup_model(cfg, seed=12)

  def run(layout):
    with kernels.use(beam_keys=layout):
      return jax.jit(lambda src: beam_search(
          make_logits_fn(cfg, params), init_cache(cfg, params, 3, MAX_LEN, src), 3, 3, MAX_LEN,
          expand_cache=expand_cache, reorder_cache=reorder_cache))(sources())

  (ids_t, scores_t), (ids_r, scores_r) = run("transposed"), run("rows")
  assert varied(ids_r)
  np.testing.assert_array_equal(ids_t, ids_r)
  np.testing.assert_allclose(scores_t, scores_r, atol=1e-5 if dtype == "float32" else 1e-2)
