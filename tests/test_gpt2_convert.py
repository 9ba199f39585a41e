"""GPT-2's numpy converter and vocabulary permutation (txf.hf.gpt2, txf.data.bpe), no torch:
the quick tier. The model against GPT2LMHeadModel itself is tests/test_hf_gpt2.py (slow)."""

import numpy as np
import pytest

from txf.data import bpe
from txf.hf import gpt2


def random_state_dict(rng, vocab=11, d=8, layers=2, positions=6, tied=True):
  sd = {"transformer.wte.weight": rng.normal(size=(vocab, d)),
        "transformer.wpe.weight": rng.normal(size=(positions, d)),
        "transformer.ln_f.weight": rng.normal(size=d), "transformer.ln_f.bias": rng.normal(size=d)}
  for i in range(layers):
    p = f"transformer.h.{i}"
    for name, shape in (("ln_1.weight", (d,)), ("ln_1.bias", (d,)), ("ln_2.weight", (d,)),
                        ("ln_2.bias", (d,)), ("attn.c_attn.weight", (d, 3 * d)),
                        ("attn.c_attn.bias", (3 * d,)), ("attn.c_proj.weight", (d, d)),
                        ("attn.c_proj.bias", (d,)), ("mlp.c_fc.weight", (d, 4 * d)),
                        ("mlp.c_fc.bias", (4 * d,)), ("mlp.c_proj.weight", (4 * d, d)),
                        ("mlp.c_proj.bias", (d,))):
      sd[f"{p}.{name}"] = rng.normal(size=shape)
  if not tied:
    sd["lm_head.weight"] = rng.normal(size=(vocab, d))
  return {k: v.astype(np.float32) for k, v in sd.items()}


def test_order_is_a_permutation_with_three_extra_rows():
  from txf.data.tokenizer import Tokenizer
  assert issubclass(bpe.GPT2Tokenizer, Tokenizer)
  order = bpe.gpt2_order(7, eos=5)
  assert order.tolist() == [7, 8, 5, 9, 0, 1, 2, 3, 4, 6]
  assert sorted(order.tolist()) == list(range(10))
  with pytest.raises(Exception, match="eos"):
    bpe.gpt2_order(7, eos=7)


@pytest.mark.parametrize("tied", [True, False])
def test_state_dict_round_trip_is_exact(tied):
  rng = np.random.default_rng(0)
  sd = random_state_dict(rng, tied=tied)
  fields = gpt2.model_fields({"vocab_size": 11, "n_embd": 8, "n_head": 2, "n_layer": 2,
                              "n_positions": 6, "eos_token_id": 4, "bos_token_id": 4,
                              "tie_word_embeddings": tied})
  order = bpe.gpt2_order(11, eos=4)
  params = gpt2.params_from_state_dict(sd, fields, order)
  emb = params["embed"]["embedding"]
  assert emb.shape == (14, 8) and not emb[[0, 1, 3]].any()  # txf's PAD/BOS/UNK rows
  np.testing.assert_array_equal(emb[2], sd["transformer.wte.weight"][4])  # EOS = <|endoftext|>
  np.testing.assert_array_equal(emb[4:], np.delete(sd["transformer.wte.weight"], 4, axis=0))
  q = params["decoder"]["layer_1"]["self_attention"]["query"]  # [d, h, d_k]: c_attn's first third
  np.testing.assert_array_equal(q[:, 1, :], sd["transformer.h.1.attn.c_attn.weight"][:, 4:8])
  v_bias = params["decoder"]["layer_0"]["self_attention"]["value_bias"]
  np.testing.assert_array_equal(v_bias.reshape(-1), sd["transformer.h.0.attn.c_attn.bias"][16:])
  back = gpt2.state_dict_from_params(params, fields, order, 14)
  assert sorted(back) == sorted(sd)
  for k in sd:
    np.testing.assert_array_equal(back[k], sd[k], err_msg=k)


def test_model_fields_of_the_default_config_and_refusals():
  f = gpt2.model_fields({})  # GPT2Config's defaults: gpt2 (124M)
  assert (f["d_model"], f["num_heads"], f["d_ff"], f["num_decoder_layers"], f["max_len"]) == \
      (768, 12, 3072, 12, 1024)
  assert f["activation"] == "gelu_tanh" and f["positional"] == "learned" and f["pre_ln"]
  assert f["decoder_start_id"] == 2 and f["mask_special_logits"] and not f["embed_scale"]
  assert gpt2.model_fields({"n_embd": 8, "n_head": 2, "n_inner": 24})["d_ff"] == 24  # n_inner != 4 d
  with pytest.raises(gpt2.UnsupportedGPT2Config) as e:
    gpt2.model_fields({"scale_attn_by_inverse_layer_idx": True, "activation_function": "silu",
                       "embd_pdrop": 0.0})
  message = str(e.value)
  for name in ("scale_attn_by_inverse_layer_idx", "activation_function='silu'", "embd_pdrop"):
    assert name in message


def test_masked_special_logits_refuse_label_smoothing():
  import txf.models  # noqa: F401  (the variant tables validate reads)
  from txf.core.config import ConfigError, base_config, validate
  c = base_config()
  c.model.mask_special_logits = True  # base_config smooths labels (0.1): mass on the masked ids
  with pytest.raises(ConfigError,
                     match=r"model.mask_special_logits=True .*optimizer.label_smoothing=0, got 0.1"):
    validate(c)
  c.optimizer.label_smoothing = 0.0
  validate(c)
