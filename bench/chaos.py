"""A chaos run: one real ``txf train`` job under a requeue loop, meeting faults in sequence.

  python -m bench.chaos --short                     # 5 faults, one process (CI's end-to-end tier)
  TXF_DATA=../shared/data python -m bench.chaos     # 20 faults, a Multi30k job of 2 processes
  python -m bench.chaos --faults 12 --processes 2 --seed 3 --dir runs/chaos

The job is real: Multi30k en->de with packing, decoding and BLEU on (experiments/multi30k_en_de_tiny.py
made small, the long mode's default; it needs the shared data: ``TXF_DATA=../shared/data`` or
``--data``), or the copy task (experiments/copy.py, the short mode's); either logs every step,
keeps a checkpoint every 2 steps and evaluates with decoding every few steps, in one process or two (``parallelism=mesh``,
jax.distributed on 127.0.0.1, each process under txf's supervising parent as ``txf`` runs it). The
loop plays the scheduler (SLURM with ``--requeue``, a TPU queued resource): it starts the job with
``TXF_EXIT_RESUMABLE_ON_SIGNAL=1``, as launch/slurm.sbatch and launch/tpu_pod.sh do, and starts it
again whenever it ends with status 75 (``EXIT_RESUMABLE``) or by a signal; when one process of the
job has ended, the others get the heartbeat bound and 30 s, then are killed (``srun
--kill-on-bad-exit``). Any other status (1, 2) is a fault that needs a hand: the run stops there.

The faults come from a schedule drawn from ``--seed``: each at a step drawn in the run (sorted), of
a kind drawn so that every kind comes at least ``--faults // 8`` times (``--short``: five kinds
drawn from the eight), on a process drawn among the job's:

  kill          ``kill -9`` of the process (its whole session: a lost host)
  stop          ``kill -STOP`` (a hung host); with one process it is continued 2 s later, with two
                the other one ends (exit 75) and then it is continued (and ends, exit 75)
  term          SIGTERM to the process (a preemption notice)
  kill_in_save  ``kill -9`` while a checkpoint is being written (tests/faults.py makes the write
                wait 2 s and say so, from the fault's step on)
  kill_in_eval  ``kill -9`` during an in-loop evaluation (the same, tests/faults.py)
  truncate      ``kill -9``, and the latest checkpoint's largest file (with two processes: its meta
                item, which every process reads) cut to a third before the job starts again
  disk_full     the disk of the run fills (a file another tenant writes, on a 48 MiB tmpfs mounted
                for the run; skipped with the reason where it cannot be mounted), and is freed once
                the job has ended
  corrupt_cache an entry of the compilation cache cut to a third (one of jax's, and with one
                process a kept program too), each met at the next start that compiles its
                program (the start that prints the cache's one line; two entries may be met in
                two starts)

At the end ``metrics.jsonl`` (timings aside) and the final parameters are compared with the same job
run without faults (beside it with ``--short``, before it otherwise), and a table says: the faults
injected by kind, the restarts, the time lost (the wall time beyond the uninterrupted run's), the
most lines a process printed on stderr in one start against the faults that start met, and whether
the rows and the parameters are equal. Exit 0 when they are and no fault needed a hand.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List

import numpy as np

from bench.chaos_faults import ROOT, Attempt, inject, mount_tmpfs, truncate_latest

EXIT_RESUMABLE = 75  # txf.core.errors.EXIT_RESUMABLE, the status the launchers requeue on
KINDS = ("kill", "stop", "term", "kill_in_save", "kill_in_eval", "truncate", "disk_full",
         "corrupt_cache")
RESTARTS = {"kill", "term", "kill_in_save", "kill_in_eval", "truncate", "disk_full"}
HOOK_DELAY = "2"   # seconds a slowed checkpoint write or evaluation waits (tests/faults.py)
TIMING_KEYS = re.compile(r"seconds|per_second|_time")
CACHE_LINE = "txf: warning: compilation cache:"  # the one line a run prints for corrupt entries


def job_args(steps: int, processes: int, eval_every: int, task: str = "copy") -> List[str]:
  """The ``txf train`` flags of the job: ``task`` "copy" (experiments/copy.py, tiny) or "multi30k"
  (experiments/multi30k_en_de_tiny.py made small: 2+2 layers of width 32, a 1000-piece joint BPE
  trained at the first start, packed batches of 1,024 tokens, greedy decoding and BLEU at each
  evaluation); a checkpoint every 2 steps, the last 3 kept, a log line every step."""
  if task == "multi30k":
    args = ["train", "--config", os.path.join(ROOT, "experiments", "multi30k_en_de_tiny.py"),
            "--progress=false", "--config.model.d_model=32", "--config.model.num_heads=2",
            "--config.model.d_ff=64", "--config.model.num_encoder_layers=2",
            "--config.model.num_decoder_layers=2", "--config.data.vocab_size=1000",
            "--config.data.tokens_per_batch=1024", "--config.eval_batches=2",
            "--config.decode_examples=16", "--config.time_limit_minutes=0"]
  else:
    args = ["train", "--config", os.path.join(ROOT, "experiments", "copy.py"), "--progress=false",
            "--config.batch_size=8", "--config.model.d_model=16", "--config.model.d_ff=32",
            "--config.decode_examples=8"]
  args += ["--config.log_every=1", f"--config.eval_every={eval_every}",
           "--config.checkpoint_every=2", "--config.keep_checkpoints=3",
           "--config.num_samples=0", f"--config.num_train_steps={steps}"]
  return args + (["--config.parallelism=mesh"] if processes > 1 else [])


def schedule(seed: int, faults: int, steps: int, short: bool, kinds=KINDS) -> List[Dict]:
  """``faults`` faults: (kind, process 0 or 1, alternating for each kind, trigger step), sorted
  by step. Every kind comes ``faults // len(kinds)`` times at least (short: 5 kinds drawn)."""
  rng = random.Random(seed)
  if short:
    chosen = rng.sample(list(kinds), min(faults, len(kinds)))
    drawn = (chosen * faults)[:faults]
  else:
    drawn = list(kinds) * (faults // len(kinds))
    drawn += rng.sample(list(kinds), faults - len(drawn))
  rng.shuffle(drawn)
  # trigger steps: spread over the run, leaving room for the last evaluation
  triggers = sorted(rng.sample(range(3, steps - 3), faults))
  first = {kind: rng.randrange(2) for kind in kinds}  # then the other process, and so on
  seen: Dict[str, int] = {}
  plan = []
  for kind, step in zip(drawn, triggers):
    seen[kind] = seen.get(kind, 0) + 1
    plan.append({"kind": kind, "step": step, "process": (first[kind] + seen[kind] - 1) % 2})
  return plan


def rows(workdir: str) -> List[Dict]:
  """metrics.jsonl's rows without their timings."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    out = [json.loads(line) for line in f if line.strip()]
  return [{k: v for k, v in r.items() if not TIMING_KEYS.search(k)} for r in out]


def same_params(a: str, b: str) -> bool:
  """Whether the final parameters of workdirs ``a`` and ``b`` are equal, bit for bit."""
  import jax  # pylint: disable=import-outside-toplevel  # only at the end
  from txf.runtime import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  left = jax.tree_util.tree_leaves(workdir_lib.load_params(a))
  right = jax.tree_util.tree_leaves(workdir_lib.load_params(b))
  return len(left) == len(right) and all(
      np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(np.asarray(x), np.asarray(y))
      for x, y in zip(left, right))


def base_env(cache: str) -> Dict[str, str]:
  """The job's environment: a requeueing launcher's, the run's own compilation cache."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TXF_COMPILE_CACHE=cache,
             TXF_COMPILE_CACHE_MIN_SECS="0", TXF_EXIT_RESUMABLE_ON_SIGNAL="1",
             FAULT_QUIET_END="1", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3",
             TXF_MALLOC="system")
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
  for name in ("JAX_COMPILATION_CACHE_DIR", "TXF_COORDINATOR", "TXF_DISTRIBUTED"):
    env.pop(name, None)
  return env


