"""Global batches (txf/data/global_batches.py) as P processes see them, without starting processes:
each "process" is an iterator with its own RowLayout. Every process forms the same batch shapes;
the rows they fill add up to the one-process batch; a data position saved by one count resumes on
another, packed data included."""

import numpy as np
import pytest

from txf.data import global_batches
from txf.data.base import CheckpointableIterator, DataError, RowLayout

from test_data_fixtures import parallel_dir, plain_dir, tsv_dir
from test_data_pipeline import MODES, _task

GLOBAL_MODES = sorted(MODES)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("global")
  return {"root": root, "parallel": parallel_dir(root / "par"), "tsv": tsv_dir(root / "tsv"),
          "plain": plain_dir(root / "plain")}


def _strided(count: int, index: int) -> RowLayout:
  """Process ``index`` of ``count`` fills rows index, index + count, ... (a non-block layout, as a
  mesh whose batch axis interleaves processes gives)."""
  return RowLayout(lambda r: np.arange(index, r, count), count)


@pytest.mark.parametrize("mode", GLOBAL_MODES)
@pytest.mark.parametrize("count", [2, 4])
def test_processes_form_the_same_batches_and_their_rows_add_up_to_one_process(dirs, mode, count):
  kind, data = MODES[mode]
  task = _task(dirs, kind, **data)
  whole = task.train_iterator(8, 3, layout=RowLayout(None, count))
  layouts = [_strided(count, i) if i % 2 else RowLayout.block(i, count) for i in range(count)]
  layouts = [_strided(count, i) for i in range(count)] if mode == "bucketing" else \
      [RowLayout.block(i, count) for i in range(count)]
  parts = [task.train_iterator(8, 3, layout=layout) for layout in layouts]
  shapes = set()
  for _ in range(12):
    full = next(whole)
    got = [next(p) for p in parts]
    for k, v in full.items():
      assert all(g[k].shape == v.shape for g in got), (k, [g[k].shape for g in got], v.shape)
      assert v.shape[0] % count == 0
      summed = np.zeros_like(v)
      for layout, g in zip(layouts, got):
        rows = layout.rows(v.shape[0])
        summed[rows] = g[k][rows]
        others = np.setdiff1d(np.arange(v.shape[0]), rows)
        assert not g[k][others].any(), "rows of other processes must stay PAD"
      np.testing.assert_array_equal(summed, v, err_msg=k)
    shapes.add(tuple(full[sorted(full)[0]].shape))
  if "bucketing" in mode or mode == "classification":
    assert len(shapes) > 1, shapes  # several bucket shapes, agreed by every process


@pytest.mark.parametrize("mode", ["bucketing_tokens", "classification", "lm_stream", "plain",
                                  "packing"])
