"""``txf export-hf --workdir W --output DIR [--params params_avg5.msgpack]``.

Writes DIR for Hugging Face's ``from_pretrained``: config.json, generation_config.json,
model.safetensors and the tokenizer's files, as the first architecture of txf.hf's
``ARCHITECTURES`` that claims the run (an imported BERT, GPT-2 or T5, fine-tuned or not), else as
Marian (``MarianMTModel``): an imported Marian, or a txf translation run with a SentencePiece
tokenizer and Marian's options (sin_cos positions, layer_norm_eps=1e-5, post-LN). Anything else is
refused with what stands in the way (docs/huggingface.md).
"""

import sys

from absl import flags

from txf.runtime import workdir as workdir_lib
from txf.core import families
from txf.core.errors import TxfError
from txf import hf

flags.DEFINE_string("workdir", None, "run directory of a translation run (or of an imported BERT or GPT-2)", required=True)
flags.DEFINE_string("output", None, "the new Hugging Face model directory (must not exist, or be empty)",
                    required=True)
flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack)")


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}")
  f = flags.FLAGS
  out = hf.export_hf(f.workdir, f.output, f.params,
                     say=lambda line: print(f"txf: note: {line}", file=sys.stderr))
  family = workdir_lib.load_config(f.workdir).model.family
  kind, tokenizer = families.get(family).hf_classes
  print(f"exported {f.workdir} -> {out} ({kind}.from_pretrained / {tokenizer}.from_pretrained)")
