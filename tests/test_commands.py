"""txf translate / eval / generate, on a tiny copy model and a tiny decoder_lm trained once per module.

The command-line tests run ``python -m txf.cli ...`` in a subprocess (exit status, stdout, stderr);
the rest call txf.inference directly, which the commands are thin wrappers of.
"""

import json
import math
import os
import runpy
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.conftest import apply_overrides
from txf import inference
from txf.commands import terminal
from txf.core.errors import TxfError
from txf.inference.evaluate import exact_match
from txf.decode import DecodingSpec
from txf.decode import decoders as decoding
from txf.runtime import workdir as workdir_lib
from txf.data.base import EOS_ID

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**overrides):
  config = runpy.run_path(os.path.join(REPO, "experiments", "copy.py"))["get_config"]()
  config.num_samples = 0
  config.decode_examples = 16
  config.eval_batches = 1
  config.checkpoint_every = 0  # only at the end
  return apply_overrides(config, overrides)


def _train(config, workdir):
  from txf.train import train
  train(config, str(workdir))
  return str(workdir)


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
  """A tiny encoder-decoder that has learned to copy (trained once, ~300 steps)."""
  return _train(_config(), tmp_path_factory.mktemp("runs") / "copy")


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
  """A barely trained decoder_lm on the copy data: enough to sample from."""
  config = _config(**{"model.family": "decoder_lm", "num_train_steps": 5, "decode_examples": 0})
  return _train(config, tmp_path_factory.mktemp("runs") / "lm")


def _txf(*args, stdin=None, cwd=None):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "txf.cli", *args], input=stdin, capture_output=True,
                        text=True, cwd=cwd, env=env, timeout=300)


def _user_error(result):
  """The one-line message of a user error (exit status 2), without absl/jax log lines."""
  assert result.returncode == 2, (result.returncode, result.stderr)
  lines = [l for l in result.stderr.splitlines() if l.startswith("txf: error:")]
  assert len(lines) == 1, result.stderr
  assert "Traceback" not in result.stderr
  return lines[0]


@pytest.fixture(scope="module")
def held_out(copy_run):
  run = inference.load_run(copy_run)
  return [e.source for e in run.task.examples("test", 20)]


OVERLONG = " ".join(f"s{i % 10}" for i in range(12))  # 12 symbols + EOS = 13 > max_input_len = 10


