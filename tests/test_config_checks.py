"""Configs that would train silently wrong are refused before anything compiles (txf train exits 2
with one line), and a run shortened below its cooldown scales the cooldown with a note."""

import math

import pytest

from tests.conftest import apply_overrides, run_txf
from txf.core import config as config_lib
from txf.core.config import ConfigError, base_config, validate


# (field, value, the refusal's words): the default experiment, as `txf train` without --config
SILENTLY_WRONG = [
    ("optimizer.learning_rate_scale", 0.0, "optimizer.learning_rate_scale=0.0 must be > 0"),
    ("optimizer.learning_rate_scale", -1.0, "optimizer.learning_rate_scale=-1.0 must be > 0"),
    ("optimizer.b1", 1.0, "optimizer.b1=1.0 must be in [0, 1)"),
    ("optimizer.b2", -0.1, "optimizer.b2=-0.1 must be in [0, 1)"),
    ("optimizer.eps", 0.0, "optimizer.eps=0.0 must be > 0"),
    ("grad_accum_steps", 3, "batch_size=64 is not divisible by grad_accum_steps=3"),
    ("best_metric", "bleu_score", "best_metric='bleu_score' is never logged by a "
     "encoder_decoder run with this config (its evaluations log loss, nll, accuracy, perplexity, "
     "exact_match, bleu)"),
]


@pytest.mark.parametrize("field, value, needle", SILENTLY_WRONG)
def test_silently_wrong_configs_are_refused(field, value, needle):
  config = apply_overrides(config_lib.load_experiment("default"), {field: value})
  with pytest.raises(ConfigError) as e:
    validate(config)
  assert needle in str(e.value)


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_train_refuses_a_silently_wrong_config_in_one_line_before_writing(tmp_path):
  # the command's path for every refusal above: one line, exit 2, no traceback, no workdir
  field, value, needle = SILENTLY_WRONG[2]
  r = run_txf("train", "--workdir", str(tmp_path / "w"), f"--config.{field}={value}",
              "--progress=false")
  assert r.returncode == 2, r.stdout + r.stderr
  assert needle in r.stderr, r.stderr
  assert "Traceback" not in r.stderr
  assert not (tmp_path / "w").exists()  # refused before the workdir is written


def test_best_metric_depends_on_family_and_decoding():
  c = base_config()
  c.best_metric = "bleu"
  validate(c)  # a translation run decodes (decode_examples=200): bleu is logged
  c.decode_examples = 0
  with pytest.raises(ConfigError, match="best_metric='bleu' is never logged"):
    validate(c)
  c = base_config()
  c.model.family = "encoder_classifier"
  c.best_metric = "perplexity"
  with pytest.raises(ConfigError, match="loss, nll, accuracy"):
    validate(c)
  c.best_metric = "accuracy"
  validate(c)


def test_valid_optimizer_edges_pass():
  c = base_config()
  c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.0, 0.999, 1e-12
  c.batch_size, c.grad_accum_steps = 64, 4
  validate(c)


@pytest.mark.parametrize("steps, cooldown, original, expected", [
    (50, 500, 1500, 17),    # 500 * 50 / 1500 = 16.7
    (3, 500, 1500, 1),      # never below 1 step
    (100, 90, 100, None),   # fits: untouched
    (200, 1200, 2000, 120),
])
def test_fit_cooldown_keeps_its_share_of_the_run(steps, cooldown, original, expected):
  c = base_config()
  c.num_train_steps, c.optimizer.cooldown_steps = steps, cooldown
  note = config_lib.fit_cooldown(c, original)
  if expected is None:
    assert note is None and c.optimizer.cooldown_steps == cooldown
  else:
    assert c.optimizer.cooldown_steps == expected == max(1, math.floor(cooldown * steps / original + 0.5))
    assert f"scaled to {expected} steps" in note
    validate(c)


CONFIG = """
from txf.core.config import base_config

def get_config():
  c = base_config()
  c.name = "cooldown"
  c.num_train_steps = 300
  c.batch_size = 8
  c.log_every = 1
  c.decode_examples = 4
  c.num_samples = 0
  c.eval_batches = 1
  c.model.d_model, c.model.num_heads, c.model.d_ff = 16, 2, 32
  c.model.num_encoder_layers = c.model.num_decoder_layers = 1
  c.model.max_len = 32
  c.optimizer.warmup_steps = 10
  c.optimizer.cooldown_steps = 150
  return c
"""


@pytest.mark.slow
def test_shortened_run_scales_its_cooldown_with_a_note(tmp_path):
  path = tmp_path / "cooldown.py"
  path.write_text(CONFIG)
  r = run_txf("train", "--config", str(path), "--workdir", str(tmp_path / "w"),
              "--config.num_train_steps=2", "--progress=false", cwd=str(tmp_path))
  assert r.returncode == 0, r.stderr
  assert ("txf: note: num_train_steps=2 is shorter than the experiment's cooldown_steps=150 "
          "(of 300 steps): the cooldown is scaled to 1 steps") in r.stdout
  # an explicit cooldown longer than the run is still an error (the user asked for both)
  r = run_txf("train", "--config", str(path), "--workdir", str(tmp_path / "w2"),
              "--config.num_train_steps=2", "--config.optimizer.cooldown_steps=150", cwd=str(tmp_path))
  assert r.returncode == 2 and "optimizer.cooldown_steps=150 must be in [0, num_train_steps=2]" in r.stderr
