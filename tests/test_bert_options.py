"""BERT's model options in txf, recomputed in float64 numpy from the module's own parameters: the
embeddings Dropout(LN(E[x] + P[pos] + T[0])) (model.type_vocab_size, model.embed_norm, learned
positions, no sqrt(d) scale), the pooler tanh(W h_0 + b) (model.pooler), and the encoder_mlm
family's head LN(gelu(h W + b)) E^T + b_out (these compile: the end-to-end tier). Also: the BERT converter (txf/hf/bert.py) takes a
random state dict to txf parameters and back unchanged, and the defaults add no parameter."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from txf.hf import bert
from txf.models import build_model, forward, init_params
from txf.nn import TransformerConfig

BERT_LIKE = dict(vocab_size=13, d_model=8, num_heads=2, d_ff=16, num_encoder_layers=1,
                 num_decoder_layers=0, dropout_rate=0.0, positional="learned", embed_scale=False,
                 attention_bias=True, activation="gelu", layer_norm_eps=1e-12, type_vocab_size=2,
                 embed_norm=True, max_len=8)
IDS = np.array([[1, 6, 7, 8, 2], [1, 9, 2, 0, 0]])


def np_layer_norm(x, p, eps=1e-12):
  mu = x.mean(-1, keepdims=True)
  return p["scale"] * (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) + p["bias"]


def np_gelu(z):
  return 0.5 * z * (1 + erf(z / math.sqrt(2)))


def np_encoder(p, ids):
  """The encoder's output [L, d] for one row (post-LN, BERT's embeddings), float64."""
  valid = ids != 0
  pos = p["encoder"]["positions"]
  x = p["embed"]["embedding"][ids] + pos["pos_embedding"][:len(ids)] + pos["token_type_embedding"][0]
  x = np_layer_norm(x, pos["embed_norm"])
  lay = p["encoder"]["layer_0"]
  a = lay["self_attention"]
  proj = lambda name: np.einsum("ld,dhk->hlk", x, a[name]) + a[f"{name}_bias"][:, None, :]
  q, k, v = proj("query"), proj("key"), proj("value")
  s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
  s = np.where(valid[None, None, :], s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  x = np_layer_norm(x + np.einsum("hlk,hkd->ld", w @ v, a["out"]) + a["out_bias"], lay["norm_1"])
  f = lay["ffn"]
  return np_layer_norm(x + np_gelu(x @ f["wi"] + f["bi"]) @ f["wo"] + f["bo"], lay["norm_2"])


def randomized(params, seed):
  """Every leaf random (zero-initialised biases and unit gains would hide mistakes)."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(0, 0.5, a.shape), jnp.float32), params)


@pytest.mark.slow  # compiles a model; the converter tests below stay quick
def test_bert_embeddings_and_pooler_match_numpy():
  cfg = TransformerConfig(family="encoder_classifier", num_classes=3, pooling="first", pooler=True,
                          **BERT_LIKE)
  batch = {"inputs": jnp.asarray(IDS, jnp.int32), "label": jnp.zeros(2, jnp.int32)}
  params = randomized(init_params(cfg, jax.random.key(0), batch), 1)
  logits = np.asarray(forward(build_model(cfg, deterministic=True), params, batch)[0])
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  expected = []
  for row in IDS:
    h0 = np_encoder(p, row)[0]
    pooled = np.tanh(h0 @ p["pooler"]["kernel"] + p["pooler"]["bias"])
    expected.append(pooled @ p["classifier"]["kernel"] + p["classifier"]["bias"])
  np.testing.assert_allclose(logits, np.stack(expected), rtol=0, atol=1e-4)


@pytest.mark.slow  # compiles a model; the converter tests below stay quick
@pytest.mark.parametrize("tie", [True, False])
def test_mlm_head_matches_numpy(tie):
  cfg = TransformerConfig(family="encoder_mlm", tie_output=tie, logits_bias=True, **BERT_LIKE)
  batch = {"inputs": jnp.asarray(IDS, jnp.int32), "targets": jnp.asarray(IDS, jnp.int32)}
  params = randomized(init_params(cfg, jax.random.key(0), batch), 2)
  logits, targets, weights = forward(build_model(cfg, deterministic=True), params, batch)
  assert logits.shape == (2, 5, 13)
  np.testing.assert_array_equal(weights, IDS != 0)
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  out = p["embed"]["embedding"].T if tie else p["logits_kernel"]
  for b, row in enumerate(IDS):
    h = np_gelu(np_encoder(p, row) @ p["mlm_dense"]["kernel"] + p["mlm_dense"]["bias"])
    expected = np_layer_norm(h, p["mlm_norm"]) @ out + p["logits_bias"]
    valid = row != 0
    np.testing.assert_allclose(np.asarray(logits)[b][valid], expected[valid], rtol=0, atol=1e-4)


