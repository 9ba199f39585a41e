"""The benchmarks live outside the installed package (bench/ of the checkout): ``python -m bench``
runs from the checkout's root, the wheel leaves them out, and ``txf bench`` without a checkout says
what to do in one ``txf: error:`` line."""

import os
import shutil
import subprocess
import sys

import pytest
import setuptools

from tests.conftest import ROOT, run_txf


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_python_m_bench_runs_from_the_checkout_root():
  proc = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
  assert proc.returncode == 0, proc.stderr
  assert "--configs" in proc.stdout and "--dtypes" in proc.stdout


def test_the_package_ships_no_benchmarks():
  packages = setuptools.find_namespace_packages(ROOT, include=["txf", "txf.*"])
  assert "txf.plan" in packages and "txf.commands" in packages  # the user features stay
  assert not [p for p in packages if "bench" in p]
  assert os.path.isfile(os.path.join(ROOT, "bench", "run.py"))


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_txf_bench_without_a_checkout_is_one_error_line(tmp_path):
  """txf as a wheel installs it: the package alone, no bench/ beside it."""
  site = tmp_path / "site"
  shutil.copytree(os.path.join(ROOT, "txf"), site / "txf", ignore=shutil.ignore_patterns("__pycache__"))
  proc = run_txf("bench", "--configs=tiny", "--nodecode", env={"PYTHONPATH": str(site)},
                 cwd=str(tmp_path))
  assert proc.returncode == 2, proc.stdout + proc.stderr
  errors = [l for l in proc.stderr.splitlines() if l.startswith("txf: error: ")]
  assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert "source checkout" in errors[0] and str(site) in errors[0]
