"""A sweep's ledger: one JSON line per complete run, a small file that outlives the runs' workdirs.

A study of many runs may take several sittings on machines whose disks do not last (a preemptible
VM, a scratch folder wiped between jobs). ``txf sweep SWEEP_FILE --ledger FILE`` appends a record
to FILE as each run completes, and records the complete runs it finds on disk; a run whose record
is in FILE counts as complete and is not trained again, even where its workdir is gone. The report
(``txf sweep report ... --ledger FILE``) reads a recorded run's metrics from its record. Kept under
version control beside the sweep file, a ledger carries a study from one machine to the next.

A record is matched to a run by its **identity**: the sha256 of the experiment file's contents,
the run's overrides (the sweep's and its arm's, the steps among them) and its seed, i.e. what the
sweep asks ``txf train`` to run. A change to txf itself does not change it (as a complete workdir
is not trained again after one); the record names the commit, the CPU and the jax it ran with.

A record: {"format", "sweep", "arm", "seed", "steps", "identity", "rows" (metrics.jsonl, a step
logged twice kept once), "config" (the run's config.json), "params" ({"sha256", "count",
"non_embedding"} of the final parameters), "seconds" (the run's time, None for one found complete),
"cpu", "cores" (the CPUs the sweep's processes may run on), "jax", "commit", "recorded" (UTC)}.

XLA:CPU sizes its thread pool by the cores a process sees when it starts, and splits some sums by
it: a run reproduces its record bit for bit with the same number of cores (on another CPU model
too), and drifts by summation order with another.
"""

import functools
import hashlib
import json
import os
import subprocess
import time
from typing import Any, Dict, List, Optional, Tuple

import jax
import numpy as np
from flax import serialization

from txf.models.build import count_params
from txf.runtime import machine, workdir as workdir_lib
from txf.sweep.grid import Run, Sweep, SweepError

FORMAT = 1
KEYS = ("format", "sweep", "arm", "seed", "steps", "identity", "rows")
# the vocabulary and position tables, outside the non-embedding count N of the scaling fits
VOCABULARY_TABLES = ("embedding", "pos_embedding", "token_type_embedding", "logits_kernel")


def read_rows(workdir: str) -> List[Dict]:
  """The rows of ``workdir/metrics.jsonl`` ([] if absent); a line cut short by a kill is skipped."""
  path = workdir_lib.path_of(workdir, workdir_lib.METRICS_FILE)
  if not os.path.isfile(path):
    return []
  rows = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except ValueError:
        continue
  return rows


def non_embedding_params(tree) -> int:
  """Scalars in a parameter tree (nested dicts of arrays) outside ``VOCABULARY_TABLES``."""
  if isinstance(tree, dict):
    return sum(non_embedding_params(v) for k, v in tree.items() if k not in VOCABULARY_TABLES)
  return int(np.asarray(tree).size)


