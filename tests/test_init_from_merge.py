"""init_from across objectives: ``txf.train.init_from.merge`` takes every parameter the source has
at the same path, keeps the run's own initialisation for the rest, drops the source's others, and
refuses a shared path of another shape in one error naming it (worked by hand on small trees)."""

import json

import numpy as np
import pytest

from txf.core.errors import TxfError
from txf.train.init_from import merge, write_report


def trees():
  mlm = {"embed": {"embedding": np.full((5, 4), 1.0, np.float32)},
         "encoder": {"layer_0": {"kernel": np.arange(16, dtype=np.float32).reshape(4, 4)}},
         "mlm_dense": {"kernel": np.ones((4, 4), np.float32)},
         "logits_bias": np.zeros(5, np.float32)}
  classifier = {"embed": {"embedding": np.zeros((5, 4), np.float32)},
                "encoder": {"layer_0": {"kernel": np.zeros((4, 4), np.float32)}},
                "classifier": {"kernel": np.full((4, 2), 7.0, np.float32),
                               "bias": np.zeros(2, np.float32)}}
  return mlm, classifier


def test_loaded_new_and_dropped():
  mlm, classifier = trees()
  tree, report = merge(mlm, classifier, "init_from='mlm'", "encoder_classifier")
  assert report == {"loaded": ["embed/embedding", "encoder/layer_0/kernel"],
                    "new": ["classifier/bias", "classifier/kernel"],
                    "dropped": ["logits_bias", "mlm_dense/kernel"]}
  np.testing.assert_array_equal(tree["embed"]["embedding"], np.ones((5, 4)))
  np.testing.assert_array_equal(tree["encoder"]["layer_0"]["kernel"],
                                np.arange(16).reshape(4, 4))
  np.testing.assert_array_equal(tree["classifier"]["kernel"], np.full((4, 2), 7.0))
  assert set(tree) == {"embed", "encoder", "classifier"}


def test_a_shared_parameter_of_another_shape_is_one_error():
  mlm, classifier = trees()
  mlm["embed"]["embedding"] = np.ones((6, 4), np.float32)
  with pytest.raises(TxfError, match=r"parameter embed/embedding has shape \(6, 4\) there but "
                                     r"\(5, 4\) in this model.family=encoder_classifier run"):
    merge(mlm, classifier, "init_from='mlm'", "encoder_classifier")


def test_nothing_shared_is_refused():
  with pytest.raises(TxfError, match="no parameter of this model.family=decoder_lm run"):
    merge({"a": np.ones(2)}, {"b": np.ones(2)}, "init_from='x'", "decoder_lm")


def test_the_report_file_and_line(tmp_path):
  mlm, classifier = trees()
  _, report = merge(mlm, classifier, "init_from='mlm'", "encoder_classifier")
  line = write_report(str(tmp_path), report)
  assert line == ("txf: init_from: 2 parameters loaded, 2 new (classifier), 2 dropped "
                  "(logits_bias, mlm_dense): init_from.json")
  assert json.loads((tmp_path / "init_from.json").read_text()) == report
