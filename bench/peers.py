"""txf against its peers (Flax WMT example, PyTorch eager, HF Marian), interleaved in one sitting.

  python -m bench.peers --harness ../shared/bench-peers --peers_venv /work/peers-venv \\
      --flaxwmt /work/flaxwmt --configs small,base --repeats 3 --output runs/peers.json

Every measurement is a fresh process, run one after another in the order A B C D A B C D ...
(txf, flax-wmt, torch-eager, marian; per config, ``--repeats`` rounds), all with the same
allocator in ``LD_PRELOAD`` (tcmalloc when installed, as ``txf bench`` runs). The peers are the
harness scripts of ``--harness`` (``bench_flax.py``, ``bench_torch.py``; they print JSON lines) run
by the Python of ``--peers_venv``, which holds torch, transformers, jax and flax: txf itself never
imports torch. txf's own rows come from this module run as a worker (``--worker``, in txf's
Python; bench.peer_worker): the real train step (txf.train.steps, dropout 0.1, label smoothing 0.1, Adam) on the
same shapes, and cached greedy / beam-4 decoding of 16 random sources of 32 tokens, 32 output
tokens (EOS never emitted), one call = encoder + cache + search, as the flax peer times it.

Table cells are medians over the rounds of each process's median; ratios = txf / the best peer
(higher is better for tokens/s, so > 1 means txf is ahead). The JSON output holds every record.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Dict, Iterable, List, Optional, Sequence

from txf.core.errors import TxfError
from bench.peer_worker import worker
from txf.runtime.process import find_tcmalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: txf/ and bench/

SYSTEMS = ("txf", "flax-wmt", "torch-eager", "marian")
PEERS = SYSTEMS[1:]
# Variants, measured for the record beside the float32 rows (train only): txf with the peers'
# attention-weight dropout (0.1; HF Marian's placement), txf with bfloat16 compute
# (model.dtype=bfloat16, float32 parameters), and PyTorch eager under bf16 autocast; the old code
# (--before_tree) in float32 and with bfloat16 compute.
VARIANTS = ("txf-attn-dropout", "txf-bf16", "torch-bf16", "txf-before", "txf-bf16-before")
BEFORE = "txf-before"  # txf's worker run from another source tree (--before_tree): the old code
BEFORE_BF16 = "txf-bf16-before"  # the same with bfloat16 compute, beside txf-bf16
OLD_CODE = (BEFORE, BEFORE_BF16)
BF16_PAIR = ("txf-bf16", "torch-bf16")
TXF_FLAGS = {"txf": [], "txf-attn-dropout": ["--attention_dropout", "0.1", "--nodecode"],
             "txf-bf16": ["--dtype", "bfloat16", "--nodecode"]}
# torch-eager's harness run inside torch.autocast("cpu", bfloat16) (matmuls in bf16, weights and
# optimizer in float32), its records renamed; txf itself never imports torch.
_TORCH_AUTOCAST = ("import runpy, sys, torch; path = sys.argv[1]; sys.argv = sys.argv[1:]; "
                   "torch.autocast('cpu', dtype=torch.bfloat16).__enter__(); "
                   "runpy.run_path(path, run_name='__main__')")
CONFIGS = ("small", "base", "transformer_tiny")
# Configs the peers' harness does not know, in its own size keys: a wrapper adds them to the
# harness script's CONFIGS table before its main() runs. Transformer-Tiny is
# experiments/multi30k_en_de_tiny.py's model and batch (bench.train.BENCH_CONFIGS["transformer_tiny"]:
# one 8k table for both languages, 64 rows x 64 tokens a side); the harness keeps its dropout 0.1
# where txf's tiny row draws 0.3, the same work per step.
HARNESS_EXTRA = {"transformer_tiny": dict(V=8000, d=128, f=256, h=4, L=4, B=64, S=64, T=64)}
_WITH_CONFIG = ("import importlib.util, json, sys; path, extra = sys.argv[1], json.loads(sys.argv[2]); "
                "sys.argv = [path] + sys.argv[3:]; {prelude}"
                "spec = importlib.util.spec_from_file_location('txf_peer_harness', path); "
                "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; "
                "spec.loader.exec_module(m); m.CONFIGS.update(extra); m.main()")


def cpu_model() -> str:
  """The CPU's model name and whether it has AVX512-BF16 (from /proc/cpuinfo)."""
  try:
    with open("/proc/cpuinfo") as f:
      text = f.read()
  except OSError:
    return "unknown CPU"
  name = next((line.split(":", 1)[1].strip() for line in text.splitlines()
               if line.startswith("model name")), "unknown CPU")
  return f"{name}, {os.cpu_count()} cores, avx512_bf16 {'yes' if 'avx512_bf16' in text else 'no'}"


