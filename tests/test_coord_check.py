"""txf coord-check (txf/train/coord_check.py): the widths' configs, and (slow) the check itself
at small widths: under muP each layer's output RMS stays close across widths, in the standard
parametrization it grows with the width."""

import os

import numpy as np
import pytest

from tests.conftest import ROOT
from txf.commands.coord_check import parse_widths
from txf.core.errors import TxfError
from txf.train import coord_check
from txf.core.config import load_experiment


def _copy(parametrization="standard"):
  config = load_experiment(os.path.join(ROOT, "experiments", "copy.py"))
  config.model.parametrization = parametrization
  return config


def test_a_width_scales_d_model_and_d_ff_and_keeps_the_base_width():
  config = _copy("mup")                                  # d_model 64, d_ff 128, 2 heads
  wide = coord_check.width_config(config, 256)
  assert (wide.model.d_model, wide.model.d_ff, wide.model.num_heads) == (256, 512, 2)
  assert wide.model.mup_base_width == 64 and wide.model.dropout_rate == 0.0
  assert config.model.d_model == 64 and config.model.mup_base_width == 0   # the original untouched
  assert coord_check.width_config(_copy(), 128).model.mup_base_width == 0
  assert parse_widths("64,128, 256") == [64, 128, 256]
  for bad in ("64", "64,x", "0,64"):
    with pytest.raises(TxfError, match="two or more positive widths"):
      parse_widths(bad)


def test_the_spread_is_max_over_min_across_widths():
  check = coord_check.CoordCheck([32, 64], 2, "mup", {
      "a": {32: [1.0, 2.0], 64: [1.5, 1.0]}, coord_check.LOGITS: {32: [1.0, 1.0], 64: [9.0, 9.0]}})
  np.testing.assert_allclose(check.spread("a"), [1.5, 2.0])
  assert check.worst() == 2.0 and check.worst(include_logits=True) == 9.0
  assert "| a | 2 | 1 | 2.000 |" in coord_check.table(check)


@pytest.mark.slow
def test_mup_keeps_activations_across_widths_and_standard_does_not(tmp_path):
  widths, results = [32, 64, 128], {}
  for name in ("mup", "standard"):
    config = _copy(name)
    config.model.d_model, config.model.d_ff = 32, 64      # tuned at the smallest width
    results[name] = coord_check.run(config, widths, steps=3, learning_rate=0.01, seeds=2)
  mup, std = results["mup"].worst(), results["standard"].worst()
  assert mup < 1.5 and std > 3.0 and std > 2 * mup, (mup, std)
  # the standard parametrization's attention output grows with the width after the first update
  grows = [results["standard"].rms["encoder/layer_0/self_attention"][w][-1] for w in widths]
  assert grows[0] < grows[1] < grows[2]
  paths = coord_check.write(results["mup"], str(tmp_path))
  assert all(os.path.getsize(p) > 0 for p in paths.values())
