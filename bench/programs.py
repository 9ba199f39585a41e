"""Is a compiled program the same as another checkout's? A refactor that leaves XLA's optimised
module unchanged cannot have changed its speed; one that changes it shows where.

  python -m bench.programs --config small --program beam4 --before_tree ../old-checkout
  python -m bench.programs --config tiny --program train --before_tree DIR --output diff.txt
  python -m bench.programs --config small --program greedy           (this tree only: the count)

Each tree's program is built in a process of its own, by that tree's bench code (``bench``, or
``txf.bench`` in older checkouts), exactly as the peers' worker builds it: ``train`` is the train
step of ``bench.train.build_step`` on the config's random batch; ``greedy`` and ``beamK`` the
cached decoder of ``bench.decode.decode_fn`` (parameters prepared once, 16 sources of 32 tokens,
32 output tokens). The program is compiled and its optimised HLO (``compiled.as_text()``) reduced
by :func:`normalise` to its instructions, without what names where they came from (metadata,
source files and lines, the numbering of instructions and computations). Prints each tree's
instruction count and whether the two programs are identical; otherwise the first lines that differ
(all of them with ``--output``).
"""

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import List, Optional

from txf.core.errors import TxfError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = ("train", "greedy", "beamK (e.g. beam4)")
DECODE_BATCH, DECODE_SRC, DECODE_OUT = 16, 32, 32

# what a line of optimised HLO carries beside the computation itself
_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")
_FRAMES = re.compile(r"^\s*\d+\s+(\{.*\}|\".*\")\s*$")  # the file, function and frame tables
_LOCATIONS = re.compile(r",?\s*(stack_frame_id|source_line|source_file)=\d+")
_NAME = re.compile(r"%[\w\-.]+")                                   # %fusion.12, %param_0.2920
_HEADER_NAME = re.compile(r"[A-Za-z_][\w\-.]*(?=: )")               # a computation's (param_0.2920: s32[]


def normalise(hlo_text: str) -> List[str]:
  """The instructions of an optimised HLO module's text, one string per line, with everything
  that names where they came from removed: ``metadata={...}``, the stack-frame and file tables,
  ``stack_frame_id``/``source_file``/``source_line`` attributes, and the digits and dots of
  ``%names`` (``%fusion.12``, ``%param_0.2920``: XLA's numbering, which any change upstream
  shifts). Opcodes, shapes, layouts, operands' order, attributes and constants are kept. Two builds of one program give equal lists whatever
  Python produced them; blank lines and the module's header line are dropped."""
  out = []
  for line in hlo_text.splitlines():
    if not line.strip() or line.startswith("HloModule") or _FRAMES.match(line):
      continue
    line = _LOCATIONS.sub("", _METADATA.sub("", line))
    line = _NAME.sub(lambda m: re.sub(r"[.\d]+", "", m.group()), line)  # %param_0.29 -> %param_
    line = _HEADER_NAME.sub(lambda m: re.sub(r"[.\d]+", "", m.group()), line)  # (param_0.29: f32[]
    out.append(line.rstrip())
  return out


def instruction_count(lines: List[str]) -> int:
  """How many of ``normalise``'s lines are instructions (``name = type op(...)``)."""
  return sum(1 for line in lines if re.match(r"^\s*(ROOT\s+)?%?[\w.\-]+\s*=\s*\S", line))


def _worker(config: str, program: str, out: str) -> None:
  """In the tree on sys.path: compile ``program`` at ``config`` and write its optimised HLO."""
  import jax
  import jax.numpy as jnp
  try:
    from bench import decode as decode_bench, train as train_bench
  except ImportError:  # an older checkout keeps its bench inside the package
    from txf.bench import decode as decode_bench, train as train_bench
  from txf.models import init_params
  cfg = train_bench.config_for(config, "float32", "auto")
  shape = train_bench.BENCH_CONFIGS[config]
  batch = train_bench.random_batch(cfg, shape["batch"], shape["source_len"], shape["target_len"])
  if program == "train":
    runner, state = train_bench.build_step(cfg, batch)
    lowered = runner.train_jit.lower(state, batch, jax.random.key(1))
  else:
    beam = 1 if program == "greedy" else int(program[len("beam"):])
    params = init_params(cfg, jax.random.key(0), {k: v[:1] for k, v in batch.items()})
    inputs = jax.random.randint(jax.random.key(2), (DECODE_BATCH, DECODE_SRC), 4, cfg.vocab_size,
                                jnp.int32)
    dcfg, dparams = decode_bench.prepared(cfg, params, True, None)
    fn = decode_bench.decode_fn(dcfg, "greedy" if beam == 1 else f"beam{beam}", True,
                                DECODE_BATCH, DECODE_OUT, beam)
    lowered = fn.lower(dparams, inputs)
  with open(out, "w") as f:
    f.write(lowered.compile().as_text())