def hooks_env(pending: List[Dict]) -> Dict[str, str]:
  """tests/faults.py's slowed (and announced) checkpoint writes and evaluations, from the step of
  the next pending kill_in_save / kill_in_eval fault on."""
  env = {}
  for kind, delay, start in (("kill_in_save", "FAULT_SAVE_DELAY_S", "FAULT_SAVE_FROM_STEP"),
                             ("kill_in_eval", "FAULT_EVAL_DELAY_S", "FAULT_EVAL_FROM_STEP")):
    steps = [f["step"] for f in pending if f["kind"] == kind]
    if steps:
      env.update({delay: HOOK_DELAY, start: str(min(steps))})
  return env


def ready(fault: Dict, attempt: Attempt) -> bool:
  """Whether ``fault`` is due in ``attempt``: the job has reached its step (a checkpoint write or
  an evaluation of that step or later has started, for those kinds)."""
  if fault["kind"] in ("kill_in_save", "kill_in_eval"):
    what = "slow save" if fault["kind"] == "kill_in_save" else "evaluation"
    return any(h == what and s >= fault["step"] for h, s in list(attempt.hooks))
  return attempt.step >= fault["step"]


def run_job(args, workdir: str, processes: int, env: Dict[str, str], plan: List[Dict],
            cache: str, disk: str, seed: int, timeout: float) -> Dict:
  """Runs the job under the requeue loop, injecting ``plan``'s faults in order; returns the starts
  (statuses, stderr lines, faults met), the faults injected, and whether it ended by itself."""
  pending, injected, starts = [dict(f) for f in plan], [], []
  rng, planted, began = random.Random(seed + 1), 0, time.time()
  caches = 0  # corrupt cache entries planted whose line has not been printed yet
  while True:
    attempt = Attempt(args, workdir, processes, {**env, **hooks_env(pending)})
    met, planted, fired, todo = planted, 0, 0, {}
    restarting = False
    while attempt.running() and time.time() - began < timeout:
      if pending and not restarting and ready(pending[0], attempt):
        fault = pending.pop(0)
        fault.update(at=max(attempt.step, fault["step"]), start=len(starts) + 1,
                     process=fault["process"] % processes)
        todo.update(inject(fault, attempt, processes, cache, disk, rng))
        injected.append(fault)
        fired += 1
        planted += fault["kind"] == "truncate"   # met by the next start, which restores
        # each entry cut (one of jax's, and with one process a kept program too) is met by the
        # first start that compiles its program, which may be another start for each
        caches += len(fault.get("cut") or []) if fault["kind"] == "corrupt_cache" else 0
        restarting = fault["kind"] in RESTARTS or "stopped" in todo
      time.sleep(0.05)
    if attempt.running():  # past the time allowed: ended, as a scheduler's time limit does
      for p in range(processes):
        attempt.signal(p, signal.SIGKILL)
    statuses = attempt.finish(todo.get("stopped"))
    if todo.get("free"):  # the other tenant frees the disk
      os.remove(todo["free"])
    for fault in injected:
      if fault["kind"] == "truncate" and "cut" not in fault:
        fault["cut"] = truncate_latest(workdir, processes)
    # a corrupt cache entry is met where its program is next compiled: the start that prints
    # the cache's line (one per start at most, however many entries it met), the next one or a
    # later one
    healed = caches > 0 and any(CACHE_LINE in line for lines in attempt.lines.values()
                                for line in lines)
    caches -= healed
    starts.append({"statuses": statuses, "allowed": fired + met + healed,
                   "lines": {p: list(v) for p, v in attempt.lines.items()},
                   "seconds": time.time() - attempt.started})
    done = all(s == 0 for s in statuses)
    hand = any(s > 0 and s != EXIT_RESUMABLE for s in statuses)
    if done or hand or time.time() - began >= timeout:
      return {"starts": starts, "injected": injected, "pending": pending,
              "seconds": time.time() - began, "ended": done}
    # requeued: every process ended with 75 or by a signal