def identity(sweep: Sweep, run: Run) -> str:
  """sha256 (hex) of what ``run`` trains: the experiment file's bytes, its overrides, its seed."""
  with open(sweep.config, "rb") as f:
    experiment = hashlib.sha256(f.read()).hexdigest()
  what = {"experiment": experiment, "overrides": {**sweep.overrides, **sweep.arms[run.arm]},
          "seed": run.seed}
  return hashlib.sha256(json.dumps(what, sort_keys=True, default=repr).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def _commit() -> str:
  """The git commit of this txf's checkout (+dirty with uncommitted changes), else 'unknown'."""
  here = os.path.dirname(os.path.abspath(__file__))
  try:
    head = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  return head + ("+dirty" if dirty else "")


def _final_params(workdir: str) -> Dict[str, Any]:
  """{"sha256", "count", "non_embedding"} of a run's params.msgpack ({} for sharded params/)."""
  path = workdir_lib.path_of(workdir, workdir_lib.PARAMS_FILE)
  if not os.path.isfile(path):
    return {}
  with open(path, "rb") as f:
    data = f.read()
  tree = serialization.msgpack_restore(data) if data else {}
  return {"sha256": hashlib.sha256(data).hexdigest(), "count": count_params(tree),
          "non_embedding": non_embedding_params(tree)}


def _unique_rows(rows: List[Dict]) -> List[Dict]:
  """``rows`` with a (split, step) logged twice (a resumed run re-logs) kept once, its last."""
  last = {}
  for r in rows:
    last[(r.get("split"), r.get("step"))] = r
  return list(last.values())


def load(path: str) -> Dict[str, Dict]:
  """The records of the ledger ``path`` by identity ({} where there is no file yet). A last line
  cut short (no newline: a kill while writing) is skipped; any other line that is not a record is a
  SweepError naming it."""
  if not os.path.exists(path):
    return {}
  records = {}
  with open(path, encoding="utf-8") as f:
    lines = f.readlines()
  for n, line in enumerate(lines, 1):
    if not line.strip() or (n == len(lines) and not line.endswith("\n")):
      continue
    try:
      record = json.loads(line)
      missing = [k for k in KEYS if k not in record] if isinstance(record, dict) else list(KEYS)
    except ValueError:
      record, missing = None, None
    if record is None or missing:
      what = f"lacks {', '.join(missing)}" if missing else "is not JSON"
      raise SweepError(f"{path}:{n}: the line {what}, so it is not a ledger record: restore the file "
                       f"(e.g. git checkout {path}) or delete the line (its run is trained again)")
    records[record["identity"]] = record
  return records


class Ledger:
  """The ledger file ``path`` of ``sweep``: which runs it records, and a record added per run."""

  def __init__(self, path: str, sweep: Sweep):
    self.path = path
    self.sweep = sweep
    self.identities = {run.index: identity(sweep, run) for run in sweep.runs}
    self.records = load(path)

  def get(self, run: Run) -> Optional[Dict]:
    """The record of ``run``, None if it has none."""
    return self.records.get(self.identities[run.index])

  def add(self, run: Run, seconds: Optional[float]) -> Dict:
    """Record the complete run ``run`` (from its workdir) and append the record to the file in one
    write; returns it."""
    config_path = workdir_lib.path_of(run.workdir, workdir_lib.CONFIG_FILE)
    config = None
    if os.path.isfile(config_path):
      with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    record = {"format": FORMAT, "sweep": self.sweep.name, "arm": run.arm, "seed": run.seed,
              "steps": run.steps, "identity": self.identities[run.index],
              "rows": _unique_rows(read_rows(run.workdir)), "config": config,
              "params": _final_params(run.workdir),
              "seconds": None if seconds is None else round(float(seconds), 1),
              "cpu": machine.cpu_model_and_flags()[0], "cores": machine.usable_cores(),
              "jax": jax.__version__, "commit": _commit(),
              "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")
      f.flush()
      os.fsync(f.fileno())
    self.records[record["identity"]] = record
    return record


_OPENED: Dict[Tuple[int, str, float], Ledger] = {}   # (id of the sweep, path, mtime) -> its Ledger


def of(sweep: Sweep) -> Optional[Ledger]:
  """The ledger named by ``sweep.ledger`` (None without one), read once per change of the file."""
  if not sweep.ledger:
    return None
  mtime = os.path.getmtime(sweep.ledger) if os.path.exists(sweep.ledger) else -1.0
  key = (id(sweep), sweep.ledger, mtime)
  if key not in _OPENED:
    _OPENED.clear()
    _OPENED[key] = Ledger(sweep.ledger, sweep)
  return _OPENED[key]


def record_of(sweep: Sweep, run: Run) -> Optional[Dict]:
  """``run``'s record in the sweep's ledger, None without a ledger or a record."""
  ledger = of(sweep)
  return ledger.get(run) if ledger else None


def size_of(sweep: Sweep, run: Run) -> Tuple[Optional[int], Optional[Dict]]:
  """(non-embedding parameters, config) of a complete ``run`` from its workdir, else its record;
  (None, None) where neither has them."""
  final = _final_params(run.workdir)
  config = workdir_lib.path_of(run.workdir, workdir_lib.CONFIG_FILE)
  if final and os.path.isfile(config):
    with open(config, encoding="utf-8") as f:
      return final["non_embedding"], json.load(f)
  record = record_of(sweep, run)
  if record and record.get("params", {}).get("non_embedding") is not None and record.get("config"):
    return int(record["params"]["non_embedding"]), record["config"]
  return None, None


def compared(sweep: Sweep) -> List[Tuple[Run, Dict, bool]]:
  """(run, its record, whether its final parameters on disk have the record's sha256) for each
  run that is both complete on disk and recorded: a study run again, checked bit for bit."""
  out = []
  for run in sweep.runs:
    record = record_of(sweep, run)
    on_disk = os.path.isfile(workdir_lib.path_of(run.workdir, workdir_lib.PARAMS_FILE))
    if record and on_disk and record.get("params", {}).get("sha256"):
      out.append((run, record, _final_params(run.workdir)["sha256"] == record["params"]["sha256"]))
  return out

