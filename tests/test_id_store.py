"""txf/data/id_store.py: the training split's encoded examples kept in memory, and the real tasks'
batches with and without it."""

import threading

import numpy as np
import pytest

from txf.data import id_store
from txf.data.id_store import IdStore

from test_data_fixtures import parallel_dir, plain_dir, tsv_dir
from test_data_pipeline import MODES, _task


def _example(n_in, n_out, label=None):
  ex = {"inputs": np.arange(10, 10 + n_in, dtype=np.int32),
        "targets": np.arange(50, 50 + n_out, dtype=np.int32)}
  if label is not None:
    ex["label"] = label
  return ex


def test_a_stored_example_comes_back_as_it_went_in():
  store = IdStore(3, ["inputs", "targets"], ["label"])
  assert len(store) == 0 and store.get(1) is None
  store.put(1, _example(1, 4, label=7))
  store.put(0, _example(3, 2, label=2))
  assert len(store) == 2 and store.get(2) is None
  got = store.get(1)
  np.testing.assert_array_equal(got["inputs"], [10])
  np.testing.assert_array_equal(got["targets"], [50, 51, 52, 53])
  assert got["label"] == 7 and store.get(0)["label"] == 2
  np.testing.assert_array_equal(store.get(0)["inputs"], [10, 11, 12])  # its neighbour untouched
  with pytest.raises(ValueError):
    got["inputs"][0] = 0                      # a view into the store: read-only
  store.put(1, _example(2, 2, label=1))       # stored once: a second put changes nothing
  assert store.get(1)["label"] == 7 and len(store.get(1)["inputs"]) == 1


def test_the_store_grows_past_its_first_arrays_and_keeps_every_example():
  rng = np.random.default_rng(0)
  store = IdStore(300, ["inputs", "targets"])
  sizes = rng.integers(1, 40, (300, 2))
  examples = [{"inputs": rng.integers(0, 1000, n_in).astype(np.int32),
               "targets": rng.integers(0, 1000, n_out).astype(np.int32)} for n_in, n_out in sizes]
  order = rng.permutation(300)
  first = store.get                            # a reader holding views from before the growth
  for i in order[:10]:
    store.put(int(i), examples[i])
  early = {int(i): first(int(i)) for i in order[:10]}
  for i in order[10:]:
    store.put(int(i), examples[i])
  assert sizes.sum() > 2 * 1024 and len(store) == 300   # past the first 1024 ids of each feature
  for i, ex in enumerate(examples):
    for f in ("inputs", "targets"):
      np.testing.assert_array_equal(store.get(i)[f], ex[f])
  for i, ex in early.items():
    np.testing.assert_array_equal(ex["inputs"], examples[i]["inputs"])


def test_threads_putting_the_same_records_store_each_once():
  examples = [_example(1 + i % 7, 1 + i % 5) for i in range(3000)]
  want = sum(len(ex["inputs"]) + len(ex["targets"]) for ex in examples)
  store = IdStore(3000, ["inputs", "targets"], max_tokens=want)  # room for one copy of each
  start = threading.Barrier(4)

  def put_all():
    start.wait()
    for i, ex in enumerate(examples):
      store.put(i, ex)

  threads = [threading.Thread(target=put_all) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(store) == 3000                   # a second copy would have run out of room
  for i, ex in enumerate(examples):
    np.testing.assert_array_equal(store.get(i)["inputs"], ex["inputs"])


def test_an_example_without_every_field_is_not_stored():
  store = IdStore(1, ["inputs", "targets"], ["label"])
  store.put(0, _example(2, 2))                # no label
  assert store.get(0) is None
  store.put(0, {"inputs": np.arange(3), "label": 1})      # no targets
  assert store.get(0) is None


def test_read_encodes_only_what_is_not_stored_and_keeps_the_order():
  store = IdStore(4, ["inputs", "targets"])
  store.put(2, _example(3, 1))
  asked = []

  def encode(indices):
    asked.append(list(indices))
    return [_example(i + 1, 1) for i in indices]

  got = store.read([3, 2, 0, 2], encode)
  assert asked == [[3, 0]]
  assert [len(ex["inputs"]) for ex in got] == [4, 3, 1, 3]
  got = store.read([0, 3], encode)            # stored by the first read
  assert asked == [[3, 0]] and [len(ex["inputs"]) for ex in got] == [1, 4]


def test_past_its_budget_a_store_keeps_what_fits_and_encodes_the_rest():
  store = IdStore(3, ["inputs", "targets"], max_tokens=10)
  store.put(0, _example(3, 2))                # 5 ids
  store.put(1, _example(4, 2))                # 6 more: over 10, not stored
  store.put(2, _example(2, 3))                # 5 more: exactly 10
  assert [store.get(i) is not None for i in range(3)] == [True, False, True]
  asked = []
  got = store.read([1, 0], lambda ix: asked.append(ix) or [_example(4, 2)])
  assert asked == [[1]] and store.get(1) is None and len(got[0]["inputs"]) == 4


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("store")
  return {"root": root, "parallel": parallel_dir(root / "par"), "tsv": tsv_dir(root / "tsv"),
          "plain": plain_dir(root / "plain")}


EXAMPLE_MODES = sorted(m for m in MODES if m != "lm_stream")   # lm_stream reads a token stream


@pytest.mark.parametrize("mode", EXAMPLE_MODES)
def test_the_batches_are_the_same_without_a_store_and_nothing_is_encoded_twice(
    dirs, mode, monkeypatch):
  kind, data = MODES[mode]
  task = _task(dirs, kind, **data)
  it = task.train_iterator(8, 3)
  calls = []
  encode = task.encode_record
  monkeypatch.setattr(task, "encode_record", lambda r: calls.append(1) or encode(r))
  kept = [next(it) for _ in range(25)]        # several epochs of the fixture's data
  assert calls == []                          # every record was encoded once, by the length pass
  plain = _task(dirs, kind, **data, id_store_tokens=0)      # the run's setting: no ids kept
  fresh = plain.train_iterator(8, 3)
  assert len(plain._index(plain.sources[plain.split_name("train")], list(plain.features),
                          kind == "tsv")[1]) == 0          # a store with no room holds nothing
  for want in kept:
    got = next(fresh)
    assert sorted(got) == sorted(want)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=f"{mode}: {k}")


def test_the_config_default_is_the_store_default():
  from txf.core.config import base_config
  assert base_config().data.id_store_tokens == id_store.MAX_TOKENS


def test_a_run_resumes_with_another_store_budget_but_not_other_batching():
  from txf.core.config import base_config
  from txf.runtime.workdir import config_to_dict, differing_fields
  old = config_to_dict(base_config())
  new = base_config()
  new.data.id_store_tokens = 0
  assert differing_fields(old, config_to_dict(new)) == []
  del old["data"]["id_store_tokens"]           # a run written before the field existed
  assert differing_fields(old, config_to_dict(new)) == []
  new.data.packing = True
  assert differing_fields(old, config_to_dict(new)) == [("data.packing", False, True)]
