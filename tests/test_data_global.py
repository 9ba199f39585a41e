"""Global batches (txf/data/global_batches.py) as P processes see them, without starting processes:
each "process" is an iterator with its own RowLayout. Every process forms the same batch shapes;
the rows they fill add up to the one-process batch; a data position saved by one count resumes on
another; packed data refuses another count with a clear error."""

import numpy as np
import pytest

from txf.data.base import RowLayout
from txf.data.base import DataError

from test_data_fixtures import parallel_dir, plain_dir, tsv_dir
from test_data_pipeline import MODES, _task

GLOBAL_MODES = [m for m in sorted(MODES) if m != "packing"]


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


@pytest.mark.parametrize("mode", ["bucketing_tokens", "classification", "lm_stream", "plain"])
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


def test_packed_data_saved_by_two_processes_names_the_count_it_resumes_on(dirs):
  kind, data = MODES["packing"]
  task = _task(dirs, kind, **data)
  two = task.train_iterator(8, 0, 1, 2)
  next(two)
  one = task.train_iterator(8, 0)
  with pytest.raises(DataError, match=r"saved by 2 process\(es\).*resumes only on that count, "
                                       r"not on 1: run it on 2 process"):
    one.set_state(two.get_state())
  batch = next(task.train_iterator(8, 0, 1, 2))
  assert batch["inputs"].shape[0] == 8 and not batch["inputs"][:4].any()  # process 1: rows 4..7
