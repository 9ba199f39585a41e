"""The frozen specs the layers below the loop take (txf.core.specs): defaults from base_config,
read once from a run config, immutable; and no layer below the loop reads the run config."""

import ast
import dataclasses
import glob
import os

import pytest

from txf.core.config import base_config
from txf.data.base import DataSpec
from txf.parallel import ParallelSpec
from txf.train.checkpoint import CheckpointSpec
from txf.train.optimizer import OptimizerSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_spec_built_by_hand_has_base_configs_defaults():
  c = base_config()
  layout = ParallelSpec(batch_size=48)
  assert (layout.batch_size, layout.parallelism, layout.mesh_shape, layout.vocab_multiple) == (
      48, c.parallelism, tuple(c.mesh_shape), c.model.vocab_multiple)
  assert dict(layout.sharding_rules) == dict(c.sharding_rules)
  assert OptimizerSpec().b2 == c.optimizer.b2 and OptimizerSpec().name == c.optimizer.name
  assert CheckpointSpec().keep_checkpoints == c.keep_checkpoints


def test_from_config_reads_every_field_from_its_path():
  c = base_config()
  c.batch_size, c.model.vocab_multiple, c.mesh_shape = 96, 8, [2, -1, 1]
  c.sharding_rules.vocab = "tensor"
  c.keep_checkpoints, c.best_metric, c.seed = 7, "bleu", 11
  c.optimizer.learning_rate, c.data.packing = 0.25, True
  layout = ParallelSpec.from_config(c)
  assert (layout.batch_size, layout.vocab_multiple, layout.mesh_shape) == (96, 8, (2, -1, 1))
  assert layout.sharding_rules["vocab"] == "tensor"
  assert CheckpointSpec.from_config(c) == CheckpointSpec(seed=11, keep_checkpoints=7,
                                                         best_metric="bleu")
  assert OptimizerSpec.from_config(c.optimizer).learning_rate == 0.25
  assert DataSpec.from_config(c.data).packing is True


def test_a_section_missing_fields_takes_their_defaults_and_unknown_ones_are_ignored():
  spec = OptimizerSpec.from_config({"learning_rate": 0.5, "not_a_field": 1})
  assert spec.learning_rate == 0.5 and spec.warmup_steps == base_config().optimizer.warmup_steps


def test_specs_are_frozen_and_do_not_share_the_configs_mutable_values():
  c = base_config()
  layout = ParallelSpec.from_config(c)
  with pytest.raises(dataclasses.FrozenInstanceError):
    layout.batch_size = 1
  with pytest.raises(TypeError):
    layout.sharding_rules["vocab"] = "tensor"  # a read-only mapping
  c.sharding_rules.vocab = "changed after reading"
  assert layout.sharding_rules["vocab"] == base_config().sharding_rules.vocab


# The modules that take a spec: none of them reads a run config's field.
SPEC_TAKERS = sorted(glob.glob(os.path.join(ROOT, "txf", "parallel", "*.py"))
                     + glob.glob(os.path.join(ROOT, "txf", "data", "*.py"))) + [
    os.path.join(ROOT, "txf", "train", "optimizer.py"),
    os.path.join(ROOT, "txf", "train", "checkpoint.py")]
# The functions that do, and why.
READ_THE_CONFIG = {
    "from_config": "builds the spec: where the config is read, once",
    "point_at_data": "edits a loaded run's config in place when its data moved (txf eval --data_path)",
}


def _config_reads(tree):
  skip = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in READ_THE_CONFIG
          for n in ast.walk(f)}
  return [f"line {node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
          if id(node) not in skip and isinstance(node, ast.Attribute)
          and isinstance(node.value, ast.Name) and node.value.id in ("config", "cfg", "run_config")]


@pytest.mark.parametrize("path", SPEC_TAKERS, ids=lambda p: os.path.relpath(p, ROOT))
def test_the_layers_that_take_a_spec_read_no_run_config(path):
  reads = _config_reads(ast.parse(open(path).read()))
  assert not reads, f"{os.path.relpath(path, ROOT)} reads the run config: {reads}"


def test_the_scan_finds_a_config_read():
  assert _config_reads(ast.parse("def f(config):\n  return config.batch_size\n")) == [
      "line 2: config.batch_size"]
  assert _config_reads(ast.parse("def point_at_data(config):\n  config.data.path = 1\n")) == []
