"""Every runner with every model family, in-loop evaluation and decoding on, on 8 fake CPU devices.

Runners: pmap, mesh fsdp (1,-1,1), mesh (2,2,2), and by hand mesh data (8,1,1) and mesh tensor
(4,1,2) (MATRIX_RUNNERS=all). CI leaves those two out: the batch is split 8 ways over the fsdp
axis as over a data axis of 8, the (2,2,2) mesh has a data axis and a tensor axis of 2, and
tests/test_parallel.py compares the (8,1,1) and (4,1,2) steps with one device's); families:
encoder-decoder (the default experiment, greedy and beam decoding), decoder LM
(shakespeare_char, greedy sample continuations), encoder classifier (sst2, accuracy),
translation with the ablation bench's variants together (relative bias, multi-query attention,
QK-norm, SwiGLU, RMSNorm, Muon), and the pretraining objectives (masked LM on SST-2's text, span
corruption on Tiny Shakespeare's), on the
shared data in ``../shared/data`` (``$TXF_DATA``) or, when it is absent, small stand-in files in
the same formats. Each case trains 2 steps through ``txf.train.train`` (the loop the CLI runs)
with checkpoints at steps 1 and 2 and an evaluation with decoding at the end, then resumes from
step 1 (checkpoint 2 and params.msgpack removed) to redo step 2 and evaluate again. Checked:

- step 1's loss equals the single-device run's on the same global batch to ~1e-6 (the topologies
  sum in different orders; dropout is 0 so every layout draws the same model);
- the resumed step 2 (its metrics rows, its evaluation, params.msgpack) equals the uninterrupted
  one exactly (the same topology);
- the in-loop decoding (the sample translations or continuations the loop printed at step 2)
  equals decoding the run's own params.msgpack on one device, and the final params.msgpack holds
  unreplicated parameters of the model's shapes.

Tiny models (d_model 16, one layer, short lengths); the runs of a file share one subprocess
(XLA_FLAGS set before jax is imported, XLA backend optimisation off, a persistent compilation
cache), run once per session; each parametrised case checks its own results. This file runs the
three model families, tests/test_matrix_pretrain.py the variants and the pretraining objectives,
so that two xdist workers share the matrix.
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

WORKER_XLA_FLAGS = "--xla_force_host_platform_device_count=8"  # + tests/xla_flags.py's

if __name__ == "__main__":  # the 8-device worker: XLA_FLAGS must be set before jax is imported
  os.environ["XLA_FLAGS"] = WORKER_XLA_FLAGS
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from tests.xla_flags import TEST_XLA_FLAGS
  from txf.runtime.process import add_xla_flags
  add_xla_flags(*TEST_XLA_FLAGS)  # the flags of every test process (those this XLA knows)

import numpy as np
import pytest

from tests.conftest import apply_overrides

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.environ.get("TXF_DATA") or os.path.join(ROOT, "..", "shared", "data")
STAND_IN = not all(os.path.exists(os.path.join(SHARED_DATA, d)) for d in ("sst2", "tinyshakespeare"))

RUNNERS = {
    "pmap": {"parallelism": "pmap"},
    "data": {"parallelism": "mesh", "mesh_shape": (8, 1, 1)},
    "fsdp": {"parallelism": "mesh", "mesh_shape": (1, -1, 1)},
    "tensor": {"parallelism": "mesh", "mesh_shape": (4, 1, 2)},
    "2x2x2": {"parallelism": "mesh", "mesh_shape": (2, 2, 2)},
}
# a subset by hand, e.g. MATRIX_RUNNERS=pmap,2x2x2 (.ci/run's newest jax), or all five (all)
CHOSEN_RUNNERS = os.environ.get("MATRIX_RUNNERS", "pmap,fsdp,2x2x2")
if CHOSEN_RUNNERS != "all":
  RUNNERS = {name: RUNNERS[name] for name in CHOSEN_RUNNERS.split(",")}


def chosen(families):
  """``families`` less those that MATRIX_FAMILIES leaves out (a subset by hand, e.g.
  MATRIX_FAMILIES=mlm,span)."""
  only = os.environ.get("MATRIX_FAMILIES")
  return tuple(f for f in families if not only or f in only.split(","))


FAMILIES = chosen(("translate", "lm", "classify"))  # test_matrix_pretrain.py: the other three
DECODED = ("translate", "lm", "variants")  # the families whose in-loop samples are compared
TINY = {"model.d_model": 16, "model.num_heads": 2, "model.d_ff": 32, "model.dropout_rate": 0.0,
        "batch_size": 16, "num_train_steps": 2, "log_every": 1, "eval_every": 0,
        "checkpoint_every": 1, "eval_batches": 1, "time_limit_minutes": 0.0,
        "optimizer.warmup_steps": 10, "optimizer.cooldown_steps": 0, "best_metric": ""}
FAMILY_CONFIG = {
    "translate": ("default", {"model.num_encoder_layers": 1, "model.num_decoder_layers": 1,
                              "model.max_len": 24, "decode_examples": 8, "num_samples": 2,
                              "decode_max_extra": 4}),
    "lm": ("shakespeare_char", {"model.num_decoder_layers": 1, "model.max_len": 48,
                                "data.max_target_len": 24, "num_samples": 2}),
    "classify": ("sst2", {"model.num_encoder_layers": 1, "model.max_len": 32,
                          "data.max_input_len": 24, "data.vocab_size": 512,
                          "data.bucketing": False}),
    # translation with the ablation bench's variants at once: T5's relative bias and multi-query
    # attention in the beam cache, QK-norm, a gated FFN, RMSNorm, and Muon's sharded state (the
    # single key/value head replicated over the tensor axis)
    "variants": ("default", {"model.num_encoder_layers": 1, "model.num_decoder_layers": 1,
                             "model.max_len": 24, "decode_examples": 8, "num_samples": 2,
                             "decode_max_extra": 4, "model.positional": "relative",
                             "model.relative_buckets": 8, "model.relative_max_distance": 16,
                             "model.num_kv_heads": 1, "sharding_rules.kv_heads": "",
                             "model.qk_norm": "rms_norm", "model.activation": "swiglu",
                             "model.norm": "rms_norm", "model.pre_ln": True,
                             "optimizer.name": "muon", "optimizer.schedule": "constant",
                             "optimizer.learning_rate": 0.02}),
    # the pretraining objectives: BERT's masked LM on SST-2's text, T5's span corruption on Tiny
    # Shakespeare's. Their losses draw the masks from the step's rng, which pmap folds with the
    # device index as it does dropout's (README, "From one CPU to a pod"); like dropout 0 above,
    # every eligible token masked (rate 1, all to <mask>) and one span per 24-token window make
    # the draw the same on every layout, so step 1 is compared across them
    "mlm": ("sst2_mlm", {"model.num_encoder_layers": 1, "model.max_len": 32,
                         "data.max_input_len": 24, "data.vocab_size": 512,
                         "optimizer.weight_decay": 0.0, "pretrain.mask_rate": 1.0,
                         "pretrain.mask_token_fraction": 1.0,
                         "pretrain.random_token_fraction": 0.0}),
    "span": ("shakespeare_char", {"model.family": "span_corruption",
                                  "model.num_encoder_layers": 1, "model.num_decoder_layers": 1,
                                  "model.max_len": 32, "data.max_input_len": 24,
                                  "data.max_target_len": 24, "data.tokenizer": "sentencepiece",
                                  "data.vocab_size": 512, "pretrain.num_sentinels": 8,
                                  "num_samples": 0, "optimizer.label_smoothing": 0.0}),
}
# Beam search under some layouts, greedy under the others (the single-device reference decodes
# the final parameters with the same setting).
BEAM = {"pmap": 2, "2x2x2": 2}


def _stand_in_data(root):
  """Small files in the shared data's formats: tinyshakespeare/input.txt, sst2/{train,dev}.tsv."""
  rs = np.random.RandomState(0)
  words = ("the king and queen speak of love war night day good bad film story plays "
           "fine dull great poor act scene").split()
  os.makedirs(os.path.join(root, "tinyshakespeare"))
  with open(os.path.join(root, "tinyshakespeare", "input.txt"), "w") as f:
    for i in range(400):
      f.write(f"{words[i % 4].upper()}:\n" + " ".join(rs.choice(words, 9)) + ".\n\n")
  os.makedirs(os.path.join(root, "sst2"))
  for split, n in (("train", 600), ("dev", 64)):
    with open(os.path.join(root, "sst2", f"{split}.tsv"), "w") as f:
      f.write("sentence\tlabel\n")
      for _ in range(n):
        label = rs.randint(2)
        f.write(" ".join(rs.choice(words, 6)) + (" great" if label else " dull") + f"\t{label}\n")


