"""What ``txf translate``, ``txf classify``, ``txf eval`` and ``txf generate`` share: load a trained
run for inference, read input lines, translate or classify lines in fixed-shape batches, sample from
a language model, evaluate a split into a JSON-ready report.

No absl flags here (the commands own those), so tests and notebooks can call everything directly.
"""

import dataclasses
import functools
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

import numpy as np

from txf import workdir as workdir_lib
from txf.data.base import EOS_ID, PAD_ID, UNK_ID, Task

DEFAULT_PARAMS = "params.msgpack"
Warn = Callable[[str], None]


def warn_stderr(message: str) -> None:
  """Print ``txf: warning: <message>`` on stderr."""
  print(f"txf: warning: {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class InferenceRun:
  """A trained run ready for decoding: its config, task (with the run's tokenizer), model config and
  parameters (a pytree of numpy arrays), and the parameter file they came from."""
  workdir: str
  config: Any
  task: Task
  model_cfg: Any
  params: Any
  params_path: str

  @property
  def family(self) -> str:
    return self.model_cfg.family


def resolve_params_path(workdir: str, name: Optional[str] = None) -> str:
  """The parameter file ``name`` (default params.msgpack) of a run.

  A bare or relative name is looked up in the workdir first (``params_avg5.msgpack``), then relative
  to the current directory (``runs/x/params_avg5.msgpack``); an absolute path is used as is.
  Raises FileNotFoundError naming what was looked for and how to make it.
  """
  name = name or DEFAULT_PARAMS
  candidates = [name] if os.path.isabs(name) else [os.path.join(workdir, name), name]
  for path in candidates:
    if os.path.isfile(path):
      return path
  if name == DEFAULT_PARAMS:
    raise FileNotFoundError(
        f"no trained parameters in {workdir} (no {DEFAULT_PARAMS}): the run has not finished; train "
        f"it to the end (`txf train --workdir {workdir}`), or average its checkpoints with "
        f"`txf average-checkpoints --workdir {workdir}` and pass --params params_avg<N>.msgpack")
  present = sorted(f for f in os.listdir(workdir) if f.endswith(".msgpack")) if os.path.isdir(workdir) else []
  raise FileNotFoundError(f"--params {name}: no such file in {workdir} or the current directory "
                          f"(parameter files in the workdir: {', '.join(present) or 'none'})")


def check_params(model_cfg, task: Task, params, path: str) -> None:
  """Raise ValueError if ``params`` does not have the tree and shapes of the run's model."""
  import jax
  from flax import traverse_util
  from txf.models import init_params
  batch = {"inputs": np.zeros((1, max(task.max_input_len, 1)), np.int32),
           "targets": np.zeros((1, max(task.max_target_len, 1)), np.int32)}
  expected = jax.eval_shape(lambda: init_params(model_cfg, jax.random.key(0), batch))
  want = {"/".join(k): tuple(v.shape) for k, v in traverse_util.flatten_dict(expected).items()}
  if not isinstance(params, dict):
    raise ValueError(f"{path} does not hold a parameter tree")
  got = {"/".join(k): tuple(np.shape(v)) for k, v in traverse_util.flatten_dict(params).items()}
  problems = [f"missing {k}" for k in sorted(set(want) - set(got))]
  problems += [f"unexpected {k}" for k in sorted(set(got) - set(want))]
  problems += [f"{k}: shape {got[k]} != {want[k]}" for k in sorted(set(want) & set(got))
               if got[k] != want[k]]
  if problems:
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    raise ValueError(f"{path} does not match this run's model ({model_cfg.family}, d_model="
                     f"{model_cfg.d_model}): {'; '.join(problems[:3])}{more}; is it from another run?")


def load_inference_run(workdir: str, params_name: Optional[str] = None) -> InferenceRun:
  """Load a run's config, task and parameters (final, or ``params_name``, e.g. an average).

  The parameter file is located before the task is built, so a run without trained parameters
  fails fast with a clear FileNotFoundError; parameters of another model raise ValueError.
  """
  from txf.data import make_task
  from txf.train.steps import model_config_from
  config = workdir_lib.load_config(workdir)
  path = resolve_params_path(workdir, params_name)
  task = make_task(config, workdir)
  model_cfg = model_config_from(config, task)
  params = workdir_lib.load_params(workdir, os.path.abspath(path))
  check_params(model_cfg, task, params, path)
  import jax
  return InferenceRun(workdir, config, task, model_cfg, jax.device_put(params), path)


def require_family(run: InferenceRun, family: str, command: str) -> None:
  """ValueError unless the run's model family is ``family`` (pointing at the right command)."""
  if run.family == family:
    return
  other = {"encoder_decoder": "txf translate", "decoder_lm": "txf generate",
           "encoder_classifier": "txf classify"}[run.family]
  raise ValueError(f"txf {command} needs a model.family={family} run, but {run.workdir} holds a "
                   f"model.family={run.family} run: use `{other}` for it")


# ----------------------------------------------------------------------------- input lines


def read_lines(path: Optional[str] = None, stream=None) -> List[str]:
  """Lines of a UTF-8 file (or of ``stream``/stdin when ``path`` is None or "-").

  Split on LF only (a trailing CR is dropped); a final newline does not make an extra line.
  Invalid UTF-8 raises ValueError naming the line.
  """
  if path and path != "-":
    if not os.path.isfile(path):
      raise FileNotFoundError(f"--input {path}: no such file")
    with open(path, "rb") as f:
      raw, name = f.read(), path
  else:
    stream = stream if stream is not None else sys.stdin
    raw, name = getattr(stream, "buffer", stream).read(), "stdin"
    if isinstance(raw, str):
      raw = raw.encode("utf-8")
  if not raw:
    return []
  pieces = raw.split(b"\n")
  if pieces[-1] == b"":
    pieces.pop()
  lines = []
  for lineno, piece in enumerate(pieces, 1):
    try:
      lines.append(piece.decode("utf-8").removesuffix("\r"))
    except UnicodeDecodeError as e:
      raise ValueError(f"{name}:{lineno}: not UTF-8 (byte {piece[e.start]:#04x} at column "
                       f"{e.start + 1})") from None
  return lines


def write_lines(lines: Sequence[str], path: Optional[str] = None, stream: Optional[TextIO] = None) -> None:
  """Write one line per item (UTF-8, LF) to ``path``, or to ``stream``/stdout."""
  text = "".join(line + "\n" for line in lines)
  if path and path != "-":
    with open(path, "w", encoding="utf-8", newline="\n") as f:
      f.write(text)
    return
  stream = stream if stream is not None else sys.stdout
  if hasattr(stream, "buffer"):
    stream.flush()
    stream.buffer.write(text.encode("utf-8"))
    stream.buffer.flush()
  else:
    stream.write(text)


# ----------------------------------------------------------------------------- translate


def _full_source_ids(task: Task, text: str) -> np.ndarray:
  """Source ids of ``text`` ending with EOS, not truncated (so over-long lines can be reported).

  Real-data tasks truncate in ``encode_source``; their codec (txf.data.tokenizer.Codec) encodes
  without a limit when given max_len 0.
  """
  try:
    from txf.data.tokenizer import Codec
  except ImportError:  # a build without the real-data pipeline
    Codec = ()
  codec = getattr(task, "codec", None)
  if Codec and isinstance(codec, Codec):
    return np.asarray(codec.encode_source(text, 0), np.int32)
  return np.asarray(task.encode_source(text), np.int32)


def encode_lines(task: Task, lines: Sequence[str], warn: Warn = warn_stderr) -> List[Optional[np.ndarray]]:
  """Source ids per line (None for an empty or blank line); lines with more tokens than the task's
  ``max_input_len`` (EOS counted) are cut to its first max_input_len - 1 tokens + EOS, with a warning."""
  limit = task.max_input_len
  out: List[Optional[np.ndarray]] = []
  for lineno, line in enumerate(lines, 1):
    if not line.strip():
      out.append(None)
      continue
    ids = _full_source_ids(task, line)
    if len(ids) > limit:
      warn(f"line {lineno}: {len(ids)} tokens (EOS included), more than the model's "
           f"data.max_input_len={limit}: truncated to its first {limit - 1} tokens + EOS")
      ids = np.concatenate([ids[:limit - 1], np.asarray([EOS_ID], np.int32)])
    out.append(ids)
  return out


def check_decoding_flags(beam: int, max_extra: int, batch_size: int) -> None:
  """ValueError for a beam, max_extra or batch size that cannot work."""
  if beam < 1:
    raise ValueError(f"--beam={beam}: the beam size must be >= 1 (1 = greedy)")
  if max_extra < 0:
    raise ValueError(f"--max_extra={max_extra} must be >= 0")
  if batch_size < 1:
    raise ValueError(f"--batch_size={batch_size} must be >= 1")


def decode_buffer_len(run: InferenceRun, max_extra: int) -> int:
  """The fixed decode length per batch: min(model.max_len, data.max_input_len + max_extra)."""
  return max(1, min(run.model_cfg.max_len, run.task.max_input_len + max_extra))


def translate_lines(run: InferenceRun, lines: Sequence[str], beam: int = 1, alpha: float = 0.6,
                    max_extra: int = 50, batch_size: int = 32, warn: Warn = warn_stderr) -> List[str]:
  """One detokenized translation per line, in order; empty lines give empty outputs.

  Non-empty lines are sorted by length and decoded in fixed [batch_size, data.max_input_len]
  batches (one compile); each output is cut at its own source length (EOS counted) + max_extra.
  """
  from txf.train import evaluate
  check_decoding_flags(beam, max_extra, batch_size)
  sources = encode_lines(run.task, lines, warn)
  todo = sorted((i for i, s in enumerate(sources) if s is not None), key=lambda i: -len(sources[i]))
  ids = evaluate.translate_ids(run.model_cfg, run.params, [sources[i] for i in todo],
                               run.task.max_input_len, decode_buffer_len(run, max_extra), batch_size,
                               beam, alpha, max_extra=max_extra)
  out = [""] * len(lines)
  for i, row in zip(todo, ids):
    out[i] = " ".join(run.task.decode_target(row).split("\n"))  # one output line per input line
  return out


# ----------------------------------------------------------------------------- classify


@functools.lru_cache(maxsize=8)
def _compiled_classifier(model_cfg):
  import jax
  from txf.models import build_model
  model = build_model(model_cfg, deterministic=True)
  return jax.jit(lambda params, inputs: jax.nn.softmax(model.apply({"params": params}, inputs=inputs), -1))


def classify_lines(run: InferenceRun, lines: Sequence[str], batch_size: int = 64,
                   warn: Warn = warn_stderr) -> List[Optional[np.ndarray]]:
  """Class probabilities per line: ``softmax(classifier(inputs))``, a float array [num_classes], or
  None for an empty or blank line. Lines are encoded as in training (ids + EOS; over-long lines
  truncated with a warning) and run in fixed [batch_size, data.max_input_len] batches (one compile).
  """
  if batch_size < 1:
    raise ValueError(f"--batch_size={batch_size} must be >= 1")
  sources = encode_lines(run.task, lines, warn)
  todo = [i for i, s in enumerate(sources) if s is not None]
  classify = _compiled_classifier(run.model_cfg)
  out: List[Optional[np.ndarray]] = [None] * len(lines)
  for start in range(0, len(todo), batch_size):
    rows = todo[start:start + batch_size]
    inputs = np.full((batch_size, run.task.max_input_len), PAD_ID, np.int32)
    for r, i in enumerate(rows):
      inputs[r, :len(sources[i])] = sources[i]
    probs = np.asarray(classify(run.params, inputs), np.float64)
    for r, i in enumerate(rows):
      out[i] = probs[r]
  return out


# ----------------------------------------------------------------------------- generate


def sample_texts(run: InferenceRun, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
                 top_k: int = 0, top_p: float = 0.95, seed: int = 0, num_samples: int = 1,
                 warn: Warn = warn_stderr) -> List[str]:
  """``num_samples`` continuations of ``prompt`` from a decoder_lm run, each as prompt + continuation.

  Prompt and continuation share the context the model was trained on (BOS included): the
  training window ``data.max_target_len``, or ``model.max_len`` if smaller. Positions past the
  training window were never seen (samples turn to noise there), so ``max_new_tokens`` is
  lowered, with a warning, to fit.
  """
  import jax
  import jax.numpy as jnp
  require_family(run, "decoder_lm", "generate")
  if max_new_tokens < 1 or num_samples < 1:
    raise ValueError(f"--max_new_tokens={max_new_tokens} and --num_samples={num_samples} must be >= 1")
  if temperature < 0:
    raise ValueError(f"--temperature={temperature} must be >= 0 (0 = greedy)")
  if top_k < 0:
    raise ValueError(f"--top_k={top_k} must be >= 0 (0 = off)")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"--top_p={top_p} must be in (0, 1] (1 = off)")
  prompt_ids = np.asarray(run.task.encode_source(prompt), np.int32) if prompt else np.zeros((0,), np.int32)
  unknown = int(np.sum(prompt_ids == UNK_ID))
  if unknown:
    warn(f"the prompt has {unknown} token(s) outside the model's vocabulary (read as <unk>)")
  trained = int(run.task.max_target_len or run.model_cfg.max_len)
  context = min(run.model_cfg.max_len, trained)
  where = (f"model.max_len={context}" if context < trained else
           f"the training window data.max_target_len={context}")
  room = context - 1 - len(prompt_ids)  # BOS + prompt + new tokens, minus the last one never fed
  if room < 1:
    raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the model's context is {where} "
                     f"tokens (BOS included): shorten the prompt")
  if max_new_tokens > room + 1:
    warn(f"--max_new_tokens={max_new_tokens} does not fit the model's context ({where} tokens) "
         f"with a {len(prompt_ids)}-token prompt: generating at most {room + 1}")
    max_new_tokens = room + 1
  sampler = _compiled_sampler(run.model_cfg, num_samples, len(prompt_ids), max_new_tokens,
                              float(temperature), int(top_k), float(top_p))
  prompts = jnp.tile(jnp.asarray(prompt_ids)[None, :], (num_samples, 1))
  new = np.asarray(sampler(run.params, prompts, jax.random.key(seed)))
  return [run.task.decode_target(np.concatenate([prompt_ids, row])) for row in new]


