"""Inference on a trained run: load it, evaluate it, translate, classify and generate.

One loader (``load_run``: a workdir -> config, task with the run's tokenizer, model config,
parameters) and one evaluator (``Evaluator``: teacher-forced sums + held-out decoding, exact match,
BLEU), used by the training loop, by ``txf eval/translate/classify/generate`` and by notebooks.
"""

from txf.decode.decoders import decode_buffer_len, translate_ids, translate_texts
from txf.inference.evaluate import (Evaluator, Progress, check_decoding_flags, default_split,
                                    evaluate_split, exact_match, make_eval_step, split_names,
                                    summarize)
from txf.inference.lines import (answer_stream, classify_lines, encode_lines, from_terminal, iter_lines, read_lines,
                                 sample_prompts, sample_texts, translate_lines, write_lines)
from txf.inference.run import (Run, load_run, load_task, require_family, resolve_params_path,
                               warn_stderr)
