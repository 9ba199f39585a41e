"""Caches that heal (txf/runtime/cache_repair.py, program_cache, compile_cache): a corrupt entry of
jax's persistent cache or a corrupt kept program is compiled again and replaced in the run that
meets it, so the next run reads it back without a word; a run says so in one line however many
entries were bad; and the same holds for a job of two processes (jax.distributed on 127.0.0.1),
where jax's cache serves them (jax 0.12.1 turns it off for a multi-process CPU run, and the bad
entry is then never read)."""

import glob
import json
import os
import subprocess
import sys

import jax
import pytest

from tests.conftest import ROOT
from tests.test_multiprocess import _launch
from txf.runtime import cache_repair, compile_cache

LINE = "txf: warning: compilation cache: an entry could not be read ("

# one jax.jit program and one kept program (program_cache), their results printed
SCRIPT = """
import json, os, jax, jax.numpy as jnp
from txf.parallel import distributed
distributed.maybe_initialize()
from txf.runtime import compile_cache, program_cache
compile_cache.apply(jax.config)
traced = []
@program_cache.cached_jit
def kept(a):
  traced.append(1)
  return jnp.sin(a) @ a.T
x = jnp.arange(12.0).reshape(3, 4)
if jax.process_count() > 1:  # a collective over both processes
  y = jax.jit(lambda a: jnp.tanh(a).sum())(x) + jax.pmap(lambda v: jax.lax.psum(v, "i"), "i")(
      jnp.ones((jax.local_device_count(),)) * (jax.process_index() + 1))[0]
else:
  y = jax.jit(lambda a: (jnp.tanh(a) @ a.T).sum())(x)
print(json.dumps({"y": float(y), "kept": float(kept(x).sum()), "traced": len(traced)}))
"""


def _run(cache):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", compile_cache.ENV: cache,
         compile_cache.ENV_MIN_SECS: "0"}  # keep every program, however fast it compiled
  return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                        cwd=ROOT, timeout=120)


def _entries(cache):
  return sorted(glob.glob(os.path.join(cache, "*", "*-cache")) +
                glob.glob(os.path.join(cache, "*", "programs", "*.program")))