def table(result: Dict, reference_s: float, rows_equal: bool, params_equal: bool,
          skipped: Dict[str, str]) -> str:
  """The report: faults by kind, restarts, time lost, stderr lines, equality."""
  out = [f"{'fault':<14} {'injected':>8}  at steps (process)"]
  for kind in KINDS:
    these = [f for f in result["injected"] if f["kind"] == kind]
    where = ", ".join(f"{f['at']} ({f['process']})" for f in these)
    note = f"  skipped: {skipped[kind]}" if kind in skipped else ""
    out.append(f"{kind:<14} {len(these):>8}  {where}{note}")
  starts = result["starts"]
  worst = max(((len(lines), s["allowed"], i + 1, p) for i, s in enumerate(starts)
               for p, lines in s["lines"].items()), default=(0, 0, 0, 0))
  over = [(i + 1, p, lines) for i, s in enumerate(starts) for p, lines in s["lines"].items()
          if len(lines) > s["allowed"]]
  out += [f"{'total':<14} {len(result['injected']):>8}",
          f"restarts: {len(starts) - 1}; statuses: " +
          " ".join("/".join(str(c) for c in s["statuses"]) for s in starts),
          f"wall time: {result['seconds']:.0f} s (uninterrupted: {reference_s:.0f} s; time lost: "
          f"{result['seconds'] - reference_s:.0f} s)",
          f"stderr: at most {worst[0]} line(s) from one process in one start; over one line per "
          f"fault met: {len(over)}" + (f" (start {over[0][0]}, process {over[0][1]}: "
                                       f"{over[0][2][:3]})" if over else ""),
          f"ended by itself: {'yes' if result['ended'] else 'no: ' + str(starts[-1]['lines'])}",
          f"metrics.jsonl rows equal (timings aside): {'yes' if rows_equal else 'NO'}",
          f"final parameters equal (bit for bit): {'yes' if params_equal else 'NO'}"]
  return "\n".join(out)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--short", action="store_true", help="5 faults, one process (CI)")
  parser.add_argument("--faults", type=int, default=None, help="faults (default 20; short 5)")
  parser.add_argument("--processes", type=int, choices=(1, 2), default=None,
                      help="processes of the job (default 2; short 1)")
  parser.add_argument("--steps", type=int, default=None, help="train steps (default 4 a fault + 16)")
  parser.add_argument("--seed", type=int, default=0, help="draws the schedule")
  parser.add_argument("--dir", default="", help="where the runs go (default: a temporary folder)")
  parser.add_argument("--task", choices=("copy", "multi30k"), default=None,
                      help="the job (default multi30k; short: copy)")
  parser.add_argument("--data", default=os.environ.get("TXF_DATA", ""),
                      help="the shared data folder for multi30k (default: $TXF_DATA)")
  parser.add_argument("--timeout", type=float, default=None,
                      help="seconds for the chaos run (default 3600; short 1800)")
  a = parser.parse_args(argv)
  faults = a.faults or (5 if a.short else 20)
  processes = a.processes or (1 if a.short else 2)
  steps = a.steps or (4 * faults + 16)
  task = a.task or ("copy" if a.short else "multi30k")
  a.timeout = a.timeout or (1800 if a.short else 3600)
  if task == "multi30k":
    found = os.path.join(a.data, "multi30k", "tok", "train.lc.norm.tok.en") if a.data else ""
    if not found or not os.path.isfile(found):
      print("txf: error: the Multi30k job needs the shared data: pass --data ../shared/data or set "
            "TXF_DATA (a folder with multi30k/tok/), or run --task copy", file=sys.stderr)
      return 2
  base = os.path.abspath(a.dir) if a.dir else tempfile.mkdtemp(prefix="txf-chaos-")
  os.makedirs(base, exist_ok=True)
  cache, disk = os.path.join(base, "cache"), os.path.join(base, "disk")
  for path in (os.path.join(base, "reference"), os.path.join(base, "run"), disk, cache):
    shutil.rmtree(path, ignore_errors=True)
  skipped, kinds = {}, list(KINDS)
  why = mount_tmpfs(disk)
  if why:
    skipped["disk_full"] = why
    kinds.remove("disk_full")
  workdir, reference = os.path.join(disk, "run"), os.path.join(base, "reference")
  plan = schedule(a.seed, faults, steps, a.short, kinds)
  args = job_args(steps, processes, eval_every=6 if a.short else 8, task=task)
  env = base_env(cache)
  if task == "multi30k":
    env["TXF_DATA"] = os.path.abspath(a.data)
  print(f"chaos: {processes} process(es), {task} task, {steps} steps, {faults} faults (seed "
        f"{a.seed}): " + ", ".join(f"{f['kind']}@{f['step']}" for f in plan), flush=True)
  try:
    ref: Dict = {}

    def uninterrupted():
      start = time.time()
      ref["result"] = run_job(args, reference, processes, env, [], cache, disk, a.seed, a.timeout)
      ref["seconds"] = time.time() - start

    if processes == 1 and a.short:  # beside the chaos run (a start's cold compile is shared)
      helper = threading.Thread(target=uninterrupted)
      helper.start()
    else:
      uninterrupted()
      helper = None
    result = run_job(args, workdir, processes, env, plan, cache, disk, a.seed, a.timeout)
    if helper is not None:
      helper.join()
    if not ref["result"]["ended"]:
      print("chaos: the uninterrupted run failed: " + str(ref["result"]["starts"][-1]["lines"]))
      return 1
    ended = result["ended"]
    rows_equal = ended and rows(workdir) == rows(reference)
    params_equal = ended and same_params(workdir, reference)
    if os.environ.get("CHAOS_DEBUG"):
      print(json.dumps({"starts": result["starts"], "injected": result["injected"]}, indent=1))
    print(table(result, ref["seconds"], rows_equal, params_equal, skipped), flush=True)
    return 0 if rows_equal and params_equal else 1
  finally:
    if a.dir and os.path.isdir(workdir):  # the chaos run's folder is kept beside the reference
      shutil.rmtree(os.path.join(base, "run"), ignore_errors=True)
      shutil.copytree(workdir, os.path.join(base, "run"), symlinks=True)
    if not why:
      subprocess.run(["umount", "-l", disk], capture_output=True)
    if not a.dir:
      shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