@pytest.mark.parametrize("before,after", [(2, 1), (1, 2), (2, 4)])
def test_a_data_position_saved_by_one_process_count_resumes_on_another(dirs, mode, before, after):
  kind, data = MODES[mode]
  task = _task(dirs, kind, **data)
  multiple = 4  # the same row rounding on every count (the batch splits over 4 shards)
  reference = task.train_iterator(8, 5, layout=RowLayout(None, multiple))
  expected = [next(reference) for _ in range(9)]
  saved = task.train_iterator(8, 5, layout=RowLayout(
      lambda r: np.arange(0, r // before), multiple))  # process 0 of `before`
  for _ in range(5):
    next(saved)
  state = saved.get_state()
  resumed = [task.train_iterator(8, 5, layout=RowLayout(
      (lambda i: lambda r: np.arange(i * r // after, (i + 1) * r // after))(i), multiple))
      for i in range(after)]
  for it in resumed:
    it.set_state(state)
  for want in expected[5:]:
    got = [next(it) for it in resumed]
    for k, v in want.items():
      combined = np.zeros_like(v)
      for i, g in enumerate(got):
        rows = slice(i * v.shape[0] // after, (i + 1) * v.shape[0] // after)
        combined[rows] = g[k][rows]
      np.testing.assert_array_equal(combined, v, err_msg=k)


def test_packed_rows_hold_whole_examples_numbered_by_segment_and_position(dirs):
  kind, data = MODES["packing"]
  task = _task(dirs, kind, **data)
  it = task.train_iterator(8, 0)
  records = {tuple(task.encode_record(r)["inputs"]): tuple(task.encode_record(r)["targets"])
             for r in task.records("train")}
  seen = 0
  for _ in range(6):
    batch = next(it)
    for row in range(batch["inputs"].shape[0]):
      segs = batch["inputs_segmentation"][row]
      for s in range(1, int(segs.max()) + 1):
        at = segs == s
        src = batch["inputs"][row][at]
        tgt = batch["targets"][row][batch["targets_segmentation"][row] == s]
        assert records[tuple(src)] == tuple(tgt)          # the pair, whole, in one row
        np.testing.assert_array_equal(batch["inputs_position"][row][at], np.arange(at.sum()))
        seen += 1
      assert not batch["inputs"][row][segs == 0].any()    # padding only after the segments
  assert seen > 6 * 8                                       # several examples per row


def test_old_packed_positions_are_refused_with_what_to_do(dirs):
  kind, data = MODES["packing"]
  it = _task(dirs, kind, **data).train_iterator(8, 0)
  with pytest.raises(DataError, match="earlier txf's per-process grain packer.*resume this run "
                                      "with the txf that started it"):
    it.set_state({"grain": {}, "pipeline": "x", "processes": 2})


class _Counting(CheckpointableIterator):
  """Batches {"n": [n]}; fails at ``fail_at`` (to check errors cross the prefetch thread)."""

  def __init__(self, fail_at=None):
    self.n, self.fail_at = 0, fail_at

  def __next__(self):
    if self.n == self.fail_at:
      raise DataError(f"bad record at {self.n}")
    self.n += 1
    return {"n": np.array([self.n - 1])}

  def get_state(self):
    return {"n": self.n}

  def set_state(self, state):
    self.n = state["n"]


def test_prefetch_keeps_the_batches_and_states_of_the_consumed_steps():
  ahead = global_batches.Prefetched(_Counting(), 3)
  assert ahead.get_state() == {"n": 0}
  assert [int(next(ahead)["n"][0]) for _ in range(5)] == [0, 1, 2, 3, 4]
  assert ahead.get_state() == {"n": 5}            # the thread is ahead; the state is not
  ahead.set_state({"n": 2})
  assert ahead.get_state() == {"n": 2}
  assert [int(next(ahead)["n"][0]) for _ in range(3)] == [2, 3, 4]
  failing = global_batches.Prefetched(_Counting(fail_at=2), 4)
  assert [int(next(failing)["n"][0]) for _ in range(2)] == [0, 1]
  with pytest.raises(DataError, match="bad record at 2"):
    next(failing)


def test_real_tasks_prefetch_unless_told_not_to(dirs):
  kind, data = MODES["plain"]
  task = _task(dirs, kind, **data)
  assert isinstance(task.train_iterator(8, 0), global_batches.Prefetched)
  plain = _task(dirs, kind, **data, prefetch=0).train_iterator(8, 0)
  assert isinstance(plain, global_batches.IndexBatchIterator)
  ahead = task.train_iterator(8, 0)
  for _ in range(3):
    a, b = next(ahead), next(plain)
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_a_packed_batch_by_hand_with_an_empty_row_and_filler_rows():
  # rows: [ex 0, ex 1], [], [ex 2], and one filler row past the packed ones
  examples = {0: {"inputs": np.array([5, 6]), "targets": np.array([7])},
              1: {"inputs": np.array([8]), "targets": np.array([9, 10])},
              2: {"inputs": np.array([11, 12, 13]), "targets": np.array([14])}}
  read = lambda indices: [examples[i] for i in indices]
  b = global_batches._fill_packed({"inputs": 5, "targets": 4}, 4, [[0, 1], [], [2]],
                                  RowLayout(None, 1), read)
  np.testing.assert_array_equal(b["inputs"], [[5, 6, 8, 0, 0], [0] * 5, [11, 12, 13, 0, 0], [0] * 5])
  np.testing.assert_array_equal(b["inputs_segmentation"],
                                [[1, 1, 2, 0, 0], [0] * 5, [1, 1, 1, 0, 0], [0] * 5])
  np.testing.assert_array_equal(b["inputs_position"],
                                [[0, 1, 0, 0, 0], [0] * 5, [0, 1, 2, 0, 0], [0] * 5])
  np.testing.assert_array_equal(b["targets"], [[7, 9, 10, 0], [0] * 4, [14, 0, 0, 0], [0] * 4])
  np.testing.assert_array_equal(b["targets_segmentation"],
                                [[1, 2, 2, 0], [0] * 4, [1, 0, 0, 0], [0] * 4])
  np.testing.assert_array_equal(b["targets_position"], [[0, 0, 1, 0], [0] * 4, [0, 0, 0, 0], [0] * 4])
  # the second of two processes (block layout: rows 2 and 3) fills only row 2
  half = global_batches._fill_packed({"inputs": 5, "targets": 4}, 4, [[0, 1], [], [2]],
                                     RowLayout.block(1, 2), read)
  np.testing.assert_array_equal(half["inputs"], [[0] * 5, [0] * 5, [11, 12, 13, 0, 0], [0] * 5])
  # the last packed row empty: nothing read past the examples
  tail = global_batches._fill_packed({"inputs": 5, "targets": 4}, 2, [[2], []],
                                     RowLayout(None, 1), read)
  np.testing.assert_array_equal(tail["inputs"], [[11, 12, 13, 0, 0], [0] * 5])
