"""A fourth model family declared from this file alone: one flax module and one registry line.

The module is a bigram language model (logits of token t from the embedding of token t-1 alone,
no attention), registered as ``toy_bigram``. The quick tests check what the registry derives for it
(batch keys, metrics, the loss weighting, the forward pass against numpy), and the end-to-end test
trains, resumes, evaluates and averages it through the ordinary commands, this file named as the
run's plugin (``--config.plugins=tests/test_family_registry.py``), so the commands' own processes
register it the same way.
"""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.core import families
from txf.core import config as config_lib
from txf.core.config import ConfigError


class BigramLM(nn.Module):
  """logits[b, t] = E[y_{t-1}] W + c, with y_{-1} = the decoder start id; [B, T] -> [B, T, V]."""
  config: "object"

  @nn.compact
  def __call__(self, targets, targets_segmentation=None, targets_position=None):
    cfg = self.config
    previous = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=cfg.decoder_start_id)[:, :-1]
    h = nn.Embed(cfg.padded_tgt_vocab_size, cfg.d_model, name="embed")(previous)
    return nn.Dense(cfg.tgt_vocab_size, name="out")(h).astype(jnp.float32)


TOY = families.register(families.Family(
    name="toy_bigram", module=BigramLM, inputs=("targets",), predicts="targets",
    data_kind="plain", decoding=None, command="txf eval", encoder=False))

PLUGIN = os.path.relpath(__file__, os.path.dirname(os.path.dirname(__file__)))  # as a user types it


def test_the_registry_derives_the_toy_familys_keys_metrics_and_checks():
  assert "toy_bigram" in families.names() and families.get("toy_bigram") is TOY
  assert TOY.metrics == ("loss", "nll", "accuracy", "perplexity")
  assert TOY.batch_keys == ("targets",)
  assert families.get("encoder_classifier").batch_keys[-1] == "label"
  with pytest.raises(families.FamilyError, match="already registered"):
    families.register(families.Family(name="toy_bigram", module="x.y:Z", inputs=("targets",)))
  with pytest.raises(families.FamilyError, match="predicts targets, so its inputs"):
    families.register(families.Family(name="bad", module=BigramLM, inputs=("inputs",)))
  with pytest.raises(families.FamilyError, match="data_kind='images'"):
    families.register(families.Family(name="bad", module=BigramLM, inputs=("targets",),
                                      data_kind="images"))
  assert "bad" not in families.names()
  cfg = config_lib.load_experiment("default")
  cfg.model.family, cfg.decode_examples, cfg.best_metric = "toy_bigram", 500, "bleu"
  with pytest.raises(ConfigError, match="best_metric='bleu' is never logged by a toy_bigram run"):
    config_lib.validate(cfg)   # it does not decode: no bleu, whatever decode_examples says
  cfg.model.family = "no_such_family"
  with pytest.raises(ConfigError, match="model.family='no_such_family' is not one of"):
    config_lib.validate(cfg)


def plain_nll(label_smoothing):
  """A family's own loss factory: the unsmoothed NLL sum whatever ``label_smoothing`` says."""
  from txf.models import forward

  def loss_fn(model, params, batch, rng):
    logits, targets, weights = forward(model, params, batch, rng)
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
    correct = (logits.argmax(-1) == targets) * weights
    return (nll * weights).sum(), {"count": weights.sum(), "nll_sum": (nll * weights).sum(),
                                   "correct": correct.sum()}
  return loss_fn


def test_a_familys_own_loss_is_what_its_steps_minimise():
  from txf.data import make_task
  from txf.inference import make_eval_step
  from txf.models import init_params, model_config_from
  families.register(families.Family(name="toy_bigram_nll", module=BigramLM, inputs=("targets",),
                                    loss=plain_nll))
  try:
    cfg = config_lib.load_experiment("default")
    cfg.model.family, cfg.model.d_model = "toy_bigram_nll", 8
    task = make_task(cfg)
    batch = next(task.train_iterator(4, 0))
    model_cfg = model_config_from(cfg, task, vocab_multiple=1)
    params = init_params(model_cfg, jax.random.key(1), batch)
    sums = make_eval_step(model_cfg, label_smoothing=0.3)(params, batch)   # smoothing unused
    y = np.asarray(batch["targets"])
    previous = np.concatenate([np.full((y.shape[0], 1), model_cfg.decoder_start_id), y[:, :-1]], 1)
    logits = (np.asarray(params["embed"]["embedding"], np.float64)[previous]
              @ np.asarray(params["out"]["kernel"], np.float64) + np.asarray(params["out"]["bias"]))
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    nll = logz - np.take_along_axis(logits, y[..., None], -1)[..., 0]
    want = (nll * (y != 0)).sum()
    np.testing.assert_allclose(float(sums["loss_sum"]), want, rtol=1e-5)
    np.testing.assert_allclose(float(sums["nll_sum"]), want, rtol=1e-5)
  finally:
    families.unregister("toy_bigram_nll")


