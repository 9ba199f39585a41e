"""The "A model family" and "A loss" recipes of docs/extending.md, each from a plugin file written
into the recipe's folder (the files its "Files:" line names), checked against numpy, then trained
with ``txf train`` and served by the family's command (the ``slow`` tier)."""

import json
import os

import jax
import numpy as np
import pytest

from tests.test_recipes import TINY, mine, page_files, train_and_translate, write, written  # noqa: F401
from txf.core import config as config_lib, families


# ----------------------------------------------------------------------------- a model family

FAMILY_PLUGIN = '''
    # my_family.py: a bigram language model (each token predicted from the one before it alone)
    import flax.linen as nn
    import jax.numpy as jnp
    from txf.core import families

    class BigramLM(nn.Module):
      config: object          # the run's TransformerConfig

      @nn.compact
      def __call__(self, targets, targets_segmentation=None, targets_position=None):
        cfg = self.config
        previous = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=cfg.decoder_start_id)[:, :-1]
        h = nn.Embed(cfg.padded_tgt_vocab_size, cfg.d_model, name="embed")(previous)
        return nn.Dense(cfg.tgt_vocab_size, name="out")(h).astype(jnp.float32)

    families.register(families.Family(name="bigram", module=BigramLM, inputs=("targets",),
                                      predicts="targets", data_kind="plain"))
'''


@pytest.fixture
def family_plugin(mine):
  path = write(mine, "my_family.py", FAMILY_PLUGIN)
  assert written(mine) == page_files("A model family")
  yield path
  if "bigram" in families.names():
    families.unregister("bigram")


def test_recipe_model_family_is_registered_and_computes_its_formula(family_plugin):
  from txf.data import make_task  # pylint: disable=import-outside-toplevel
  from txf.models import forward, build_model, init_params, model_config_from  # pylint: disable=import-outside-toplevel
  cfg = config_lib.load_experiment("default")
  cfg.model.family, cfg.model.d_model = "bigram", 8
  with pytest.raises(config_lib.ConfigError, match="model.family='bigram' is not one of"):
    config_lib.validate(cfg)
  cfg.plugins = family_plugin
  config_lib.validate(cfg)           # imports the plugin: the family is then known
  task = make_task(cfg)
  batch = next(task.train_iterator(4, 0))
  model_cfg = model_config_from(cfg, task, vocab_multiple=1)
  params = init_params(model_cfg, jax.random.key(0), batch)
  logits, _, _ = forward(build_model(model_cfg, deterministic=True), params, batch)
  y = np.asarray(batch["targets"])
  previous = np.concatenate([np.full((y.shape[0], 1), model_cfg.decoder_start_id), y[:, :-1]], 1)
  want = (np.asarray(params["embed"]["embedding"], np.float64)[previous]
          @ np.asarray(params["out"]["kernel"], np.float64) + np.asarray(params["out"]["bias"]))
  np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_recipe_model_family_trains_and_is_served(tmp_path, txf_cli, family_plugin):
  workdir = str(tmp_path / "run")
  trained = txf_cli("train", *TINY, "--workdir", workdir, f"--config.plugins={family_plugin}",
                    "--config.model.family=bigram")
  assert trained.returncode == 0, trained.stderr[-3000:]
  # its serving command is the record's (txf eval: a family that is never decoded), from the
  # stored config.plugins, in another process
  served = txf_cli("eval", "--workdir", workdir, "--split", "test", "--max_examples", "8")
  assert served.returncode == 0, served.stderr[-3000:]
  report = json.loads(served.stdout)
  assert report["family"] == "bigram" and np.isfinite(report["loss"]) and report["num_examples"] == 8


# ----------------------------------------------------------------------------- a loss

LOSS_PLUGIN = '''
    # my_loss.py: translation trained on the plain NLL (no label smoothing), as a family of its own
    import dataclasses
    import jax
    import jax.numpy as jnp
    from txf.core import families
    from txf.models import forward

    def make_plain_nll(label_smoothing):     # the config's label_smoothing is not used
      def loss_fn(model, params, batch, rng):
        logits, targets, weights = forward(model, params, batch, rng)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
        correct = (logits.argmax(-1) == targets) * weights
        return (nll * weights).sum(), {"count": weights.sum(), "nll_sum": (nll * weights).sum(),
                                       "correct": correct.sum()}
      return loss_fn

    families.register(dataclasses.replace(families.get("encoder_decoder"), name="translation_nll",
                                          loss=make_plain_nll))
'''


@pytest.fixture
def loss_plugin(mine):
  path = write(mine, "my_loss.py", LOSS_PLUGIN)
  assert written(mine) == page_files("A loss")
  yield path
  if "translation_nll" in families.names():
    families.unregister("translation_nll")


def test_recipe_loss_is_what_the_family_minimises(loss_plugin):
  from txf.data import make_task  # pylint: disable=import-outside-toplevel
  from txf.models import build_model, default_loss, forward, init_params, model_config_from  # pylint: disable=import-outside-toplevel
  cfg = config_lib.load_experiment("default")
  cfg.plugins, cfg.model.family = loss_plugin, "translation_nll"
  cfg.model.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
  config_lib.validate(cfg)
  task = make_task(cfg)
  batch = next(task.train_iterator(4, 0))
  model_cfg = model_config_from(cfg, task, vocab_multiple=1)
  params = init_params(model_cfg, jax.random.key(0), batch)
  model = build_model(model_cfg, deterministic=True)
  loss_fn = default_loss(model_cfg, label_smoothing=0.1)     # the family's: smoothing unused
  loss, sums = jax.jit(lambda p, b: loss_fn(model, p, b, None))(params, batch)
  logits, targets, weights = (np.asarray(a, np.float64) for a in
                              jax.jit(lambda p, b: forward(model, p, b))(params, batch))
  shifted = logits - logits.max(-1, keepdims=True)
  log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_p, targets.astype(int)[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(loss), (nll * weights).sum(), rtol=1e-5)   # no smoothing
  assert float(sums["count"]) == weights.sum()


@pytest.mark.slow
def test_recipe_loss_trains_and_translates(tmp_path, txf_cli, loss_plugin):
  workdir, _ = train_and_translate(txf_cli, tmp_path, f"--config.plugins={loss_plugin}",
                                   "--config.model.family=translation_nll")
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  train_rows = [r for r in rows if r["split"] == "train"]
  # the logged loss is the plain NLL although optimizer.label_smoothing is 0.1 (the default
  # loss logs the smoothed cross-entropy, larger than the NLL)
  assert train_rows and all(abs(r["loss"] - r["nll"]) <= 1e-5 * r["nll"] for r in train_rows)
