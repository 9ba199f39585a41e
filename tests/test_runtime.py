"""txf.runtime.process: when the txf command re-executes itself under tcmalloc, and that it really does."""

import os
import subprocess
import sys

import pytest

from tests.conftest import run_txf
from txf.runtime import process as runtime

LIB = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def _plan(env, platform="linux", found=LIB, path0="/venv/bin"):
  return runtime.reexec_plan(env, ["/bin/txf", "train", "--workdir", "w"], platform, lambda: found,
                             code_root="/src/txf-checkout", path0=path0)


def test_reexec_plan_preloads_tcmalloc_once_and_keeps_the_arguments():
  argv, env = _plan({"PATH": "/bin", "LD_PRELOAD": "/x/other.so"})
  assert argv == [sys.executable, "-P", "-m", "txf.cli", "train", "--workdir", "w"]
  assert env["LD_PRELOAD"] == f"{LIB} /x/other.so" and env["PATH"] == "/bin"
  assert "PYTHONPATH" not in env  # the console script's directory holds no txf
  assert _plan(env) is None  # the re-executed process does not loop


def test_reexec_plan_keeps_the_code_of_python_m_in_a_checkout_first():
  # python -m txf.cli run in a checkout imported txf from the working directory, which -P drops
  _, env = _plan({"PYTHONPATH": "/extra"}, path0="/src/txf-checkout")
  assert env["PYTHONPATH"] == os.pathsep.join(["/src/txf-checkout", "/extra"])
  _, env = _plan({}, path0="/src/txf-checkout/")
  assert env["PYTHONPATH"] == "/src/txf-checkout"
  _, env = _plan({"PYTHONPATH": "/extra"}, path0=None)  # started with -P itself
  assert env["PYTHONPATH"] == "/extra"


@pytest.mark.parametrize("env,platform,found", [
    ({"TXF_MALLOC": "system"}, "linux", LIB),      # turned off
    ({}, "darwin", LIB),                           # not Linux
    ({}, "linux", None),                           # not installed
    ({"LD_PRELOAD": LIB}, "linux", LIB),           # already preloaded
])
def test_no_reexec(env, platform, found):
  assert _plan(env, platform, found) is None


def test_bad_setting_and_missing_forced_library_are_named():
  with pytest.raises(ValueError, match="TXF_MALLOC='jemalloc'"):
    _plan({"TXF_MALLOC": "jemalloc"})
  with pytest.raises(ValueError, match="apt-get install libtcmalloc-minimal4"):
    _plan({"TXF_MALLOC": "tcmalloc"}, found=None)


def test_find_tcmalloc_looks_in_the_given_directories(tmp_path):
  assert runtime.find_tcmalloc([str(tmp_path)]) is None
  (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
  assert runtime.find_tcmalloc([str(tmp_path)]) == str(tmp_path / "libtcmalloc_minimal.so.4")


@pytest.mark.skipif(runtime.find_tcmalloc() is None or not sys.platform.startswith("linux"),
                    reason="tcmalloc is not installed here")
@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_txf_command_runs_under_tcmalloc_and_system_malloc_on_request():
  env = {"LD_PRELOAD": None, "_TXF_MALLOC_REEXEC": None, "TXF_MALLOC": None}
  r = run_txf("info", env=env)
  assert r.returncode == 0 and "allocator: tcmalloc" in r.stdout, r.stderr
  r = run_txf("info", env={**env, "TXF_MALLOC": "system"})
  assert r.returncode == 0 and "allocator: system" in r.stdout, r.stderr


@pytest.mark.skipif(runtime.find_tcmalloc() is None or not sys.platform.startswith("linux"),
                    reason="tcmalloc is not installed here")
@pytest.mark.slow  # end to end (a txf process or more): the slow tier
@pytest.mark.parametrize("launch", ["console script", "python -m"])
def test_the_reexecuted_command_imports_the_same_txf_inside_another_checkout(tmp_path, launch):
  # a directory that looks like another checkout: its txf.cli says so and fails
  fake = tmp_path / "txf"
  fake.mkdir()
  (fake / "__init__.py").write_text("")
  (fake / "cli.py").write_text("import sys\nprint('the other checkout')\nsys.exit(3)\n")
  env = {k: v for k, v in os.environ.items()
         if k not in ("LD_PRELOAD", "_TXF_MALLOC_REEXEC", "TXF_MALLOC", "PYTHONPATH")}
  if launch == "console script":
    script = os.path.join(os.path.dirname(sys.executable), "txf")
    if not os.path.exists(script):
      pytest.skip("the txf console script is not installed here")
    cmd, cwd = [script, "info"], tmp_path
  else:  # python -m txf.cli in this checkout imports it from the working directory
    env["PYTHONPATH"] = str(tmp_path)  # the other checkout on the path too, after the working dir
    cmd, cwd = [sys.executable, "-m", "txf.cli", "info"], runtime.CODE_ROOT
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd,
                     env={**env, "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 0 and "the other checkout" not in r.stdout, (r.stdout, r.stderr[-2000:])
  assert "allocator: tcmalloc" in r.stdout  # it did re-execute


def test_xla_knows_reads_the_flag_names_a_library_registers(tmp_path):
  lib = tmp_path / "libfake.so"
  lib.write_bytes(b"\x7fELF junk\x00xla_cpu_old_flag\x00more\x00xla_backend_optimization_level\x00"
                  b"\n\x1bxla_only_a_proto_field\x18")
  assert runtime.xla_knows("--xla_cpu_old_flag=false", [str(lib)])
  assert runtime.xla_knows("xla_backend_optimization_level", [str(lib)])
  assert not runtime.xla_knows("--xla_cpu_old", [str(lib)])                  # a prefix is not a flag
  assert not runtime.xla_knows("--xla_only_a_proto_field=1", [str(lib)])     # not registered as a flag


def test_add_xla_flags_passes_only_what_the_installed_xla_knows():
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  left_out = runtime.add_xla_flags("--xla_backend_optimization_level=0", "--xla_txf_no_such_flag=1",
                                   environ=env)
  assert left_out == ["--xla_txf_no_such_flag=1"]
  assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0"
  # XLA starts with what was kept (an unknown flag would abort the process)
  code = "import jax; print(len(jax.devices()))"
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                     env={**os.environ, "JAX_PLATFORMS": "cpu", **env})
  assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr[-2000:]
