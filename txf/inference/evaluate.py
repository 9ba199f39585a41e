"""The one evaluator: teacher-forced loss/accuracy/perplexity sums over a split, and held-out decoding
with exact match and BLEU. The training loop evaluates with it in-loop, ``txf eval`` writes its
report from it (``evaluate_split``), notebooks call it directly.
"""

import collections.abc
import math
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import sacrebleu

from txf.data.base import PAD_ID, Batch, Example, truncate_keep_eos
from txf.core import families
from txf.runtime import storage
from txf.core.errors import TxfError
from txf.inference import bleu as bleu_lib
from txf.decode.decoders import translate_texts
from txf.decode.spec import DecodingSpec
from txf.inference.run import Warn, log_warning
from txf.models import LossFn, ModelBuilder, build_model, default_loss
from txf.nn import TransformerConfig
from txf.parallel import placed

# progress(what, done, total, unit): e.g. ("decoding", 96, 1000, "sentences")
ProgressFn = Callable[[str, int, int, str], None]


def make_eval_step(model_cfg: TransformerConfig, label_smoothing: float = 0.0,
                   axis_name: Optional[str] = None, *, loss_fn: Optional[LossFn] = None,
                   build: Optional[ModelBuilder] = None) -> Callable:
  """``eval_step(params, batch) -> metric sums`` {loss_sum, nll_sum, correct, count} of the
  deterministic model (sums, so batches add up; psum'd over ``axis_name`` if set)."""
  model = (build or build_model)(model_cfg, deterministic=True)
  loss = loss_fn or default_loss(model_cfg, label_smoothing)

  def eval_step(params, batch):
    loss_sum, terms = loss(model, params, batch, None)
    sums = {"loss_sum": loss_sum, "nll_sum": terms["nll_sum"], "correct": terms["correct"],
            "count": terms["count"]}
    if axis_name is not None:
      sums = jax.lax.psum(sums, axis_name)
    return sums

  return eval_step


def summarize(sums: Dict[str, float], family: str) -> Dict[str, float]:
  """Metric sums over batches -> loss = loss_sum / count, accuracy = correct / count,
  nll = nll_sum / count and (for a family that predicts tokens, not labels) perplexity = exp(nll)."""
  count = max(float(sums["count"]), 1.0)
  out = {"loss": float(sums["loss_sum"]) / count, "accuracy": float(sums["correct"]) / count}
  nll = float(sums["nll_sum"]) / count
  out["nll"] = nll
  if families.get(family).predicts == "targets":
    out["perplexity"] = math.exp(min(nll, 50.0))
  return out


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """Fraction of hypotheses equal to their reference (after whitespace normalisation)."""
  if not references:
    return 0.0
  same = sum(" ".join(h.split()) == " ".join(r.split()) for h, r in zip(hypotheses, references))
  return same / len(references)


