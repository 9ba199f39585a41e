"""A failed background checkpoint write, raised at once when a run has several processes.

Orbax writes a checkpoint in a background thread. With several processes, when that write fails
on one process only (a full disk on one host), orbax keeps the error in its save thread; its
finalize thread then raises it and waits at a barrier which the other processes, still waiting at
the write's own barrier, never reach. Every process stays alive, waiting, until orbax's 20-minute
barrier timeout, while each main thread waits on its finalize thread. ``FailedSaves`` records the
error as the save thread ends and raises it in the main thread at the next wait, which ends the run
on every process with its one line; once it has raised, no wait blocks on that finalize thread
again. With one process it does nothing (orbax raises the error itself).
"""

from typing import List


class FailedSaves:
  """The failed background saves of ``manager`` (an ``orbax.checkpoint.CheckpointManager``),
  watched when ``enabled`` (several processes). Nothing is watched where orbax's save thread is
  not found (another orbax version): the waits are then orbax's own."""

  def __init__(self, manager, enabled: bool):
    self._manager = manager
    self._failed: List[BaseException] = []
    self.failed_before = False  # a failure was raised: its finalize thread may never end
    self.enabled = enabled and self._watch()

  def _watch(self) -> bool:
    async_manager = getattr(getattr(self._manager, "_checkpointer", None), "_async_manager", None)
    run = getattr(async_manager, "_thread_func", None)
    if run is None:
      return False

    def thread_func(*args, **kwargs):
      run(*args, **kwargs)
      error = getattr(async_manager, "_exception", None)
      if error is not None and not getattr(async_manager, "_cancel_requested", False):
        self._failed.append(error)

    async_manager._thread_func = thread_func  # pylint: disable=protected-access
    return True

  def wait(self) -> None:
    """Wait for the save in flight, raising its error as soon as this process's background write
    has failed; return at once after a failure was raised (its finalize thread may never end)."""
    if not self.enabled:
      return
    holder = getattr(self._manager, "_finalize_thread", None)
    while True:
      if self._failed:
        self.failed_before = True
        raise self._failed.pop(0)
      thread = holder.get() if holder is not None else None
      if self.failed_before or thread is None or not thread.is_alive():
        return
      thread.join(0.1)
