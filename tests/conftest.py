"""Shared test set-up: CPU JAX, the repository root, and a helper to run the txf CLI."""

import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# torch (the Hugging Face reference models of tests/test_hf_*.py) on one thread: their matmuls are
# tiny, and two xdist workers share the cores; XLA's CPU thread pool does not read this variable
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

from txf.runtime import compile_cache, process as runtime  # noqa: E402
from tests.xla_flags import TEST_XLA_FLAGS  # noqa: E402
# The model's variant tables declare the allowed values that txf.core.config.validate checks.
import txf.models  # noqa: E402,F401  pylint: disable=unused-import

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One compilation cache for the whole session: every xdist worker, and every txf command a test
# starts (they inherit TXF_COMPILE_CACHE), reads back the programs another test compiled. It lives
# in the checkout (.cache/ is ignored), so a fresh clone starts cold; TXF_COMPILE_CACHE overrides.
TEST_CACHE = os.path.join(ROOT, ".cache", "xla-tests")
os.environ.setdefault(compile_cache.ENV, TEST_CACHE)
# Both tiers compile far more than they run (tiny models, a few steps): tests/xla_flags.py's
# flags halve the compile time. Every process of the session (xdist workers, the txf commands and
# workers the tests start) inherits them through XLA_FLAGS, so results compared across processes
# come from the same programs, and the end-to-end tier reads back the programs the quick tier
# compiled.
EXPERIMENTS = os.path.join(ROOT, "experiments")


def pytest_configure(config):
  """Before any test starts jax's backend: the tests' XLA flags, then the shared cache (its
  folder is keyed by the flags)."""
  del config
  have = os.environ.get("XLA_FLAGS", "").split()  # xdist workers inherit the controller's
  runtime.add_xla_flags(*[f for f in TEST_XLA_FLAGS if f not in have])
  compile_cache.apply(jax.config)


# The test files that take longest (`pytest -n 2 --durations=0`, both tiers, 2 cores), longest
# first. xdist hands each worker one file at a time in collection order (--dist=loadfile
# --no-loadscope-reorder, pyproject.toml): starting the long files first keeps one worker from
# running a long file alone at the end while the other is idle.
LONGEST_FIRST = ("test_matrix.py", "test_matrix_pretrain.py", "test_multiprocess_pod.py",
                 "test_multiprocess.py", "test_lost_hosts.py", "test_readme_commands.py",
                 "test_stack.py", "test_plan.py", "test_train_terminal.py", "test_disk_full.py",
                 "test_attention_impl.py", "test_notebooks.py", "test_models.py")


def pytest_collection_modifyitems(session, config, items):
  """Orders the files: LONGEST_FIRST's, then the others by their number of tests, most first
  (xdist's own order for the rest); the tests of a file keep their order."""
  del session, config
  files = {}
  for item in items:
    files.setdefault(item.nodeid.split("::")[0], []).append(item)
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  order = sorted(files, key=lambda f: (rank.get(os.path.basename(f), len(rank)), -len(files[f])))
  items[:] = [item for f in order for item in files[f]]


def run_txf(*args, timeout=300, env=None, cwd=None):
  """Run ``python -m txf.cli ARGS`` in a subprocess; returns CompletedProcess (text).
  ``env`` entries are added to this process's environment; a None value removes the variable."""
  full_env = {k: v for k, v in {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}.items()
              if v is not None}
  return subprocess.run([sys.executable, "-m", "txf.cli", *args], capture_output=True, text=True,
                        timeout=timeout, env=full_env, cwd=cwd or ROOT)


def apply_overrides(config, overrides):
  """Set dotted config fields in place: {"model.d_model": 16, "batch_size": 8}; returns config."""
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


@pytest.fixture
def txf_cli():
  return run_txf