def _config(family, runner, data_path):
  from txf.core.config import load_experiment
  name, extra = FAMILY_CONFIG[family]
  config = load_experiment(name)
  overrides = {**TINY, **extra, **RUNNERS.get(runner, {"parallelism": "single"}),
               "beam_size": BEAM.get(runner, 1)}
  if family not in ("translate", "variants"):
    overrides["data.path"] = data_path
  return apply_overrides(config, overrides)


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def _train(config, workdir):
  """Runs ``txf.train.train`` with the lines ``txf train`` prints (its TerminalReporter); returns them."""
  from txf.commands.reporting import TerminalReporter
  from txf.train import train
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    train(config, workdir, report=TerminalReporter(progress=False))
  return out.getvalue()


def _printed_samples(printed, step):
  """The text of the samples the loop printed at the evaluation of ``step``."""
  return printed.split(f"samples at step {step}:\n", 1)[1].split("\neval at step", 1)[0]


def _decode_on_one_device(config, workdir):
  """What the loop's sample lines at the last step should read: the run's params.msgpack decoded
  on one device (translations: the ``hyp:`` lines; LM: the continuations)."""
  from txf.runtime import workdir as workdir_lib
  from txf.data import make_task
  from txf.decode import DecodingSpec
  from txf.inference import Evaluator
  from txf.models import model_config_from
  from txf.train.samples import lm_prompts, lm_samples
  task = make_task(config, workdir)
  # params.msgpack holds the real vocabulary: the padding rows of a tensor mesh are not exported
  model_cfg = model_config_from(config, task, vocab_multiple=1)
  params = workdir_lib.load_params(workdir)
  batches = task.eval_batches(config.data.eval_split, config.batch_size,
                              config.eval_batches * config.batch_size)
  if model_cfg.family == "encoder_decoder":
    examples = task.examples(config.data.eval_split, config.decode_examples)
    evaluator = Evaluator(model_cfg, task, batches, examples, DecodingSpec.from_config(config))
    return [f"     hyp: {h}" for h in evaluator.translate(params)[:config.num_samples]]
  if model_cfg.family == "decoder_lm":
    return [f"  {t}" for t in lm_samples(model_cfg, task, params,
                                         lm_prompts(batches, config.num_samples))]
  return []


