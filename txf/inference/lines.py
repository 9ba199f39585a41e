"""Inference on lines of text: translate or classify them in fixed-shape batches, sample
continuations from a language model. ``txf translate``, ``txf classify`` and ``txf generate`` are
thin wrappers of these (reading stdin and writing stdout is theirs: txf/commands/terminal.py); no
absl flags here, so tests and notebooks call them.
"""

import functools
from typing import List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from txf.data.base import EOS_ID, UNK_ID, Task, pad_batch, truncate_keep_eos
from txf.data.tokenizer import Codec
from txf.core.errors import TxfError
from txf.decode.sampling import row_keys
from txf.decode.decoders import compiled_ragged_sampler, decode_buffer_len, translate_ids
from txf.decode.spec import SAMPLING, DecodingSpec
from txf.inference.evaluate import check_decoding_flags
from txf.inference.run import Run, Warn, log_warning, require_family
from txf.models import build_model


def _full_source_ids(task: Task, text: str) -> np.ndarray:
  """Source ids of ``text`` ending with EOS, not truncated (so over-long lines can be reported).

  Real-data tasks truncate in ``encode_source``; their codec encodes without a limit given max_len 0.
  """
  codec = getattr(task, "codec", None)
  if isinstance(codec, Codec):
    return np.asarray(codec.encode_source(text, 0), np.int32)
  return np.asarray(task.encode_source(text), np.int32)


def encode_lines(task: Task, lines: Sequence[str], warn: Warn = log_warning) -> List[Optional[np.ndarray]]:
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
    out.append(truncate_keep_eos(ids, limit))
  return out


def translate_lines(run: Run, lines: Sequence[str], spec: Optional[DecodingSpec] = None,
                    batch_size: int = 32, warn: Warn = log_warning) -> List[str]:
  """One detokenized translation per line, in order; empty lines give empty outputs.

  Non-empty lines are sorted by length and decoded in batches of ``batch_size``, shaped as
  ``spec.length_bucket`` says (txf.decode.decoders.translate_ids); each output is cut at its own
  source length (EOS counted) + ``spec.max_extra``. The search is ``spec``'s (default: the run's
  own decoding settings, ``DecodingSpec.from_config(run.config)``).
  """
  spec = spec or DecodingSpec.from_config(run.config)
  check_decoding_flags(spec, batch_size)
  sources = encode_lines(run.task, lines, warn)
  todo = sorted((i for i, s in enumerate(sources) if s is not None), key=lambda i: -len(sources[i]))
  ids = translate_ids(run.model_cfg, run.params, [sources[i] for i in todo], run.task.max_input_len,
                      decode_buffer_len(run.model_cfg, run.task, spec.max_extra), spec, batch_size)
  out = [""] * len(lines)
  for i, row in zip(todo, ids):
    out[i] = " ".join(run.task.decode_target(row).split("\n"))  # one output line per input line
  return out


@functools.lru_cache(maxsize=8)
def _compiled_classifier(model_cfg):
  model = build_model(model_cfg, deterministic=True)
  return jax.jit(lambda params, inputs: jax.nn.softmax(model.apply({"params": params}, inputs=inputs), -1))


def classify_lines(run: Run, lines: Sequence[str], batch_size: int = 64,
                   warn: Warn = log_warning) -> List[Optional[np.ndarray]]:
  """Class probabilities per line: ``softmax(classifier(inputs))``, a float array [num_classes], or
  None for an empty or blank line. Lines are encoded as in training (ids + EOS; over-long lines
  truncated with a warning) and run in fixed [batch_size, data.max_input_len] batches (one compile).
  """
  if batch_size < 1:
    raise TxfError(f"--batch_size={batch_size} must be >= 1")
  sources = encode_lines(run.task, lines, warn)
  todo = [i for i, s in enumerate(sources) if s is not None]
  classify = _compiled_classifier(run.model_cfg)
  out: List[Optional[np.ndarray]] = [None] * len(lines)
  for start in range(0, len(todo), batch_size):
    rows = todo[start:start + batch_size]
    inputs = pad_batch([sources[i] for i in rows], run.task.max_input_len, batch_size)
    probs = np.asarray(classify(run.params, inputs), np.float64)
    for r, i in enumerate(rows):
      out[i] = probs[r]
  return out


def _check_sampling(max_new_tokens: int, spec: DecodingSpec, num_samples: int) -> None:
  if max_new_tokens < 1 or num_samples < 1:
    raise TxfError(f"--max_new_tokens={max_new_tokens} and --num_samples={num_samples} must be >= 1")
  if spec.temperature < 0:
    raise TxfError(f"--temperature={spec.temperature} must be >= 0 (0 = greedy)")
  if spec.top_k < 0:
    raise TxfError(f"--top_k={spec.top_k} must be >= 0 (0 = off)")
  if not 0.0 < spec.top_p <= 1.0:
    raise TxfError(f"--top_p={spec.top_p} must be in (0, 1] (1 = off)")


def _context(run: Run):
  """(context tokens, BOS included, that prompt + continuation share; how to name it)."""
  trained = int(run.task.max_target_len or run.model_cfg.max_len)
  context = min(run.model_cfg.max_len, trained)
  where = (f"model.max_len={context}" if context < trained else
           f"the training window data.max_target_len={context}")
  return context, where


def _prompt_ids(run: Run, prompt: str, what: str, warn: Warn) -> np.ndarray:
  ids = np.asarray(run.task.encode_source(prompt), np.int32) if prompt else np.zeros((0,), np.int32)
  unknown = int(np.sum(ids == UNK_ID))
  if unknown:
    warn(f"{what} has {unknown} token(s) outside the model's vocabulary (read as <unk>)")
  return ids


