"""translate_ids with length buckets: sources longest first, each batch shaped by its own longest
source (txf.decode.decoders.batch_shape), outputs in the caller's order and equal to one fixed shape's."""

import jax
import numpy as np
import pytest

from txf.decode import DecodingSpec
from txf.decode.decoders import batch_shape, translate_ids
from txf.models import init_params
from txf.nn import TransformerConfig


@pytest.mark.parametrize("lengths, bucket, want", [
    ((20, 12), 8, (24, 24 + 5)),   # ceil(20 / 8) * 8 = 24
    ((7, 5), 8, (8, 13)),
    ((8,), 8, (8, 13)),            # a multiple of the bucket stays itself
    ((9,), 8, (16, 21)),
    ((3,), 16, (16, 21)),
    ((30,), 8, (30, 35)),          # never past input_len (30)
    ((3,), 1, (3, 8)),
    ((20, 12), 0, (30, 40)),       # bucket 0: the fixed shape (input_len, max_len)
])
def test_batch_shape_by_hand(lengths, bucket, want):
  assert batch_shape(lengths, input_len=30, max_len=40, max_extra=5, bucket=bucket) == want


def test_the_buffer_never_exceeds_max_len():
  assert batch_shape([20], input_len=30, max_len=22, max_extra=5, bucket=8) == (24, 22)


def _model():
  cfg = TransformerConfig(family="encoder_decoder", vocab_size=30, d_model=32, num_heads=2, d_ff=64,
                          num_encoder_layers=1, num_decoder_layers=2, max_len=48, dropout_rate=0.0)
  params = init_params(cfg, jax.random.key(5), {"inputs": np.ones((1, 8), np.int32),
                                                "targets": np.ones((1, 8), np.int32)})
  rng = np.random.default_rng(2)
  sources = [np.append(rng.integers(3, 30, n - 1), 2) for n in (3, 12, 5, 20, 7, 2, 9)]
  return cfg, params, sources


def _recording_wrap(shapes):
  def wrap(run):
    jitted = jax.jit(run)

    def call(params, inputs):
      out = jitted(params, inputs)
      shapes.append((tuple(inputs.shape), tuple(out.shape)))
      return out
    return call
  return wrap


def test_batches_are_shaped_by_their_own_longest_source_and_outputs_keep_the_callers_order():
  """Greedy: sorted 20, 12 | 9, 7 | 5, 3 | 2 with bucket 8, input_len 24, max_extra 5, max_len 40
  gives inputs [2, 24], [2, 16], [2, 8], [2, 8] and buffers 29, 21, 13, 13; every output equals
  the one-shape decoding's (data order, [2, 24] inputs, buffer 40), row for row."""
  cfg, params, sources = _model()
  shapes = []
  spec = DecodingSpec(max_extra=5)
  got = translate_ids(cfg, params, sources, 24, 40, spec, batch_size=2, wrap=_recording_wrap(shapes))
  assert shapes == [((2, 24), (2, 29)), ((2, 16), (2, 21)), ((2, 8), (2, 13)), ((2, 8), (2, 13))]
  shapes.clear()
  fixed = translate_ids(cfg, params, sources, 24, 40, spec.replace(length_bucket=0), batch_size=2,
                        wrap=_recording_wrap(shapes))
  assert {s for s in shapes} == {((2, 24), (2, 40))}
  assert [list(r) for r in got] == [list(r) for r in fixed]
  # each row is its own source's: decoded alone it is the same
  alone = [translate_ids(cfg, params, [s], 24, 40, spec, batch_size=2)[0] for s in sources]
  assert [list(r) for r in got] == [list(r) for r in alone]


def test_beam_search_with_buckets_equals_one_shape_when_the_buffer_is_the_same():
  """Beam 3 where every batch's buffer is max_len (max_extra large): only the order and the source
  padding change, and the hypotheses do not."""
  cfg, params, sources = _model()
  spec = DecodingSpec(beam_size=3, max_extra=40)
  got = translate_ids(cfg, params, sources, 24, 40, spec, batch_size=3)
  fixed = translate_ids(cfg, params, sources, 24, 40, spec.replace(length_bucket=0), batch_size=3)
  assert [list(r) for r in got] == [list(r) for r in fixed]


def test_progress_counts_rows_and_cut_false_keeps_one_shape():
  cfg, params, sources = _model()
  done, shapes = [], []
  translate_ids(cfg, params, sources, 24, 40, DecodingSpec(max_extra=5), batch_size=3,
                progress=done.append)
  assert done == [3, 6, 7]
  translate_ids(cfg, params, sources, 24, 40, DecodingSpec(max_extra=5), batch_size=3, cut=False,
                wrap=_recording_wrap(shapes))
  assert {s for s in shapes} == {((3, 24), (3, 40))}  # uncut outputs need the whole buffer


def test_specs_differing_only_outside_the_search_share_one_compiled_program():
  """Each new compiled decoder calls ``wrap`` once. Sources of lengths 3 and 12 make one batch
  of shape [2, 16] with bucket 8 or 16, so only the spec can add programs."""
  cfg, params, sources = _model()
  made = []

  def wrap(run):
    made.append(run)
    return jax.jit(run)

  def decode(spec):
    return [list(r) for r in translate_ids(cfg, params, sources[:2], 24, 40, spec, batch_size=2,
                                           wrap=wrap)]

  beam = DecodingSpec(beam_size=2, max_extra=5)
  first = decode(beam)
  assert decode(beam.replace(length_bucket=16)) == first
  assert decode(beam.replace(temperature=0.5, top_k=3, top_p=0.9)) == first
  assert len(made) == 1
  decode(beam.replace(alpha=1.0))  # the length penalty is the search's own: a second program
  assert len(made) == 2
  greedy = DecodingSpec(max_extra=5)
  decode(greedy)
  decode(greedy.replace(alpha=1.0, length_penalty="power", early_stopping=True, length_bucket=16))
  assert len(made) == 3  # greedy ignores the beam's settings
  decode(greedy.replace(banned_ids=(5,)))
  assert len(made) == 4


def test_search_settings_keep_what_the_search_reads():
  spec = DecodingSpec(beam_size=4, alpha=1.0, length_penalty="power", early_stopping=True,
                      max_extra=9, length_bucket=3, banned_ids=(7,), temperature=0.3, top_k=5,
                      top_p=0.5, weights_dtype="bfloat16")
  assert spec.search_settings() == DecodingSpec(beam_size=4, alpha=1.0, length_penalty="power",
                                                early_stopping=True, banned_ids=(7,),
                                                weights_dtype="bfloat16")
  assert spec.replace(beam_size=1).search_settings() == DecodingSpec(banned_ids=(7,),
                                                                     weights_dtype="bfloat16")
