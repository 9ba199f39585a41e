"""The faults of a chaos run (bench/chaos.py) and the job they meet: one start of a txf training
job of one or two processes (each in its own session, as a host), and what is done to it: signals,
a checkpoint cut short, a compilation-cache entry cut short, a disk filled by another tenant."""

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEARTBEAT = 5      # TXF_HEARTBEAT_TIMEOUT of a job of two processes, seconds
HOOK_LINE = re.compile(r"^(\d+): (slow save|evaluation) started$")


class Attempt:
  """One start of the job: its processes (each in its own session), the step process 0 last
  logged, the stderr lines of each process, the hook lines (slow save / evaluation started)."""

  def __init__(self, args: List[str], workdir: str, processes: int, env: Dict[str, str]):
    self.step, self.hooks, self.procs = 0, [], []
    self.lines: Dict[int, List[str]] = {p: [] for p in range(processes)}
    self.started = time.time()
    port = _free_port()
    for p in range(processes):
      penv = dict(env)
      if processes > 1:
        penv.update(TXF_COORDINATOR=f"127.0.0.1:{port}", TXF_NUM_PROCESSES=str(processes),
                    TXF_PROCESS_ID=str(p), TXF_HEARTBEAT_TIMEOUT=str(HEARTBEAT),
                    JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo", FAULT_SUPERVISED="1")
      proc = subprocess.Popen([sys.executable, "-m", "tests.faults", *args, "--workdir", workdir],
                              env=penv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
      threading.Thread(target=self._stdout, args=(proc.stdout,), daemon=True).start()
      threading.Thread(target=self._stderr, args=(p, proc.stderr), daemon=True).start()
      self.procs.append(proc)

  def _stdout(self, stream) -> None:
    for line in stream:
      found = re.match(r"step (\d+)/", line)
      if found:
        self.step = max(self.step, int(found.group(1)))

  def _stderr(self, p: int, stream) -> None:
    for line in stream:
      line = line.rstrip("\n")
      hook = HOOK_LINE.match(line)
      if hook:
        self.hooks.append((hook.group(2), int(hook.group(1))))
      elif line.strip():
        self.lines[p].append(line)

  def signal(self, p: int, signum: int, group: bool = True) -> None:
    try:
      if group:
        os.killpg(self.procs[p].pid, signum)
      else:
        self.procs[p].send_signal(signum)
    except OSError:
      pass

  def running(self) -> bool:
    return all(proc.poll() is None for proc in self.procs)

  def finish(self, stopped: Optional[int]) -> List[int]:
    """Waits for every process: once one has ended, the others get the heartbeat bound and 30 s
    (a stopped one is continued first, once the rest have ended), then are killed."""
    while self.running():
      time.sleep(0.1)
    deadline = time.time() + HEARTBEAT + 30
    for p, proc in enumerate(self.procs):
      if p == stopped:
        continue
      _wait(proc, deadline)
    if stopped is not None:
      self.signal(stopped, signal.SIGCONT)
      _wait(self.procs[stopped], time.time() + 60)
    time.sleep(0.3)  # the readers' last lines
    return [proc.returncode for proc in self.procs]


def _wait(proc, deadline: float) -> None:
  try:
    proc.wait(timeout=max(0.1, deadline - time.time()))
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)  # the scheduler ends the job's remaining processes
    proc.wait()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _cut(path: str) -> None:
  """Cuts the file at ``path`` to a third of its size (at least a byte shorter)."""
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.truncate(min(size - 1, size // 3))


def latest_checkpoint(workdir: str) -> Optional[str]:
  path = os.path.join(workdir, "checkpoints")
  steps = sorted(int(n) for n in os.listdir(path) if n.isdigit()) if os.path.isdir(path) else []
  return os.path.join(path, str(steps[-1])) if steps else None


def truncate_latest(workdir: str, processes: int) -> str:
  """Cuts a file of the latest checkpoint (see the module docstring); returns its path or ''."""
  step_dir = latest_checkpoint(workdir)
  files = []
  for root, _, names in os.walk(step_dir or os.devnull):
    files += [os.path.join(root, n) for n in names if os.path.getsize(os.path.join(root, n)) > 1]
  if processes > 1:
    files = [f for f in files if os.sep + "meta" + os.sep in f]
  if not files:
    return ""
  target = max(files, key=os.path.getsize)
  _cut(target)
  return target


def corrupt_cache(cache: str, rng: random.Random, processes: int) -> List[str]:
  """Cuts one of jax's entries (and with one process one kept program) to a third."""
  cut = []
  for pattern in ("-cache",) + ((".program",) if processes == 1 else ()):
    found = sorted(os.path.join(root, n) for root, _, names in os.walk(cache) for n in names
                   if n.endswith(pattern) and os.path.getsize(os.path.join(root, n)) > 1)
    if found:
      cut.append(rng.choice(found))
      _cut(cut[-1])
  return cut


def fill(disk: str) -> str:
  """Fills the file system of ``disk`` with one file (as another tenant would); returns it."""
  path = os.path.join(disk, "another-tenant")
  with open(path, "wb", buffering=0) as f:
    for chunk in (1 << 20, 1 << 12, 1):
      try:
        while True:
          f.write(b"\0" * chunk)
      except OSError:
        pass
  return path


def mount_tmpfs(path: str, mib: int = 48) -> str:
  """Mounts a ``mib`` MiB tmpfs at ``path``; '' when done, else why not."""
  os.makedirs(path, exist_ok=True)
  try:
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", path],
                       capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"cannot mount a tmpfs ({e})"
  return "" if r.returncode == 0 else f"cannot mount a tmpfs ({(r.stderr or 'not root').strip()})"


def inject(fault: Dict, attempt: Attempt, processes: int, cache: str, disk: str,
           rng: random.Random) -> Dict:
  """Injects ``fault`` into ``attempt``; returns what to do once the attempt has ended."""
  kind, p = fault["kind"], fault["process"]
  todo = {}
  if kind in ("kill", "kill_in_save", "kill_in_eval", "truncate"):
    attempt.signal(p, signal.SIGKILL)
  elif kind == "term":
    attempt.signal(p, signal.SIGTERM, group=False)  # to the launcher's process: it passes it on
  elif kind == "stop":
    attempt.signal(p, signal.SIGSTOP)
    if processes == 1:
      time.sleep(2.0)
      attempt.signal(p, signal.SIGCONT)
    else:
      todo["stopped"] = p
  elif kind == "disk_full":
    todo["free"] = fill(disk)
  elif kind == "corrupt_cache":
    fault["cut"] = corrupt_cache(cache, rng, processes)
  return todo