@pytest.fixture(scope="module")
def translated(copy_run, held_out, tmp_path_factory):
  """txf translate --beam 2 on held-out sources with empty lines, a blank line and an over-long line."""
  lines = held_out[:5] + [""] + held_out[5:12] + ["", "   ", OVERLONG] + held_out[12:]
  path = tmp_path_factory.mktemp("io") / "src.txt"
  path.write_text("\n".join(lines) + "\n")
  result = _txf("translate", f"--workdir={copy_run}", f"--input={path}", "--beam=2", "--batch_size=8")
  assert result.returncode == 0, result.stderr
  return lines, result


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_translate_round_trip_copies_held_out_sources(translated, held_out):
  lines, result = translated
  out = result.stdout.split("\n")[:-1]
  pairs = [(src, hyp) for src, hyp in zip(lines, out) if src in held_out]
  assert len(pairs) == len(held_out)
  assert sum(src == hyp for src, hyp in pairs) >= 0.8 * len(pairs), pairs


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_translate_preserves_empty_lines_and_line_count(translated):
  lines, result = translated
  assert result.stdout.endswith("\n")
  out = result.stdout.split("\n")[:-1]
  assert len(out) == len(lines)
  for src, hyp in zip(lines, out):
    assert (hyp == "") == (src.strip() == ""), (src, hyp)


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_translate_warns_on_overlong_line(translated):
  lines, result = translated
  lineno = lines.index(OVERLONG) + 1
  warnings = [l for l in result.stderr.splitlines() if "warning" in l and "max_input_len" in l]
  assert len(warnings) == 1, result.stderr
  assert f"line {lineno}:" in warnings[0] and "13 tokens" in warnings[0] and "truncated" in warnings[0]
  assert result.stdout.split("\n")[lineno - 1].strip()  # still translated


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_translate_and_eval_decode_with_bfloat16_weights_when_asked(copy_run, held_out, tmp_path):
  """--decode_dtype bfloat16: the same trained copy model decoded with its weights cast to bfloat16
  still copies the held-out sources; the spec says so in translate's summary and eval's report."""
  path = tmp_path / "src.txt"
  path.write_text("\n".join(held_out) + "\n")
  result = _txf("translate", f"--workdir={copy_run}", f"--input={path}", "--beam=2",
                "--batch_size=8", "--decode_dtype=bfloat16")
  assert result.returncode == 0, result.stderr
  assert "beam 2, gnmt alpha 0.6, bfloat16 weights" in result.stderr
  out = result.stdout.splitlines()
  assert len(out) == len(held_out)
  assert sum(src == hyp for src, hyp in zip(held_out, out)) >= 0.8 * len(held_out), out
  report_path = tmp_path / "report.json"
  ev = _txf("eval", f"--workdir={copy_run}", "--split=test", "--max_examples=16", "--batch_size=8",
            "--decode_dtype=bfloat16", f"--output={report_path}")
  assert ev.returncode == 0, ev.stderr
  report = json.loads(report_path.read_text())
  assert report["decoding"]["weights_dtype"] == "bfloat16" and report["exact_match"] >= 0.8


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_translate_without_trained_params_is_a_clear_error(copy_run, tmp_path):
  shutil.copy(os.path.join(copy_run, "config.json"), tmp_path / "config.json")
  message = _user_error(_txf("translate", f"--workdir={tmp_path}", stdin="s1 s2\n"))
  assert "no trained parameters" in message and "params.msgpack" in message


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_translate_beam_below_one_is_a_clear_error(copy_run):
  message = _user_error(_txf("translate", f"--workdir={copy_run}", "--beam=0", stdin="s1 s2\n"))
  assert "--beam=0" in message and ">= 1" in message


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_params_flag_loads_an_alternate_file(copy_run, tmp_path):
  run = inference.load_run(copy_run)
  zeros = jax.tree_util.tree_map(np.zeros_like, jax.device_get(run.params))
  workdir_lib.save_params(copy_run, zeros, "params_zero.msgpack")
  try:
    alt = inference.load_run(copy_run, "params_zero.msgpack")
    assert alt.params_path == os.path.join(copy_run, "params_zero.msgpack")
    assert all(not np.any(np.asarray(x)) for x in jax.tree_util.tree_leaves(alt.params))
    # all-zero parameters give all-zero logits: argmax is PAD at every step, so empty outputs
    # (the trained params.msgpack copies: test_translate_round_trip_copies_held_out_sources)
    zero = _txf("translate", f"--workdir={copy_run}", "--params=params_zero.msgpack",
                stdin="s1 s2 s3\ns4 s5 s6 s7\n")
    assert zero.returncode == 0, zero.stderr
    assert zero.stdout == "\n\n"
    assert "params_zero.msgpack" in zero.stderr
    report = inference.evaluate_split(alt, "test", max_examples=8, batch_size=8)
    assert report["exact_match"] == 0.0 and report["params"].endswith("params_zero.msgpack")
  finally:
    os.remove(os.path.join(copy_run, "params_zero.msgpack"))


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_params_of_another_model_are_refused(copy_run, lm_run):
  with pytest.raises(TxfError, match="does not match this run's model"):
    inference.load_run(copy_run, os.path.join(lm_run, "params.msgpack"))
  with pytest.raises(TxfError, match="params_avg5.msgpack"):
    inference.load_run(copy_run, "params_avg5.msgpack")


def test_translate_ids_cuts_each_row_at_source_length_plus_max_extra(monkeypatch):
  """A decoder that never emits EOS: each row stops at its own source length + max_extra."""
  monkeypatch.setattr(decoding, "_compiled_decoder",
                      lambda cfg, b, max_len, spec, *options: lambda p, x: np.full((b, max_len), 7))
  sources = [np.array([4, 5, EOS_ID]), np.array([4, 5, 6, 7, 8, 9, EOS_ID]), np.array([EOS_ID])]
  out = decoding.translate_ids(None, None, sources, input_len=8, max_len=12,
                               spec=DecodingSpec(max_extra=3), batch_size=2)
  assert [len(r) for r in out] == [6, 10, 4]
  full = decoding.translate_ids(None, None, sources, input_len=8, max_len=12, batch_size=2,
                                cut=False)
  assert [len(r) for r in full] == [12, 12, 12]