# ---------------------------------------------------------------- the pure part: records -> table


def summarize(records: Iterable[dict]) -> Dict[tuple, Dict[str, float]]:
  """Medians per (config, system) over the rounds: records are the JSON lines of every process.

  Returns {(config, system): {"step_s", "tok_s", "first_s", "beam_tok_s", "greedy_tok_s",
  "beam_bf16_tok_s", "cores", "rounds"}} (absent keys: not measured; "cores": the process's
  CPU-seconds / wall-seconds, 2.0 = both cores of this machine busy throughout). A train record has phase "train", ``step_s.median`` and
  ``tokens_per_s.median``; a decode record phase "decode", ``out_tokens_per_s.median`` and
  ``method`` ("beam" when missing, as the peers' decode is beam 4; "greedy"; "beam-bf16": beam 4
  with bfloat16 weights).
  """
  cells: Dict[tuple, Dict[str, List[float]]] = {}
  for r in records:
    if "peer" not in r or "phase" not in r:
      continue
    c = cells.setdefault((r["config"], r["peer"]), {})
    if r["phase"] == "train":
      c.setdefault("step_s", []).append(r["step_s"]["median"])
      c.setdefault("tok_s", []).append(r["tokens_per_s"]["median"])
      if r.get("first_step_s") is not None:
        c.setdefault("first_s", []).append(r["first_step_s"])
      if r.get("process_wall_s"):  # one train record per process: its CPU-s per wall-second
        c.setdefault("cores", []).append(r["process_cpu_s"] / r["process_wall_s"])
    elif r["phase"] == "decode":
      key = {"greedy": "greedy_tok_s", "beam-bf16": "beam_bf16_tok_s"}.get(r.get("method"),
                                                                          "beam_tok_s")
      c.setdefault(key, []).append(r["out_tokens_per_s"]["median"])
  out = {}
  for key, c in cells.items():
    out[key] = {k: statistics.median(v) for k, v in c.items()}
    out[key]["rounds"] = max(len(v) for v in c.values())
  return out


def ratios(cells: Dict[tuple, Dict[str, float]], system: str = "txf") -> Dict[str, Dict[str, float]]:
  """Per config: {"train": txf tok/s / best peer tok/s, "beam": ..., "first_step": best peer's
  first step s / txf's (> 1: txf compiles faster), "vs_train"/"vs_beam": the best peer's name}."""
  out: Dict[str, Dict[str, float]] = {}
  for config in dict.fromkeys(k[0] for k in cells):
    mine = cells.get((config, system), {})
    peers = {s: c for (cfg, s), c in cells.items()
             if cfg == config and s != system and s not in VARIANTS}
    row: Dict[str, float] = {}
    for name, field in (("train", "tok_s"), ("beam", "beam_tok_s")):
      have = {s: c[field] for s, c in peers.items() if field in c}
      if field in mine and have:
        best = max(have, key=have.get)
        row[name], row[f"vs_{name}"] = mine[field] / have[best], best
    firsts = {s: c["first_s"] for s, c in peers.items() if "first_s" in c and s == "flax-wmt"}
    if "first_s" in mine and firsts:
      row["first_step"] = firsts["flax-wmt"] / mine["first_s"]
    out[config] = row
  return out


def _f(value: Optional[float], fmt: str) -> str:
  return "-" if value is None else format(value, fmt)


def table_from_file(path: str) -> str:
  """The table of a JSON file written by this script (also a partial one)."""
  with open(path) as f:
    return format_table(summarize(json.load(f)["records"]))


