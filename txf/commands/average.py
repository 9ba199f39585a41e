"""``txf average-checkpoints --workdir runs/x [--last 5 | --step best|latest|N] [--output F] [--sharded]``.

Writes the element-wise mean of the parameters of the last N checkpoints (the N highest steps in
``<workdir>/checkpoints``) to ``<workdir>/params_avg<N>.msgpack`` (flax msgpack, like
params.msgpack), which ``txf.runtime.workdir.load_params(workdir, "params_avg<N>.msgpack")`` loads.
The paper averages the last 5 (base) or 20 (big) checkpoints, written at 10-minute intervals.
``--step`` exports one checkpoint's parameters instead (``params_<step>.msgpack``): ``best`` is the
saved step with the best evaluation by the run's ``best_metric``, e.g. early stopping on dev.
``--sharded`` (the default when several processes run it) averages shard by shard on the devices
and writes ``<workdir>/params_avg<N>/``, an orbax directory of shards, read the same way.
"""

import os

from absl import flags
import jax

from txf.train.checkpoint import average_checkpoints
from txf.runtime import workdir as workdir_lib
from txf.core import families
from txf.runtime import storage
from txf.core.errors import TxfError
from txf.parallel import distributed

flags.DEFINE_string("workdir", None, "run directory holding checkpoints/", required=True)
flags.DEFINE_integer("last", 5, "average the parameters of this many most recent checkpoints")
flags.DEFINE_string("output", None, "output file name (relative to --workdir, or absolute); "
                    "default params_avg<last>.msgpack")
flags.DEFINE_enum("sharded", "auto", ["auto", "true", "false"],
                  "average shard by shard over every device of every process and write an orbax "
                  "directory of shards (params_avg<N>/): no host holds an array whole; auto = when "
                  "several processes run the command (a pod: launch it like txf train)")
flags.DEFINE_string("step", None, "export one checkpoint instead of averaging: best (by the run's "
                    "best_metric), latest, or a step number; default file params_<step>.msgpack")


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}")
  distributed.maybe_initialize()
  f = flags.FLAGS
  storage.check_filesystem(f.workdir)
  if not storage.wpath(f.workdir).is_dir():
    raise TxfError(f"no run directory {f.workdir}")
  sharded = f.sharded == "true" or (f.sharded == "auto" and jax.process_count() > 1)
  path, steps = average_checkpoints(f.workdir, f.last, f.output, f.step, sharded=sharded)
  shown = f.output or os.path.basename(path)
  if f.step:
    done = f"exported the parameters of the checkpoint at step {steps[-1]}"
  else:
    done = f"averaged the parameters of the checkpoints at steps {', '.join(map(str, steps))}"
  print(f"{done} -> {path}\nuse them with --params={shown} ({users(f.workdir)})")


def users(workdir: str) -> str:
  """The commands that take a run's --params, for its model family (config.json)."""
  try:
    command = families.get(workdir_lib.load_config(workdir).model.family).command
  except Exception:  # pylint: disable=broad-except  # an unreadable config: name only txf eval
    return "txf eval"
  return "txf eval" if command == "txf eval" else f"txf eval / {command}"
