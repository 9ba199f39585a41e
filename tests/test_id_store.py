"""txf/data/id_store.py: the training split's encoded examples kept in memory, and the real tasks'
batches with and without it."""

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
  lengths = np.array([[3, 2], [1, 4], [2, 2]])
  store = IdStore(lengths, ["inputs", "targets"], ["label"])
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


def test_an_example_of_other_lengths_or_fields_is_not_stored():
  store = IdStore(np.array([[3, 2]]), ["inputs", "targets"])
  store.put(0, _example(2, 2))                # the length index says 3 input ids
  assert store.get(0) is None
  store.put(0, {"inputs": np.arange(3)})      # no targets
  assert store.get(0) is None


def test_read_encodes_only_what_is_not_stored_and_keeps_the_order():
  lengths = np.array([[1, 1], [2, 1], [3, 1], [4, 1]])
  store = IdStore(lengths, ["inputs", "targets"])
  store.put(2, _example(3, 1))
  asked = []

  def encode(indices):
    asked.append(list(indices))
    return [_example(int(lengths[i, 0]), 1) for i in indices]

  got = store.read([3, 2, 0, 2], encode)
  assert asked == [[3, 0]]
  assert [len(ex["inputs"]) for ex in got] == [4, 3, 1, 3]
  got = store.read([0, 3], encode)            # stored by the first read
  assert asked == [[3, 0]] and [len(ex["inputs"]) for ex in got] == [1, 4]


def test_a_split_over_the_budget_gets_no_store():
  lengths = np.array([[3, 2], [1, 4]])        # 10 ids
  assert IdStore.for_split(lengths, ["inputs", "targets"], max_tokens=10) is not None
  assert IdStore.for_split(lengths, ["inputs", "targets"], max_tokens=9) is None


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
  monkeypatch.setattr(id_store, "MAX_TOKENS", 0)
  plain = _task(dirs, kind, **data)
  assert plain._index(plain.sources[plain.split_name("train")], list(plain.features),
                      kind == "tsv")[1] is None
  fresh = plain.train_iterator(8, 3)
  for want in kept:
    got = next(fresh)
    assert sorted(got) == sorted(want)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=f"{mode}: {k}")
