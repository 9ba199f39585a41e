"""txf.hf.t5, the numpy T5 <-> txf converter (no torch, no jit): the config fields of v1.0 and
v1.1 configs, the options it refuses, the per-head layout of the kernels, and that a state dict
comes back bit for bit."""

import numpy as np
import pytest

from txf.data.tokenizer import marian_order
from txf.hf import t5

RNG = np.random.default_rng(7)


def random_state_dict(d=8, h=3, dk=4, dff=10, vocab=12, buckets=8, gated=False, lm_head=False):
  """A T5 state dict of random float32 tensors, two layers per stack, as save_pretrained stores it."""
  w = lambda *shape: RNG.normal(size=shape).astype(np.float32)
  sd = {"shared.weight": w(vocab, d), "encoder.final_layer_norm.weight": w(d),
        "decoder.final_layer_norm.weight": w(d)}
  if lm_head:
    sd["lm_head.weight"] = w(vocab, d)
  ffn = (("wi_0", "wi_1") if gated else ("wi",))
  for stack in ("encoder", "decoder"):
    sd[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = w(buckets, h)
    for i in range(2):
      attentions = ["0.SelfAttention"] + (["1.EncDecAttention"] if stack == "decoder" else [])
      for a in attentions:
        for n in "qkv":
          sd[f"{stack}.block.{i}.layer.{a}.{n}.weight"] = w(h * dk, d)
        sd[f"{stack}.block.{i}.layer.{a}.o.weight"] = w(d, h * dk)
      f = 2 if stack == "decoder" else 1
      for n in ffn:
        sd[f"{stack}.block.{i}.layer.{f}.DenseReluDense.{n}.weight"] = w(dff, d)
      sd[f"{stack}.block.{i}.layer.{f}.DenseReluDense.wo.weight"] = w(d, dff)
      for j in range(f + 1):
        sd[f"{stack}.block.{i}.layer.{j}.layer_norm.weight"] = w(d)
  return sd


def config(version, **kw):
  base = {"d_model": 8, "d_kv": 4, "num_heads": 3, "d_ff": 10, "num_layers": 2,
          "vocab_size": 12, "relative_attention_num_buckets": 8,
          "relative_attention_max_distance": 16, "model_type": "t5"}
  if version == "v1.1":
    base.update(feed_forward_proj="gated-gelu", tie_word_embeddings=False)
  return {**base, **kw}


def test_fields_of_v10_and_v11():
  v10 = t5.model_fields(config("v1.0"), tied=True)
  assert (v10["activation"], v10["tie_output"], v10["logits_scale"]) == ("relu", True, 8 ** -0.5)
  v11 = t5.model_fields(config("v1.1"), tied=False)
  assert (v11["activation"], v11["tie_output"], v11["logits_scale"]) == ("geglu_tanh", False, 1.0)
  for f in (v10, v11):
    assert (f["head_dim"], f["attention"], f["relative_shared"], f["norm"], f["pre_ln"],
            f["use_bias"], f["embed_scale"], f["decoder_start_id"]) == (
                4, "dot_product", True, "rms_norm", True, False, False, 0)
  # transformers 5's own field wins over tie_word_embeddings
  assert t5.model_fields(config("v1.0", scale_decoder_outputs=False), True)["logits_scale"] == 1.0


@pytest.mark.parametrize("change,words", [
    ({"feed_forward_proj": "gated-tanh"}, "feed_forward_proj='gated-tanh'"),
    ({"relative_attention_num_buckets": 7}, "relative_attention_num_buckets=7"),
    ({"decoder_start_token_id": 5}, "decoder_start_token_id=5"),
    ({"architectures": ["T5EncoderModel"]}, "T5ForConditionalGeneration")])
def test_refuses_what_txf_cannot_represent(change, words):
  with pytest.raises(t5.UnsupportedT5Config, match=words.replace("[", r"\[")):
    t5.model_fields(config("v1.0", **change), tied=True)


@pytest.mark.parametrize("version", ["v1.0", "v1.1"])
def test_round_trip_is_bit_exact_and_heads_are_column_blocks(version):
  sd = random_state_dict(gated=version == "v1.1", lm_head=version == "v1.1")
  fields = t5.model_fields(config(version), tied=t5.head_is_tied(sd))
  order = marian_order(12, 0, 1, 2)
  params = t5.params_from_state_dict(sd, fields, order)
  # head 1 of W^Q is rows 4..7 of q.weight (torch [out, in]); W^O's head 2 is its columns 8..11
  q = sd["encoder.block.1.layer.0.SelfAttention.q.weight"]
  np.testing.assert_array_equal(params["encoder"]["layer_1"]["self_attention"]["query"][:, 1],
                                q[4:8].T)
  o = sd["decoder.block.0.layer.1.EncDecAttention.o.weight"]
  np.testing.assert_array_equal(params["decoder"]["layer_0"]["cross_attention"]["out"][2],
                                o[:, 8:12].T)
  # txf row t is T5 row order[t]: T5's EOS (1) is txf's 2
  np.testing.assert_array_equal(params["embed"]["embedding"][2], sd["shared.weight"][1])
  back = t5.state_dict_from_params(params, fields, order, 12)
  if version == "v1.0":  # tied and scaled: no lm_head, as save_pretrained stores it
    assert sorted(back) == sorted(sd)
  else:
    assert sorted(back) == sorted(sd) and "wi_gate" in params["decoder"]["layer_1"]["ffn"]
  for key, value in sd.items():
    assert back[key].dtype == np.float32 and np.array_equal(back[key], value), key
