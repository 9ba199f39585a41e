"""A sweep file read, checked and expanded into runs: arms x seeds, each a ``txf train`` command.

A sweep file is a Python file whose ``get_sweep()`` returns a dict, or a JSON or TOML file holding
the same dict (see docs/sweeps.md):

  config     the base experiment (a path, or the name of an experiment shipped with txf)
  overrides  {field: value} applied to every arm (dotted fields of txf/core/config.py)
  arms       {name: {field: value}}: named override sets, one arm each
  grid       {field: [values]}: the Cartesian product of the lists, one arm per combination
             (give arms or grid, not both)
  seeds      a count K (seeds 0..K-1) or a list of seeds; each arm runs once per seed
  baseline   the arm the others are compared with (default: the first)
  metric     what is compared: SPLIT/KEY of metrics.jsonl rows, e.g. eval/loss, eval/bleu
  metrics    more than one: a list of SPLIT/KEY, each compared in the report (the first is the
             metric, unless metric is given too; then metric comes first)
  reference  published differences to the baseline, {arm: {SPLIT/KEY: delta, "params": N,
             "row": label}} with "_source" naming where they come from: the report puts them
             beside the sweep's own differences (txf.sweep.reference)
  mode       final (the value at the last step) | min | max (the best over the run)
  steps      num_train_steps of every run (default: the experiment's); the same as
             overrides {"num_train_steps": N}
  name       the sweep's name (default: the file's name); the root defaults to runs/sweeps/<name>

Every arm's config is built here as ``txf train`` would build it (the experiment, then the
overrides, the seed and the steps) and checked with ``txf.core.config.validate`` before anything runs.
"""

import ast
import dataclasses
import difflib
import itertools
import json
import os
import re
import tomllib
from typing import Any, Dict, List, Optional

import ml_collections

from txf.core import config as config_lib
from txf.train import tables
from txf.core.errors import TxfError

SPEC_FIELDS = ("config", "overrides", "arms", "grid", "seeds", "baseline", "metric", "mode", "steps",
               "name", "metrics", "reference")
MODES = ("final", "min", "max")
METRIC_SPLITS = ("eval", "train")   # the ``split`` of the metrics.jsonl rows a metric is read from
SWEEP_FILE = "sweep.json"            # the expanded sweep, written under the root: what `report` reads
_ARM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=,+-]*$")


class SweepError(TxfError):
  """A sweep file or a sweep command line that cannot run; the message names the fix."""


@dataclasses.dataclass
class Run:
  """One training run of a sweep: an arm at a seed, in ``root/<arm>/seed-<seed>/``."""
  index: int                        # position in the sweep (the SLURM array index)
  arm: str
  seed: int
  workdir: str                      # root/<arm>/seed-<seed>: a plain `txf train` workdir
  log: str                          # root/<arm>/seed-<seed>.log: the run's output (beside the workdir)
  steps: int                        # num_train_steps of the run: reached = finished
  args: List[str]                   # `txf train` arguments after "train"

  @property
  def label(self) -> str:
    return f"{self.arm}/seed-{self.seed}"


@dataclasses.dataclass
class Sweep:
  """A checked sweep: the experiment, its arms (name -> overrides, in order), the seeds, what is
  compared, and the runs under ``root``."""
  name: str
  config: str                       # the experiment file
  overrides: Dict[str, Any]         # every arm
  arms: Dict[str, Dict[str, Any]]   # arm -> its own overrides
  seeds: List[int]
  baseline: str
  metric: str                       # SPLIT/KEY
  mode: str                         # final | min | max
  steps: Optional[int]              # the file's steps (in overrides as num_train_steps)
  root: str = ""
  runs: List[Run] = dataclasses.field(default_factory=list)
  metrics: List[str] = dataclasses.field(default_factory=list)   # every metric compared (metric first)
  reference: Dict[str, Any] = dataclasses.field(default_factory=dict)  # published deltas, per arm
  ledger: str = ""                  # a file recording the complete runs (txf.sweep.ledger), or ""

  @property
  def compared(self) -> List[str]:
    """The metrics the report compares: ``metric``, then the other ``metrics`` (a sweep.json
    written before ``metrics`` existed compares its one metric)."""
    return [self.metric] + [m for m in self.metrics if m != self.metric]

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "Sweep":
    runs = [Run(**r) for r in d.get("runs", [])]
    return cls(**{**d, "runs": runs})


