"""Inference on a trained run: load it, evaluate it, translate, classify and generate.

One loader (``load_run``: a workdir -> config, task with the run's tokenizer, model config,
parameters) and one evaluator (``Evaluator``: teacher-forced sums + held-out decoding, exact match,
BLEU), used by the training loop, by ``txf eval/translate/classify/generate`` and by notebooks.
These take and return Python values and report through ``warn``/``progress`` callbacks; reading
stdin and writing the terminal is the commands' (txf/commands/terminal.py).
"""

from txf.decode.decoders import decode_buffer_len, translate_texts
from txf.inference.evaluate import (Evaluator, check_decoding_flags, default_split, evaluate_split,
                                    make_eval_step, split_names)
from txf.inference.fill import fill_masks
from txf.inference.lines import classify_lines, sample_prompts, sample_texts, translate_lines
from txf.inference.run import Run, load_run, require_family
