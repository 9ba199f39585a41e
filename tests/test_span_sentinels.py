"""Span corruption's sentinels and settings (quick): <extra_id_N> pieces on top of a trained
sentencepiece model, the first-sentinel check, splitting decoded targets, the config checks, and
the other families' tokenizer settings unchanged."""

import pytest

from txf.core import config as config_lib
from txf.data import sentinels, tokenizer
from txf.data.base import DataError, DataSpec
from txf.data.sources import _tokenizer_settings

TEXT = ["a man rides a bike on the street .", "two dogs are playing in the park .",
        "a woman walks near the water with a red ball ."] * 40


@pytest.fixture(scope="module")
def base():
  return tokenizer.train_sentencepiece(TEXT, 300)


def test_sentinels_are_the_top_ids_and_one_piece_each(base):
  tok = sentinels.add_sentinels(base, 5)
  v = base.vocab_size
  assert tok.vocab_size == v + 5
  for n in range(5):  # <extra_id_N> = V + 5 - 1 - N, the top id for N = 0
    assert tok.encode(f"<extra_id_{n}>")[-1] == v + 4 - n
  assert sentinels.first_sentinel(tok, 5) == v + 4
  text = "a man rides a bike ."
  assert tok.encode(text) == base.encode(text)          # the other pieces keep their ids
  ids = tok.encode("a man <extra_id_0> a bike <extra_id_1> .")
  assert ids.count(v + 4) == 1 and ids.count(v + 3) == 1


def test_a_tokenizer_without_enough_sentinels_is_one_error(base):
  with pytest.raises(DataError, match="needs a tokenizer with 3 sentinel tokens"):
    sentinels.first_sentinel(base, 3)
  with pytest.raises(DataError, match=r"<extra_id_5> is missing"):
    sentinels.first_sentinel(sentinels.add_sentinels(base, 5), 6)
  with pytest.raises(DataError, match="sentinel"):
    sentinels.first_sentinel(tokenizer.CharTokenizer("abc<>_extrid0123456789"), 2)


def test_split_sentinels_hand_worked():
  # targets <S0> 7 8 <S1> 9 EOS 5 with <extra_id_0> = 99: spans [7, 8] and [9]; after EOS ignored
  assert sentinels.split_sentinels([99, 7, 8, 98, 9, 2, 5], 99, 10) == ([0, 1], [[7, 8], [9]])
  assert sentinels.split_sentinels([4, 97, 6, 2], 99, 10) == ([2], [[6]])   # leading non-sentinel dropped
  assert sentinels.split_sentinels([4, 5, 6], 99, 10) == ([], [])


def test_other_families_tokenizer_settings_unchanged():
  d = DataSpec.from_config(config_lib.base_config().data)
  assert "sentinels" not in _tokenizer_settings(d)
  assert _tokenizer_settings(d, 100) == {**_tokenizer_settings(d), "sentinels": 100}


def _span_config(**pretrain):
  cfg = config_lib.base_config()
  cfg.model.family = "span_corruption"
  cfg.data.max_input_len = 32
  for k, v in pretrain.items():
    cfg.pretrain[k] = v
  return cfg


def test_config_checks():
  config_lib.validate(_span_config())                    # T5's defaults on 32-token windows
  for bad, match in [({"noise_density": 0.0}, "noise_density=0.0 must be in"),
                     ({"mean_span_length": 0.5}, "mean_span_length=0.5"),
                     ({"num_sentinels": 1, "mean_span_length": 1.0}, "needs 5 other tokens and 5 sentinels"),
                     ({"noise_density": 0.95, "mean_span_length": 1.0}, "needs 30 other tokens")]:
    with pytest.raises(config_lib.ConfigError, match=match):
      config_lib.validate(_span_config(**bad))
  cfg = _span_config(noise_density=0.5, mean_span_length=1.0)
  cfg.model.max_len = 32                                 # 32 - 16 + 16 + 1 = 33 input tokens
  with pytest.raises(config_lib.ConfigError, match=r"shorter than the span-corrupted input \(33"):
    config_lib.validate(cfg)
  other = config_lib.base_config()                       # other families: pretrain not checked
  other.pretrain.noise_density = 0.0
  config_lib.validate(other)


def test_t5_tokenizer_numbering_is_the_same_convention(base):
  """An imported T5's tokenizer (txf.hf.t5.t5_codec's layout: the sentinels at
  V_spm + extra - 1 - N, model vocabulary padded beyond them) gives the span task its first id."""
  pieces, extra = base.vocab_size, 5
  vocab = {base._sp.id_to_piece(i): i for i in range(pieces)}
  vocab.update({f"<extra_id_{n}>": pieces + extra - 1 - n for n in range(extra)})
  t5 = tokenizer.T5Tokenizer(base.model_proto, vocab, {"pad": 0, "eos": 2, "unk": 3},
                             pieces + extra + 3)
  assert sentinels.first_sentinel(t5, extra) == pieces + extra - 1   # not the padded top id
  with pytest.raises(DataError):
    sentinels.first_sentinel(t5, extra + 1)