def read_spec(path: str) -> Dict[str, Any]:
  """The dict a sweep file holds: ``get_sweep()`` of a .py file, a .json object, a .toml table."""
  if not os.path.isfile(path):
    raise SweepError(f"no sweep file {path}: give the path of a .py (get_sweep()), .json or .toml "
                     f"sweep file (docs/sweeps.md)")
  ext = os.path.splitext(path)[1].lower()
  try:
    if ext == ".py":
      namespace: Dict[str, Any] = {"__file__": os.path.abspath(path), "__name__": "_txf_sweep"}
      with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), namespace)  # pylint: disable=exec-used
      if "get_sweep" not in namespace:
        raise SweepError(f"the sweep file {path} has no get_sweep(): define get_sweep() returning the "
                         f"sweep's dict (docs/sweeps.md)")
      spec = namespace["get_sweep"]()
    elif ext == ".json":
      with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    elif ext == ".toml":
      with open(path, "rb") as f:
        spec = tomllib.load(f)
    else:
      raise SweepError(f"the sweep file {path} is not .py, .json or .toml")
  except (SyntaxError, ValueError) as e:  # JSONDecodeError and TOMLDecodeError are ValueErrors
    raise SweepError(f"the sweep file {path} does not parse: {e}") from e
  if not isinstance(spec, dict):
    raise SweepError(f"the sweep file {path} gives a {type(spec).__name__}, not a dict")
  return spec


def parse_value(field: str, text: str) -> Any:
  """A ``--set FIELD=TEXT`` value as the type of the field's default in ``base_config()``."""
  default = _flat_defaults().get(field)
  if isinstance(default, bool):
    low = text.strip().lower()
    if low not in ("true", "false", "1", "0", "yes", "no"):
      raise SweepError(f"--set {field}={text}: give true or false")
    return low in ("true", "1", "yes")
  try:
    if isinstance(default, int):
      return int(text)
    if isinstance(default, float):
      return float(text)
    if isinstance(default, (tuple, list)):
      return tuple(ast.literal_eval(text))
  except (ValueError, SyntaxError) as e:
    raise SweepError(f"--set {field}={text}: not a {type(default).__name__} ({e})") from e
  return text


def parse_sets(items: List[str]) -> Dict[str, Any]:
  """``["model.d_ff=512", ...]`` as {field: typed value} (the sweep command's ``--set`` flags)."""
  out = {}
  for item in items:
    if "=" not in item:
      raise SweepError(f"--set {item}: write FIELD=VALUE, e.g. --set model.d_ff=512")
    field, text = item.split("=", 1)
    check_field(field.strip(), "--set")
    out[field.strip()] = parse_value(field.strip(), text)
  return out


def check_field(field: str, where: str) -> None:
  """SweepError unless ``field`` is a dotted field of ``base_config()`` (and not the seed)."""
  known = config_lib.field_names()
  if field == "seed":
    raise SweepError(f"{where} sets seed: the sweep's seeds give each run its seed (use seeds)")
  if field not in known:
    close = difflib.get_close_matches(field, known, n=1)
    hint = f"did you mean {close[0]}?" if close else "see txf/core/config.py for the fields"
    raise SweepError(f"unknown config field '{field}' in {where}: {hint}")


def arg_value(value: Any) -> str:
  """How ``--config.FIELD=`` writes ``value`` for ml_collections' parser (bools lower-case)."""
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, (list, tuple)):
    return str(tuple(value))
  return str(value)


