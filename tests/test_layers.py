"""The import contracts in pyproject.toml hold: ``lint-imports`` fails on any back-arrow between
txf's layers (e.g. inference importing train, or data importing a model), and on a search
algorithm of txf.decode importing the model adapter."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _lint_imports() -> list:
  exe = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
  return [exe]


def test_import_contracts_are_kept():
  out = subprocess.run(_lint_imports(), cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
  assert "0 broken" in out.stdout


@pytest.mark.parametrize("module, arrow", [
    ("inference/run.py", "import txf.train.loop  # a back-arrow\n"),
    ("decode/beam.py", "import txf.decode.adapter  # a search algorithm importing the model adapter\n"),
])
def test_a_back_arrow_breaks_the_contracts(tmp_path, module, arrow):
  """A copy of txf with one forbidden import (inference importing train; beam search importing
  the model adapter, hence the models): lint-imports must fail and name it (the check can fail)."""
  copy = tmp_path / "repo"
  shutil.copytree(os.path.join(ROOT, "txf"), copy / "txf",
                  ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copy(os.path.join(ROOT, "pyproject.toml"), copy / "pyproject.toml")
  path = copy / "txf" / module
  path.write_text(arrow + path.read_text())
  env = dict(os.environ, PYTHONPATH=str(copy))
  out = subprocess.run(_lint_imports(), cwd=copy, capture_output=True, text=True, timeout=120,
                       env=env)
  assert out.returncode != 0
  importer = "txf." + module[:-len(".py")].replace("/", ".")
  assert f"{importer} -> {arrow.split()[1]}" in out.stdout
