"""The txf command line: help, version, one-line errors for what a user typed, quiet logging.

Most tests run the real CLI in a subprocess and check its exit status and what it printed; the
commands' declared flags (txf.commands.declared) are checked in this process.
"""

import json
import os
import subprocess
import sys

import pytest
from absl import flags

from tests.conftest import ROOT, run_txf
from txf import cli
from txf.commands import declared
from txf.commands.common import default_config_path
from txf.runtime import process as runtime


def error_line(result):
  """The single stderr line of a refused command (and no traceback)."""
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert "Traceback" not in result.stderr, result.stderr
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith("txf: error: "), result.stderr
  return lines[0]


def test_top_level_help_lists_every_command_and_exits_0():
  r = run_txf("--help")
  assert r.returncode == 0, r.stderr
  for name in cli.COMMANDS:
    assert f"  {name} " in r.stdout
  assert run_txf().returncode == 2  # no command at all is a usage error


def test_version_prints_the_package_version():
  import txf
  r = run_txf("--version")
  assert r.returncode == 0 and r.stdout.strip() == f"txf {txf.__version__}"


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
@pytest.mark.parametrize("name", ["train", "eval", "translate", "generate", "average-checkpoints"])
def test_command_help_prints_its_purpose_and_own_flags(name):
  r = run_txf(name, "--help")
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith(f"txf {name}: {cli.COMMANDS[name][1]}")
  assert "--workdir" in r.stdout  # every one of these has its own --workdir
  assert "--helpfull" not in r.stdout and "absl" not in r.stdout.split("every command:")[0]
  assert "--xla_" not in r.stdout and "--jax_" not in r.stdout  # no global library flags


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_train_help_names_the_config_flag_and_required_flags_are_marked():
  assert "--config.FIELD=VALUE" in run_txf("train", "-h").stdout
  assert "--workdir: run directory of a trained run (required)" in run_txf("eval", "--help").stdout


@pytest.mark.parametrize("args,expected", [
    (["trian"], "unknown command 'trian': did you mean 'train'?"),
    (["train", "--bogus=1"], "unknown flag --bogus for txf train"),
    (["train", "--config.model.num_head=2"],
     "unknown config field 'model.num_head' in --config.model.num_head=2: did you mean "
     "--config.model.num_heads?"),
    (["train", "--config=/nonexistent/x.py"], "no config file /nonexistent/x.py"),
    (["train", "--config", "nosuchexperiment"], "no config file nosuchexperiment"),
    (["train", "--config.batch_size=abc"], "flag --config.batch_size=abc: invalid literal for int()"),
    (["eval"], "--workdir is required"),
])
@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_usage_errors_are_one_line_and_exit_2(args, expected, tmp_path):
  r = run_txf(*args, "--workdir", str(tmp_path / "w")) if args[0] == "train" else run_txf(*args)
  assert r.returncode == 2, r.stderr
  assert expected in error_line(r)
  assert not (tmp_path / "w").exists()  # refused before a workdir exists