def _value_name(value: Any) -> str:
  return re.sub(r"[^A-Za-z0-9_.+-]", "_", arg_value(value).replace(" ", ""))


def grid_arms(grid: Dict[str, List[Any]]) -> Dict[str, Dict[str, Any]]:
  """The arms of a grid: one per combination of the lists' values (the first field varying slowest),
  named ``leaf=value,leaf=value`` (the full dotted field where two fields share a leaf name).

  E.g. {"model.d_model": [32, 64], "model.norm": ["layer_norm", "rms_norm"]} gives 4 arms,
  "d_model=32,norm=layer_norm", "d_model=32,norm=rms_norm", "d_model=64,norm=layer_norm", ...
  """
  fields = list(grid)
  for f in fields:
    if not isinstance(grid[f], (list, tuple)) or not grid[f]:
      raise SweepError(f"grid field {f}: give a non-empty list of values, e.g. [32, 64]")
  leaves = [f.rsplit(".", 1)[-1] for f in fields]
  short = [leaf if leaves.count(leaf) == 1 else f for f, leaf in zip(fields, leaves)]
  arms = {}
  for combo in itertools.product(*(grid[f] for f in fields)):
    name = ",".join(f"{s}={_value_name(v)}" for s, v in zip(short, combo))
    if name in arms:
      raise SweepError(f"two grid combinations are both named {name!r}: make the values distinct")
    arms[name] = dict(zip(fields, combo))
  return arms


def _flat_defaults() -> Dict[str, Any]:
  return config_lib._flatten(config_lib.base_config())  # pylint: disable=protected-access


def _set(config: ml_collections.ConfigDict, field: str, value: Any, where: str) -> None:
  *parents, leaf = field.split(".")
  node = config
  for p in parents:
    node = node[p]
  try:
    node[leaf] = tuple(value) if isinstance(value, list) else value
  except (TypeError, ValueError, KeyError) as e:
    raise SweepError(f"{where}: {field}={value!r} does not fit the field "
                     f"(default {_flat_defaults().get(field)!r}): {e}") from e


def _resolve_experiment(spec_config: str, spec_dir: str) -> str:
  """The experiment file: as given from the working directory, a shipped experiment's name, or a
  path relative to the sweep file's folder."""
  try:
    return config_lib.experiment_path(spec_config)
  except config_lib.ConfigError as first:
    beside = os.path.join(spec_dir, spec_config)
    if os.path.isfile(beside):
      return beside
    raise SweepError(f"config: {first}") from first


def build_config(sweep: Sweep, arm: str, seed: int) -> ml_collections.ConfigDict:
  """The config of one run, as ``txf train`` builds it from the sweep's arguments: the
  experiment's ``get_config()``, the sweep's overrides (its steps among them), the arm's, the
  seed; a cooldown longer than the shortened run is scaled as the train command scales it
  (txf.core.config.fit_cooldown)."""
  config = config_lib.load_experiment(sweep.config)
  original = config.num_train_steps
  merged = {**sweep.overrides, **sweep.arms[arm]}
  for field, value in merged.items():
    _set(config, field, value, f"arm {arm!r}")
  config.seed = seed
  if "optimizer.cooldown_steps" not in merged:
    config_lib.fit_cooldown(config, original)
  return config


def train_args(sweep: Sweep, arm: str, seed: int, workdir: str) -> List[str]:
  """The ``txf train`` arguments (after ``train``) of one run."""
  args = ["--config", sweep.config, "--workdir", workdir, "--progress=false"]
  merged = {**sweep.overrides, **sweep.arms[arm]}
  args += [f"--config.{f}={arg_value(v)}" for f, v in merged.items()]
  args.append(f"--config.seed={seed}")
  return args