def _param_shapes(config, workdir, model_shapes):
  """{path: shape} of the model's parameters (from its abstract init; only if ``model_shapes``,
  else None) and of params.msgpack."""
  import jax
  from txf.runtime import workdir as workdir_lib
  flat = lambda tree: {jax.tree_util.keystr(k): list(np.shape(v))
                       for k, v in jax.tree_util.tree_leaves_with_path(tree)}
  want = None
  if model_shapes:
    from txf.data import make_task
    from txf.models import init_params, model_config_from
    task = make_task(config, workdir)
    model_cfg = model_config_from(config, task, vocab_multiple=1)
    batch = next(task.train_iterator(config.batch_size, config.seed))
    want = flat(jax.eval_shape(lambda: init_params(model_cfg, jax.random.key(0), batch)))
  return want, flat(workdir_lib.load_params(workdir))


def _case(family, runner, base, data_path):
  """One run, then its resume from step 2; returns what the checks need (JSON)."""
  config = _config(family, runner, data_path)
  workdir = os.path.join(base, f"{family}-{runner}")
  printed = _train(config, workdir)
  rows = _rows(workdir)
  with open(os.path.join(workdir, "params.msgpack"), "rb") as f:
    params_bytes = f.read()
  expected_samples = _decode_on_one_device(config, workdir) if family in DECODED else []
  samples = []
  if expected_samples:  # translations: the hyp lines; LM: the whole text (it may hold newlines)
    text = _printed_samples(printed, 2)
    samples = [text] if family == "lm" else [
        line for line in text.splitlines() if line.startswith("     hyp:")]
    expected_samples = ["\n".join(expected_samples)] if family == "lm" else expected_samples
  want_shapes, got_shapes = _param_shapes(config, workdir, model_shapes=runner == "single")
  # Resume: drop the last checkpoint and the final parameters, run the same config again.
  shutil.rmtree(os.path.join(workdir, "checkpoints", "2"))
  os.remove(os.path.join(workdir, "params.msgpack"))
  resumed_printed = _train(config, workdir)
  with open(os.path.join(workdir, "params.msgpack"), "rb") as f:
    resumed_bytes = f.read()
  train_rows = lambda rs: {r["step"]: r for r in rs if r.get("split") == "train"}
  eval_rows = lambda rs: {r["step"]: r for r in rs if r.get("split") == "eval"}
  strip = lambda r: {k: v for k, v in r.items() if k not in ("tokens_per_second", "time", "wall_time")}
  return {
      "train": {s: strip(r) for s, r in train_rows(rows).items()},
      "eval": {s: strip(r) for s, r in eval_rows(rows).items()},
      "resumed_train": {s: strip(r) for s, r in train_rows(_rows(workdir)).items()},
      "resumed_eval": {s: strip(r) for s, r in eval_rows(_rows(workdir)).items()},
      "resumed_from_1": "resumed from the checkpoint at step 1" in resumed_printed,
      "params_equal_after_resume": params_bytes == resumed_bytes,
      "samples": samples, "expected_samples": expected_samples,
      "param_shapes": got_shapes, "model_shapes": want_shapes,
  }


