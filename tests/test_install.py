"""A non-editable install runs: build the wheel, install it into a bare directory, and train the
packaged default experiment from a directory outside the repository."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)


def _setuptools_builds_wheels() -> bool:
  try:
    from importlib import metadata
    major, minor = (int(x) for x in metadata.version("setuptools").split(".")[:2])
  except Exception:  # pylint: disable=broad-except
    return False
  return (major, minor) >= (70, 1)  # bdist_wheel built in: no network, no build isolation


@pytest.mark.slow
@pytest.mark.skipif(not _setuptools_builds_wheels(),
                    reason="needs setuptools>=70.1 (the test extra) to build the wheel offline")
def test_wheel_install_trains_the_packaged_default_from_anywhere(tmp_path):
  src = tmp_path / "src"
  ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
  for name in ("txf", "experiments"):
    shutil.copytree(os.path.join(ROOT, name), src / name, ignore=ignore)
  for name in ("pyproject.toml", "setup.py", "README.md"):
    shutil.copy(os.path.join(ROOT, name), src / name)
  pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
  subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", str(src), "-w",
                        str(tmp_path / "dist")], check=True, capture_output=True, timeout=240)
  wheels = os.listdir(tmp_path / "dist")
  assert len(wheels) == 1 and wheels[0].startswith("txf-"), wheels
  site = tmp_path / "site"
  subprocess.run(pip + ["install", "--no-deps", "--target", str(site),
                        str(tmp_path / "dist" / wheels[0])], check=True, capture_output=True,
                 timeout=240)
  assert (site / "txf" / "experiments" / "default.py").is_file()
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  # JAX picks its platform itself (no JAX_PLATFORMS), so its TPU probe would run and log
  env = {**{k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}, "PYTHONPATH": str(site)}
  where = subprocess.run([sys.executable, "-c", "import txf; print(txf.__file__)"], env=env,
                         cwd=elsewhere, capture_output=True, text=True, timeout=60)
  assert where.stdout.strip() == str(site / "txf" / "__init__.py")  # the wheel, not the checkout
  r = subprocess.run([str(site / "bin" / "txf"), "train", "--config", "default",
                      "--config.num_train_steps=2", "--config.decode_examples=8",
                      "--config.eval_batches=1", "--workdir", "run", "--progress=false"],
                     env=env, cwd=elsewhere, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "2 steps of 64" in r.stdout
  # quiet: no absl-format library lines (I1123 12:00:00.0 ... file.py:12] ...), no TPU probe
  assert not re.search(r"^[IWE]\d{4} ", r.stdout + r.stderr, re.M), r.stderr
  assert "Unable to initialize backend" not in r.stderr
  assert (elsewhere / "run" / "params.msgpack").is_file()
  # the README's form of the path also resolves to the packaged copy
  r = subprocess.run([str(site / "bin" / "txf"), "train", "--config", "experiments/nosuch.py"],
                     env=env, cwd=elsewhere, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "no config file experiments/nosuch.py" in r.stderr
  assert "sst2" in r.stderr  # lists the packaged experiments