def format_table(cells: Dict[tuple, Dict[str, float]], system: str = "txf") -> str:
  """The issue's markdown table (train step s, target tok/s, first step s, beam-4 and greedy
  decode tok/s, cores used per config and system) and one line of ratios per config."""
  lines = ["| config | system | train step s | target tok/s | first step s | beam-4 decode tok/s "
           "| greedy decode tok/s | beam-4, bf16 weights | cores used |", "|---|---|---|---|---|---|---|---|---|"]
  order = {s: i for i, s in enumerate(SYSTEMS + VARIANTS)}
  configs = list(dict.fromkeys(k[0] for k in cells))
  configs.sort(key=lambda c: CONFIGS.index(c) if c in CONFIGS else len(CONFIGS))
  for config in configs:
    for s in sorted((s for c, s in cells if c == config), key=lambda s: (order.get(s, 99), s)):
      c = cells[(config, s)]
      lines.append(f"| {config} | {s} | {_f(c.get('step_s'), '.3f')} | {_f(c.get('tok_s'), '.0f')} "
                   f"| {_f(c.get('first_s'), '.1f')} | {_f(c.get('beam_tok_s'), '.0f')} "
                   f"| {_f(c.get('greedy_tok_s'), '.0f')} | {_f(c.get('beam_bf16_tok_s'), '.0f')} "
                   f"| {_f(c.get('cores'), '.2f')} |")
  lines.append("")
  for config, r in ratios(cells, system).items():
    parts = []
    if "train" in r:
      parts.append(f"train {r['train']:.2f}x (best peer {r['vs_train']})")
    if "beam" in r:
      parts.append(f"beam-4 decode {r['beam']:.2f}x (best peer {r['vs_beam']})")
    if "first_step" in r:
      parts.append(f"first step: flax-wmt's / {system}'s = {r['first_step']:.2f}")
    lines.append(f"{config}: {system} / best peer: " + ("; ".join(parts) if parts else "n/a"))
    old = cells.get((config, BEFORE), {})
    now = cells.get((config, system), {})
    parts = [f"{name} {now[k] / old[k]:.2f}x" for name, k in (
        ("train", "tok_s"), ("beam-4", "beam_tok_s"), ("greedy", "greedy_tok_s")) if k in now and k in old]
    if parts:
      lines.append(f"{config}: {system} / {BEFORE} (the same sitting): " + ", ".join(parts))
    mine, old = (cells.get((config, s), {}).get("tok_s") for s in ("txf-bf16", BEFORE_BF16))
    if mine and old:
      lines.append(f"{config}: txf-bf16 / {BEFORE_BF16} (the same sitting): train {mine / old:.2f}x")
    mine, theirs = (cells.get((config, s), {}).get("tok_s") for s in BF16_PAIR)
    if mine and theirs:
      lines.append(f"{config}: bf16 compute, {BF16_PAIR[0]} / {BF16_PAIR[1]}: train "
                   f"{mine / theirs:.2f}x")
  return "\n".join(lines)


# ---------------------------------------------------------------- running the processes


def check_args(harness: str, peers_venv: Optional[str], flaxwmt: Optional[str],
               systems: Sequence[str], configs: Sequence[str], repeats: int) -> None:
  """Raise TxfError naming the problem and the fix for arguments that cannot work."""
  unknown = [s for s in systems if s not in SYSTEMS + VARIANTS]
  if unknown:
    raise TxfError(f"unknown system(s) {unknown}: choose from {', '.join(SYSTEMS + VARIANTS)}")
  bad = [c for c in configs if c not in CONFIGS]
  if bad:
    raise TxfError(f"unknown config(s) {bad}: choose from {', '.join(CONFIGS)}")
  if repeats < 1:
    raise TxfError(f"--repeats must be >= 1, got {repeats}")
  peers = [s for s in systems if s not in TXF_FLAGS and s not in OLD_CODE]
  if not peers:
    return
  need = {"flax-wmt": "bench_flax.py", "torch-eager": "bench_torch.py", "marian": "bench_torch.py",
          "torch-bf16": "bench_torch.py"}
  for s in peers:
    if not os.path.isfile(os.path.join(harness or "", need[s])):
      raise TxfError(f"--harness={harness!r} holds no {need[s]} (for {s}): pass the peer harness "
                     f"folder (shared/bench-peers), or leave {s} out of --systems")
  if not peers_venv or not os.path.isfile(os.path.join(peers_venv, "bin", "python")):
    raise TxfError(f"--peers_venv={peers_venv!r} has no bin/python: make the peers' venv as the "
                   f"harness README says (torch, transformers, jax, flax), or run --systems=txf")
  if "flax-wmt" in peers and not (flaxwmt and os.path.isfile(os.path.join(flaxwmt, "train.py"))):
    raise TxfError(f"--flaxwmt={flaxwmt!r} holds no train.py: copy google/flax examples/wmt there "
                   f"with the harness's setup_flaxwmt.sh, or leave flax-wmt out of --systems")


# Where the peers module lives in a checkout of txf: bench/ (now), txf/bench/ (before issue 26).
PEERS_MODULES = ("bench.peers", "txf.bench.peers")