@pytest.mark.slow
def test_config_file_with_a_syntax_error_or_without_get_config(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config(:\n  pass\n")
  r = run_txf("train", f"--config={bad}", "--workdir", str(tmp_path / "w"))
  assert r.returncode == 2
  assert f"the config file {bad} does not parse: invalid syntax at line 1" in error_line(r)
  empty = tmp_path / "empty.py"
  empty.write_text("X = 1\n")
  r = run_txf("train", "--config", str(empty), "--workdir", str(tmp_path / "w"))
  assert r.returncode == 2
  assert f"the config file {empty} has no get_config()" in error_line(r)
  r = run_txf("train", "--config", str(empty), "--workdir", str(tmp_path / "w"), "--verbose_errors")
  assert r.returncode == 2 and "Traceback" in r.stderr  # asked for


def test_config_names_resolve_to_the_shipped_experiments(tmp_path):
  from txf.core import config as config_lib
  assert config_lib.experiment_path("sst2") == os.path.join(ROOT, "experiments", "sst2.py")
  # the README's relative path works from any directory
  assert config_lib.experiment_path("experiments/default.py").endswith(
      os.path.join("experiments", "default.py"))
  elsewhere = tmp_path / "mine.py"
  elsewhere.write_text("")
  assert config_lib.experiment_path(str(elsewhere)) == str(elsewhere)  # a real file wins
  with pytest.raises(config_lib.ConfigError, match="sst2"):  # the message lists the names
    config_lib.experiment_path("somewhere/sst2.py")  # another directory is never substituted


def test_split_verbosity():
  assert runtime.split_verbosity(["--workdir", "w"]) == (False, ["--workdir", "w"])
  assert runtime.split_verbosity(["-v", "--workdir", "w"]) == (True, ["--verbosity=0", "--workdir", "w"])
  assert runtime.split_verbosity(["--verbosity=1"]) == (True, ["--verbosity=1"])
  assert runtime.split_verbosity(["--verbosity=-1"]) == (False, ["--verbosity=-1"])


def test_library_filter_passes_txf_warnings_and_library_errors_only():
  import logging
  f = runtime.LibraryFilter("/pkg/txf")

  def record(level, path):
    return logging.LogRecord("absl", level, path, 1, "m", None, None)
  assert f.filter(record(logging.WARNING, "/pkg/txf/data/text.py"))
  assert not f.filter(record(logging.INFO, "/pkg/txf/data/text.py"))
  assert not f.filter(record(logging.WARNING, "/site/orbax/checkpoint_manager.py"))
  assert f.filter(record(logging.ERROR, "/site/orbax/checkpoint_manager.py"))


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_info_is_quiet_by_default_and_logs_with_v():
  # JAX chooses its platform itself here: without a TPU it probes for one and logs that at INFO
  UNSET = {"JAX_PLATFORMS": None, "TF_CPP_MIN_LOG_LEVEL": None}
  quiet = run_txf("info", env=UNSET)
  assert quiet.returncode == 0, quiet.stderr
  assert quiet.stderr.strip() == "", quiet.stderr  # no "Unable to initialize backend 'tpu'" line
  assert quiet.stdout.startswith("jax: ")
  loud = run_txf("info", "-v", env=UNSET)
  assert loud.returncode == 0
  assert "xla_bridge" in loud.stderr  # jax's own INFO lines are back when asked for


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_average_checkpoints_has_no_orbax_read_only_warning(tmp_path):
  from tests.test_checkpoint import _spec, _state
  from txf.train.checkpoint import Checkpointer
  ck = Checkpointer(str(tmp_path), _spec(keep_checkpoints=3))
  for step in (10, 20):
    ck.save(step, _state(step / 7, step), {"next_index": step})
  ck.close()
  quiet = run_txf("average-checkpoints", "--workdir", str(tmp_path), "--last", "2",
                  "--output", "avg.msgpack")
  assert quiet.returncode == 0, quiet.stderr
  assert "averaged the parameters of the checkpoints at steps 10, 20" in quiet.stdout
  assert quiet.stderr.strip() == "", quiet.stderr
  loud = run_txf("average-checkpoints", "--workdir", str(tmp_path), "--last", "2",
                 "--output", "avg.msgpack", "-v")
  assert loud.returncode == 0 and "read only" in loud.stderr  # orbax says it when asked to


# What each command's module defined at import before the flags moved to txf.commands.declared
# (main at 903772c): name -> (absl flag_type, default[, REQUIRED]). A flag may be added; none may be
# lost or change its type, default or requiredness.
REQUIRED, DEFAULT_CONFIG = "required", "experiments/default.py"
FLAGS_BEFORE = {
    "train": {"config": ("config object", DEFAULT_CONFIG), "workdir": ("string", None),
              "fresh": ("bool", False), "progress": ("bool", None)},
    "translate": {"workdir": ("string", None, REQUIRED), "input": ("string", None),
                  "output": ("string", None), "params": ("string", None), "beam": ("int", None),
                  "alpha": ("float", None), "decode_dtype": ("string enum", None),
                  "max_extra": ("int", None), "length_bucket": ("int", None), "batch_size": ("int", 32)},
    "classify": {"workdir": ("string", None, REQUIRED), "input": ("string", None),
                 "output": ("string", None), "params": ("string", None), "batch_size": ("int", 64)},
    "eval": {"workdir": ("string", None, REQUIRED), "split": ("string", None),
             "data_path": ("string", None), "params": ("string", None), "output": ("string", None),
             "bleu": ("string enum", None), "beam": ("int", None), "alpha": ("float", None),
             "decode_dtype": ("string enum", None), "max_extra": ("int", None),
             "max_examples": ("int", 0), "length_bucket": ("int", None), "batch_size": ("int", 32),
             "progress_every": ("float", 10.0)},
    "generate": {"workdir": ("string", None, REQUIRED), "prompt": ("multi string", None),
                 "input": ("string", None), "params": ("string", None), "max_new_tokens": ("int", 200),
                 "temperature": ("float", 0.8), "top_k": ("int", 0), "top_p": ("float", 0.95),
                 "seed": ("int", 0), "num_samples": ("int", 1)},
    "average-checkpoints": {"workdir": ("string", None, REQUIRED), "last": ("int", 5),
                            "output": ("string", None), "sharded": ("string enum", "auto"),
                            "step": ("string", None)},
    "bench": {"configs": ("comma separated list of strings", ["small", "base"]),
              "output": ("string", "runs/bench.json"), "steps": ("int", 5),
              "dtypes": ("comma separated list of strings", ["float32"]),
              "attention_impls": ("comma separated list of strings", ["auto"]),
              "decode": ("bool", True), "decode_batch": ("int", 8), "decode_length": ("int", 32),
              "beam": ("int", 4), "bf16_dots": ("comma separated list of strings", ["auto"])},
    "info": {},
    "sweep": {"root": ("string", None), "parallel": ("int", 1), "set": ("multi string", []),
              "emit": ("string enum", None), "sbatch": ("multi string", []), "report": ("bool", True),
              "fit": ("bool", False), "predict": ("string", ""), "bootstrap": ("int", 1000)},
    "coord-check": {"config": ("config object", DEFAULT_CONFIG), "widths": ("string", "64,128,256,512"),
                    "steps": ("int", 5), "seeds": ("int", 16), "learning_rate": ("float", 0.0),
                    "out": ("string", None)},
    "plan": {"config": ("config object", DEFAULT_CONFIG), "devices": ("int", 0),
             "vocab_size": ("int", 0), "device_peak_tflops": ("float", 0.0), "mfu": ("float", 0.4),
             "hosts": ("int", 0), "json": ("string", ""), "topology": ("string", "")},
    "import-hf": {"workdir": ("string", None, REQUIRED), "data_config": ("string", None),
                  "max_len": ("int", 128), "plugins": ("string", "")},
    "export-hf": {"workdir": ("string", None, REQUIRED), "output": ("string", None, REQUIRED),
                  "params": ("string", None)},
    "prepare-data": {"data_dir": ("string", "")},
    "inspect": {"workdir": ("string", None, REQUIRED), "input": ("string", None),
                "list": ("bool", False), "output": ("string", None), "params": ("string", None)},
    "ablate-heads": {"workdir": ("string", None, REQUIRED), "split": ("string", "val"),
                     "mode": ("string enum", "zero"), "max_examples": ("int", 500),
                     "batch_size": ("int", 100), "decode": ("bool", True),
                     "output": ("string", None), "params": ("string", None)},
}


def test_every_command_declares_the_flags_its_module_defined():
  assert set(FLAGS_BEFORE) == set(cli.COMMANDS)
  for name, before in FLAGS_BEFORE.items():
    fv = flags.FlagValues()
    names = declared.define(name, fv)
    assert len(names) == len(set(names)) and set(before) <= set(names), (name, names)
    for flag, (kind, default, *required) in before.items():
      f = fv[flag]
      now = f.default_as_str if default == DEFAULT_CONFIG else f.default
      want = repr(default_config_path()) if default == DEFAULT_CONFIG else default
      assert (f.flag_type(), now, cli._required(f)) == (kind, want, bool(required)), (name, flag)
      assert f.help.strip(), (name, flag)


# cli.main as the console script runs it, then what the process imported
NO_MACHINERY = """
import json, sys
from txf import cli
codes = []
for args in ([NAME, "--help"], [NAME, "--nosuchflag"]):
  try:
    cli.main(["txf", *args])
  except SystemExit as e:
    codes.append(e.code)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "flax", "orbax", "optax")
               or m == cli.COMMANDS[NAME].module)
print(json.dumps({"codes": codes, "heavy": heavy}))
"""


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_help_and_a_refused_flag_answer_without_importing_the_command_or_jax(name):
  r = subprocess.run([sys.executable, "-c", NO_MACHINERY.replace("NAME", repr(name))], cwd=ROOT,
                     capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout.splitlines()[-1])
  assert out == {"codes": [0, 2], "heavy": []}, out
  assert r.stdout.startswith(f"txf {name}: {cli.COMMANDS[name].purpose}")
  assert error_line(r) == f"txf: error: unknown flag --nosuchflag for txf {name}: see txf {name} --help"


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly():
  # `txf info | head -0`: the reader is gone before the first line; the command stops as a shell
  # tool does (exit 128 + SIGPIPE), with no traceback
  read_end, write_end = os.pipe()
  proc = subprocess.Popen([sys.executable, "-m", "txf.cli", "info"], cwd=ROOT,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=write_end,
                          stderr=subprocess.PIPE)
  os.close(write_end)
  os.close(read_end)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 141 and stderr.decode() == "", stderr.decode()
