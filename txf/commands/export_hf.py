"""``txf export-hf --workdir W --output DIR [--params params_avg5.msgpack]``.

Writes DIR for Hugging Face: config.json, generation_config.json, model.safetensors and the Marian
tokenizer files (source.spm, target.spm, vocab.json, tokenizer_config.json), which
``MarianMTModel.from_pretrained(DIR)`` and ``MarianTokenizer.from_pretrained(DIR)`` load. Works for
a run imported with ``txf import-hf`` (fine-tuned or not) and for a txf translation run with a
SentencePiece tokenizer and Marian's options (model.positional_layout=sin_cos,
model.layer_norm_eps=1e-5, post-LN); anything else is refused with what stands in the way. An
imported BERT (encoder_classifier or encoder_mlm with its WordPiece tokenizer, fine-tuned or not)
is written as ``BertForSequenceClassification`` / ``BertForMaskedLM`` with tokenizer.json,
vocab.txt and tokenizer_config.json (``AutoTokenizer.from_pretrained(DIR)``). A decoder_lm run is
exported as GPT-2 (GPT2LMHeadModel, GPT2TokenizerFast: tokenizer.json, vocab.json, merges.txt),
which only a run started from an imported GPT-2 can be (README, "GPT-2"). A run with T5's layout
(an imported T5, fine-tuned or not) is written as a T5 model (config.json, model.safetensors,
spiece.model, tokenizer_config.json: txf.inference.hf_t5).
"""

import sys

from absl import flags

from txf import workdir as workdir_lib
from txf.errors import TxfError
from txf.inference import hf

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
  kind, tokenizer = {"encoder_decoder": ("MarianMTModel", "MarianTokenizer"),
                     "encoder_classifier": ("BertForSequenceClassification", "AutoTokenizer"),
                     "encoder_mlm": ("BertForMaskedLM", "AutoTokenizer"),
                     "decoder_lm": ("GPT2LMHeadModel", "GPT2TokenizerFast")}.get(family, ("AutoModel", "AutoTokenizer"))
  print(f"exported {f.workdir} -> {out} ({kind}.from_pretrained / {tokenizer}.from_pretrained)")
