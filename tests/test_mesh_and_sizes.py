"""The mesh and size arithmetic, each in one place: the -1 fill of a mesh shape (strict and
lenient), the sharding-rule parser, the rows of a batch (the data's count, which ``txf plan``
shows) and the model config built from a config and the data's sizes."""

import itertools
import math
import types

import pytest

from txf.core import config as config_lib
from txf.core.config import ConfigError, base_config, fill_mesh_shape, mesh_axis_sizes, rule_axes
from txf.data import pipeline
from txf.data.real import make_real_task
from txf.models import model_config_for, model_config_from
from txf.parallel import sharding
from txf.plan import batch_shape

from test_data_fixtures import config_for, parallel_dir, plain_dir


def test_strict_fill_takes_the_rest_of_the_devices():
  assert fill_mesh_shape((-1, 2, 1), 8) == (4, 2, 1)
  assert fill_mesh_shape((2, -1, 2), 8) == (2, 2, 2)
  assert fill_mesh_shape((1, 8, 1), 8) == (1, 8, 1)
  assert fill_mesh_shape([-1, 1, 1], 1) == (1, 1, 1)
  assert sharding.resolve_mesh_shape((-1, 2, 1), 8) == (4, 2, 1)


def test_strict_fill_agrees_with_an_enumeration_of_every_shape():
  # independent: a shape is valid on 8 devices iff its -1 (at most one) can be set so that the
  # product is 8; the answer is then that one completion
  values = (-2, -1, 0, 1, 2, 3, 4, 8)
  for shape in itertools.product(values, repeat=3):
    completions = [c for c in itertools.product((1, 2, 4, 8), repeat=3) if math.prod(c) == 8
                   and all(s == -1 or s == x for s, x in zip(shape, c))]
    valid = shape.count(-1) <= 1 and all(s == -1 or s > 0 for s in shape)
    if valid and len(completions) == 1:
      assert fill_mesh_shape(shape, 8) == completions[0], shape
    else:
      with pytest.raises(ConfigError):
        fill_mesh_shape(shape, 8)


@pytest.mark.parametrize("shape, message", [
    ((-1, -1, 1), "mesh_shape=(-1, -1, 1): entries must be positive, with at most one -1"),
    ((0, 1, 1), "mesh_shape=(0, 1, 1): entries must be positive, with at most one -1"),
    ((-1, 3, 1), "mesh_shape=(-1, 3, 1): 8 devices are not divisible by 3; change mesh_shape"),
    ((3, 1, 1), "mesh_shape=(3, 1, 1) has 3 devices but there are 8; use -1 for one axis to take "
                "the rest"),
    ((8, 1), "mesh_shape=(8, 1) needs 3 entries ('data', 'fsdp', 'tensor')"),
])
def test_strict_fill_names_the_problem(shape, message):
  for fill in (lambda: fill_mesh_shape(shape, 8), lambda: sharding.resolve_mesh_shape(shape, 8)):
    with pytest.raises(ConfigError) as e:
      fill()
    assert str(e.value) == message
  with pytest.raises(ConfigError, match=r"^dcn_mesh_shape=\(3, 1, 1\) has 3 devices"):
    sharding.resolve_mesh_shape((3, 1, 1), 8, "dcn_mesh_shape")


def test_lenient_fill_falls_back_to_one():
  assert fill_mesh_shape((-1, 2, 1), 8, strict=False) == (4, 2, 1)
  assert fill_mesh_shape((-1, 3, 1), 8, strict=False) == (1, 3, 1)   # 3 does not divide 8
  assert fill_mesh_shape((-1, -1, 2), 8, strict=False) == (1, 1, 2)  # two -1: neither filled
  assert fill_mesh_shape((0, 2, -1), 8, strict=False) == (1, 2, 4)   # 0 counts as 1
  assert fill_mesh_shape((3, 1, 1), 8, strict=False) == (3, 1, 1)    # the product is not checked
  assert fill_mesh_shape((8, 1), 8, strict=False) == (1, 1, 1)
  assert fill_mesh_shape((), 8, strict=False) == (1, 1, 1)


