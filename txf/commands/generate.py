"""Runs ``txf generate``; its usage text and flags are declared in txf.commands.declared.generate
(``txf generate --help``), which txf/cli.py parses before importing this module."""

import sys
from typing import List

from absl import flags

from txf import inference
from txf.commands import terminal
from txf.decode import DecodingSpec
from txf.core import families
from txf.core.errors import TxfError
from txf.inference.spans import fill_sentinels


def _print(samples: List[List[str]]) -> None:
  """Each prompt's samples; headers name the prompt (several prompts) or the sample (several)."""
  for p, texts in enumerate(samples, 1):
    for s, text in enumerate(texts, 1):
      if len(samples) > 1:
        print(f"--- prompt {p}, sample {s}")
      elif len(texts) > 1:
        print(f"--- sample {s}")
      print(text)
  sys.stdout.flush()


def _fill_line(text: str, tops) -> str:
  """The filled text, then (tab) for each mask its candidates: ``[1] good 0.412, great 0.220``."""
  if not any(tops):
    return text
  return text + "\t" + "  ".join(
      f"[{m}] " + ", ".join(f"{tok} {p:.3f}" for tok, p in cands) for m, cands in enumerate(tops, 1))


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}: quote the prompt, --prompt \"...\"")
  f = flags.FLAGS
  if f.prompt and f.input:
    raise TxfError("--prompt and --input both give prompts: use one of them")
  run = terminal.load_run(f.workdir, f.params)
  inference.require_family(run, "decoder_lm", "generate")
  serves = families.get(run.family).serves
  if serves == "fill_spans":  # fill each <extra_id_N> of the prompts (greedy)
    prompts = list(f.prompt) if f.prompt else terminal.read_lines(f.input)
    if not prompts:
      raise TxfError(f"a {run.family} run fills sentinels: give a prompt such as --prompt "
                     "\"a man <extra_id_0> a bike\"")
    _print([[text] for text in fill_sentinels(run, prompts, f.max_new_tokens)])
    return
  if serves == "fill_masks":
    _fill(run, f)
    return
  spec = DecodingSpec(temperature=f.temperature, top_k=f.top_k, top_p=f.top_p)

  def sample(prompts):
    return inference.sample_prompts(run, prompts, f.max_new_tokens, spec, f.seed, f.num_samples,
                                    warn=terminal.warn_stderr, start=f.start)

  if not f.prompt and terminal.from_terminal(f.input):
    print("txf generate: type a prompt per line (Ctrl-D ends)", file=sys.stderr, flush=True)
    for line in terminal.iter_lines():
      _print(sample([line]))
    return
  prompts = list(f.prompt) if f.prompt else terminal.read_lines(f.input)
  if not prompts:
    prompts = [""]
  _print(sample(prompts))


def _fill(run, f) -> None:
  """An encoder_mlm run: one line per text, its masks filled (``inference.fill_masks``)."""

  def answer(texts):
    for text, tops in inference.fill_masks(run, texts, max(f.top_k, 0), warn=terminal.warn_stderr):
      print(_fill_line(text, tops))
    sys.stdout.flush()

  if not f.prompt and terminal.from_terminal(f.input):
    print("txf generate: type a text with <mask> per line (Ctrl-D ends)", file=sys.stderr, flush=True)
    for line in terminal.iter_lines():
      answer([line])
    return
  texts = list(f.prompt) if f.prompt else terminal.read_lines(f.input)
  if not texts:
    raise TxfError("txf generate on a masked LM needs texts with a mask token: --prompt \"a <mask> "
                   "movie\" or lines on stdin")
  answer(texts)