def peers_module(tree: str) -> str:
  """The module name of the peers benchmark in the txf checkout ``tree``."""
  for name in PEERS_MODULES:
    if os.path.isfile(os.path.join(tree, *name.split(".")) + ".py"):
      return name
  return PEERS_MODULES[0]


def command(system: str, config: str, harness: str, peers_venv: Optional[str],
            flaxwmt: Optional[str], steps: int, decode_reps: int, bf16_decode: bool = False,
            before_tree: Optional[str] = None) -> List[str]:
  """argv of one measurement process (train and decode of one system at one config)."""
  if system in OLD_CODE:  # the worker of the txf found in before_tree (its records say "txf")
    return [sys.executable, "-c", "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
            f"runpy.run_module('{peers_module(before_tree)}', run_name='__main__', alter_sys=True)",
            before_tree, "--worker", "--configs", config, "--steps", str(steps),
            "--decode_reps", str(decode_reps)] + (
                TXF_FLAGS["txf-bf16"] if system == BEFORE_BF16
                else ["--bf16_decode"] if bf16_decode else [])
  if system in TXF_FLAGS:
    return [sys.executable, "-m", "bench.peers", "--worker", "--configs", config,
            "--steps", str(steps), "--decode_reps", str(decode_reps), "--name", system
            ] + TXF_FLAGS[system] + (["--bf16_decode"] if bf16_decode and system == "txf" else [])
  python = os.path.join(peers_venv, "bin", "python")
  if system == "torch-bf16":
    script, args = "bench_torch.py", ["--peer", "torch-eager", "--config", config, "--phase",
                                      "train", "--steps", str(steps)]
  elif system == "flax-wmt":
    script, args = "bench_flax.py", ["--wmt_dir", flaxwmt, "--config", config, "--phase", "both",
                                     "--steps", str(steps), "--decode-reps", str(decode_reps)]
  else:
    script, args = "bench_torch.py", ["--peer", system, "--config", config, "--phase",
                                      "both" if system == "marian" else "train", "--steps",
                                      str(steps), "--decode-reps", str(decode_reps)]
  path = os.path.join(harness, script)
  if config in HARNESS_EXTRA:
    prelude = ("import torch; torch.autocast('cpu', dtype=torch.bfloat16).__enter__(); "
               if system == "torch-bf16" else "")
    return [python, "-c", _WITH_CONFIG.format(prelude=prelude), path,
            json.dumps({config: HARNESS_EXTRA[config]})] + args
  if system == "torch-bf16":
    return [python, "-c", _TORCH_AUTOCAST, path] + args
  return [python, path] + args


def parse_records(stdout: str) -> List[dict]:
  """The JSON object lines of a process's output (other lines ignored)."""
  out = []
  for line in stdout.splitlines():
    line = line.strip()
    if line.startswith("{"):
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out


