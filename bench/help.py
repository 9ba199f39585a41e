"""How fast a command answers without running: ``txf CMD --help`` and a refused flag against ``txf --help``.

  python -m bench.help                          # every command's --help and `train --nosuchflag`, 5 rounds
  python -m bench.help --commands train --repeats 9

Each measurement is a fresh ``python -m txf.cli ...`` process of this checkout, timed from its start
to its exit (wall seconds, ``time.perf_counter``) and by the CPU seconds it used (user + system,
``resource.RUSAGE_CHILDREN``). Rounds alternate the reference ``txf --help`` with each command line,
so a load that comes and goes hits both; cells are medians over the rounds, and ``ratio`` is a
command line's median over the reference's (wall, and CPU in brackets). txf.cli answers these from
txf.commands.declared without importing the command's module (and jax): the ratios stay near 1.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Sequence, Tuple

from txf.commands.declared import COMMANDS as DECLARED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = ("--help",)
COMMANDS = tuple(DECLARED)  # every command txf declares (txf.commands.declared: no jax imported)


def timed(args: Sequence[str], env: Dict[str, str]) -> Tuple[float, float]:
  """(wall seconds, CPU seconds) of one ``python -m txf.cli ARGS`` process; its exit status is
  not checked (a refused flag exits 2), but a traceback stops the benchmark."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", "txf.cli", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if "Traceback" in proc.stderr:
    raise RuntimeError(f"txf {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
  return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def sitting(lines: List[Tuple[str, ...]], repeats: int) -> Dict[Tuple[str, ...], List[Tuple[float, float]]]:
  """{command line: [(wall, cpu)] per round} for the reference and each line, alternating."""
  env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
         "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)}
  timed(REFERENCE, env)  # one unmeasured start: the file cache warm for every measured one
  times = {line: [] for line in [REFERENCE] + lines}
  for _ in range(repeats):
    for line in [REFERENCE] + lines:
      times[line].append(timed(line, env))
  return times


def table(times: Dict[Tuple[str, ...], List[Tuple[float, float]]]) -> str:
  """One row per command line: median wall and CPU seconds, and their ratio to ``txf --help``."""
  ref_wall = statistics.median(w for w, _ in times[REFERENCE])
  ref_cpu = statistics.median(c for _, c in times[REFERENCE])
  rows = [f"{'command line':<32} {'wall s':>7} {'cpu s':>7}  ratio (cpu)"]
  for line, runs in times.items():
    wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
    rows.append(f"{'txf ' + ' '.join(line):<32} {wall:7.3f} {cpu:7.3f}  {wall / ref_wall:5.2f}x "
                f"({cpu / ref_cpu:.2f}x)")
  return "\n".join(rows)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--commands", default=",".join(COMMANDS),
                      help="commands whose --help is timed (comma-separated)")
  parser.add_argument("--repeats", type=int, default=5, help="rounds; cells are their medians")
  parser.add_argument("--no-refusal", dest="refusal", action="store_false",
                      help="leave out `txf train --nosuchflag` (a mistyped flag, refused)")
  args = parser.parse_args(argv)
  names = [c for c in args.commands.split(",") if c]
  unknown = [c for c in names if c not in COMMANDS]
  if unknown or args.repeats < 1:
    parser.error(f"unknown command(s) {unknown}: choose from {', '.join(COMMANDS)}" if unknown
                 else "--repeats must be >= 1")
  lines = [(name, "--help") for name in names] + ([("train", "--nosuchflag")] if args.refusal else [])
  print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
        f"{args.repeats} rounds", flush=True)
  print(table(sitting(lines, args.repeats)))


if __name__ == "__main__":
  main()
