"""Inference on a trained run: load it, evaluate it, translate, classify and generate.

One loader (``load_run``: a workdir -> config, task with the run's tokenizer, model config,
parameters) and one evaluator (``Evaluator``: teacher-forced sums + held-out decoding, exact match,
BLEU), used by the training loop, by ``txf eval/translate/classify/generate`` and by notebooks.
"""

from txf.inference.decoding import decode_buffer_len, translate_ids, translate_texts
from txf.inference.evaluate import (Evaluator, check_decoding_flags, evaluate_split, exact_match,
                                    make_eval_step, summarize)
from txf.inference.lines import (classify_lines, encode_lines, read_lines, sample_texts,
                                 translate_lines, write_lines)
from txf.inference.run import Run, load_run, require_family, resolve_params_path, warn_stderr