@functools.lru_cache(maxsize=8)
def _compiled_sampler(model_cfg, num_samples: int, prompt_len: int, max_new_tokens: int,
                      temperature: float, top_k: int, top_p: float):
  """jit'd (params, prompts int [num_samples, prompt_len], rng) -> int [num_samples, max_new_tokens]."""
  import jax
  from txf import decode
  from txf.models.inference import init_cache, make_logits_fn

  def run_sampler(params, prompts, rng):
    cache = init_cache(model_cfg, params, num_samples, prompt_len + max_new_tokens)
    return decode.sample(make_logits_fn(model_cfg, params), cache, prompts, rng, max_new_tokens,
                         temperature=temperature, top_k=top_k, top_p=top_p)

  return jax.jit(run_sampler)


# ----------------------------------------------------------------------------- evaluate


def _count_examples(batches: Sequence[Dict[str, np.ndarray]]) -> int:
  """Real (not all-PAD filler) rows over fixed-shape eval batches."""
  key = "inputs" if batches and "inputs" in batches[0] else "targets"
  return int(sum(np.any(np.asarray(b[key]) != 0, axis=-1).sum() for b in batches))


def teacher_forced_metrics(run: InferenceRun, batches: Sequence[Dict[str, np.ndarray]]) -> Dict[str, float]:
  """Unsmoothed loss (nats per token, or per example for classification), token/example accuracy,
  perplexity = exp(loss) (not for classification) over ``batches``."""
  import jax
  from txf.train import evaluate
  from txf.train.steps import make_eval_step
  step = jax.jit(make_eval_step(run.model_cfg, 0.0))
  sums = None
  for batch in batches:
    s = jax.device_get(step(run.params, batch))
    sums = s if sums is None else {k: sums[k] + s[k] for k in sums}
  if sums is None:
    return {}
  m = evaluate.summarize(sums, run.family)
  out = {"loss": m["nll"], "accuracy": m["accuracy"]}
  if "perplexity" in m:
    out["perplexity"] = m["perplexity"]
  if run.family != "encoder_classifier":
    out["tokens"] = int(float(sums["count"]))
  return out


