"""Config validation: each kind of bad config gives a clear error naming the field and the fix."""

import os

import pytest

from txf.core import config as config_lib
from txf.core import families
from txf.core.config import ConfigError, base_config, validate
from tests.conftest import EXPERIMENTS, run_txf


def test_base_and_experiment_configs_validate():
  validate(base_config())
  import importlib.util
  for name in sorted(os.listdir(EXPERIMENTS)):
    if name.endswith(".py"):
      spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(EXPERIMENTS, name))
      module = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
      validate(module.get_config())


@pytest.mark.parametrize("mutate, needle", [
    (lambda c: setattr(c.model, "num_heads", 3), "not divisible by model.num_heads=3"),
    (lambda c: setattr(c.pretrain, "mask_rate", 0.0), "pretrain.mask_rate=0.0 must be in (0, 1]"),
    (lambda c: c.pretrain.update(mask_token_fraction=0.8, random_token_fraction=0.3),
     "with a sum <= 1"),
    (lambda c: setattr(c.model, "d_ff", -1), "model.d_ff=-1 must be an integer >= 0"),
    (lambda c: setattr(c, "batch_size", -4), "batch_size=-4 must be positive"),
    (lambda c: setattr(c.model, "dropout_rate", 1.5), "model.dropout_rate=1.5 must be in [0, 1)"),
    (lambda c: setattr(c.data, "id_store_tokens", -1), "data.id_store_tokens=-1 must be in [0, 2**31 - 1]"),
    (lambda c: setattr(c.data, "id_store_tokens", 2 ** 31),
     "data.id_store_tokens=2147483648 must be in [0, 2**31 - 1]"),
    (lambda c: setattr(c.model, "positional", "rotary"), "model.positional='rotary' is not one of"),
    (lambda c: c.model.update(positional="rope", d_model=24), "d_k = d_model / num_heads = 3 must be even"),
    (lambda c: c.model.update(positional="rope", rope_base=1.0), "model.rope_base=1.0 must be > 1"),
    (lambda c: c.model.update(positional="relative", relative_buckets=5),
     "model.relative_buckets=5 must be an even integer >= 4"),
    (lambda c: c.model.update(positional="relative", relative_max_distance=16),
     "model.relative_max_distance=16 must be an integer > relative_buckets / 2 = 16"),
])
def test_bad_values(mutate, needle):
  c = base_config()
  mutate(c)
  with pytest.raises(ConfigError, match=None) as e:
    validate(c)
  assert needle in str(e.value)


def test_unknown_field_suggests_the_right_name():
  c = base_config()
  c.model.num_head = 4
  with pytest.raises(ConfigError) as e:
    validate(c)
  assert "unknown field 'model.num_head'" in str(e.value) and "model.num_heads" in str(e.value)


def test_max_len_shorter_than_data():
  c = base_config()
  c.model.max_len = 16
  with pytest.raises(ConfigError) as e:
    validate(c, {"max_input_len": 32, "max_target_len": 20})
  msg = str(e.value)
  assert "model.max_len=16" in msg and "max_input_len=32" in msg and "max_target_len=20" in msg


@pytest.mark.parametrize("flag, needle", [
    ("--config.model.num_heads=5", "not divisible"),
    ("--config.model.max_len=8", "model.max_len=8 is shorter than the data"),
])
@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_cli_reports_bad_config_and_writes_nothing(tmp_path, flag, needle):
  workdir = tmp_path / "run"
  r = run_txf("train", "--config", os.path.join(EXPERIMENTS, "copy.py"), "--workdir", str(workdir), flag,
              "--progress=false")
  assert r.returncode == 2, r.stderr
  assert needle in r.stderr
  assert "Traceback" not in r.stderr
  if workdir.exists():  # a config that fails before training leaves no half-written run behind
    assert not (workdir / "params.msgpack").exists()


def test_the_reference_gives_every_field_its_default_allowed_values_and_meaning():
  import txf.models  # noqa: F401  (the variant tables declare their fields' values)
  fields = {f["key"]: f for f in config_lib.reference()}
  flat = config_lib._flatten(config_lib.base_config())
  assert set(fields) == set(flat)
  missing = [k for k, f in fields.items() if not f["meaning"]]
  assert not missing, missing                 # every field's line in base_config has a comment
  assert fields["optimizer.label_smoothing"]["default"] == 0.1
  assert "epsilon_ls" in fields["optimizer.label_smoothing"]["meaning"]
  assert fields["sharding_rules.heads"]["meaning"].startswith("attention heads")
  assert fields["model.family"]["allowed"] == families.names()
  assert fields["model.norm"]["allowed"] == ("layer_norm", "rms_norm")
  assert fields["num_train_steps"]["allowed"] is None
  for key in ("data.format", "data.spm_model_type", "parallelism"):   # validate holds them to it
    cfg = config_lib.base_config()
    section, _, name = key.rpartition(".")
    (cfg[section] if section else cfg)[name] = "nope"
    with pytest.raises(config_lib.ConfigError, match=f"{key}='nope' is not one of"):
      config_lib.validate(cfg)


def test_ffn_and_block_variants_validate():
  c = base_config()
  c.model.activation, c.model.ffn_match_params = "swiglu", True
  c.model.use_bias, c.model.parallel_block = False, True
  validate(c)
  c.model.activation = "glu"
  with pytest.raises(ConfigError) as e:
    validate(c)
  assert "model.activation='glu' is not one of" in str(e.value) and "'swiglu'" in str(e.value)