def test_read_lines_keeps_count_and_names_bad_bytes(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes(b"a b\r\n\nc")
  assert terminal.read_lines(str(path)) == ["a b", "", "c"]
  path.write_bytes(b"ok\n\n")
  assert terminal.read_lines(str(path)) == ["ok", ""]
  path.write_bytes(b"ok\nbad \xff\n")
  with pytest.raises(TxfError, match=r"in.txt:2: not UTF-8"):
    terminal.read_lines(str(path))
  with pytest.raises(TxfError):
    terminal.read_lines(str(tmp_path / "missing.txt"))


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_eval_writes_translation_report(copy_run):
  result = _txf("eval", f"--workdir={copy_run}", "--split=test", "--max_examples=64")
  assert result.returncode == 0, result.stderr
  with open(os.path.join(copy_run, "eval_test.json")) as f:
    report = json.load(f)
  assert json.loads(result.stdout) == report
  for key in ("bleu", "bleu_signature", "chrf", "chrf_signature", "exact_match", "loss",
              "perplexity", "num_examples", "params", "split"):
    assert key in report, key
  assert report["num_examples"] == 64 and report["split"] == "test"
  assert "nrefs:1" in report["bleu_signature"] and "tok:13a" in report["bleu_signature"]
  assert "version:" in report["bleu_signature"] and "nc:6" in report["chrf_signature"]
  assert 0.0 <= report["exact_match"] <= 1.0 and report["exact_match"] >= 0.8
  assert 0.0 <= report["chrf"] <= 100.0 + 1e-9 and 50.0 <= report["bleu"] <= 100.0 + 1e-9
  assert report["params"] == os.path.join(copy_run, "params.msgpack")


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_eval_language_model_reports_perplexity(lm_run):
  run = inference.load_run(lm_run)
  report = inference.evaluate_split(run, "val", max_examples=40, batch_size=16)
  assert report["num_examples"] == 40 and "bleu" not in report
  assert report["perplexity"] == pytest.approx(math.exp(report["loss"]))
  assert report["perplexity"] > 1.0 and math.isfinite(report["perplexity"])
  with pytest.raises(TxfError, match="split 'nope'"):
    inference.evaluate_split(run, "nope")


def test_eval_classifier_accuracy_is_argmax_over_real_rows():
  """A made-up classification task (filler rows included) and an untrained classifier."""
  from txf.models import build_model, init_params
  from txf.nn import TransformerConfig

  rng = np.random.default_rng(0)
  batches = [{"inputs": rng.integers(3, 12, (4, 6)).astype(np.int32),
              "label": rng.integers(0, 3, (4,)).astype(np.int32)} for _ in range(3)]
  batches[-1]["inputs"][2:] = 0  # two filler rows

  class Task:
    family, vocab_size, num_classes, max_input_len, max_target_len = "encoder_classifier", 12, 3, 6, 0

    def eval_batches(self, split, batch_size, max_examples=None):
      return batches

  task = Task()
  cfg = TransformerConfig(family="encoder_classifier", vocab_size=12, num_classes=3, d_model=16,
                          num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=0, max_len=8)
  params = jax.jit(lambda key: init_params(cfg, key, batches[0]))(jax.random.key(1))
  run = inference.Run("w", None, task, cfg, params, "w/params.msgpack")
  report = inference.evaluate_split(run, "test", batch_size=4)
  model = build_model(cfg, deterministic=True)
  inputs = np.concatenate([b["inputs"] for b in batches])
  labels = np.concatenate([b["label"] for b in batches])
  pred = np.argmax(np.asarray(model.apply({"params": params}, inputs)), axis=-1)
  hits = (pred == labels)[np.any(inputs != 0, axis=-1)]
  assert report["num_examples"] == 10 == len(hits)
  assert report["accuracy"] == pytest.approx(np.mean(hits))
  assert "perplexity" not in report and "bleu" not in report


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_generate_samples_from_a_language_model(lm_run):
  result = _txf("generate", f"--workdir={lm_run}", "--prompt=s1 s2", "--max_new_tokens=6",
                "--num_samples=2", "--seed=3")
  assert result.returncode == 0, result.stderr
  samples = [l for l in result.stdout.splitlines() if not l.startswith("--- sample")]
  assert len(samples) == 2 and all(s.startswith("s1 s2") for s in samples), result.stdout
  assert all(len(s.split()) <= 2 + 6 for s in samples)


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_generate_is_deterministic_and_fits_the_context(lm_run):
  run = inference.load_run(lm_run)
  warned = []
  a = inference.sample_texts(run, "s3", max_new_tokens=500, seed=5, num_samples=2, warn=warned.append)
  b = inference.sample_texts(run, "s3", max_new_tokens=500, seed=5, num_samples=2, warn=warned.append)
  assert a == b and any("max_new_tokens=500" in w for w in warned)
  # the context is the window the model was trained on (positions past it were never seen)
  context = min(run.model_cfg.max_len, run.task.max_target_len)
  assert all(len(t.split()) <= context for t in a), (context, a)
  assert any(f"max_new_tokens=500 does not fit the model's context (" in w and f"={context} tokens" in w
             for w in warned), warned
  with pytest.raises(TxfError, match="top_p"):
    inference.sample_texts(run, "s3", spec=DecodingSpec(top_p=0.0))


@pytest.mark.slow  # a trained run through the CLI: the slow tier
def test_generate_refuses_other_families(copy_run):
  run = inference.load_run(copy_run)
  with pytest.raises(TxfError, match="needs a model.family=decoder_lm run.*txf translate"):
    inference.sample_texts(run, "s1")


# -- one decoding spec from the run's config to the decoder: eval scores what translate outputs ---

@pytest.fixture(scope="module")
def penalty_run(tmp_path_factory):
  """A barely trained copy model whose run decodes with Hugging Face's conventions (power length
  penalty, alpha 1, early stopping, beam 4): outputs of varied lengths, where the settings matter."""
  config = _config(**{"num_train_steps": 40, "decode_examples": 0, "beam_size": 4, "alpha": 1.0,
                      "length_penalty": "power", "early_stopping": True})
  return _train(config, tmp_path_factory.mktemp("runs") / "penalty")


@pytest.mark.slow  # a third trained run for the module (15 s): the end-to-end tier
def test_eval_scores_what_translate_outputs_with_the_runs_decoding_settings(penalty_run):
  from txf.inference import bleu as bleu_lib
  run = inference.load_run(penalty_run)
  spec = DecodingSpec.from_config(run.config)
  assert (spec.beam_size, spec.length_penalty, spec.early_stopping, spec.alpha) == (4, "power", True, 1.0)
  examples = run.task.examples("test", 48)
  sources = [e.source for e in examples]
  # both paths with their defaults, as the commands call them without --beam/--alpha
  translated = inference.translate_lines(run, sources, batch_size=16)
  report = inference.evaluate_split(run, "test", max_examples=48, batch_size=16)
  refs = [e.reference for e in examples]
  assert report["decoding"] == spec.as_dict()
  lang = run.config.data.tgt_lang
  assert report["bleu"] == bleu_lib.corpus_bleu(translated, refs, "sacrebleu", lang)["bleu"]
  assert report["exact_match"] == exact_match(translated, refs)
  # the settings matter for this model: the paper's GNMT penalty without early stopping decodes
  # other outputs, so an evaluation that dropped the run's settings would score other text
  gnmt = inference.translate_lines(run, sources, DecodingSpec(beam_size=4), batch_size=16)
  assert gnmt != translated


@pytest.mark.slow
def test_txf_eval_and_txf_translate_agree_from_the_command_line(penalty_run, tmp_path):
  """The commands themselves: `txf eval`'s BLEU equals the BLEU of `txf translate`'s output."""
  from txf.inference import bleu as bleu_lib
  run = inference.load_run(penalty_run)
  examples = run.task.examples("test", 32)
  source = tmp_path / "src.txt"
  source.write_text("".join(e.source + "\n" for e in examples))
  report_path = tmp_path / "report.json"
  ev = _txf("eval", "--workdir", penalty_run, "--split", "test", "--max_examples", "32",
            "--batch_size", "16", "--output", str(report_path))
  assert ev.returncode == 0, ev.stderr
  tr = _txf("translate", "--workdir", penalty_run, "--input", str(source), "--batch_size", "16")
  assert tr.returncode == 0, tr.stderr
  assert "beam 4, power alpha 1, early stopping" in tr.stderr
  hyps = tr.stdout.splitlines()
  report = json.loads(report_path.read_text())
  assert report["bleu"] == bleu_lib.corpus_bleu(hyps, [e.reference for e in examples], "sacrebleu",
                                                run.config.data.tgt_lang)["bleu"]
