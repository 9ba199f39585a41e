"""The import contracts in pyproject.toml hold: ``lint-imports`` fails on any back-arrow between
txf's layers (e.g. inference importing train, or data importing a model)."""

import os
import shutil
import subprocess
import sys

from tests.conftest import ROOT


def _lint_imports() -> list:
  exe = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
  return [exe]


def test_import_contracts_are_kept():
  out = subprocess.run(_lint_imports(), cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
  assert "0 broken" in out.stdout


def test_a_back_arrow_breaks_the_contracts(tmp_path):
  """A copy of txf where inference imports train: lint-imports must fail (the check can fail)."""
  copy = tmp_path / "repo"
  shutil.copytree(os.path.join(ROOT, "txf"), copy / "txf",
                  ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copy(os.path.join(ROOT, "pyproject.toml"), copy / "pyproject.toml")
  run_py = copy / "txf" / "inference" / "run.py"
  run_py.write_text("import txf.train.loop  # a back-arrow\n" + run_py.read_text())
  env = dict(os.environ, PYTHONPATH=str(copy))
  out = subprocess.run(_lint_imports(), cwd=copy, capture_output=True, text=True, timeout=120,
                       env=env)
  assert out.returncode != 0
  assert "txf.inference.run -> txf.train.loop" in out.stdout
