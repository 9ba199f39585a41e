"""Tokenizers: round trips, fixed special ids, byte fallback, determinism, save/load."""

import numpy as np
import pytest

from txf.runtime import workdir as workdir_lib
from txf.core.config import base_config
from txf.data import sources, tokenizer
from txf.data.base import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from txf.data.base import DataError

from test_data_fixtures import sentences


@pytest.fixture(scope="module")
def corpus():
  src, tgt = sentences(300)
  return src + tgt


@pytest.fixture(scope="module")
def sp(corpus):
  return tokenizer.train_sentencepiece(corpus, 320, "bpe")


def test_sentencepiece_round_trip_and_special_ids(sp, corpus):
  for text in corpus[:50]:
    ids = sp.encode(text)
    assert min(ids) >= 4 and sp.decode(ids) == text
  assert [sp._sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
  assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
  assert sp.decode([BOS_ID] + sp.encode("the cat.") + [EOS_ID, PAD_ID]) == "the cat."


def test_byte_fallback_keeps_unseen_characters(sp):
  text = "Grüße, 日本 ✓"
  ids = sp.encode(text)
  assert UNK_ID not in ids and sp.decode(ids) == text


def test_sentencepiece_training_is_deterministic(corpus, sp):
  again = tokenizer.train_sentencepiece(corpus, 320, "bpe")
  assert again.model_proto == sp.model_proto
  unigram = [tokenizer.train_sentencepiece(corpus, 300, "unigram").model_proto for _ in range(2)]
  assert unigram[0] == unigram[1]


def test_too_small_vocab_is_a_clear_error(corpus):
  with pytest.raises(DataError, match="data.vocab_size=100 is too small"):
    tokenizer.train_sentencepiece(corpus, 100)


def test_char_tokenizer_round_trip():
  text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
  tok = tokenizer.CharTokenizer(text)
  assert tok.vocab_size == 4 + len(set(text))
  ids = tok.encode(text)
  assert min(ids) >= 4 and tok.decode(ids) == text
  assert tok.encode("Z") == [UNK_ID]                 # unseen character
  assert tok.decode([BOS_ID] + tok.encode("hear") + [EOS_ID]) == "hear"


@pytest.mark.parametrize("joint", [True, False])
def test_codec_save_load_is_identical(tmp_path, corpus, sp, joint):
  target = sp if joint else tokenizer.train_sentencepiece(corpus[::-1], 330, "bpe")
  codec = tokenizer.Codec(sp, target, {"vocab_size": 320})
  codec.save(str(tmp_path))
  loaded = tokenizer.load_codec(str(tmp_path))
  assert loaded.joint == joint and loaded.settings == {"vocab_size": 320}
  assert loaded.source.model_proto == sp.model_proto
  assert loaded.target.model_proto == target.model_proto
  text = corpus[7]
  np.testing.assert_array_equal(loaded.encode_source(text, 64), codec.encode_source(text, 64))
  ids = list(target.encode(text)) + [EOS_ID, 9, 9]
  assert loaded.decode_target(ids) == text          # cut at EOS
  assert tokenizer.load_codec(str(tmp_path / "absent")) is None


def test_char_codec_save_load(tmp_path):
  codec = tokenizer.Codec(*(2 * [tokenizer.CharTokenizer("abc\n")]))
  codec.save(str(tmp_path))
  loaded = tokenizer.load_codec(str(tmp_path))
  assert loaded.source.chars == "\nabc" and loaded.joint


def test_encode_source_truncates_keeping_eos(sp):
  codec = tokenizer.Codec(sp, sp)
  long = " ".join(["river"] * 40)
  ids = codec.encode_source(long, 8)
  assert ids.dtype == np.int32 and len(ids) == 8 and ids[-1] == EOS_ID
  assert codec.encode_source(long, 8, eos=False)[-1] != EOS_ID


def test_sample_evenly():
  np.testing.assert_array_equal(tokenizer.sample_evenly(5, 10), np.arange(5))
  s = tokenizer.sample_evenly(1000, 10)
  assert len(s) == 10 and s[0] == 0 and s[-1] == 999


@pytest.mark.parametrize("extra, sentinels, warns", [
    ({"sentinels": 100}, 0, False),            # a span-corruption run's tokenizer, fine-tuned from
    ({"mask_token": "<mask>"}, 0, False),      # a masked-LM run's tokenizer, fine-tuned from
    ({"sentinels": 100}, 100, False),          # the pretraining itself, resumed
    ({"sentinels": 50}, 100, True),            # other sentinels than the config's
    ({"vocab_size": 999}, 0, True),            # another vocabulary than the config's
])
def test_run_tokenizer_warns_only_on_a_real_mismatch(tmp_path, monkeypatch, extra, sentinels, warns):
  d = base_config().data
  settings = dict(sources._tokenizer_settings(d), **extra)
  char = tokenizer.CharTokenizer("abc\n")
  tokenizer.Codec(char, char, settings).save(
      workdir_lib.path_of(str(tmp_path), workdir_lib.TOKENIZER_DIR))
  heard = []
  monkeypatch.setattr(sources.logging, "warning", lambda *a: heard.append(a))
  codec = sources.build_codec(d, str(tmp_path), "plain", [], None, "", str(tmp_path / "cache"),
                              sentinels=sentinels)
  assert codec.settings == settings
  assert bool(heard) == warns