def _mesh_config(mesh_shape, dcn=(), vocab_rule="tensor"):
  c = base_config()
  c.parallelism, c.mesh_shape, c.dcn_mesh_shape = "mesh", mesh_shape, dcn
  c.sharding_rules.vocab = vocab_rule
  return c


def test_mesh_axis_sizes_fill_the_slice_and_multiply_by_the_slices():
  assert mesh_axis_sizes(_mesh_config((-1, 2, 1)), 8) == {"data": 4, "fsdp": 2, "tensor": 1}
  # 16 devices in 2 slices: (-1, 2, 1) over 8 per slice is (4, 2, 1), times (2, 1, 1) across
  assert mesh_axis_sizes(_mesh_config((-1, 2, 1), (2, 1, 1)), 16, 2) == {
      "data": 8, "fsdp": 2, "tensor": 1}
  assert mesh_axis_sizes(_mesh_config((-1, 1, 1), (1, -1, 1)), 16, 4) == {
      "data": 4, "fsdp": 4, "tensor": 1}
  assert mesh_axis_sizes(_mesh_config((-1, 3, 1)), 8) == {"data": 1, "fsdp": 3, "tensor": 1}
  single = base_config()
  single.mesh_shape = (1, 1, 8)
  assert mesh_axis_sizes(single, 8) == {"data": 1, "fsdp": 1, "tensor": 1}


def test_one_rule_parser_for_the_config_checks_the_mesh_and_the_vocabulary():
  assert rule_axes("data,fsdp") == ("data", "fsdp")
  assert rule_axes(" fsdp , tensor ,") == ("fsdp", "tensor")
  assert rule_axes("") == () and rule_axes(None) == ()
  assert rule_axes(("fsdp",)) == ("fsdp",)
  rules = sharding.parse_rules({"embed": " data, tensor", "kv": None})
  assert rules["embed"] == ("data", "tensor") and rules["kv"] == () and rules["batch"] == (
      "data", "fsdp")
  assert config_lib.vocab_splits(_mesh_config((2, 2, 2), vocab_rule="fsdp, tensor"), 8) == 4
  assert config_lib.vocab_splits(_mesh_config((2, 2, 2), vocab_rule=""), 8) == 1
  assert config_lib.resolve_vocab_multiple(_mesh_config((1, 1, 8)), 8, "cpu") == 128
  bad = base_config()
  bad.sharding_rules.embed = "data,fdsp"
  with pytest.raises(ConfigError) as e:
    config_lib.validate(bad)
  assert ("sharding_rules.embed='data,fdsp' names mesh axis 'fdsp', which does not exist: use "
          "some of ('data', 'fsdp', 'tensor')") in str(e.value)
  with pytest.raises(ConfigError) as e:
    sharding.parse_rules(dict(bad.sharding_rules.items()))
  assert str(e.value) == ("sharding_rules.embed='data,fdsp' names mesh axis 'fdsp', which does not "
                          "exist: the mesh axes are ('data', 'fsdp', 'tensor')")


def test_rows_for_tokens_by_hand():
  assert pipeline.rows_for_tokens(8, 0, 8, 32) == 8          # a fixed row count
  assert pipeline.rows_for_tokens(8, 1000, 8, 32) == 24      # 1000 // 32 = 31 -> 24
  assert pipeline.rows_for_tokens(8, 100, 8, 32) == 8        # 3 rows -> at least one multiple
  assert pipeline.rows_for_tokens(8, 100, 1, 32) == 3
  assert pipeline.rows_for_tokens(8, 100, 0, 32) == 3


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("sizes")
  return {"root": root, "parallel": parallel_dir(root / "par"), "plain": plain_dir(root / "plain")}


# (kind, data fields, rows worked by hand) with batch_size 8 and 32 / 32 tokens
BATCHING = {
    "plain": ("parallel", {}, 8),
    "tokens": ("parallel", {"tokens_per_batch": 200, "rows_multiple": 2}, 6),      # 200 // 32 = 6
    "bucketed": ("parallel", {"bucketing": True, "bucket_window": 2, "tokens_per_batch": 256,
                              "rows_multiple": 4}, 8),                              # 256 // 32
    "packed": ("parallel", {"packing": True, "tokens_per_batch": 512, "rows_multiple": 4}, 16),
    "lm_stream": ("plain", {"max_target_len": 48, "tokens_per_batch": 480, "rows_multiple": 4},
                  8),                                                               # 10 -> 8
}