def evaluate_split(run: InferenceRun, split: str, beam: int = 1, alpha: float = 0.6, max_extra: int = 50,
                   max_examples: int = 0, batch_size: int = 32, warn: Warn = warn_stderr
                   ) -> Dict[str, Any]:
  """The report of ``txf eval``: a JSON-ready dict for one split.

  Every family: ``loss`` (unsmoothed NLL, nats per token; per example for classification) and
  ``accuracy`` (per token; per example = argmax == label for classification), teacher-forced over
  the split's eval batches. Language models add ``perplexity`` = exp(loss). Translation adds
  sacreBLEU ``bleu`` and ``chrf`` on detokenized text with their ``*_signature`` strings, and
  ``exact_match``, from decoding the split's first ``num_examples`` sources (default: the whole
  split as the task gives it; synthetic tasks: 1000) with greedy (beam 1) or beam search.
  """
  from txf.train import evaluate
  check_decoding_flags(beam, max_extra, batch_size)
  if max_examples < 0:
    raise ValueError(f"--max_examples={max_examples} must be >= 0 (0 = the whole split)")
  started = time.time()
  try:
    batches = run.task.eval_batches(split, batch_size, max_examples or None)
  except KeyError:
    d = run.config.data
    raise ValueError(f"split {split!r} is not in this run's data: use one of {d.train_split!r}, "
                     f"{d.eval_split!r}, {d.test_split!r}") from None
  n = _count_examples(batches)
  if n == 0:
    raise ValueError(f"split {split!r} has no examples")
  report: Dict[str, Any] = {"workdir": run.workdir, "params": os.path.abspath(run.params_path),
                            "split": split, "family": run.family, "num_examples": n}
  report.update(teacher_forced_metrics(run, batches))
  if run.family == "encoder_decoder":
    import sacrebleu
    examples = run.task.examples(split, n)
    limit = run.task.max_input_len
    sources = [np.asarray(e.source_ids, np.int32) for e in examples]
    long = sum(len(s) > limit for s in sources)
    if long:
      warn(f"{long} of {len(sources)} {split} sources are longer than data.max_input_len={limit} "
           f"tokens: truncated")
      sources = [s if len(s) <= limit else np.append(s[:limit - 1], np.int32(EOS_ID)) for s in sources]
    ids = evaluate.translate_ids(run.model_cfg, run.params, sources, limit,
                                 decode_buffer_len(run, max_extra), batch_size, beam, alpha,
                                 max_extra=max_extra)
    hyps = [run.task.decode_target(row) for row in ids]
    refs = [e.reference for e in examples]
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score, chrf_score = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    report.update({"bleu": float(bleu_score.score), "bleu_signature": str(bleu.get_signature()),
                   "bleu_verbose": str(bleu_score), "chrf": float(chrf_score.score),
                   "chrf_signature": str(chrf.get_signature()),
                   "exact_match": evaluate.exact_match(hyps, refs),
                   "decoding": {"beam": beam, "alpha": alpha, "max_extra": max_extra}})
  report["seconds"] = round(time.time() - started, 3)
  for k, v in report.items():  # JSON has no inf/nan
    if isinstance(v, float) and not math.isfinite(v):
      report[k] = None
  return report
