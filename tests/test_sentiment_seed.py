"""experiments/sentiment_seed.py: the seed's settings, a valid config, and a clear error without data."""

import importlib.util
import os

import pytest

from tests.conftest import EXPERIMENTS
from txf.core import config as config_lib


def _config():
  spec = importlib.util.spec_from_file_location("sentiment_seed", os.path.join(EXPERIMENTS, "sentiment_seed.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def test_sentiment_seed_is_valid_and_keeps_the_seed_settings():
  c = _config()
  config_lib.validate(c, {"max_input_len": c.data.max_input_len})
  m, o, d = c.model, c.optimizer, c.data
  assert (m.family, m.num_encoder_layers, m.num_heads, m.d_ff) == ("encoder_classifier", 2, 3, 400)
  assert m.d_model == 51 and m.d_model % m.num_heads == 0  # the seed's 50, rounded to 3 heads of 17
  assert (o.schedule, o.learning_rate, o.warmup_steps) == ("constant", 1e-3, 1)
  assert (d.source, d.format, d.path, d.eval_split) == ("text:rt-polarity", "tsv", "", "dev")
  assert d.truncate and m.max_len >= d.max_input_len


def test_sentiment_seed_without_data_names_txf_data(monkeypatch):
  from txf.data import make_task
  from txf.data.base import DataError
  monkeypatch.delenv("TXF_DATA", raising=False)
  with pytest.raises(DataError, match="TXF_DATA"):
    make_task(_config())