def load_sweep(path: str, root: Optional[str] = None, sets: Optional[Dict[str, Any]] = None) -> Sweep:
  """Read, check and expand the sweep file ``path``: every arm's config is built and validated,
  the runs listed under ``root`` (default runs/sweeps/<name>). ``sets`` are the command line's
  overrides, over the file's ``overrides``. Raises SweepError (one line) on the first problem."""
  spec = read_spec(path)
  unknown = sorted(set(spec) - set(SPEC_FIELDS))
  if unknown:
    raise SweepError(f"{path}: unknown sweep field(s) {', '.join(unknown)}: the fields are "
                     f"{', '.join(SPEC_FIELDS)}")
  if ("arms" in spec) == ("grid" in spec):
    raise SweepError(f"{path}: give either arms (named override sets) or grid (lists of values), "
                     f"{'not both' if 'arms' in spec else 'one of them'}")
  overrides = dict(spec.get("overrides", {}) or {})
  for field in overrides:
    check_field(field, "overrides")
  steps = spec.get("steps")
  if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0):
    raise SweepError(f"{path}: steps={steps!r} must be a positive number of steps")
  if steps:
    overrides["num_train_steps"] = steps
  overrides.update(sets or {})  # the command line's --set last: over the file's steps and overrides
  if "arms" in spec:
    if not isinstance(spec["arms"], dict) or not spec["arms"]:
      raise SweepError(f"{path}: arms must be a non-empty dict of name -> {{field: value}}")
    arms = {str(k): dict(v or {}) for k, v in spec["arms"].items()}
  else:
    if not isinstance(spec["grid"], dict) or not spec["grid"]:
      raise SweepError(f"{path}: grid must be a non-empty dict of field -> [values]")
    arms = grid_arms(spec["grid"])
  for name, fields in arms.items():
    if not _ARM_NAME.match(name):
      raise SweepError(f"arm name {name!r}: use letters, digits and _ . = , + - (it names a folder)")
    for field in fields:
      check_field(field, f"arm {name!r}")
  seeds = spec.get("seeds", 1)
  seeds = list(range(seeds)) if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds
  if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
      or not all(isinstance(s, int) and s >= 0 for s in seeds)):
    raise SweepError(f"{path}: seeds must be a count >= 1 or a list of distinct seeds >= 0, "
                     f"not {spec.get('seeds')!r}")
  baseline = spec.get("baseline", next(iter(arms)))
  if baseline not in arms:
    raise SweepError(f"unknown baseline arm {baseline!r}: the arms are {', '.join(arms)}")
  listed = spec.get("metrics", [])
  if not isinstance(listed, (list, tuple)) or not all(isinstance(m, str) for m in listed):
    raise SweepError(f"{path}: metrics must be a list of SPLIT/KEY names, e.g. "
                     f"[\"eval/bleu\", \"eval/perplexity\"]")
  metric = spec.get("metric", listed[0] if listed else "eval/loss")
  mode = spec.get("mode", "final")
  if mode not in MODES:
    raise SweepError(f"{path}: mode={mode!r} is not one of {', '.join(MODES)}")
  name = str(spec.get("name") or os.path.splitext(os.path.basename(path))[0])
  experiment = _resolve_experiment(str(spec.get("config", "default")),
                                   os.path.dirname(os.path.abspath(path)))
  sweep = Sweep(name, experiment, overrides, arms, seeds, baseline, str(metric), mode, steps)
  sweep.metrics = [sweep.metric] + [m for m in listed if m != sweep.metric] if listed else []
  sweep.reference = check_reference(spec.get("reference", {}) or {}, arms, sweep.compared, path)
  sweep.root = root or os.path.join("runs", "sweeps", name)
  if "://" in sweep.root:
    raise SweepError(f"--root {sweep.root}: a sweep's root is a local (or shared) folder")
  for arm in arms:
    try:
      config = build_config(sweep, arm, seeds[0])
      tables.validate(config)
    except config_lib.ConfigError as e:
      raise SweepError(f"arm {arm!r}: {e}") from e
    for metric in sweep.compared:
      check_metric(metric, config)
    for seed in seeds:
      workdir = os.path.join(sweep.root, arm, f"seed-{seed}")
      sweep.runs.append(Run(len(sweep.runs), arm, seed, workdir, workdir + ".log",
                            int(config.num_train_steps), train_args(sweep, arm, seed, workdir)))
  return sweep