def test_the_toy_family_builds_and_its_forward_is_the_bigram_formula():
  from txf.models import build_model, forward, init_params, model_config_from
  from txf.data import make_task
  cfg = config_lib.load_experiment("default")
  cfg.model.family, cfg.model.d_model = "toy_bigram", 8
  task = make_task(cfg)
  assert task.max_input_len == 0   # the synthetic task feeds it targets alone
  batch = next(task.train_iterator(4, 0))
  assert sorted(batch) == ["targets"]
  model_cfg = model_config_from(cfg, task, vocab_multiple=1)
  model = build_model(model_cfg, deterministic=True)
  assert isinstance(model, BigramLM)
  params = init_params(model_cfg, jax.random.key(0), batch)
  logits, targets, weights = forward(model, params, batch)
  y = np.asarray(batch["targets"])
  previous = np.concatenate([np.full((y.shape[0], 1), model_cfg.decoder_start_id), y[:, :-1]], 1)
  table = np.asarray(params["embed"]["embedding"], np.float64)
  w, c = (np.asarray(params["out"][k], np.float64) for k in ("kernel", "bias"))
  np.testing.assert_allclose(np.asarray(logits), table[previous] @ w + c, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(weights), (y != 0).astype(np.float32))
  np.testing.assert_array_equal(np.asarray(targets), y)


@pytest.mark.slow
def test_a_registered_family_trains_resumes_evaluates_and_averages_through_the_commands(
    tmp_path, txf_cli):
  workdir = str(tmp_path / "toy")
  common = ["--config", "default", "--workdir", workdir, "--progress=false",
            f"--config.plugins={PLUGIN}", "--config.model.family=toy_bigram",
            "--config.model.d_model=16", "--config.batch_size=16", "--config.log_every=4",
            "--config.eval_every=6", "--config.checkpoint_every=6", "--config.decode_examples=0",
            "--config.eval_batches=2", "--config.optimizer.warmup_steps=4"]
  first = txf_cli("train", *common, "--config.num_train_steps=12")
  assert first.returncode == 0, first.stderr[-3000:]
  assert "txf: toy_bigram," in first.stdout
  stored = json.load(open(os.path.join(workdir, "config.json")))
  assert stored["plugins"] == os.path.abspath(PLUGIN)   # later commands find it from anywhere
  resumed = txf_cli("train", *common, "--config.num_train_steps=18")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  train_steps = [r["step"] for r in rows if r.get("split") == "train"]
  assert train_steps == sorted(set(train_steps)) and train_steps[-1] == 18   # resumed, not redone
  evals = [r for r in rows if r.get("split") == "eval"]
  assert evals and set(TOY.metrics) <= set(evals[-1])
  assert not {"bleu", "exact_match"} & set(evals[-1])
  # txf eval from another directory: config.json's plugin path registers the family there too
  scored = txf_cli("eval", "--workdir", "toy", "--split", "val", "--output", "report.json",
                   cwd=str(tmp_path))
  assert scored.returncode == 0, scored.stderr[-3000:]
  report = json.load(open(tmp_path / "report.json"))
  assert report["family"] == "toy_bigram" and report["num_examples"] > 0
  assert np.isclose(report["perplexity"], np.exp(report["loss"]), rtol=1e-6)
  averaged = txf_cli("average-checkpoints", "--workdir", workdir, "--last", "2")
  assert averaged.returncode == 0, averaged.stderr[-3000:]
  assert "use them with --params=" in averaged.stdout and "(txf eval)" in averaged.stdout
  # a command that serves another family names the one that serves this
  (tmp_path / "in.txt").write_text("s1 s2\n")
  wrong = txf_cli("translate", "--workdir", workdir, "--input", str(tmp_path / "in.txt"))
  assert wrong.returncode == 2 and "use `txf eval` for it" in wrong.stderr