def _corrupt(paths):
  for path in paths:
    with open(path, "r+b") as f:  # cut short, as a process killed while writing it leaves it
      f.truncate(max(1, os.path.getsize(path) // 3))


def test_the_guard_removes_an_unreadable_entry_and_answers_a_miss(tmp_path, monkeypatch):
  calls = []

  def read(cache_key, *_):  # jax's reader: the entry "k1" is cut short, "k2" reads back
    calls.append(cache_key)
    if cache_key == "k1":
      raise ValueError("Error -5 while decompressing data")
    return "program", 3

  monkeypatch.setattr(cache_repair._jax_cache, "get_executable_and_time", read)
  monkeypatch.setattr(cache_repair, "_entry_path", lambda key: str(tmp_path / f"{key}-cache"))
  monkeypatch.setattr(compile_cache, "_entry_said", False)
  monkeypatch.setattr(compile_cache, "_said", set())
  for key in ("k1", "k2"):
    (tmp_path / f"{key}-cache").write_bytes(b"x")
    (tmp_path / f"{key}-atime").write_bytes(b"t")
  assert cache_repair.install()
  guarded = cache_repair._jax_cache.get_executable_and_time
  assert guarded is not read and cache_repair.install()  # installed once
  assert guarded("k1", None, None, None) == (None, None)  # a miss: jax compiles and writes it
  assert sorted(os.listdir(tmp_path)) == ["k2-atime", "k2-cache"]
  assert guarded("k2", None, None, None) == ("program", 3)
  with cache_repair.compiling_fresh():  # read (a bad one would be replaced), never handed back
    assert guarded("k2", None, None, None) == (None, None)
  assert guarded("k2", None, None, None) == ("program", 3)
  assert calls == ["k1", "k2", "k2", "k2"]
  jax.config.update("jax_raise_persistent_cache_errors", True)
  try:
    with pytest.raises(ValueError):  # jax's own option still raises
      guarded("k1", None, None, None)
  finally:
    jax.config.update("jax_raise_persistent_cache_errors", False)


def test_an_entry_replaced_meanwhile_is_not_removed(tmp_path, monkeypatch):
  path = tmp_path / "k-cache"
  path.write_bytes(b"bad")
  monkeypatch.setattr(cache_repair, "_entry_path", lambda key: str(path))
  seen = cache_repair._identity(str(path))
  os.remove(path)
  path.write_bytes(b"another process's good entry")  # written between the read and the removal
  cache_repair._discard("k", seen)
  assert path.read_bytes() == b"another process's good entry"


def test_one_line_however_many_entries(capsys, monkeypatch):
  monkeypatch.setattr(compile_cache, "_entry_said", False)
  monkeypatch.setattr(compile_cache, "_said", set())
  compile_cache.unreadable_entry("error: Error -5 while decompressing data")
  compile_cache.unreadable_entry("UnpicklingError: pickle data was truncated")
  compile_cache.entry_problem("a compiled program could not be written (No space left on device)")
  err = capsys.readouterr().err.splitlines()
  assert err == [LINE + "error: Error -5 while decompressing data): compiled again and replaced"]


@pytest.mark.slow  # end to end (subprocesses): the slow tier
def test_corrupt_entries_are_replaced_in_the_run_that_meets_them(tmp_path):
  cache = str(tmp_path / "cache")
  cold = _run(cache)
  assert cold.returncode == 0 and cold.stderr == "", cold.stderr
  first = json.loads(cold.stdout)
  entries = _entries(cache)
  assert any(p.endswith(".program") for p in entries) and len(entries) >= 3, entries
  _corrupt(entries)  # every entry: jax's, and the kept program
  broken = _run(cache)
  assert broken.returncode == 0, broken.stderr
  assert json.loads(broken.stdout) == first  # compiled again: the same result
  lines = broken.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith(LINE), broken.stderr
  assert lines[0].endswith("compiled again and replaced"), lines
  assert _entries(cache) == entries  # each replaced in place, the kept program too
  healed = _run(cache)
  assert healed.returncode == 0 and healed.stderr == "", healed.stderr
  assert json.loads(healed.stdout) == {**first, "traced": 0}  # the kept program read back whole
  stamps = {p: os.path.getmtime(p) for p in entries if p.endswith("-cache")}
  assert _run(cache).stderr == "" and {p: os.path.getmtime(p) for p in stamps} == stamps


@pytest.mark.slow  # two processes over 127.0.0.1: the slow tier
def test_a_corrupt_entry_in_a_job_of_two_processes(tmp_path):
  cache = str(tmp_path / "cache")
  env = {compile_cache.ENV: cache, compile_cache.ENV_MIN_SECS: "0",
         "JAX_COMPILATION_CACHE_DIR": None}

  def job():
    status, out, _ = _launch(2, 1, [sys.executable, "-c", SCRIPT], timeout=90, kill_after=10,
                             env={k: v for k, v in env.items() if v is not None})
    assert status == 0, out[-3000:]
    return out

  out = job()
  results = [json.loads(line.split("] ", 1)[1]) for line in out.splitlines() if "{" in line]
  assert len(results) == 2, out
  if not compile_cache.serves_multi_process(jax.__version__, "cpu"):
    assert _entries(cache) == [] and "warning" not in out  # jax's cache is off for such a job
    return
  entries = [p for p in _entries(cache) if p.endswith("-cache")]
  assert entries, out  # process 0 writes jax's entries (no kept programs with two processes)
  _corrupt(entries)
  broken = job()
  lines = [line for line in broken.splitlines() if "txf:" in line]
  assert {line[:4] for line in lines} <= {"[0] ", "[1] "} and len(lines) == len(
      {line[:4] for line in lines}), broken  # at most one line a process
  assert lines and all(line[4:].startswith(LINE) for line in lines), broken
  assert sorted(p for p in _entries(cache) if p.endswith("-cache")) == entries
  healed = job()
  assert "txf:" not in healed, healed