def check_metric(metric: str, config: ml_collections.ConfigDict) -> None:
  """SweepError unless ``metric`` is SPLIT/KEY with a split txf logs, and, for eval, a key that
  this config's evaluations log (txf.core.config.eval_metrics)."""
  split, _, key = metric.partition("/")
  if split not in METRIC_SPLITS or not key:
    raise SweepError(f"metric {metric!r}: write SPLIT/KEY with SPLIT one of {', '.join(METRIC_SPLITS)}, "
                     f"e.g. eval/loss or eval/bleu")
  if split == "eval":
    logged = config_lib.eval_metrics(config)
    if key not in logged:
      raise SweepError(f"metric {metric!r} is never logged by this sweep's runs: their evaluations "
                       f"log {', '.join('eval/' + k for k in logged)}")


def check_reference(reference: Any, arms: Dict[str, Dict[str, Any]], metrics: List[str],
                    path: str) -> Dict[str, Any]:
  """The sweep file's ``reference``, checked: a dict of arm -> {metric: delta (a number or None),
  "params": a count or None, "row": a label}, every arm one of the sweep's, every metric one it
  compares; "_source" (a string) says where the numbers come from."""
  if not isinstance(reference, dict):
    raise SweepError(f"{path}: reference must be a dict of arm -> {{metric: delta}}")
  for arm, entry in reference.items():
    if arm == "_source":
      if not isinstance(entry, str):
        raise SweepError(f"{path}: reference _source must be a string naming the numbers' source")
      continue
    if arm not in arms:
      raise SweepError(f"{path}: reference names arm {arm!r}, which the sweep does not have (its "
                       f"arms: {', '.join(arms)})")
    if not isinstance(entry, dict):
      raise SweepError(f"{path}: reference[{arm!r}] must be a dict of metric -> delta")
    for key, value in entry.items():
      if key == "row":
        continue
      if key != "params" and key not in metrics:
        raise SweepError(f"{path}: reference[{arm!r}] gives {key!r}, not a compared metric (the "
                         f"sweep compares {', '.join(metrics)}; add it to metrics) nor params/row")
      if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise SweepError(f"{path}: reference[{arm!r}][{key!r}] = {value!r} must be a number or None")
  return dict(reference)


def write_sweep(sweep: Sweep) -> str:
  """Write the expanded sweep to ``root/sweep.json`` (what ``txf sweep report ROOT`` reads)."""
  os.makedirs(sweep.root, exist_ok=True)
  path = os.path.join(sweep.root, SWEEP_FILE)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(sweep.to_dict(), f, indent=2)
  os.replace(tmp, path)
  return path


def read_sweep(root: str) -> Sweep:
  """The sweep written under ``root`` by ``txf sweep`` (its sweep.json)."""
  path = os.path.join(root, SWEEP_FILE)
  if not os.path.isfile(path):
    raise SweepError(f"{root} holds no sweep (no {SWEEP_FILE}): run `txf sweep SWEEP_FILE --root "
                     f"{root}` (or --emit) first")
  with open(path, encoding="utf-8") as f:
    sweep = Sweep.from_dict(json.load(f))
  return rebased(sweep, root)


def rebased(sweep: Sweep, root: str) -> Sweep:
  """``sweep`` with its root, and every run's workdir and log under it, moved to ``root``: a sweep
  folder read from another directory than the one it ran from, or moved or copied (off a
  cluster), is read where it now is, not where it was written."""
  old = sweep.root or root

  def move(path: str) -> str:
    return os.path.normpath(os.path.join(root, os.path.relpath(path, old))) if path else path

  runs = [dataclasses.replace(run, workdir=move(run.workdir), log=move(run.log)) for run in sweep.runs]
  return dataclasses.replace(sweep, root=root, runs=runs)