def _worker(out_path, families):
  """Runs the single-device reference and every runner for each of ``families``; writes one JSON
  file."""
  import jax
  jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.dirname(out_path), "jax-cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  base = tempfile.mkdtemp(prefix="txf-matrix-")
  data_path = SHARED_DATA
  if STAND_IN:
    data_path = os.path.join(base, "data")
    _stand_in_data(data_path)
  results = {"devices": jax.device_count(), "stand_in": data_path != SHARED_DATA}
  for family in families:
    for runner in ("single",) + tuple(RUNNERS):
      try:
        results[f"{family}/{runner}"] = _case(family, runner, base, data_path)
      except BaseException as e:  # noqa: BLE001 (recorded, and reported by that case's test)
        results[f"{family}/{runner}"] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
      with open(out_path + ".partial", "w") as f:  # what is done so far, for a run watched by hand
        json.dump(results, f)
  shutil.rmtree(base, ignore_errors=True)
  with open(out_path, "w") as f:
    json.dump(results, f)


def run_matrix(tmp_path_factory, families):
  """The worker's results for ``families`` (one subprocess on 8 CPU devices)."""
  out = str(tmp_path_factory.mktemp("matrix") / "matrix.json")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": WORKER_XLA_FLAGS}
  done = subprocess.run([sys.executable, os.path.abspath(__file__), out, ",".join(families)],
                        capture_output=True, text=True, timeout=1500, env=env, cwd=ROOT)
  assert done.returncode == 0, done.stderr[-4000:]
  with open(out) as f:
    results = json.load(f)
  assert results["devices"] == 8
  return results


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
  return run_matrix(tmp_path_factory, FAMILIES)


def _get(matrix, family, runner):
  result = matrix[f"{family}/{runner}"]
  assert "error" not in result, f"{family} under {runner}: {result['error']}"
  return result


def _check_run(result, family, model_shapes=None):
  """Checks one run against itself: the resume and the final parameters (of the model's shapes:
  the single-device run's ``model_shapes``, from the model's abstract init)."""
  assert result["resumed_from_1"]
  # The resumed step 2 equals the uninterrupted step 2 bit for bit (same topology).
  assert result["resumed_train"] == result["train"]
  assert result["resumed_eval"] == result["eval"]
  assert result["params_equal_after_resume"]
  # params.msgpack holds unreplicated parameters of the model's own shapes.
  assert result["param_shapes"] == (result["model_shapes"] or model_shapes)
  # In-loop evaluation ran at the last step, with its family's metrics.
  assert sorted(result["eval"]) == ["2"]
  for step in ("2",):
    ev = result["eval"][step]
    assert np.isfinite(ev["loss"]) and 0.0 <= ev["accuracy"] <= 1.0
    if family == "translate":
      assert 0.0 <= ev["exact_match"] <= 1.0 and ev["bleu"] >= 0.0
    if family == "lm":
      assert np.isclose(ev["perplexity"], np.exp(ev["nll"]), rtol=1e-6)
  # The decoding the loop printed equals decoding the saved parameters on one device.
  if family in DECODED:
    assert result["expected_samples"], "nothing was decoded"
    assert result["samples"] == result["expected_samples"]


def check_single(matrix, family):
  """The single-device reference run of ``family``: its resume and final parameters."""
  _check_run(_get(matrix, family, "single"), family)


def check_runner(matrix, family, runner):
  """``family`` under ``runner`` against itself (resume, parameters, decoding) and against the
  single-device run at step 1."""
  result = _get(matrix, family, runner)
  single = _get(matrix, family, "single")
  _check_run(result, family, single["model_shapes"])
  # Step 1: the same global batch and initial parameters as on one device; only the order of the
  # float32 sums differs between topologies.
  np.testing.assert_allclose(result["train"]["1"]["loss"], single["train"]["1"]["loss"],
                             rtol=2e-6, atol=1e-6)
  np.testing.assert_allclose(result["train"]["1"]["grad_norm"], single["train"]["1"]["grad_norm"],
                             rtol=1e-5)
  np.testing.assert_allclose(result["eval"]["2"]["loss"], single["eval"]["2"]["loss"], rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_single_device_reference(matrix, family):
  check_single(matrix, family)


# Tensor axes split vocabularies of any size (165, 69, a stand-in's): model.vocab_multiple pads them.
@pytest.mark.parametrize("family,runner", [(f, r) for f in FAMILIES for r in RUNNERS])
def test_runner_family(matrix, family, runner):
  check_runner(matrix, family, runner)


if __name__ == "__main__":
  _worker(sys.argv[1], sys.argv[2].split(","))