class Evaluator:
  """Evaluates parameters on fixed eval batches and (translation) held-out examples.

  ``sums(sums_fn)``: the metric sums of ``sums_fn(batch)`` added over the batches (the loop passes
  its runner's eval step, ``txf eval`` a jitted ``make_eval_step``). ``translate(params)``: the
  detokenized hypotheses of the examples, searched as ``spec`` says (a
  ``txf.decode.DecodingSpec``: greedy or beam, its length penalty and stopping, each output at
  most source length + ``spec.max_extra`` tokens). ``__call__`` gives both as the metrics the
  loop logs: loss, accuracy, nll, perplexity, exact_match, bleu.
  """

  def __init__(self, model_cfg: TransformerConfig, task, batches: Sequence[Batch],
               examples: Sequence[Example] = (), spec: DecodingSpec = DecodingSpec(), *,
               decode_batch_size: int = 64, bleu_protocol: str = "sacrebleu", lang: str = "en"):
    self.model_cfg, self.task = model_cfg, task
    self.bleu_protocol, self.lang = bleu_protocol, lang
    # a Sequence is kept as it is (a task's lazily made batches are made at the first evaluation)
    self.batches = batches if isinstance(batches, collections.abc.Sequence) else list(batches)
    self.examples = list(examples)
    self.spec = spec
    self.decode_batch_size = decode_batch_size

  @property
  def references(self) -> List[str]:
    return [e.reference for e in self.examples]

  def sums(self, sums_fn: Callable[[Batch], Dict[str, Any]],
           progress: Optional[Callable[[int], None]] = None) -> Optional[Dict[str, float]]:
    """Metric sums over every eval batch (None when there are no batches); ``progress(done)``
    after each batch."""
    total = None
    for done, batch in enumerate(self.batches, 1):
      s = sums_fn(batch)
      total = s if total is None else jax.tree_util.tree_map(jnp.add, total, s)
      if progress is not None:
        progress(done)
    return None if total is None else jax.device_get(total)

  def translate(self, params, progress: Optional[Callable[[int], None]] = None) -> List[str]:
    """Hypotheses for the held-out examples (sources longer than data.max_input_len truncated).

    ``params``: a runner's ``DeviceParams`` (``runner.device_params(state)``): each device and
    process decodes its share of every batch of sentences (the batch size rounded up to a
    multiple of its ``shards``), the parameters stay where they are (replicated, sharded) and
    only the ids are gathered; or plain parameters, decoded on the default device.
    ``progress(sentences_done)`` after each decoded batch.
    """
    where = placed.local(params)
    sources = [truncate_keep_eos(e.source_ids, self.task.max_input_len) for e in self.examples]
    batch_size = -(-self.decode_batch_size // where.shards) * where.shards
    return translate_texts(self.model_cfg, where.params, self.task, sources, self.spec, batch_size,
                           wrap=where.rows_fn, progress=progress)

  def __call__(self, sums_fn: Callable[[Batch], Dict[str, Any]], params: Callable[[], Any]
               ) -> Dict[str, Any]:
    """The metrics dict; ``params()`` gives the parameters (a runner's ``DeviceParams``, or plain
    ones), called only if there is decoding. The hypotheses are kept in ``self.hypotheses``."""
    sums = self.sums(sums_fn)
    metrics = summarize(sums, self.model_cfg.family) if sums is not None else {}
    self.hypotheses = []
    if families.get(self.model_cfg.family).decoding == "seq2seq" and self.examples:
      self.hypotheses = self.translate(params())
      metrics["exact_match"] = exact_match(self.hypotheses, self.references)
      metrics["bleu"] = bleu_lib.corpus_bleu(self.hypotheses, self.references, self.bleu_protocol,
                                             self.lang)["bleu"]
    return metrics


def count_examples(batches: Sequence[Batch]) -> int:
  """Real (not all-PAD filler) rows over fixed-shape eval batches."""
  key = "inputs" if batches and "inputs" in batches[0] else "targets"
  return int(sum(np.any(np.asarray(b[key]) != PAD_ID, axis=-1).sum() for b in batches))


def check_decoding_flags(spec: DecodingSpec, batch_size: int) -> None:
  """TxfError for a decoding spec or batch size that cannot work."""
  spec.check()
  if batch_size < 1:
    raise TxfError(f"--batch_size={batch_size} must be >= 1")


def split_names(task) -> Optional[List[str]]:
  """The splits a real-data task's data has (opening the data), or None for a task that makes
  any split (synthetic)."""
  sources = getattr(task, "sources", None)
  return None if sources is None else sorted(sources)


def default_split(run) -> str:
  """The split ``txf eval`` scores by default: the run's test split, or its eval split when the data
  has no test split."""
  d = run.config.data
  names = split_names(run.task)
  if names is not None and d.test_split not in names and d.eval_split in names:
    return d.eval_split
  return d.test_split


def evaluate_split(run, split: str, spec: Optional[DecodingSpec] = None,
                   max_examples: int = 0, batch_size: int = 32, warn: Warn = log_warning,
                   progress: Optional[ProgressFn] = None, bleu_protocol: str = "sacrebleu"
                   ) -> Dict[str, Any]:
  """The report of ``txf eval`` for one split of a loaded run (``txf.inference.load_run``).

  Every family: ``loss`` (unsmoothed NLL, nats per token; per example for classification) and
  ``accuracy`` (per token; per example = argmax == label for classification), teacher-forced over
  the split's eval batches. Language models add ``perplexity`` = exp(loss). Translation adds
  ``bleu`` under ``bleu_protocol`` (``txf.inference.bleu``: sacreBLEU on cased detokenized text,
  or ``tok-lc`` on lowercased Moses tokens) with ``bleu_protocol`` and sacreBLEU's
  ``bleu_signature``, sacreBLEU ``chrf`` on detokenized text with its signature, and
  ``exact_match``, from decoding the split's first ``num_examples`` sources (default: the whole
  split as the task gives it; synthetic tasks: 1000), searched as ``spec`` says (default: the
  run's own decoding settings, ``DecodingSpec.from_config(run.config)``).
  ``progress(what, done, total, unit)`` hears the batches scored and sentences decoded (default:
  nothing; ``txf eval`` passes txf.commands.terminal.Progress, lines on stderr); ``warn(message)``
  hears problems with the data (default: the ``txf.inference`` logger).
  """
  spec = spec or DecodingSpec.from_config(run.config)
  check_decoding_flags(spec, batch_size)
  if max_examples < 0:
    raise TxfError(f"--max_examples={max_examples} must be >= 0 (0 = the whole split)")
  progress = progress or (lambda what, done, total, unit: None)
  started = time.time()
  try:
    batches = run.task.eval_batches(split, batch_size, max_examples or None)
  except KeyError:
    d = run.config.data
    raise TxfError(f"split {split!r} is not in this run's data: use one of {d.train_split!r}, "
                   f"{d.eval_split!r}, {d.test_split!r}") from None
  n = count_examples(batches)
  if n == 0:
    raise TxfError(f"split {split!r} has no examples")
  family = run.family
  seq2seq = families.get(family).decoding == "seq2seq"
  examples = run.task.examples(split, n) if seq2seq else []
  report: Dict[str, Any] = {"workdir": run.workdir, "params": storage.absolute(run.params_path),
                            "split": split, "family": family, "num_examples": n}
  evaluator = Evaluator(run.model_cfg, run.task, batches, examples, spec, decode_batch_size=batch_size)
  step = jax.jit(make_eval_step(run.model_cfg, 0.0))
  sums = evaluator.sums(lambda b: step(run.params, b),
                        progress=lambda k: progress("scoring", k, len(batches), "batches"))
  m = summarize(sums, family)
  report.update({"loss": m["nll"], "accuracy": m["accuracy"]})
  if "perplexity" in m:
    report["perplexity"] = m["perplexity"]
  if families.get(family).predicts == "targets":
    report["tokens"] = int(float(sums["count"]))
  if examples:
    limit = run.task.max_input_len
    long = sum(len(e.source_ids) > limit for e in examples)
    if long:
      warn(f"{long} of {len(examples)} {split} sources are longer than data.max_input_len={limit} "
           f"tokens: truncated")
    hyps = evaluator.translate(
        run.params, progress=lambda k: progress("decoding", k, len(examples), "sentences"))
    refs = evaluator.references
    chrf = sacrebleu.metrics.CHRF()
    chrf_score = chrf.corpus_score(hyps, [refs])
    report.update(bleu_lib.corpus_bleu(hyps, refs, bleu_protocol, run.config.data.tgt_lang))
    report.update({"chrf": float(chrf_score.score),
                   "chrf_signature": str(chrf.get_signature()),
                   "exact_match": exact_match(hyps, refs),
                   "decoding": spec.as_dict()})
  report["seconds"] = round(time.time() - started, 3)
  for k, v in report.items():  # JSON has no inf/nan
    if isinstance(v, float) and not math.isfinite(v):
      report[k] = None
  return report
