"""The runner x family matrix of tests/test_matrix.py for the ablation bench's variants together
and the pretraining objectives (masked LM, span corruption): the same runs and checks, in a
subprocess of its own, so that a second xdist worker runs them beside test_matrix.py's families.
"""

import pytest

from tests import test_matrix as matrix_lib

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

FAMILIES = matrix_lib.chosen(("variants", "mlm", "span"))


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
  return matrix_lib.run_matrix(tmp_path_factory, FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_single_device_reference(matrix, family):
  matrix_lib.check_single(matrix, family)


@pytest.mark.parametrize("family,runner", [(f, r) for f in FAMILIES for r in matrix_lib.RUNNERS])
def test_runner_family(matrix, family, runner):
  matrix_lib.check_runner(matrix, family, runner)
