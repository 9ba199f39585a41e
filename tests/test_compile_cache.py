"""The persistent compilation cache (txf/runtime/compile_cache.py): where it lives, what keys its folder,
its bound, and that a cache that cannot be used is one warning line and a normal compile."""

import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_txf
from txf.runtime import compile_cache

# a program compiled through the cache, then its result printed (a fresh process each time)
SCRIPT = """
import json, jax, jax.numpy as jnp
from txf.runtime import compile_cache
where = compile_cache.apply(jax.config)
x = jnp.arange(12.0).reshape(3, 4)
y = jax.jit(lambda a: (jnp.tanh(a) @ a.T).sum())(x)
print(json.dumps({"where": where, "y": float(y)}))
"""


def _python(cache, env=None):
  full = {**os.environ, "JAX_PLATFORMS": "cpu", compile_cache.ENV: cache,
          compile_cache.ENV_MIN_SECS: "0", **(env or {})}  # keep even this small program
  return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=full,
                        cwd=ROOT, timeout=120)


def test_the_folder_comes_from_the_config_then_the_environment_then_xdg():
  home = os.path.expanduser("~")
  assert compile_cache.base_dir("", {}) == os.path.join(home, ".cache", "txf", "xla")
  assert compile_cache.base_dir("", {"XDG_CACHE_HOME": "/x/cache"}) == "/x/cache/txf/xla"
  assert compile_cache.base_dir("", {"XDG_CACHE_HOME": "/x", compile_cache.ENV: "/e"}) == "/e"
  assert compile_cache.base_dir("/c", {compile_cache.ENV: "/e"}) == "/c"
  assert compile_cache.base_dir("off", {compile_cache.ENV: "/e"}) is None
  for off in ("off", "OFF", "0", "none", "false"):
    assert compile_cache.base_dir("", {compile_cache.ENV: off}) is None
    assert compile_cache.cache_dir("", {compile_cache.ENV: off}) is None
  assert compile_cache.jax_options("off", {}) == {"jax_enable_compilation_cache": False,
                                                   "jax_compilation_cache_dir": None}