def run_sitting(systems: Sequence[str], configs: Sequence[str], repeats: int, harness: str,
                peers_venv: Optional[str], flaxwmt: Optional[str], steps: int, decode_reps: int,
                preload: Optional[str], bf16_decode: bool = False, say=print,
                progress=None, before_tree: Optional[str] = None) -> List[dict]:
  """Run every (round, config, system) process in turn; returns all records (with round, load).

  ``progress(records so far)`` is called after every process (to save partial results)."""
  env = dict(os.environ)
  if preload:
    env["LD_PRELOAD"] = " ".join(p for p in (preload, env.get("LD_PRELOAD", "")) if p)
    env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 40))
  env["_TXF_MALLOC_REEXEC"] = "1"  # the worker must not re-execute itself
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)  # bench/
  records = []
  for rnd in range(1, repeats + 1):
    for config in configs:
      for system in systems:
        argv = command(system, config, harness, peers_venv, flaxwmt, steps, decode_reps,
                       bf16_decode, before_tree)
        load = os.getloadavg()[0]
        cpu0 = _children_cpu_s()
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
        cpu = _children_cpu_s() - cpu0
        got = parse_records(proc.stdout)
        say(f"round {rnd} {config} {system}: {len(got)} records in {wall:.0f}s, "
            f"{cpu:.0f} CPU-s = {cpu / wall:.2f} cores (load {load:.1f} -> {os.getloadavg()[0]:.1f})"
            + ("" if proc.returncode == 0 else f", exit {proc.returncode}: "
               f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}"))
        for r in got:
          if system in VARIANTS:
            r["peer"] = system
          r.update(round=rnd, load_before=load, load_after=os.getloadavg()[0],
                   process_wall_s=wall, process_cpu_s=cpu)
        records += got
        if progress is not None:
          progress(records)
  return records


def _children_cpu_s() -> float:
  """User + system CPU-seconds of every child process waited for so far."""
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- command line


def _csv(text: str) -> List[str]:
  return [x.strip() for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
  """Command line; returns the exit status (2 with one ``txf: error:`` line on bad arguments)."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--harness", default="../shared/bench-peers", help="the peers' harness folder")
  p.add_argument("--peers_venv", default=None, help="venv with torch, transformers, jax, flax")
  p.add_argument("--flaxwmt", default=os.environ.get("FLAXWMT"),
                 help="copy of google/flax examples/wmt (setup_flaxwmt.sh)")
  p.add_argument("--systems", default=",".join(SYSTEMS),
                 help=f"comma-separated: {','.join(SYSTEMS)}; variants: {','.join(VARIANTS)}")
  p.add_argument("--configs", default="small,base")
  p.add_argument("--repeats", type=int, default=3, help="rounds of A B C D")
  p.add_argument("--steps", type=int, default=10, help="timed train steps per process")
  p.add_argument("--decode_reps", type=int, default=5, help="timed decode calls per process")
  p.add_argument("--output", default="runs/peers.json", help="JSON file ('' = none)")
  p.add_argument("--malloc", default="tcmalloc", choices=("tcmalloc", "system"),
                 help="allocator preloaded into every process")
  p.add_argument("--bf16_decode", action="store_true",
                 help="also time txf's beam 4 with bfloat16 weights (an option, not the default)")
  p.add_argument("--before_tree", default=None,
                 help=f"a checkout of older txf code: adds the system {BEFORE}, its worker, to the "
                      f"sitting (before/after in one sitting); --systems {BEFORE_BF16}: that worker "
                      f"with bfloat16 compute instead")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--name", default="txf", help=argparse.SUPPRESS)
  p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
  p.add_argument("--attention_dropout", type=float, default=0.0, help=argparse.SUPPRESS)
  p.add_argument("--nodecode", action="store_true", help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  try:
    if a.worker:
      worker(_csv(a.configs)[0], a.steps, a.decode_reps, dtype=a.dtype, bf16_decode=a.bf16_decode,
             attention_dropout=a.attention_dropout, decode=not a.nodecode, name=a.name)
      return 0
    systems, configs = _csv(a.systems), _csv(a.configs)
    if a.before_tree:
      if not any(os.path.isfile(os.path.join(a.before_tree, *p.split("."))  + ".py")
                 for p in PEERS_MODULES):
        raise TxfError(f"--before_tree={a.before_tree!r} holds no bench/peers.py: pass a "
                       f"checkout of txf (e.g. git worktree add DIR OLD_COMMIT)")
      if BEFORE_BF16 not in systems:  # the old code in float32 unless its bf16 row is asked for
        systems = [s for s in systems if s != BEFORE] + [BEFORE]
    elif any(s in systems for s in OLD_CODE):
      raise TxfError(f"the systems {' and '.join(OLD_CODE)} need --before_tree=DIR, a checkout of "
                     f"older txf code")
    check_args(a.harness, a.peers_venv, a.flaxwmt, systems, configs, a.repeats)
    preload = None
    if a.malloc == "tcmalloc":
      preload = find_tcmalloc()
  except TxfError as e:
    print(f"txf: error: {e}", file=sys.stderr)
    return 2
  machine = cpu_model()
  print(f"peers side by side on {machine}; malloc {preload or 'system'}; "
        f"load {os.getloadavg()[0]:.1f} at start")

  def save(records: List[dict]) -> None:  # after every process: a cut-short sitting keeps its rows
    if a.output:
      cells = summarize(records)
      os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
      with open(a.output, "w") as f:
        json.dump({"machine": machine, "argv": sys.argv, "records": records,
                   "table": format_table(cells),
                   "cells": [dict(config=k[0], system=k[1], **v) for k, v in cells.items()]}, f,
                  indent=1)

  records = run_sitting(systems, configs, a.repeats, a.harness, a.peers_venv, a.flaxwmt, a.steps,
                        a.decode_reps, preload, a.bf16_decode, progress=save,
                        before_tree=a.before_tree)
  print()
  print(format_table(summarize(records)))
  if a.output:
    print(f"\nwrote {a.output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
