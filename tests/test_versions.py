"""The jax release CI's newest-jax stage runs is named once (.ci/versions): .ci/run installs exactly
it, pyproject.toml caps jax and jaxlib at it, and the README's "tested" line names it."""

import os
import re
import tomllib

from tests.conftest import ROOT


def _newest() -> str:
  with open(os.path.join(ROOT, ".ci", "versions")) as f:
    found = re.findall(r"^JAX_NEWEST=([0-9.]+)\s*$", f.read(), re.M)
  assert len(found) == 1, found
  return found[0]


def test_ci_installs_exactly_the_named_release():
  with open(os.path.join(ROOT, ".ci", "run")) as f:
    run = f.read()
  assert ". .ci/versions" in run
  assert '"jax==$JAX_NEWEST" "jaxlib==$JAX_NEWEST"' in run
  assert "jax>=" not in run  # no open range that a new release would move under a submission


def test_pyproject_caps_jax_at_the_release_ci_has_run():
  newest = _newest()
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
  for name in ("jax", "jaxlib"):
    spec = next(d for d in deps if re.match(rf"{name}[<>=]", d))
    assert f"<={newest}" in spec, (spec, newest)


def test_the_readme_names_the_tested_release():
  newest = _newest()
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  tested = [line for line in readme.splitlines() if "tested" in line.lower() and "jax" in line]
  assert tested and all(newest in line for line in tested), tested
