"""Defaults are written once, in base_config: ``txf.core.config.complete`` fills every field a
config lacks (an older run's config.json, a config or an optimizer section built by hand), and no
code restates a default with ``config.get("field", default)``."""

import json
import os
import re

import ml_collections
import pytest

from txf.core import config as config_lib
from txf.core.config import base_config, complete, mesh_axis_sizes, validate, vocab_splits
from txf.decode import DecodingSpec
from txf.runtime import workdir as workdir_lib
from txf.train.optimizer import make_optimizer, optimizer_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Fields an older txf did not write, at every depth: a top-level field, fields of model, data and
# optimizer, one sharding rule, and the whole pretrain section.
MISSING = ["mesh_shape", "dcn_mesh_shape", "decode_examples", "tracker", "model.num_kv_heads",
           "model.qk_norm", "model.logits_scale", "data.id_store_tokens", "optimizer.name",
           "optimizer.momentum", "sharding_rules.kv_heads", "pretrain"]


def _old_config_json(path):
  """A config.json with non-default values where it has a field, and the MISSING fields left out."""
  stored = json.loads(base_config().to_json())
  stored["batch_size"], stored["model"]["d_model"], stored["parallelism"] = 32, 256, "mesh"
  for key in MISSING:
    *parents, last = key.split(".")
    section = stored
    for p in parents:
      section = section[p]
    del section[last]
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(stored, f)


def test_an_old_config_json_loads_with_base_configs_values_for_the_fields_it_lacks(tmp_path):
  _old_config_json(str(tmp_path))
  loaded = workdir_lib.load_config(str(tmp_path))
  want = config_lib._flatten(base_config())  # pylint: disable=protected-access
  got = config_lib._flatten(loaded)  # pylint: disable=protected-access
  assert set(got) == set(want)  # every field, none missing
  changed = {"batch_size": 32, "model.d_model": 256, "parallelism": "mesh"}
  assert {k: v for k, v in got.items() if v != want[k]} == changed
  assert loaded.mesh_shape == (-1, 1, 1) and loaded.dcn_mesh_shape == ()
  assert loaded.sharding_rules.kv_heads == "tensor" and loaded.pretrain.mask_rate == 0.15
  # the mesh the run builds: base_config's (-1, 1, 1), all devices on the data axis
  assert mesh_axis_sizes(loaded, 8) == {"data": 8, "fsdp": 1, "tensor": 1}
  assert vocab_splits(loaded, 8) == 1
  validate(loaded)


def test_a_config_built_by_hand_is_validated_and_trained_as_base_config_fills_it():
  hand = ml_collections.ConfigDict({"model": {"family": "decoder_lm", "d_model": 64}, "batch_size": 8})
  validate(hand)  # checked as the run reads it: every missing field at its default
  assert "num_train_steps" not in hand and "num_heads" not in hand.model  # validate copies
  with pytest.raises(config_lib.ConfigError, match="unknown field 'model.num_head'"):
    validate(ml_collections.ConfigDict({"model": {"num_head": 4}}))
  assert complete(hand) is hand  # train fills the caller's config in place
  assert (hand.num_train_steps, hand.model.num_heads, hand.model.d_model) == (1000, 8, 64)
  assert hand.sharding_rules.batch == "data,fsdp" and hand.batch_size == 8
  new = complete({"data": {"vocab_size": 100}})
  assert isinstance(new, ml_collections.ConfigDict) and new.data.vocab_size == 100
  assert new.data.tokenizer == "word"
  assert complete(None).to_dict() == base_config().to_dict()
  locked = ml_collections.ConfigDict({"seed": 3})
  locked.lock()  # as the command line's --config is
  assert complete(locked).num_train_steps == 1000 and locked.is_locked


def test_an_experiment_file_that_leaves_fields_out_loads_complete(tmp_path):
  path = tmp_path / "partial.py"
  path.write_text("import ml_collections\n\ndef get_config():\n"
                  "  return ml_collections.ConfigDict({'name': 'partial', 'model': {'d_model': 64}})\n")
  loaded = config_lib.load_experiment(str(path))
  assert (loaded.name, loaded.model.d_model, loaded.model.d_ff, loaded.mesh_shape) == (
      "partial", 64, 2048, (-1, 1, 1))


def test_a_section_built_by_hand_gets_that_sections_defaults():
  opt = ml_collections.ConfigDict({"name": "muon", "schedule": "constant", "learning_rate": 0.02})
  make_optimizer(opt, d_model=16)  # reads momentum and muon_adam_lr_ratio it was not given
  spec = optimizer_spec(opt)
  assert (spec.name, spec.learning_rate, spec.momentum, spec.muon_adam_lr_ratio, spec.b2) == (
      "muon", 0.02, 0.95, 0.1, 0.98)
  assert "momentum" not in opt  # read, not written: the section is the caller's
  spec = DecodingSpec.from_config({"beam_size": 4})
  assert (spec.beam_size, spec.alpha, spec.length_penalty, spec.max_extra) == (4, 0.6, "gnmt", 50)


# The receivers of .get("name", default) that are not the run config (a sweep's state, a plan report).
NOT_CONFIG = {("txf/sweep/grid.py", 'd.get("runs"'), ("txf/plan/sizing.py", 'm.get("ffn_hidden"'),
              ("txf/plan/sizing.py", 'm.get("activation"')}
FALLBACK = re.compile(r"""(?<![\w.])((?:config|cfg|m|o|d|p|c|opt_cfg|given|run\.config)(?:\.\w+)?"""
                      r"""(?:\.get\([^()]*\))?\.get\(["'](\w+)["']),""")


def test_no_code_restates_a_default_with_config_get():
  found = []
  for folder, _, files in os.walk(os.path.join(ROOT, "txf")):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        with open(path, encoding="utf-8") as source:
          for n, line in enumerate(source, 1):
            for match in FALLBACK.finditer(line):
              if not any(rel == where and match.group(1).endswith(what) for where, what in NOT_CONFIG):
                found.append(f"{rel}:{n}: {match.group(1)}")
  assert not found, ("a config field read with a fallback default: read it as an attribute (the "
                     "config is complete: txf.core.config.complete), or add a receiver that is not "
                     "the run config to NOT_CONFIG:\n" + "\n".join(found))
