"""The masked-LM loss scores the chosen positions only, through the head run on those positions
alone (``predict_positions``): its sum, count and correct count equal a float64 numpy
cross-entropy over the full [B, S, V] logits at the positions ``txf.ops.mlm_mask`` chose."""

import dataclasses

import jax
import numpy as np
import pytest

from txf import ops
from txf.models import build_model, init_params
from txf.models.encoder_mlm import EVAL_MASK_SEED, max_predictions, mlm_loss
from txf.nn import BOS_ID, EOS_ID, PAD_ID, UNK_ID, TransformerConfig

pytestmark = pytest.mark.slow  # two small models built and run: the end-to-end tier

CFG = TransformerConfig(family="encoder_mlm", d_model=16, num_heads=2, d_ff=32,
                        num_encoder_layers=1, num_decoder_layers=0, vocab_size=40, max_len=16,
                        dropout_rate=0.0, dtype="float32", mask_id=4, mask_rate=0.3)


def test_the_loss_on_the_gathered_positions_equals_the_full_logits_in_float64():
  rows = np.random.default_rng(0).integers(5, 40, size=(3, 12)).astype(np.int32)
  rows[1, 8:] = 0                       # a padded row
  rows[2, 0] = BOS_ID                   # a special token, never chosen
  model = build_model(CFG, deterministic=True)
  params = init_params(CFG, jax.random.key(1), {"inputs": rows, "targets": rows})
  loss_sum, terms = mlm_loss(0.0)(model, params, {"inputs": rows}, None)

  masked, targets, weights = ops.mlm_mask(
      rows, jax.random.key(EVAL_MASK_SEED), vocab_size=40, mask_id=4, mask_rate=0.3,
      mask_token_fraction=CFG.mask_token_fraction, random_token_fraction=CFG.random_token_fraction,
      special_ids=(PAD_ID, BOS_ID, EOS_ID, UNK_ID, 4))
  logits = np.asarray(model.apply({"params": params}, inputs=masked), np.float64)  # [B, S, V]
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  chosen = np.asarray(weights) > 0
  targets = np.asarray(targets)
  nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  assert chosen.sum() == float(terms["count"]) > 0
  assert chosen.sum(1).max() <= max_predictions(12, 0.3) == 4
  np.testing.assert_allclose(float(loss_sum), nll[chosen].sum(), rtol=1e-5)
  np.testing.assert_allclose(float(terms["nll_sum"]), nll[chosen].sum(), rtol=1e-5)
  assert float(terms["correct"]) == (logits.argmax(-1) == targets)[chosen].sum()


def test_whole_words_score_every_position():
  cfg = dataclasses.replace(CFG, whole_word=True)
  rows = np.random.default_rng(1).integers(5, 40, size=(2, 10)).astype(np.int32)
  starts = np.ones_like(rows)  # every piece a word: the same choice as without whole words
  model = build_model(cfg, deterministic=True)
  params = init_params(cfg, jax.random.key(1), {"inputs": rows, "targets": rows})
  whole, terms = mlm_loss(0.0)(model, params, {"inputs": rows, "word_starts": starts}, None)
  plain, plain_terms = mlm_loss(0.0)(build_model(CFG, deterministic=True), params,
                                     {"inputs": rows}, None)
  assert float(terms["count"]) == float(plain_terms["count"])
  np.testing.assert_allclose(float(whole), float(plain), rtol=1e-6)
