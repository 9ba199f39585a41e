"""The batching engine: exact restarts, fixed shapes, reshuffling, length limits, and packing
checked through the model's output."""

import json

import jax
import numpy as np
import pytest

from txf.core import config as config_lib
from txf.data import global_batches, pipeline
from txf.data.base import EOS_ID, RowLayout, DataSpec
from txf.data.real import make_real_task
from txf.data.base import DataError
from txf.models import build_model, init_params, model_inputs
from txf.nn import TransformerConfig

from test_data_fixtures import config_for, parallel_dir, plain_dir, tsv_dir


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("pipeline")
  return {"root": root, "parallel": parallel_dir(root / "par"), "tsv": tsv_dir(root / "tsv"),
          "plain": plain_dir(root / "plain")}


def _task(dirs, kind="parallel", **data):
  family, fmt, extra = {"parallel": ("encoder_decoder", "parallel", {}),
                        "tsv": ("encoder_classifier", "tsv", {"eval_split": "dev"}),
                        "plain": ("decoder_lm", "plain", {"tokenizer": "char"})}[kind]
  cfg = config_for(f"text:{dirs[kind]}", dirs["root"] / "tfds", family, fmt, **{**extra, **data})
  return make_real_task(cfg, "")


MODES = {
    "plain": ("parallel", {}),
    "tokens": ("parallel", {"tokens_per_batch": 256, "rows_multiple": 2}),
    "bucketing": ("parallel", {"bucketing": True, "bucket_window": 2, "num_buckets": 3}),
    "bucketing_tokens": ("parallel", {"bucketing": True, "bucket_window": 2, "tokens_per_batch": 256,
                                      "rows_multiple": 2}),
    "packing": ("parallel", {"packing": True, "packing_bins": 6, "read_threads": 2}),
    "truncate": ("parallel", {"truncate": True, "max_input_len": 12, "max_target_len": 12}),
    "classification": ("tsv", {"bucketing": True, "bucket_window": 2}),
    "lm_stream": ("plain", {"max_target_len": 48}),
}


def _same(a, b):
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_restart_from_saved_state_yields_exactly_the_remaining_batches(dirs, mode):
  kind, data = MODES[mode]
  task = _task(dirs, kind, **data)
  it = task.train_iterator(8, seed=3)
  for _ in range(7):
    next(it)
  state = json.loads(json.dumps(it.get_state()))     # as a checkpoint stores it
  expected = [next(it) for _ in range(9)]             # crosses epochs / windows / packing rounds
  restored = task.train_iterator(8, seed=3)
  next(restored)                                      # a restored iterator may have moved on
  restored.set_state(state)
  for want in expected:
    _same(want, next(restored))


def test_shapes_are_fixed_per_mode(dirs):
  plain = _task(dirs).train_iterator(8, 0)
  assert {tuple(next(plain)["inputs"].shape) for _ in range(10)} == {(8, 32)}
  second = next(_task(dirs).train_iterator(8, 0, 1, 2))["inputs"]  # process 1 of 2: the global
  assert second.shape == (8, 32) and not second[:4].any() and second[4:].any(axis=1).all()  # shape
  tokens = _task(dirs, tokens_per_batch=256, rows_multiple=2).train_iterator(8, 0)
  assert {tuple(next(tokens)["targets"].shape) for _ in range(5)} == {(8, 32)}   # 256 // 32
  bucketed = _task(dirs, **MODES["bucketing_tokens"][1]).train_iterator(8, 0)
  shapes = {tuple(next(bucketed)["inputs"].shape) for _ in range(60)}
  # 4 buckets of lengths 8, 16, 24, 32; rows = 256 // length rounded down to a multiple of 2
  assert shapes <= {(32, 8), (16, 16), (10, 24), (8, 32)} and len(shapes) >= 3, shapes
  for _ in range(20):
    b = next(bucketed)
    assert b["inputs"].shape == b["targets"].shape and b["inputs"].size <= 256


def _order_of(count, seed, n):
  """The first ``n`` record indices the global engine walks (plain batches of one row)."""
  spec = pipeline.BatchSpec.of(DataSpec.from_config(config_lib.base_config().data), {"inputs": 4}, 1)
  read = lambda indices: [{"inputs": np.array([i + 1], np.int32)} for i in indices]
  it = global_batches.IndexBatchIterator(np.ones((count, 1), np.int32), spec, seed,
                                         RowLayout(), read, False, "fp")
  return [int(next(it)["inputs"][0, 0]) - 1 for _ in range(n)]


def test_no_example_within_the_lengths_is_one_error_not_an_endless_search():
  spec = pipeline.BatchSpec.of(DataSpec.from_config(config_lib.base_config().data), {"inputs": 4}, 1)
  lengths = np.full((3, 1), 6, np.int32)
  read = lambda indices: [{"inputs": np.ones(lengths[i, 0], np.int32)} for i in indices]
  with pytest.raises(DataError, match=r"train: every one of the 3 examples is longer than the "
                                      r"model takes \(inputs <= 4 tokens\)"):
    global_batches.IndexBatchIterator(lengths, spec, 0, RowLayout(), read, False, "fp")
  lengths[1] = 4  # one fits: batches come (of that one)
  it = global_batches.IndexBatchIterator(lengths, spec, 0, RowLayout(), read, False, "fp")
  assert next(it)["inputs"].shape == (1, 4)


