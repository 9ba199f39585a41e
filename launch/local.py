#!/usr/bin/env python3
"""Start N processes on this machine, each with M fake CPU devices, as one jax.distributed job.

For testing multi-host code paths on one CPU machine: the processes find each other over
127.0.0.1 (a free port), and use gloo CPU collectives. Each gets the TXF_COORDINATOR /
TXF_NUM_PROCESSES / TXF_PROCESS_ID variables that txf.parallel.distributed reads, and
XLA_FLAGS=--xla_force_host_platform_device_count=M.

Usage (run from the repository root):
  python launch/local.py --processes 2 --devices 2 -- \\
      txf train --config experiments/default.py --config.parallelism=mesh --workdir runs/local2x2
  python launch/local.py -n 2 -d 4 --timeout 600 -- python my_script.py

Output lines are prefixed with the process index ("[0] ...", "[1] ..."); gloo's connection lines
("[Gloo] Rank 0 is connected to ...") are left out unless --verbose. When a process fails,
the others are given --kill-after seconds to stop on their own (they do: jax.distributed's
heartbeat timeout, --heartbeat, ends them with an error), then are terminated. The exit status
is that of the first process to fail (0 if all succeed; 124 after --timeout). However the
launcher ends (--timeout, Ctrl-C, SIGTERM or SIGHUP to it, an error), it ends the whole process
group of every child (SIGTERM, then SIGKILL after 5 s); if the launcher itself is killed with
SIGKILL, the kernel sends each child SIGKILL (Linux: PR_SET_PDEATHSIG).
"""

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional


def free_port() -> int:
  """A TCP port on 127.0.0.1 that was free a moment ago."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_env(index: int, processes: int, devices: int, port: int,
                heartbeat: Optional[int], base: Optional[dict] = None) -> dict:
  """The environment of process ``index``: coordinator, ids, M fake CPU devices, gloo."""
  env = dict(os.environ if base is None else base)
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", "")).strip()
  env.update(TXF_COORDINATOR=f"127.0.0.1:{port}", TXF_NUM_PROCESSES=str(processes),
             TXF_PROCESS_ID=str(index), JAX_PLATFORMS="cpu",
             JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo", PYTHONUNBUFFERED="1",
             XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={devices}".strip())
  if heartbeat:
    env["TXF_HEARTBEAT_TIMEOUT"] = str(heartbeat)
  return env


_GLOO_LINE = re.compile(r"^\[Gloo\] ")


def _forward(stream, index: int, out, verbose: bool = False) -> None:
  for line in iter(stream.readline, b""):
    text = line.decode(errors="replace")
    if not verbose and _GLOO_LINE.match(text):
      continue
    out.write(f"[{index}] {text}")
    out.flush()


def _die_with_parent() -> None:
  """In the child before exec: SIGKILL when the launcher dies (Linux prctl; elsewhere nothing)."""
  try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
  except (OSError, AttributeError):
    pass


class _Stopped(Exception):
  """SIGTERM / SIGHUP reached the launcher."""


def _stop(procs: List[subprocess.Popen], grace: float = 5.0) -> None:
  """SIGTERM the live processes (their process groups), then SIGKILL what is left after ``grace``."""
  for p in procs:
    if p.poll() is None:
      try:
        os.killpg(p.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass
  deadline = time.time() + grace
  for p in procs:
    try:
      p.wait(max(0.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
      try:
        os.killpg(p.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      p.wait()


def launch(command: List[str], processes: int, devices: int, timeout: float = 0,
           kill_after: float = 30.0, heartbeat: Optional[int] = None, port: int = 0,
           out=sys.stdout, verbose: bool = False) -> int:
  """Run ``command`` as ``processes`` jax processes; returns the exit status (see the module doc)."""
  port = port or free_port()
  procs: List[subprocess.Popen] = []
  main_thread = threading.current_thread() is threading.main_thread()
  previous = {}
  if main_thread:
    def stopped(signum, frame):
      raise _Stopped(signum)
    for s in (signal.SIGTERM, signal.SIGHUP):
      previous[s] = signal.signal(s, stopped)
  try:
    return _run(command, processes, devices, timeout, kill_after, heartbeat, port, out, verbose,
                procs)
  except KeyboardInterrupt:
    out.write("[launch] interrupted: terminating all processes\n")
    return 130
  except _Stopped as e:
    signum = e.args[0]
    out.write(f"[launch] {signal.Signals(signum).name}: terminating all processes\n")
    return 128 + signum
  finally:
    _stop(procs)  # whatever ended the launcher: no child outlives it
    for s, handler in previous.items():
      signal.signal(s, handler)
    out.flush()


def _run(command, processes, devices, timeout, kill_after, heartbeat, port, out, verbose,
         procs) -> int:
  for i in range(processes):
    procs.append(subprocess.Popen(command, env=process_env(i, processes, devices, port, heartbeat),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True, preexec_fn=_die_with_parent))
  threads = [threading.Thread(target=_forward, args=(p.stdout, i, out, verbose), daemon=True)
             for i, p in enumerate(procs)]
  for t in threads:
    t.start()
  start, failed_at, status = time.time(), None, 0
  while [p.poll() for p in procs].count(None):  # poll every process (no short-circuit)
    for i, p in enumerate(procs):
      if p.returncode not in (None, 0) and failed_at is None:
        failed_at, status = time.time(), p.returncode if p.returncode > 0 else 128 - p.returncode
        out.write(f"[launch] process {i} exited with status {p.returncode}; the others have "
                  f"{kill_after:g}s to stop\n")
    if failed_at is not None and time.time() - failed_at > kill_after:
      out.write("[launch] terminating the remaining processes\n")
      _stop(procs)
      break
    if timeout and time.time() - start > timeout:
      out.write(f"[launch] timeout after {timeout:g}s: terminating all processes\n")
      _stop(procs)
      return 124
    time.sleep(0.2)
  for t in threads:
    t.join(timeout=5)
  for i, p in enumerate(procs):
    out.write(f"[launch] process {i} exit status {p.returncode}\n")
    if status == 0 and p.returncode != 0:
      status = p.returncode if p.returncode > 0 else 128 - p.returncode
  out.flush()
  return status


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   usage="%(prog)s [-n N] [-d M] [options] -- COMMAND ...")
  parser.add_argument("-n", "--processes", type=int, default=2, help="processes (default 2)")
  parser.add_argument("-d", "--devices", type=int, default=2, help="fake CPU devices per process (default 2)")
  parser.add_argument("--timeout", type=float, default=0, help="seconds before everything is stopped (0 = none)")
  parser.add_argument("--kill-after", type=float, default=30.0,
                      help="seconds the others get to exit after one fails (default 30)")
  parser.add_argument("--heartbeat", type=int, default=None,
                      help="TXF_HEARTBEAT_TIMEOUT: seconds until a silent process counts as lost (txf default 30)")
  parser.add_argument("--port", type=int, default=0, help="coordinator port (default: a free one)")
  parser.add_argument("--verbose", action="store_true", help="also print gloo's connection lines")
  parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every process runs")
  args = parser.parse_args(argv)
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  if not command:
    parser.error("give the command after --, e.g. -- txf train --config experiments/default.py")
  return launch(command, args.processes, args.devices, args.timeout, args.kill_after,
                args.heartbeat, args.port, verbose=args.verbose)


if __name__ == "__main__":
  sys.exit(main())