# How a prompt P starts the decoder (``txf generate --start``): "text" = the ids of tokenizer(P) as
# they are (the first one in the start position; the tokenizer's BOS only when its settings add
# one), what Hugging Face's generate(**tokenizer(P)) continues; "bos" = model.decoder_start_id, then
# the ids of P (a txf-trained LM's training rows, and the old start of an imported GPT-2:
# <|endoftext|> + P); "auto" = "text" for an imported Hugging Face decoder (model.mask_special_logits),
# "bos" otherwise.
STARTS = ("auto", "text", "bos")


def resolve_start(run: Run, start: str) -> str:
  """``start`` ("auto", "text" or "bos", ``STARTS``) resolved for ``run``: "text" or "bos"."""
  if start not in STARTS:
    raise TxfError(f"--start={start!r} is not one of {', '.join(STARTS)}")
  if start != "auto":
    return start
  return "text" if run.model_cfg.mask_special_logits else "bos"


def sample_prompts(run: Run, prompts: Sequence[str], max_new_tokens: int = 200,
                   spec: Optional[DecodingSpec] = None, seed: int = 0, num_samples: int = 1,
                   warn: Warn = log_warning, start: str = "auto") -> List[List[str]]:
  """``num_samples`` continuations of each prompt (prompts of any lengths, one batch of
  len(prompts) * num_samples rows): per prompt, its samples as prompt + continuation, drawn with
  ``spec``'s temperature, top_k and top_p (default ``SAMPLING``: temperature 0.8, top_p 0.95).

  Sample s of every prompt draws with the key ``fold_in(key(seed), s)``, so a prompt gets the same
  continuations in any batch as alone (``decode.sample`` with ``prompt_lengths``). The context is
  shared as in ``sample_texts``; ``max_new_tokens`` is lowered, with a warning, to what the longest
  prompt leaves. ``start`` (``STARTS``): what the decoder starts with, ``model.decoder_start_id``
  ("bos") or the prompt's own first token ("text"; an empty prompt starts with
  ``model.decoder_start_id``).
  """
  require_family(run, "decoder_lm", "generate")
  spec = SAMPLING if spec is None else spec
  _check_sampling(max_new_tokens, spec, num_samples)
  if not prompts:
    return []
  text_start = resolve_start(run, start) == "text"
  many = len(prompts) > 1
  full = [_prompt_ids(run, p, f"prompt {i + 1}" if many else "the prompt", warn)
          for i, p in enumerate(prompts)]
  first = np.full(len(full), run.model_cfg.decoder_start_id, np.int32)
  if text_start:  # each prompt's own first token (its BOS when the tokenizer adds one) starts it
    target = getattr(getattr(run.task, "codec", None), "target", None)
    if getattr(target, "adds_bos", False):
      full = [np.concatenate([[run.model_cfg.decoder_start_id], i]).astype(np.int32) for i in full]
    first = np.asarray([i[0] if len(i) else s for i, s in zip(full, first)], np.int32)
  ids = [i[1:] if text_start and len(i) else i for i in full]
  context, where = _context(run)
  longest = max(len(i) for i in ids)
  room = context - 1 - longest  # BOS + prompt + new tokens, minus the last one never fed
  if room < 1:
    which = f"prompt {[len(i) for i in ids].index(longest) + 1}" if many else "the prompt"
    raise TxfError(f"{which} has {longest + text_start} tokens; the model's context is {where} "
                   f"tokens ({'' if text_start else 'BOS '}included): shorten it")
  if max_new_tokens > room + 1:
    warn(f"--max_new_tokens={max_new_tokens} does not fit the model's context ({where} tokens) "
         f"with a {longest + text_start}-token prompt: generating at most {room + 1}")
    max_new_tokens = room + 1
  rows = [i for i in ids for _ in range(num_samples)]
  width = max(longest, 1)
  batch = pad_batch(rows, width)
  lengths = np.asarray([len(r) for r in rows], np.int32)
  keys = row_keys(jax.random.key(seed), num_samples)[np.tile(np.arange(num_samples), len(ids))]
  sampler = compiled_ragged_sampler(run.model_cfg, len(rows), width, max_new_tokens, spec)
  starts = np.repeat(first, num_samples) if text_start else None
  new = np.asarray(sampler(run.params, jnp.asarray(batch), jnp.asarray(lengths), keys,
                           None if starts is None else jnp.asarray(starts)))
  # the text is the prompt's tokens and the new ones (a leading EOS, GPT-2's <|endoftext|>, dropped:
  # decode_target ends the text at EOS)
  heads = [i[1:] if len(i) and i[0] == EOS_ID else i for i in full] if text_start else ids
  heads = [i for i in heads for _ in range(num_samples)]
  texts = [run.task.decode_target(np.concatenate([row, out])) for row, out in zip(heads, new)]
  return [texts[p * num_samples:(p + 1) * num_samples] for p in range(len(ids))]


def sample_texts(run: Run, prompt: str, max_new_tokens: int = 200,
                 spec: Optional[DecodingSpec] = None, seed: int = 0, num_samples: int = 1,
                 warn: Warn = log_warning, start: str = "auto") -> List[str]:
  """``num_samples`` continuations of ``prompt`` from a decoder_lm run, each as prompt + continuation.

  Prompt and continuation share the context the model was trained on (BOS included): the
  training window ``data.max_target_len``, or ``model.max_len`` if smaller. Positions past the
  training window were never seen (samples turn to noise there), so ``max_new_tokens`` is
  lowered, with a warning, to fit. This is ``sample_prompts`` with the one prompt.
  """
  return sample_prompts(run, [prompt], max_new_tokens, spec, seed, num_samples, warn, start)[0]
