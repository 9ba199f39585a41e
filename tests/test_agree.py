"""txf.runtime.agree: cross-process agreement.

- one process: every function answers at once with this process's own value (no collective);
  the bytes path (JSON text in int32 words) round-trips large and non-ASCII objects;
- two real processes (jax.distributed on 127.0.0.1, gloo, started by launch/local.py as a user
  would): gather_json of objects of different sizes (over 4 KB, unicode), broadcast from process 0,
  any_true when only one process sets its flag, max_int, the lagged step vote, a barrier; and the
  callers over it: ``distributed.main_first`` (a result; a TxfError on process 0 raised whole on
  both) and ``global_batches.example_lengths`` (the lengths; a bad record on process 1 raised on
  both with its message).
"""

import inspect
import json
import os
import sys

import jax
import numpy as np
import pytest

from tests.test_multiprocess import _launch
from txf.runtime import agree


def _big(seed: int, chars: int) -> dict:
  """A JSON object of about ``chars`` characters, non-ASCII among them."""
  return {"seed": seed, "text": ("ünïcödé → 翻訳 😀 " * (chars // 14 + 1))[:chars],
          "numbers": list(range(seed, seed + 50)), "nested": {"a": [1.5, None, True, "x"]}}


def test_one_process_answers_with_its_own_value_without_a_collective(monkeypatch):
  assert jax.process_count() == 1
  monkeypatch.setattr(agree.multihost_utils, "process_allgather", None)  # any collective would fail
  monkeypatch.setattr(agree.multihost_utils, "broadcast_one_to_all", None)
  monkeypatch.setattr(agree.multihost_utils, "sync_global_devices", None)
  obj = _big(3, 10_000)
  gathered = agree.gather_json(obj)
  assert gathered == [obj] and gathered[0] is obj
  assert agree.broadcast_json(obj) is obj
  assert agree.any_true(True) is True and agree.any_true(False) is False
  assert agree.any_true(1) is True and agree.any_true(0) is False
  assert agree.max_int(7) == 7 and agree.max_int(-2) == -2
  agree.barrier("nothing to wait for")
  arrays = agree.gather_arrays({"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.int32(4)})
  assert arrays["a"].shape == (1, 2, 3) and arrays["b"].shape == (1,)
  np.testing.assert_array_equal(arrays["a"][0], np.arange(6).reshape(2, 3))
  vote = agree.LaggedMax()
  assert not vote.multi and [vote.vote(v) for v in (0, 3, 0)] == [0, 3, 0]  # no lag with one


@pytest.mark.parametrize("obj", [None, "", 0, [], {}, "é", _big(1, 5_000), _big(2, 70_000),
                                 ["\u0000 nul", "tab\t", "\U0010ffff"], {"k": 1e300, "n": -1}])
def test_the_bytes_path_round_trips_any_size_and_unicode(obj):
  """What goes between processes: UTF-8 JSON text packed in int32 words, padded to a power of two
  (at least 64 words), and read back from its size."""
  data = agree._encode(obj)
  words = agree._words(len(data))
  assert words >= max(64, len(data) / 4) and words & (words - 1) == 0
  packed = agree._pack(data, words)
  assert packed.dtype == np.int32 and packed.shape == (words,)
  assert agree._decode(agree._unpack(packed, len(data))) == obj


def test_buffer_sizes_are_few():
  """Sizes share buffers: one compile per power of two, not one per message length."""
  assert {agree._words(n) for n in range(0, 257)} == {64}
  assert {agree._words(n) for n in range(257, 513)} == {128}
  assert agree._words(4097) == 2048


WORKER = inspect.getsource(_big) + r"""
import json, sys
import numpy as np
from txf.parallel import distributed
distributed.maybe_initialize()
import jax
from txf.runtime import agree
from txf.data import global_batches
from txf.data.base import DataError
from txf.core.errors import TxfError

p = jax.process_index()
out = {"process": p, "count": jax.process_count()}
out["gathered"] = agree.gather_json(_big(p, [9_000, 300][p]))   # different sizes, one over 4 KB
out["broadcast"] = agree.broadcast_json(_big(10 + p, 6_000) if p == 0 else None)
out["any_1"] = agree.any_true(p == 1)                             # only process 1 sets it
out["any_0"] = agree.any_true(p == 0)
out["any_none"] = agree.any_true(False)
out["max"] = agree.max_int([5, -3][p])
vote = agree.LaggedMax()
out["votes"] = [vote.vote(v) for v in ([0, 7, 0, 0] if p == 1 else [0, 0, 2, 0])]
agree.barrier("txf_test_agree")
out["main_first"] = distributed.main_first(lambda: 41 + 1, "the test")
long = "process 0's own words: " + "é" * 5_000 + " (the end)"
def refuse():
  raise TxfError(long)
try:
  distributed.main_first(refuse, "the test")
except TxfError as e:
  out["main_first_error"] = [type(e).__name__, str(e) == long, len(str(e))]
lengths_of = lambda idx: np.stack([np.asarray(idx), 2 * np.asarray(idx)], axis=1)
out["lengths"] = global_batches.example_lengths(7, lengths_of, 2, "train").tolist()
def bad_on_1(idx):
  if p == 1:
    raise DataError("record 3 is not UTF-8: " + "x" * 3_000)
  return lengths_of(idx)
try:
  global_batches.example_lengths(7, bad_on_1, 2, "train")
except DataError as e:
  out["lengths_error"] = str(e)
import os
with open(os.path.join(os.environ["RESULT_DIR"], f"{p}.json"), "w") as f:  # a file: a line over
  json.dump(out, f)  # the pipe's 64 KiB can be split by another thread's line on the same pipe
"""


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_two_processes_agree_over_loopback(tmp_path):
  status, out, seconds = _launch(2, 1, [sys.executable, "-c", WORKER], timeout=90, kill_after=10,
                                 env={"RESULT_DIR": str(tmp_path)})
  assert status == 0, out[-5000:]
  results = {}
  for name in os.listdir(tmp_path):
    with open(tmp_path / name) as f:
      result = json.load(f)
    results[result["process"]] = result
  assert sorted(results) == [0, 1], out[-5000:]
  every = [_big(0, 9_000), _big(1, 300)]
  bad = "record 3 is not UTF-8: " + "x" * 3_000 + " (process 1, train)"
  for p, r in results.items():
    assert r["count"] == 2
    assert r["gathered"] == every
    assert r["broadcast"] == _big(10, 6_000)
    assert (r["any_1"], r["any_0"], r["any_none"]) == (True, True, False)
    assert r["max"] == 5
    assert r["votes"] == [0, 0, 7, 2]   # each step's max, one step late, alike on both
    assert r["main_first"] == 42
    assert r["main_first_error"] == ["TxfError", True, len("process 0's own words: ") + 5_010]
    assert r["lengths"] == [[i, 2 * i] for i in range(7)]
    assert r["lengths_error"] == bad  # whole, though over the old 2,048-byte buffer
  assert seconds < 60, seconds
