"""txf.decode.DecodingSpec: one record of every decoding setting, from a config and a command line."""

import pytest

from txf.core.config import base_config
from txf.decode import DecodingSpec
from txf.core.errors import TxfError


def test_from_config_reads_the_runs_settings_and_flags_override_only_when_given():
  c = base_config()
  c.beam_size, c.alpha, c.length_penalty, c.early_stopping, c.decode_max_extra = 4, 1.0, "power", True, 7
  c.decode_dtype, c.decode_length_bucket = "bfloat16", 16
  spec = DecodingSpec.from_config(c)
  assert (spec.beam_size, spec.alpha, spec.length_penalty, spec.early_stopping, spec.max_extra,
          spec.weights_dtype, spec.length_bucket) == (4, 1.0, "power", True, 7, "bfloat16", 16)
  assert DecodingSpec.from_config(c, weights_dtype="float32").weights_dtype == "float32"
  # a flag left unset (None) keeps the run's value; a given one replaces it
  assert DecodingSpec.from_config(c, beam_size=None, alpha=None, max_extra=None) == spec
  flagged = DecodingSpec.from_config(c, beam_size=2, alpha=0.6, max_extra=3)
  assert (flagged.beam_size, flagged.alpha, flagged.max_extra) == (2, 0.6, 3)
  assert (flagged.length_penalty, flagged.early_stopping) == ("power", True)  # no flag: the run's
  # a run built by hand may have no config: the defaults, greedy
  assert DecodingSpec.from_config(None) == DecodingSpec() and DecodingSpec().greedy


def test_equal_settings_are_one_spec_whatever_their_types():
  """The compiled decoders are cached by the spec: 4 from a flag and 4.0 from JSON are one entry."""
  a = DecodingSpec(beam_size=4, alpha=1, early_stopping=1, banned_ids=[3, 5])
  b = DecodingSpec(beam_size=4.0, alpha=1.0, early_stopping=True, banned_ids=(3, 5))
  assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
  with pytest.raises(Exception):
    a.beam_size = 2  # frozen


@pytest.mark.parametrize("changes, needle", [
    ({"beam_size": 0}, "--beam=0"), ({"max_extra": -1}, "--max_extra=-1"),
    ({"length_penalty": "gnmtt"}, "length_penalty='gnmtt'"), ({"top_p": 0.0}, "top_p=0.0"),
    ({"temperature": -1.0}, "temperature=-1.0"),
    ({"weights_dtype": "float16"}, "decode_dtype='float16'"),
    ({"length_bucket": -1}, "--length_bucket=-1")])
def test_a_setting_that_cannot_work_is_named(changes, needle):
  with pytest.raises(TxfError, match=needle.replace("[", r"\[")):
    DecodingSpec(**changes).check()


def test_describe_and_as_dict():
  assert DecodingSpec().describe() == "greedy"
  assert DecodingSpec(beam_size=4, alpha=1.0, length_penalty="power", early_stopping=True).describe() \
      == "beam 4, power alpha 1, early stopping"
  assert DecodingSpec(beam_size=5, alpha=0.6).describe() == "beam 5, gnmt alpha 0.6"
  assert DecodingSpec(beam_size=4, weights_dtype="bfloat16").describe() == \
      "beam 4, gnmt alpha 0.6, bfloat16 weights"
  assert DecodingSpec(weights_dtype="bfloat16").describe() == "greedy, bfloat16 weights"
  d = DecodingSpec(banned_ids=(4,)).as_dict()
  assert d["banned_ids"] == [4] and d["beam_size"] == 1 and set(d) == {
      "beam_size", "alpha", "length_penalty", "early_stopping", "max_extra", "length_bucket",
      "banned_ids",
      "temperature", "top_k", "top_p", "weights_dtype"}


def test_banned_ids_are_never_generated():
  """An untrained model's greedy outputs, then the same with their most frequent id banned."""
  import jax
  import numpy as np
  from txf.decode.decoders import translate_ids
  from txf.models import init_params
  from txf.nn import TransformerConfig
  cfg = TransformerConfig(family="encoder_decoder", vocab_size=12, d_model=16, num_heads=2, d_ff=32,
                          num_encoder_layers=1, num_decoder_layers=1, max_len=16, dropout_rate=0.0)
  rng = np.random.default_rng(0)
  sources = [np.append(rng.integers(3, 12, n), 2) for n in (3, 5, 6, 4)]
  params = init_params(cfg, jax.random.key(0), {"inputs": np.ones((1, 8), np.int32),
                                                "targets": np.ones((1, 8), np.int32)})
  free = translate_ids(cfg, params, sources, 8, 10, DecodingSpec(), batch_size=4, cut=False)
  ids, counts = np.unique(np.concatenate(free), return_counts=True)
  top = int(ids[np.argmax(np.where(ids > 2, counts, -1))])  # the commonest real token
  banned = translate_ids(cfg, params, sources, 8, 10, DecodingSpec(banned_ids=(top,)), batch_size=4,
                         cut=False)
  assert not any(top in row for row in banned)
  assert any(top in row for row in free)


def _small_model(vocab=40):
  import jax
  import numpy as np
  from txf.models import init_params
  from txf.nn import TransformerConfig
  cfg = TransformerConfig(family="encoder_decoder", vocab_size=vocab, d_model=32, num_heads=2,
                          d_ff=64, num_encoder_layers=1, num_decoder_layers=2, max_len=16,
                          dropout_rate=0.0)
  params = init_params(cfg, jax.random.key(3), {"inputs": np.ones((1, 8), np.int32),
                                                "targets": np.ones((1, 8), np.int32)})
  rng = np.random.default_rng(1)
  sources = [np.append(rng.integers(3, vocab, n), 2) for n in (3, 7, 5, 6, 2, 4)]
  return cfg, params, sources


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_bfloat16_weights_decode_as_a_model_stored_in_bfloat16(beam):
  """weights_dtype='bfloat16' casts the float32 weights inside the compiled call: the outputs are
  those of the same model whose weights were cast to bfloat16 beforehand and whose compute dtype is
  bfloat16, decoded with no weights_dtype; the float32 weights passed in stay float32."""
  import dataclasses
  import jax
  import jax.numpy as jnp
  from txf.decode.decoders import translate_ids
  cfg, params, sources = _small_model()
  spec = DecodingSpec(beam_size=beam)
  cast = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
  stored = translate_ids(dataclasses.replace(cfg, dtype="bfloat16"), cast, sources, 8, 12, spec,
                         batch_size=3, cut=False)
  bf16 = translate_ids(cfg, params, sources, 8, 12, spec.replace(weights_dtype="bfloat16"),
                       batch_size=3, cut=False)
  assert [list(r) for r in bf16] == [list(r) for r in stored]
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))


def test_the_compiled_decoder_multiplies_in_bfloat16_only_when_asked():
  """The lowered program of the decoder: dots on bf16 operands with weights_dtype='bfloat16', none
  without it (the default decodes exactly as before)."""
  import re
  import numpy as np
  from txf.decode.decoders import _compiled_decoder
  cfg, params, _ = _small_model()
  inputs = np.full((2, 8), 5, np.int32)
  dots = lambda spec: re.findall(r"dot_general.*", _compiled_decoder(cfg, 2, 10, spec).lower(
      params, inputs).as_text())
  plain, bf16 = dots(DecodingSpec(beam_size=2)), dots(DecodingSpec(beam_size=2, weights_dtype="bfloat16"))
  assert plain and not any("bf16" in d for d in plain)
  assert sum("xbf16>" in d for d in bf16) >= len(bf16) // 2, bf16