def compiled_text(tree: str, config: str, program: str) -> str:
  """The optimised HLO text of ``program`` at ``config`` as the checkout ``tree`` builds it (in a
  subprocess whose imports come from ``tree`` first)."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "program.hlo")
    # this file is run by path, not imported: ``bench`` must resolve inside ``tree`` alone
    code = ("import runpy, sys; tree, here = sys.argv.pop(1), sys.argv.pop(1); "
            "sys.path.insert(0, tree); runpy.run_path(here)['_worker'](*sys.argv[1:])")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree),
               JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run([sys.executable, "-c", code, os.path.abspath(tree),
                           os.path.abspath(__file__), config, program, out],
                          capture_output=True, text=True, env=env, cwd=tree)
    if proc.returncode:
      raise RuntimeError(f"building {program} at {config} in {tree} failed:\n{proc.stderr[-3000:]}")
    with open(out) as f:
      return f.read()


def compare(config: str, program: str, before_tree: Optional[str] = None) -> dict:
  """{config, program, trees: {tree: instruction count}, identical (None without a before tree),
  diff: unified diff lines of the normalised programs (before -> this tree)}."""
  now = normalise(compiled_text(ROOT, config, program))
  result = {"config": config, "program": program, "trees": {ROOT: instruction_count(now)},
            "identical": None, "diff": []}
  if before_tree:
    old = normalise(compiled_text(before_tree, config, program))
    result["trees"][os.path.abspath(before_tree)] = instruction_count(old)
    result["identical"] = old == now
    result["diff"] = list(difflib.unified_diff(old, now, "before", "this tree", lineterm="", n=1))
  return result


def check_args(config: str, program: str, before_tree: Optional[str]) -> None:
  """TxfError for a program name, config or tree that cannot work."""
  if program not in ("train", "greedy") and not re.fullmatch(r"beam[1-9]\d*", program):
    raise TxfError(f"--program={program!r}: use one of {', '.join(PROGRAMS)}")
  if config not in ("tiny", "small", "base", "transformer_tiny"):
    raise TxfError(f"--config={config!r}: use tiny, small, base or transformer_tiny")
  if before_tree and not os.path.isdir(os.path.join(before_tree, "txf")):
    raise TxfError(f"--before_tree={before_tree!r} holds no txf/ package: pass a checkout of txf "
                   "(git worktree add ../old COMMIT)")


def main(argv: Optional[List[str]] = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="small", help="tiny | small | base | transformer_tiny")
  p.add_argument("--program", default="beam4", help="train | greedy | beamK (e.g. beam4)")
  p.add_argument("--before_tree", default=None, help="another checkout of txf to compare with")
  p.add_argument("--output", default=None, help="write the whole diff (or the program) here")
  p.add_argument("--json", action="store_true", help="print the result as one JSON object")
  a = p.parse_args(argv)
  try:
    check_args(a.config, a.program, a.before_tree)
  except TxfError as e:
    print(f"txf: error: {e}", file=sys.stderr)
    return 2
  result = compare(a.config, a.program, a.before_tree)
  if a.output:
    with open(a.output, "w") as f:
      f.write("\n".join(result["diff"]) + "\n")
  if a.json:
    print(json.dumps(result))
    return 0
  for tree, count in result["trees"].items():
    print(f"{a.program} at {a.config}: {count:,} instructions ({tree})")
  if result["identical"] is not None:
    print("identical programs" if result["identical"] else
          f"the programs differ ({len(result['diff'])} diff lines):")
    for line in result["diff"][:40]:
      print(line)
  return 0


if __name__ == "__main__":
  sys.exit(main())
