"""Vocabulary padding (``model.vocab_multiple``) and the mesh split checks.

A padded model (tables of ceil(V / m) * m rows) must be the unpadded model: its real rows copied
from an unpadded model and its padding rows random, the losses (reference and fused heads, label
smoothing with eps / (V - 1) over the real V), the gradients of the real rows, and greedy / beam
outputs equal the unpadded model's to float32 rounding, and a padding row made to win every argmax
is still never produced. Exports drop the padding (``unpad_vocab``). A mesh that splits a model
dimension unevenly is one ``txf: error:`` line before anything compiles.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.core.config import base_config, resolve_vocab_multiple
from txf import decode
from txf.decode.adapter import init_cache, make_logits_fn
from txf.decode.decoders import translate_ids
from txf.models import (cross_entropy_loss, build_model, forward, init_params, pad_vocab,
                        unpad_vocab)
from txf.nn import TransformerConfig

V = 13  # real vocabulary; padded to P = 20 rows by vocab_multiple=10
M, P = 10, 20
EPS = 0.1


def _cfg(family="encoder_decoder", **kw):
  base = dict(family=family, vocab_size=V, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
              num_decoder_layers=1, dropout_rate=0.0, max_len=16, vocab_multiple=1)
  base.update(kw)
  return TransformerConfig(**base)


def _batch(seed=0, rows=4, length=7):
  rs = np.random.RandomState(seed)
  x = rs.randint(3, V, size=(rows, length)).astype(np.int32)
  y = rs.randint(3, V, size=(rows, length)).astype(np.int32)
  x[:, -2:] = 0
  y[:, -3:] = 0
  y[np.arange(rows), length - 4] = 2  # EOS
  return {"inputs": x, "targets": y, "label": (np.arange(rows) % 2).astype(np.int32)}


def _padded_copy(cfg, params, multiple=M, seed=1):
  """(padded cfg, padded params): the real rows of every vocabulary table are ``params``'s, the
  padding rows random (those of a fresh init of the padded model)."""
  pcfg = dataclasses.replace(cfg, vocab_multiple=multiple)
  fresh = jax.device_get(init_params(pcfg, jax.random.key(seed), _batch()))

  def copy(path, p_new, p_old):
    p_new, p_old = np.array(p_new), np.asarray(p_old)
    if p_new.shape == p_old.shape:
      return p_old
    if p_new.shape[0] != p_old.shape[0]:
      p_new[:p_old.shape[0]] = p_old
    else:
      p_new[:, :p_old.shape[1]] = p_old
    return p_new

  return pcfg, jax.tree_util.tree_map_with_path(copy, fresh, params)


def _loss_and_grads(cfg, params, batch, fused):
  model = build_model(cfg, deterministic=True)
  loss = cross_entropy_loss(EPS, fused=fused)
  (value, terms), grads = jax.jit(jax.value_and_grad(lambda p: loss(model, p, batch, None),
                                                     has_aux=True))(params)
  return float(value), {k: float(v) for k, v in terms.items()}, grads


def _smoothed_ce_float64(logits, targets, weights, eps, vocab):
  """sum_t w_t [-(1 - eps) log p_y - eps / (vocab - 1) sum_{k != y} log p_k], numpy float64."""
  z = np.asarray(logits, np.float64)
  logp = z - z.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  lp_y = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  loss = -(1 - eps) * lp_y - eps / (vocab - 1) * (logp.sum(-1) - lp_y)
  return float((loss * weights).sum())


TABLES = {"tied": {}, "untied": {"share_embeddings": False, "tie_output": False}}


# the two translation cases in the end-to-end tier (their compiles cost the quick tier ~20 s);
# the language model's case keeps the property in the quick tier
@pytest.mark.parametrize("family,tables,fused", [
    pytest.param("encoder_decoder", "tied", False, marks=pytest.mark.slow),
    pytest.param("encoder_decoder", "untied", True, marks=pytest.mark.slow),
    ("decoder_lm", "tied", True)])
def test_padded_model_has_the_unpadded_losses_and_gradients(family, tables, fused):
  cfg = _cfg(family, **TABLES[tables])
  batch = _batch()
  params = jax.device_get(init_params(cfg, jax.random.key(0), batch))
  pcfg, pparams = _padded_copy(cfg, params)
  assert pcfg.padded_vocab_size == P and pcfg.vocab_size == V
  assert any(P in np.shape(x) for x in jax.tree_util.tree_leaves(pparams))  # really padded
  loss0, terms0, grads0 = _loss_and_grads(cfg, params, batch, fused)
  loss1, terms1, grads1 = _loss_and_grads(pcfg, pparams, batch, fused)
  # the unpadded model's own logits, smoothed over the real V in float64: an independent loss
  logits, targets, weights = forward(build_model(cfg, deterministic=True), params, batch)
  expected = _smoothed_ce_float64(logits, np.asarray(targets), np.asarray(weights), EPS, V)
  np.testing.assert_allclose(loss1, expected, rtol=2e-6)
  np.testing.assert_allclose(loss1, loss0, rtol=2e-6)
  for k in terms0:
    np.testing.assert_allclose(terms1[k], terms0[k], rtol=2e-6, atol=1e-6, err_msg=k)
  # gradients: real rows equal the unpadded model's, padding rows get none
  real = unpad_vocab(grads1, pcfg)
  for a, b in zip(jax.tree_util.tree_leaves(real), jax.tree_util.tree_leaves(grads0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  for path, g in jax.tree_util.tree_leaves_with_path(grads1):
    g = np.asarray(g)
    if P in g.shape:
      pad = g[V:] if g.shape[0] == P else g[:, V:]
      assert np.all(pad == 0), path


def test_label_smoothing_counts_the_real_vocabulary():
  """eps / (V - 1) with the real V: smoothing over the padded P would give another loss."""
  cfg = _cfg("decoder_lm")
  batch = _batch()
  params = jax.device_get(init_params(cfg, jax.random.key(0), batch))
  pcfg, pparams = _padded_copy(cfg, params)
  logits, targets, weights = forward(build_model(cfg, deterministic=True), params, batch)
  real = _smoothed_ce_float64(logits, np.asarray(targets), np.asarray(weights), EPS, V)
  wrong = _smoothed_ce_float64(logits, np.asarray(targets), np.asarray(weights), EPS, P)
  assert abs(real - wrong) > 1e-3 * abs(real)  # the check below can tell them apart
  for fused in (False, True):
    loss, _, _ = _loss_and_grads(pcfg, pparams, batch, fused)
    np.testing.assert_allclose(loss, real, rtol=2e-6)


def _poison(pcfg, pparams, scale=1e3):
  """Padding rows of the output table set to +-scale * u (u random): at every position one of
  them has a logit of about scale * |h . u|, far above every real logit."""
  u = np.random.RandomState(3).randn(pcfg.d_model).astype(np.float32)
  out = jax.tree_util.tree_map(np.array, pparams)
  if pcfg.tie_output:
    table = out["embed" if pcfg.share_embeddings or pcfg.family == "decoder_lm" else "target_embed"]
    table["embedding"][V::2] = scale * u
    table["embedding"][V + 1::2] = -scale * u
  else:
    out["decoder"]["logits_kernel"][:, V::2] = scale * u[:, None]
    out["decoder"]["logits_kernel"][:, V + 1::2] = -scale * u[:, None]
  return out


@pytest.mark.slow
@pytest.mark.parametrize("tables", ["tied", "untied"])
def test_padded_model_decodes_as_the_unpadded_one_even_with_winning_padding_rows(tables):
  cfg = _cfg("encoder_decoder", **TABLES[tables])
  batch = _batch(rows=3)
  params = jax.device_get(init_params(cfg, jax.random.key(0), batch))
  pcfg, pparams = _padded_copy(cfg, params)
  poisoned = _poison(pcfg, pparams)
  # the poisoned rows would win: the raw padded logits' argmax is a padding row
  model = build_model(pcfg, deterministic=True)
  h, table = model.apply({"params": poisoned}, batch["inputs"], batch["targets"], project=False)
  assert np.all(np.argmax(np.asarray(h @ table.T), -1) >= V)
  sources = [row[row != 0] for row in batch["inputs"]]
  for beam in (1, 3):
    spec = decode.DecodingSpec(beam_size=beam)
    ref = translate_ids(cfg, params, sources, 7, 12, spec, batch_size=3, cut=False)
    got = translate_ids(pcfg, poisoned, sources, 7, 12, spec, batch_size=3, cut=False)
    for a, b in zip(got, ref):
      np.testing.assert_array_equal(a, b)
      assert a.max() < V
  # and the loss never sees them either
  loss0, _, _ = _loss_and_grads(cfg, params, batch, True)
  for fused in (False, True):
    np.testing.assert_allclose(_loss_and_grads(pcfg, poisoned, batch, fused)[0], loss0, rtol=2e-6)


@pytest.mark.slow
def test_lm_samples_and_logits_never_reach_the_padding():
  cfg = _cfg("decoder_lm")
  params = jax.device_get(init_params(cfg, jax.random.key(0), _batch()))
  pcfg, pparams = _padded_copy(cfg, params)
  poisoned = _poison(pcfg, pparams)
  cache = init_cache(pcfg, poisoned, 4, 10)
  logits, _ = make_logits_fn(pcfg, poisoned)(jnp.ones((4, 1), jnp.int32), cache)
  assert logits.shape == (4, V)
  prompts = jnp.ones((4, 1), jnp.int32)
  ids = decode.sample(make_logits_fn(pcfg, poisoned), init_cache(pcfg, poisoned, 4, 10), prompts,
                      jax.random.key(0), 9, temperature=5.0)
  assert int(jnp.max(ids)) < V


def test_classifier_pads_its_input_embedding_only():
  cfg = _cfg("encoder_classifier", num_classes=3)
  batch = _batch()
  params = jax.device_get(init_params(cfg, jax.random.key(0), batch))
  pcfg, pparams = _padded_copy(cfg, params)
  assert pparams["embed"]["embedding"].shape == (P, 16)
  assert pparams["classifier"]["kernel"].shape == params["classifier"]["kernel"].shape
  loss0, terms0, _ = _loss_and_grads(cfg, params, batch, None)
  loss1, terms1, _ = _loss_and_grads(pcfg, pparams, batch, None)
  np.testing.assert_allclose(loss1, loss0, rtol=1e-6)


def test_unpad_and_pad_vocab_round_trip():
  cfg = _cfg("encoder_decoder", share_embeddings=False, tie_output=False, target_vocab_size=11)
  batch = _batch()
  params = jax.device_get(init_params(cfg, jax.random.key(0), batch))
  pcfg = dataclasses.replace(cfg, vocab_multiple=M)
  padded = pad_vocab(params, pcfg)
  assert padded["source_embed"]["embedding"].shape == (P, 16)
  assert padded["target_embed"]["embedding"].shape == (20, 16)  # 11 -> 20
  assert padded["decoder"]["logits_kernel"].shape == (16, 20)
  back = unpad_vocab(padded, pcfg)
  for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert back["target_embed"]["embedding"].shape == (11, 16)
  assert back["decoder"]["logits_kernel"].shape == (16, 11)


def test_vocab_multiple_auto_rule():
  c = base_config()
  assert resolve_vocab_multiple(c, 1, "cpu") == 1  # the default run: no padding, bit-identical
  assert resolve_vocab_multiple(c, 8, "cpu") == 1  # data parallel only
  assert resolve_vocab_multiple(c, 1, "gpu") == 128
  c.parallelism, c.mesh_shape = "mesh", (4, 1, 2)
  assert resolve_vocab_multiple(c, 8, "cpu") == 128  # a tensor axis: divisible by it
  c.mesh_shape = (1, 1, -1)
  assert resolve_vocab_multiple(c, 24, "cpu") == 384  # lcm(128, 24)
  c.sharding_rules.vocab = ""
  assert resolve_vocab_multiple(c, 24, "cpu") == 1  # the vocabulary is not split
  c.model.vocab_multiple = 8
  assert resolve_vocab_multiple(c, 24, "gpu") == 8  # explicit wins


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_a_mesh_that_splits_heads_unevenly_fails_in_one_line(tmp_path, txf_cli):
  proc = txf_cli("train", "--config", "default", "--workdir", str(tmp_path / "run"),
                 "--config.parallelism=mesh", "--config.mesh_shape=(1,1,3)", "--progress=false",
                 env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, timeout=240)
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("txf: error:"), proc.stderr
  assert "model.num_heads=4" in lines[0] and "tensor=3" in lines[0], lines[0]
  assert not proc.stdout.strip(), proc.stdout  # nothing else printed
  assert '--config.mesh_shape="(4, 1, 2)"' in lines[0], lines[0]
  assert not (tmp_path / "run" / "checkpoints").exists() or not any(
      (tmp_path / "run" / "checkpoints").iterdir())


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_an_explicit_vocab_multiple_that_does_not_divide_is_named(tmp_path, txf_cli):
  # the default task's vocabulary has 165 entries: odd, so tensor=2 cannot split it unpadded
  proc = txf_cli("train", "--config", "default", "--workdir", str(tmp_path / "run"),
                 "--config.parallelism=mesh", "--config.mesh_shape=(4,1,2)",
                 "--config.model.vocab_multiple=1", "--progress=false",
                 env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, timeout=240)
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("txf: error:"), proc.stderr
  assert "vocabulary rows=165" in lines[0] and "model.vocab_multiple=0" in lines[0], lines[0]
