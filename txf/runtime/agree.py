"""Cross-process agreement: every process of a job calls the same function at the same point of
its program and gets the same answer back.

With several processes (``jax.distributed``) each function is one or two small collectives over
all of the job's devices (``jax.experimental.multihost_utils``); every process must call them in
the same order, as it does its other collectives. With one process each returns its own answer at
once, with no collective, no compile and no copy (``gather_json(x) == [x]``, ``x`` itself).

  gather_json(obj)     [obj of process 0, obj of process 1, ...]: small JSON-able objects of any
                       size (the sizes are gathered first, then the bytes padded to the largest)
  broadcast_json(obj)  process 0's obj on every process (its size first, then its bytes)
  gather_arrays(tree)  a pytree of numpy arrays, each the same shape on every process, stacked:
                       a new leading axis of one entry per process
  any_true(flag)       whether any process's flag is set
  max_int(value)       the largest of the processes' ints
  barrier(name)        returns once every process has reached it
  LaggedMax            a vote every step that never waits: ``vote(value)`` starts this step's
                       max over processes and returns the previous step's (train/stopping.py)

Text of any length travels whole: there is no fixed message buffer to cut an error message short.
Objects go as ``json.dumps`` text (UTF-8), so what comes back from another process is what JSON
gives back (tuples as lists, keys as strings).

Where it lives: here, below both ``txf.data`` and ``txf.parallel`` in the layers of pyproject.toml
(``machine | agree``), because its callers sit on both sides of that row and on rows above it:
data's length index (``data.global_batches.example_lengths``), parallel's set-up barrier
(``parallel.distributed.main_first``), the checkpoints' per-process data positions
(``checkpoint``) and training's stop votes (``train.stopping``). ``data`` and ``parallel`` are
siblings that may not import each other, so a module inside ``txf.parallel`` would be out of
data's reach. It imports jax and numpy only, no txf module.
"""

import json
from typing import Any, List

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

_MIN_WORDS = 64   # buffers are whole powers of two of int32 words from here: few distinct compiles


def _encode(obj: Any) -> bytes:
  return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def _decode(data: bytes) -> Any:
  return json.loads(data.decode("utf-8"))


def _words(size: int) -> int:
  """int32 words of a buffer that holds ``size`` bytes: the next power of two, at least
  _MIN_WORDS (a collective compiles once per shape; these few shapes compile once a run)."""
  need = max(-(-size // 4), _MIN_WORDS)
  return 1 << (need - 1).bit_length()


def _pack(data: bytes, words: int) -> np.ndarray:
  """``data`` in an int32 [words] buffer, zero padded (bytes ride in int32 words: every backend
  sums and gathers int32)."""
  buffer = np.zeros(4 * words, np.uint8)
  buffer[:len(data)] = np.frombuffer(data, np.uint8)
  return buffer.view(np.int32)


def _unpack(buffer: np.ndarray, size: int) -> bytes:
  return np.ascontiguousarray(buffer, np.int32).view(np.uint8)[:size].tobytes()


def gather_json(obj: Any) -> List[Any]:
  """``[obj of process 0, obj of process 1, ...]`` on every process; ``[obj]`` with one process.

  ``obj``: anything ``json.dumps`` takes, of any size (each process's may differ). Two
  collectives: the sizes, then every process's bytes padded to the largest."""
  if jax.process_count() == 1:
    return [obj]
  data = _encode(obj)
  sizes = np.asarray(multihost_utils.process_allgather(np.int32(len(data)))).reshape(-1)
  every = np.asarray(multihost_utils.process_allgather(_pack(data, _words(int(sizes.max())))))
  return [_decode(_unpack(every[i], int(n))) for i, n in enumerate(sizes)]


def broadcast_json(obj: Any) -> Any:
  """Process 0's ``obj`` on every process (what the others pass is ignored; pass None); ``obj``
  itself with one process. Two collectives: the size, then the bytes."""
  if jax.process_count() == 1:
    return obj
  data = _encode(obj) if jax.process_index() == 0 else b""
  size = int(multihost_utils.broadcast_one_to_all(np.int32(len(data))))
  out = multihost_utils.broadcast_one_to_all(_pack(data, _words(size)))
  return _decode(_unpack(np.asarray(out), size))


def gather_arrays(tree: Any) -> Any:
  """``tree`` (numpy arrays, each of the same shape and dtype on every process) with every leaf
  stacked over the processes: shape [process_count, ...], row p from process p. One collective;
  with one process, each leaf with a leading axis of 1 (no copy across devices)."""
  if jax.process_count() == 1:
    return jax.tree.map(lambda x: np.expand_dims(np.asarray(x), 0), tree)
  return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree))


def max_int(value: int) -> int:
  """The largest of every process's ``value`` (an int32), the same on every process."""
  if jax.process_count() == 1:
    return int(value)
  return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def any_true(flag: bool) -> bool:
  """Whether any process's ``flag`` is set, the same on every process; ``flag`` with one."""
  if jax.process_count() == 1:
    return bool(flag)
  return max_int(int(bool(flag))) > 0


def barrier(name: str) -> None:
  """Return once every process has called ``barrier(name)`` (the same name everywhere; a
  different one is an error). Nothing with one process."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


class LaggedMax:
  """A max over processes voted once per step, which the host never waits for.

  ``vote(value)`` starts this step's all-reduce (the max over processes of ``value``, a jitted
  reduction over one int per device) and returns the outcome of the previous call's vote, which
  the devices have long finished: every process gets the same answer from the same call, one call
  late (0 from the first). Every process calls it once per step, in the same order as its other
  collectives. With one process ``vote(value)`` returns ``value`` itself, at once.
  """

  def __init__(self):
    self.multi = jax.process_count() > 1
    self.pending = None
    if self.multi:
      mesh = Mesh(np.array(jax.devices()), ("processes",))
      self.sharding = NamedSharding(mesh, PartitionSpec("processes"))
      self._max = jax.jit(lambda values: values.max(),
                          out_shardings=NamedSharding(mesh, PartitionSpec()))

  def vote(self, value: int) -> int:
    """``value``: this process's int32 for this step; returns the previous vote's max over
    processes (0 for the first vote), the same on every process."""
    if not self.multi:
      return int(value)
    previous = self.pending
    local = np.full((jax.local_device_count(),), int(value), np.int32)
    values = jax.make_array_from_process_local_data(self.sharding, local, (jax.device_count(),))
    self.pending = self._max(values)
    return 0 if previous is None else int(np.asarray(previous.addressable_data(0)))