def test_every_epoch_is_a_new_global_permutation():
  ids = _order_of(50, 7, 100)
  assert sorted(ids[:50]) == sorted(ids[50:]) == list(range(50)) and ids[:50] != ids[50:]
  assert ids[:50] != list(range(50))
  assert _order_of(50, 8, 50) != ids[:50]


def test_length_limiter_drops_or_truncates_and_counts():
  long = {"inputs": np.arange(10, 20, dtype=np.int32), "targets": np.array([5, EOS_ID], np.int32)}
  short = {"inputs": np.array([5, EOS_ID], np.int32), "targets": np.array([6, EOS_ID], np.int32)}
  drop = pipeline.LengthLimiter({"inputs": 4, "targets": 4}, False, True, "t")
  assert [drop.keep(e) for e in (long, short, long)] == [False, True, False]
  assert (drop.seen, drop.over) == (3, 2)
  cut = pipeline.LengthLimiter({"inputs": 4, "targets": 4}, True, True, "t")
  out = cut.cut(long)
  np.testing.assert_array_equal(out["inputs"], [10, 11, 12, EOS_ID])
  assert cut.cut(short) is short and cut.over == 1


def test_truncated_batches_end_with_eos(dirs):
  it = _task(dirs, **MODES["truncate"][1]).train_iterator(8, 0)
  for _ in range(5):
    b = next(it)
    lengths = (b["inputs"] != 0).sum(1)
    assert (b["inputs"][np.arange(8), lengths - 1] == EOS_ID).all()


def test_lm_windows_are_slices_of_the_stream_with_new_offsets_each_epoch():
  stream = np.arange(1000, dtype=np.int32)
  ds = pipeline.lm_windows(stream, 10, 0, 0, 1)
  n = len(stream) // 10 - 1
  windows = [ds[i]["targets"] for i in range(2 * n)]
  assert all(np.array_equal(w, np.arange(w[0], w[0] + 10)) for w in windows)
  offsets = {int(w[0]) % 10 for w in windows[:n]}, {int(w[0]) % 10 for w in windows[n:]}
  assert len(offsets[0]) == len(offsets[1]) == 1          # one offset per epoch


def test_state_from_another_pipeline_is_refused(dirs):
  task = _task(dirs)
  state = task.train_iterator(8, 0).get_state()
  with pytest.raises(DataError, match="another data pipeline"):
    task.train_iterator(16, 0).set_state(state)


def test_packing_never_attends_across_segments_through_the_model(dirs):
  """Each packed example's logits equal the logits of that example run alone (deterministic)."""
  task = _task(dirs, packing=True, packing_bins=8)
  batch = next(task.train_iterator(8, seed=0))
  assert {"inputs_segmentation", "targets_segmentation", "inputs_position",
          "targets_position"} <= set(batch)
  row = int(np.argmax(batch["targets_segmentation"].max(1)))
  segments = int(batch["targets_segmentation"][row].max())
  assert segments >= 2
  cfg = TransformerConfig(family="encoder_decoder", vocab_size=task.vocab_size, d_model=32,
                          num_heads=4, d_ff=64, num_encoder_layers=1, num_decoder_layers=1,
                          max_len=64)
  unpacked = {k: batch[k] for k in ("inputs", "targets")}     # parameters need only the shapes
  # jit + the rbg generator: threefry's initializers take CPU tens of seconds to compile
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0, impl="rbg"), unpacked)
  model = build_model(cfg, deterministic=True)
  apply = jax.jit(lambda p, b: model.apply({"params": p}, **model_inputs("encoder_decoder", b)))
  packed = {k: v[row:row + 1] for k, v in batch.items()}
  logits = np.asarray(apply(params, packed))[0]
  unsegmented = {k: packed[k] for k in ("inputs", "targets")}
  leaky = np.asarray(apply(params, unsegmented))[0]
  leaks = []
  for k in range(1, segments + 1):
    src = packed["inputs"][0][packed["inputs_segmentation"][0] == k]
    tgt_mask = packed["targets_segmentation"][0] == k
    tgt = packed["targets"][0][tgt_mask]
    alone = {"inputs": np.zeros((1, 32), np.int32), "targets": np.zeros((1, 32), np.int32)}
    alone["inputs"][0, :len(src)], alone["targets"][0, :len(tgt)] = src, tgt
    want = np.asarray(apply(params, alone))[0, :len(tgt)]
    np.testing.assert_allclose(logits[tgt_mask], want, atol=2e-5, rtol=1e-5)
    leaks.append(np.abs(leaky[tgt_mask] - want).max())
  assert max(leaks[1:]) > 1e-3          # without segmentation the same row does mix: the check bites