@pytest.mark.slow  # compiles a model; the converter tests below stay quick
def test_defaults_add_no_bert_parameter():
  cfg = TransformerConfig(family="encoder_classifier", vocab_size=13, d_model=8, num_heads=2,
                          d_ff=16, num_encoder_layers=1)
  params = init_params(cfg, jax.random.key(0), {"inputs": jnp.ones((1, 4), jnp.int32)})
  assert set(params) == {"embed", "encoder", "classifier"}
  assert "positions" not in params["encoder"]  # sinusoidal: no table, no token types, no norm


@pytest.mark.parametrize("family", [bert.CLASSIFIER, bert.MLM])
def test_converter_round_trip_is_the_identity(family):
  """A random BERT state dict -> txf parameters -> state dict: every tensor back bit for bit."""
  fields = bert.model_fields({"hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 16,
                              "num_hidden_layers": 2, "vocab_size": 11, "max_position_embeddings": 6,
                              "tie_word_embeddings": False}, family)
  rng = np.random.default_rng(0)
  d, f, v = 8, 16, 11
  shapes = {"bert.embeddings.word_embeddings.weight": (v, d),
            "bert.embeddings.position_embeddings.weight": (6, d),
            "bert.embeddings.token_type_embeddings.weight": (2, d),
            "bert.embeddings.LayerNorm.weight": (d,), "bert.embeddings.LayerNorm.bias": (d,)}
  for i in range(2):
    pre = f"bert.encoder.layer.{i}"
    for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                 "attention.output.dense"):
      shapes.update({f"{pre}.{name}.weight": (d, d), f"{pre}.{name}.bias": (d,)})
    shapes.update({f"{pre}.intermediate.dense.weight": (f, d), f"{pre}.intermediate.dense.bias": (f,),
                   f"{pre}.output.dense.weight": (d, f), f"{pre}.output.dense.bias": (d,)})
    for name in ("attention.output.LayerNorm", "output.LayerNorm"):
      shapes.update({f"{pre}.{name}.weight": (d,), f"{pre}.{name}.bias": (d,)})
  if family == bert.CLASSIFIER:
    shapes.update({"bert.pooler.dense.weight": (d, d), "bert.pooler.dense.bias": (d,),
                   "classifier.weight": (3, d), "classifier.bias": (3,)})
  else:
    shapes.update({"cls.predictions.transform.dense.weight": (d, d),
                   "cls.predictions.transform.dense.bias": (d,),
                   "cls.predictions.transform.LayerNorm.weight": (d,),
                   "cls.predictions.transform.LayerNorm.bias": (d,),
                   "cls.predictions.bias": (v,), "cls.predictions.decoder.weight": (v, d)})
  sd = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  order = np.asarray([0, 5, 6, 3] + [i for i in range(v) if i not in (0, 5, 6, 3)])
  params = bert.params_from_state_dict(sd, fields, order)
  np.testing.assert_array_equal(params["embed"]["embedding"][1], sd[
      "bert.embeddings.word_embeddings.weight"][5])  # txf id 1 = BERT id order[1]
  back = bert.state_dict_from_params(params, fields, order, v)
  assert sorted(back) == sorted(sd)
  for k in sd:
    np.testing.assert_array_equal(back[k], sd[k], err_msg=k)


def test_export_of_a_txf_classifier_names_what_bert_needs(tmp_path):
  """txf export-hf of a classifier trained by txf (sst2's: sinusoidal positions, mean pooling, no
  embedding norm, SentencePiece) is refused with one TxfError listing each difference."""
  from txf.core import config as config_lib
  from txf.core.errors import TxfError
  from txf import hf
  from txf.runtime.workdir import config_to_dict, write_json
  workdir = tmp_path / "run"
  workdir.mkdir()
  write_json(str(workdir / "config.json"), config_to_dict(config_lib.load_experiment("sst2")))
  with pytest.raises(TxfError) as e:
    hf.export_hf(str(workdir), str(tmp_path / "out"))
  message = str(e.value)
  for problem in ("cannot be exported as a BERT model", "model.positional='sinusoidal'",
                  "model.embed_norm=False", "model.type_vocab_size=0", "model.pooling='mean'",
                  "its tokenizer (none"):
    assert problem in message, (problem, message)
  assert not (tmp_path / "out").exists()