def test_the_fingerprint_changes_with_jax_jaxlib_flags_and_cpu(monkeypatch):
  versions = {"jax": "0.10.2", "jaxlib": "0.10.2"}
  cpu = ["AMD EPYC", "avx2 fma"]
  monkeypatch.setattr(compile_cache, "_version", lambda name: versions[name])
  monkeypatch.setattr(compile_cache, "_cpu", lambda: tuple(cpu))
  env = {"XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  seen = {compile_cache.fingerprint(env)}
  assert compile_cache.fingerprint(env) in seen  # the same inputs, the same folder
  versions["jax"] = "0.12.0"
  seen.add(compile_cache.fingerprint(env))
  versions["jaxlib"] = "0.12.0"
  seen.add(compile_cache.fingerprint(env))
  seen.add(compile_cache.fingerprint({**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}))
  cpu[1] = "avx2 avx512_bf16 fma"  # the same model name, other features
  seen.add(compile_cache.fingerprint(env))
  cpu[0] = "Intel Xeon"
  seen.add(compile_cache.fingerprint(env))
  assert len(seen) == 6
  # white space inside XLA_FLAGS does not make a new folder
  assert compile_cache.fingerprint({**env, "XLA_FLAGS": " --a  --b "}) == \
      compile_cache.fingerprint({**env, "XLA_FLAGS": "--a --b"})
  assert compile_cache.cache_dir("/c", env) == os.path.join("/c", compile_cache.fingerprint(env))


def test_the_compile_time_threshold(capsys):
  assert compile_cache.min_compile_secs({}) == compile_cache.MIN_COMPILE_SECS
  assert compile_cache.min_compile_secs({compile_cache.ENV_MIN_SECS: "0"}) == 0.0
  assert compile_cache.min_compile_secs({compile_cache.ENV_MIN_SECS: "2.5"}) == 2.5
  assert compile_cache.min_compile_secs({compile_cache.ENV_MIN_SECS: "soon"}) == compile_cache.MIN_COMPILE_SECS
  assert compile_cache.jax_options("", {compile_cache.ENV: "/tmp/x", compile_cache.ENV_MIN_SECS: "3"})[
      "jax_persistent_cache_min_compile_time_secs"] == 3.0
  assert "soon" in capsys.readouterr().err


def test_the_bound_is_in_megabytes_and_a_bad_value_warns(capsys):
  assert compile_cache.max_bytes({}) == compile_cache.DEFAULT_MAX_MB * 2 ** 20
  assert compile_cache.max_bytes({compile_cache.ENV_MAX_MB: "3"}) == 3 * 2 ** 20
  assert compile_cache.max_bytes({compile_cache.ENV_MAX_MB: "-1"}) == -1
  assert compile_cache.max_bytes({compile_cache.ENV_MAX_MB: "lots"}) == compile_cache.DEFAULT_MAX_MB * 2 ** 20
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith("txf: warning: compilation cache:") and "lots" in err[0]


def test_an_unusable_folder_is_one_warning_and_no_cache(tmp_path, capsys):
  blocker = tmp_path / "a-file"
  blocker.write_text("not a folder")
  options = compile_cache.jax_options(str(blocker / "cache"), {})
  assert options == {"jax_enable_compilation_cache": False, "jax_compilation_cache_dir": None}
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith("txf: warning: compilation cache: cannot create")


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_programs_are_written_read_back_and_a_corrupt_entry_is_one_line(tmp_path):
  cache = str(tmp_path / "cache")
  cold = _python(cache)
  assert cold.returncode == 0 and cold.stderr == "", cold.stderr
  first = json.loads(cold.stdout)
  folder = first["where"]
  assert folder == compile_cache.cache_dir(cache, {**os.environ, "JAX_PLATFORMS": "cpu"})
  entries = glob.glob(os.path.join(folder, "*-cache"))
  assert entries, os.listdir(folder)
  stamps = {p: os.path.getmtime(p) for p in entries}
  warm = _python(cache)
  assert warm.returncode == 0 and warm.stderr == "" and json.loads(warm.stdout) == first
  assert {p: os.path.getmtime(p) for p in entries} == stamps  # read back, not written again
  for path in entries:  # corrupt every entry
    with open(path, "wb") as f:
      f.write(b"\x00not a compiled program")
  broken = _python(cache)
  assert broken.returncode == 0, broken.stderr
  assert json.loads(broken.stdout) == first  # compiled as usual, the same result
  lines = broken.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("txf: warning: compilation cache: an entry could not be read"), \
      broken.stderr


def test_off_writes_nothing(tmp_path):
  off = _python("off")
  assert off.returncode == 0 and off.stderr == "" and json.loads(off.stdout)["where"] is None


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_txf_info_says_where_and_how_big_and_survives_an_unwritable_folder(tmp_path):
  cache = tmp_path / "c"
  proc = run_txf("info", env={compile_cache.ENV: str(cache)})
  assert proc.returncode == 0, proc.stderr
  line = next(l for l in proc.stdout.splitlines() if l.startswith("compile_cache: "))
  assert line.startswith(f"compile_cache: {cache}{os.sep}") and "programs" in line and "MB" in line
  assert "kept whole in programs/" in line
  blocker = tmp_path / "file"
  blocker.write_text("x")
  proc = run_txf("info", env={compile_cache.ENV: str(blocker / "c")})
  assert proc.returncode == 0, proc.stderr
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("txf: warning: compilation cache: cannot create"), \
      proc.stderr
  assert "compile_cache: off (cannot create" in proc.stdout


@pytest.mark.slow
def test_a_run_is_bit_identical_cold_warm_and_off(tmp_path):
  """The copy experiment, shortened, three times: with an empty cache, with the cache it filled,
  and with the cache off: metrics.jsonl (but its timings) and params.msgpack equal. The warm run
  reads its init, state and train step back whole from the program cache. (The whole
  default run, the same three ways: BENCHMARKS.md, "Time to first step".)"""
  cache = str(tmp_path / "cache")
  results, kept = {}, {}
  for mode, setting in (("cold", cache), ("warm", cache), ("off", "off")):
    workdir = tmp_path / mode
    proc = run_txf("train", "--config", "copy", "--workdir", str(workdir),
                   "--config.num_train_steps=12", "--config.log_every=4", "--config.eval_every=12",
                   "--config.decode_examples=8", "--config.checkpoint_every=12", "--progress=false",
                   env={compile_cache.ENV: setting, compile_cache.ENV_MIN_SECS: "0"}, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
      for key in [k for k in row if "per_second" in k or "time" in k or "seconds" in k]:
        row.pop(key)
    results[mode] = (rows, (workdir / "params.msgpack").read_bytes())
    if mode != "off":  # whole programs (txf.runtime.program_cache): kept cold, read back warm, none added
      kept[mode] = {p: os.stat(p).st_mtime_ns for p in
                    glob.glob(os.path.join(cache, "*", compile_cache.PROGRAMS_SUBDIR, "*.program"))}
      if mode == "cold":  # a read marks an entry used: set every mark back to see which are read
        for path in kept["cold"]:
          os.utime(path, ns=(1, 1))
  assert len(kept["cold"]) >= 3 and sorted(kept["warm"]) == sorted(kept["cold"])
  assert all(stamp > 1 for stamp in kept["warm"].values()), kept  # init, state and step read back
  assert glob.glob(os.path.join(compile_cache.cache_dir(cache, {**os.environ, "JAX_PLATFORMS": "cpu"}), "*-cache"))
  assert results["cold"] == results["warm"] == results["off"]


def test_a_multi_process_cpu_run_on_an_affected_jax_compiles_instead_of_reading(tmp_path, monkeypatch):
  """jax 0.12.1 hangs a multi-process CPU program read back from its cache at the first collective
  (a 2-process psum, run twice: 0.10.2 answers both times, 0.12.1 waits forever the second):
  such runs turn the cache off, and a later ``apply`` (the loop's) keeps it off."""
  assert compile_cache.serves_multi_process("0.10.2", "cpu")
  assert compile_cache.serves_multi_process("0.12.0.1", "cpu")
  assert not compile_cache.serves_multi_process("0.12.1", "cpu")
  assert not compile_cache.serves_multi_process("0.13.0", "cpu")
  assert compile_cache.serves_multi_process("0.12.1", "gpu")

  class Config:  # jax.config's update and attributes
    def update(self, name, value):
      setattr(self, name, value)

  config = Config()
  monkeypatch.setattr(compile_cache, "_reset", lambda _: None)
  monkeypatch.setattr(compile_cache, "_forced_off", False)
  compile_cache.apply(config, str(tmp_path))
  assert config.jax_enable_compilation_cache
  assert config.jax_compilation_cache_dir.startswith(str(tmp_path))
  compile_cache.force_off(config)
  assert not config.jax_enable_compilation_cache and config.jax_compilation_cache_dir is None
  assert compile_cache.apply(config, str(tmp_path)) is None
  assert not config.jax_enable_compilation_cache