@pytest.mark.parametrize("mode", sorted(BATCHING))
def test_plan_rows_are_the_rows_the_pipeline_gives(dirs, mode):
  kind, data, by_hand = BATCHING[mode]
  family, extra = {"parallel": ("encoder_decoder", {}),
                   "plain": ("decoder_lm", {"tokenizer": "char"})}[kind]
  cfg = config_for(f"text:{dirs[kind]}", dirs["root"] / "tfds", family, kind, **{**extra, **data})
  cfg.batch_size = 8
  shape = batch_shape(cfg)
  assert shape["rows"] == by_hand
  it = make_real_task(cfg, "").train_iterator(8, seed=0)
  longest = cfg.data.max_target_len
  rows = set()
  for _ in range(40):
    b = next(it)
    if b["targets"].shape[1] == longest:
      rows.add(b["targets"].shape[0])
  assert rows == {shape["rows"]}, (mode, rows, shape)


def test_one_model_config_for_training_plan_and_checkpoints(tmp_path):
  c = base_config()
  c.model.d_model, c.model.num_heads, c.model.d_ff = 16, 2, 32
  task = types.SimpleNamespace(vocab_size=300, target_vocab_size=0, num_classes=0)
  run = model_config_from(c, task, vocab_multiple=128)
  assert run == model_config_for(c, 300, 0, 0, vocab_multiple=128)
  assert (run.vocab_size, run.padded_vocab_size, run.num_classes, run.d_model) == (300, 384, 2, 16)
  assert model_config_for(c, 300, 500, 3, vocab_multiple=1).padded_tgt_vocab_size == 500
  assert model_config_for(c, 300, 500, 3, vocab_multiple=1).num_classes == 3
  # with no vocab_multiple: the config's, resolved for this (CPU) backend
  assert model_config_for(c, 300).vocab_multiple == 1
  c.model.vocab_multiple = 64
  assert model_config_for(c, 300).padded_vocab_size == 320


def test_plan_sizes_a_span_corruption_batch_by_its_corrupted_lengths():
  """Windows of L = 64 tokens at T5's density 0.15 and mean span 3, worked by hand: n = round(9.6)
  = 10 noise tokens in s = round(10 / 3) = 3 spans; the encoder reads 64 - 10 + 3 + 1 = 58 tokens
  and the decoder 10 + 3 + 1 = 14, whatever data.max_target_len says."""
  cfg = base_config()
  cfg.model.family = "span_corruption"
  cfg.batch_size = 8
  cfg.data.max_input_len, cfg.data.max_target_len = 64, 200
  cfg.pretrain.noise_density, cfg.pretrain.mean_span_length = 0.15, 3.0
  assert batch_shape(cfg) == {"rows": 8, "source_len": 64, "target_len": 14, "encoder_len": 58}
  cfg.model.family = "encoder_decoder"  # any other family: the data's own lengths
  assert batch_shape(cfg) == {"rows": 8, "source_len": 64, "target_len": 200, "encoder_len": 64}


def test_plan_sizes_a_registered_family_by_its_own_lengths():
  """A plugin family whose loss rewrites the batch says what its model reads
  (``Family.lengths``); plan takes it from the record, not from the family's name."""
  from txf.core import families
  seen = []

  def halves(max_input_len, pretrain):
    seen.append(pretrain.noise_density)
    return max_input_len // 2, 5

  families.register(families.Family(name="toy_halves", module="txf.models.encoder_decoder:"
                                    "EncoderDecoder", inputs=("inputs", "targets"),
                                    encoder=True, lengths=halves))
  try:
    cfg = base_config()
    cfg.model.family = "toy_halves"
    cfg.batch_size = 8
    cfg.data.max_input_len, cfg.data.max_target_len = 40, 200
    assert batch_shape(cfg) == {"rows": 8, "source_len": 40, "target_len": 5, "encoder_len": 20}
    assert seen == [cfg.pretrain.noise_density]
  finally:
    families.unregister("toy_halves")
