"""What each ``txf`` command takes, declared without the machinery that runs it (no jax): its
purpose, its usage text and its absl flags. ``txf CMD --help`` and a refused flag answer from here
at once; txf/cli.py defines the chosen command's flags from here, parses the command line, and only
then imports the command's module (txf/commands/<module>.py) to run it, which reads the values
from absl's ``flags.FLAGS``.

Each command is one function named after its module, ``declare(fv)``: its docstring is the usage
text ``txf CMD --help`` prints, its body defines the command's own flags on the FlagValues ``fv``.
``COMMANDS`` (at the end) maps each command's name to its module, its one-line purpose and that
function. A new flag of a command is one more ``flags.DEFINE_*`` line in its function.
"""

from typing import Callable, List, NamedTuple

from absl import flags
from ml_collections import config_flags

from txf.commands.common import default_config_path


def _config(fv: flags.FlagValues) -> None:
  """``--config``, the experiment (ml_collections' config_flags: ``--config.FIELD=VALUE`` overrides
  its fields), of ``txf train`` and ``txf plan``."""
  config_flags.DEFINE_config_file("config", default_config_path(),
                                  "experiment config file (a get_config() file in experiments/)",
                                  lock_config=True, flag_values=fv)


def _decoding(fv: flags.FlagValues) -> None:
  """The decoding flags ``txf translate`` and ``txf eval`` share (each overrides the run's config)."""
  flags.DEFINE_integer("beam", None, "beam size (1 = greedy; default: the run's config.beam_size)",
                       flag_values=fv)
  flags.DEFINE_float("alpha", None, "the length penalty's exponent, of the run's length_penalty kind "
                    "(gnmt: ((5 + L) / 6) ** alpha; power: L ** alpha; default: the run's config.alpha)",
                    flag_values=fv)
  flags.DEFINE_enum("decode_dtype", None, ["float32", "bfloat16"], "decode with the weights cast to "
                    "this dtype (default: the run's config.decode_dtype, else its own); bfloat16 is "
                    "faster on a CPU with AVX512-BF16 (txf info), its outputs may differ a little",
                    flag_values=fv)
  flags.DEFINE_integer("length_bucket", None, "sentences are decoded longest first, each batch padded "
                       "to its longest source rounded up to a multiple of this (a compile per shape); "
                       "0 = one fixed shape in the data's order (default: the run's "
                       "config.decode_length_bucket, 8)", flag_values=fv)


def train(fv: flags.FlagValues) -> None:
  """``txf train [--config experiments/X.py] [--workdir runs/x] [--config.FIELD=VALUE ...] [--fresh]``."""
  _config(fv)
  flags.DEFINE_string("workdir", None, "run directory (default: runs/<config.name>)", flag_values=fv)
  flags.DEFINE_bool("fresh", False, "move an existing run in --workdir aside and start over",
                    flag_values=fv)
  flags.DEFINE_bool("progress", None, "show a progress bar (default: only when stdout is a terminal); "
                    "without one, each log step prints one line", flag_values=fv)


def translate(fv: flags.FlagValues) -> None:
  """``txf translate --workdir runs/x [--input FILE] [--output FILE] [--beam 4] [--alpha 0.6]
  [--params params_avg5.msgpack] [--max_extra 50] [--length_bucket 8] [--batch_size 32]``.

  Reads lines (stdin or --input), writes one detokenized translation per line (stdout or --output),
  in order: empty lines stay empty, so line counts always match. Lines longer than the model's
  data.max_input_len tokens are truncated with a warning on stderr naming the line and its length.
  Only the workdir is read (tokenizer, task.json, config, parameters), not the training data. On a
  terminal each typed line is translated at once; from a file or a pipe lines are batched.
  """
  flags.DEFINE_string("workdir", None, "run directory of a trained encoder_decoder run", required=True,
                      flag_values=fv)
  flags.DEFINE_string("input", None, "file to translate, one sentence per line (default: stdin)",
                      flag_values=fv)
  flags.DEFINE_string("output", None, "where to write the translations (default: stdout)",
                      flag_values=fv)
  flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack), e.g. "
                      "params_avg5.msgpack from `txf average-checkpoints`, or a path", flag_values=fv)
  flags.DEFINE_integer("max_extra", None, "each output has at most source length + this many tokens "
                       "(default: the run's config.decode_max_extra, 50)", flag_values=fv)
  flags.DEFINE_integer("batch_size", 32, "sentences decoded together", flag_values=fv)
  _decoding(fv)


def classify(fv: flags.FlagValues) -> None:
  """``txf classify --workdir runs/sst2 [--input FILE] [--output FILE] [--params params_best.msgpack]
  [--batch_size 64]``.

  Reads lines (stdin or --input) and writes, per line, ``label<TAB>probability`` (the most probable
  class and its softmax probability; stdout or --output), in order: empty lines stay empty, so line
  counts always match. Lines longer than the model's data.max_input_len tokens are truncated with a
  warning on stderr naming the line. Only the workdir is read (tokenizer, task.json, config,
  parameters), not the training data. On a terminal each typed line is answered at once; from a file
  or a pipe lines are batched.
  """
  flags.DEFINE_string("workdir", None, "run directory of a trained encoder_classifier run", required=True,
                      flag_values=fv)
  flags.DEFINE_string("input", None, "file to classify, one text per line (default: stdin)",
                      flag_values=fv)
  flags.DEFINE_string("output", None, "where to write label<TAB>probability lines (default: stdout)",
                      flag_values=fv)
  flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack), e.g. "
                      "params_best.msgpack from `txf average-checkpoints --step best`, or a path",
                      flag_values=fv)
  flags.DEFINE_integer("batch_size", 64, "lines classified together (a fixed batch shape: one compile)",
                       flag_values=fv)


def evaluate(fv: flags.FlagValues) -> None:
  """``txf eval --workdir runs/x [--split test] [--data_path DIR] [--beam 4] [--alpha 0.6] [--params params_avg5.msgpack]
  [--output report.json] [--max_examples N] [--max_extra 50] [--length_bucket 8] [--batch_size 32] [--bleu sacrebleu|tok-lc]``.

  Writes a JSON report to --output (default workdir/eval_<split>.json; checked writable before the
  evaluation runs) and prints it:
  translation: BLEU under --bleu (sacrebleu: cased detokenized, or tok-lc: lowercased Moses tokens, as
  multi-bleu.perl), chrF on detokenized text (with their signatures) and exact match;
  classification: accuracy; language models: perplexity and loss in nats per token. Every family also
  reports the teacher-forced loss and accuracy (see txf.inference.evaluate_split). The data is read
  only for the split scored: from the run's config, or --data_path when it has moved. Evaluations
  longer than a few seconds print progress to stderr.
  """
  flags.DEFINE_string("workdir", None, "run directory of a trained run", required=True, flag_values=fv)
  flags.DEFINE_string("split", None, "split to evaluate (default: the run's config.data.test_split, "
                      "or its eval_split when the data has no test split)", flag_values=fv)
  flags.DEFINE_string("data_path", None, "where the run's data is now, if it moved: the dataset's "
                      "folder, or the folder holding it by name (like data.path); tfds sources: the "
                      "prepared-data directory (default: the run's config)", flag_values=fv)
  flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack), e.g. "
                      "params_avg5.msgpack from `txf average-checkpoints`, or a path", flag_values=fv)
  flags.DEFINE_string("output", None, "report path (default: <workdir>/eval_<split>.json)",
                      flag_values=fv)
  flags.DEFINE_enum("bleu", None, ["sacrebleu", "tok-lc"], "BLEU protocol (default: the run's "
                    "config.bleu_protocol): sacrebleu = cased detokenized text, sacreBLEU's 13a "
                    "tokenizer, WMT practice; tok-lc = lowercased, punctuation-normalised, Moses-"
                    "tokenized text scored on its tokens, multi-bleu.perl, the Multi30k papers",
                    flag_values=fv)
  flags.DEFINE_integer("max_extra", None, "each output has at most source length + this many tokens "
                       "(default: the run's config.decode_max_extra)", flag_values=fv)
  flags.DEFINE_integer("max_examples", 0, "evaluate only the first N examples (0 = the whole split; "
                       "synthetic tasks: 1000)", flag_values=fv)
  flags.DEFINE_integer("batch_size", 32, "examples per batch", flag_values=fv)
  _decoding(fv)
  flags.DEFINE_float("progress_every", 10.0, "an evaluation that runs over 5 s prints progress to "
                     "stderr at most every this many seconds (0: after every batch, from the start)",
                     flag_values=fv)


def generate(fv: flags.FlagValues) -> None:
  """``txf generate --workdir runs/lm [--prompt "..." [--prompt "..."]] [--input FILE]
  [--max_new_tokens 200] [--temperature 0.8] [--top_k 0] [--top_p 0.95] [--seed 0] [--num_samples 1]
  [--params ...]``.

  Samples continuations from a decoder_lm run and prints prompt + continuation. On an encoder_mlm
  run it fills masks instead: each text's ``<mask>`` (or an imported BERT's [MASK]) tokens become the
  model's most likely tokens, one output line per input; ``--top_k K`` appends, per mask, the K
  most likely tokens with their probabilities after a tab. Prompts come from
  ``--prompt`` (repeatable), or one per line from --input or stdin; prompts of different lengths are
  sampled together in one batch, and each gets what it would get alone with the same seed. On a
  terminal each typed line is answered at once. Without any prompt (empty input), one sample starts
  from nothing. Each output is under a ``--- prompt p, sample s`` header when there are several.
  A span_corruption run instead prints each prompt with its ``<extra_id_N>`` filled by the spans
  the model decodes greedily (``--prompt "a man <extra_id_0> a bike"``). Refuses other model families.
  An imported Hugging Face decoder continues the prompt's own tokens, as transformers' ``generate``
  on ``tokenizer(P)`` does (``--start``).
  """
  flags.DEFINE_string("workdir", None, "run directory of a trained decoder_lm run", required=True,
                      flag_values=fv)
  flags.DEFINE_multi_string("prompt", None, "text to continue; repeat for several prompts (default: "
                            "one prompt per line of --input or stdin)", flag_values=fv)
  flags.DEFINE_string("input", None, "file of prompts, one per line (default: stdin unless --prompt)",
                      flag_values=fv)
  flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack), e.g. "
                      "params_avg5.msgpack from `txf average-checkpoints`, or a path", flag_values=fv)
  flags.DEFINE_integer("max_new_tokens", 200, "most tokens to generate (lowered to fit the context "
                       "the model was trained on, data.max_target_len)", flag_values=fv)
  flags.DEFINE_float("temperature", 0.8, "softmax temperature (0 = greedy)", flag_values=fv)
  flags.DEFINE_integer("top_k", 0, "sample among the k most likely tokens (0 = off); an encoder_mlm "
                       "run: show the k most likely tokens of each mask (0 = none)", flag_values=fv)
  flags.DEFINE_float("top_p", 0.95, "nucleus sampling: the smallest set with this much mass (1 = off)",
                     flag_values=fv)
  flags.DEFINE_integer("seed", 0, "random seed", flag_values=fv)
  flags.DEFINE_integer("num_samples", 1, "how many continuations to sample per prompt", flag_values=fv)
  flags.DEFINE_enum("start", "auto", ["auto", "text", "bos"], "what the decoder starts with: text = "
                    "the prompt's own tokens as the tokenizer gives them (its BOS only when its "
                    "settings add one), as Hugging Face's generate(**tokenizer(P)); bos = "
                    "model.decoder_start_id then the prompt (a txf-trained LM's rows; an imported "
                    "GPT-2's <|endoftext|> + P); auto = text for an imported Hugging Face decoder, "
                    "bos otherwise", flag_values=fv)


def average(fv: flags.FlagValues) -> None:
  """``txf average-checkpoints --workdir runs/x [--last 5 | --step best|latest|N] [--output F] [--sharded]``.

  Writes the element-wise mean of the parameters of the last N checkpoints (the N highest steps in
  ``<workdir>/checkpoints``) to ``<workdir>/params_avg<N>.msgpack`` (flax msgpack, like
  params.msgpack), which ``txf.runtime.workdir.load_params(workdir, "params_avg<N>.msgpack")`` loads.
  The paper averages the last 5 (base) or 20 (big) checkpoints, written at 10-minute intervals.
  ``--step`` exports one checkpoint's parameters instead (``params_<step>.msgpack``): ``best`` is the
  saved step with the best evaluation by the run's ``best_metric``, e.g. early stopping on dev.
  ``--sharded`` (the default when several processes run it) averages shard by shard on the devices
  and writes ``<workdir>/params_avg<N>/``, an orbax directory of shards, read the same way.
  """
  flags.DEFINE_string("workdir", None, "run directory holding checkpoints/", required=True,
                      flag_values=fv)
  flags.DEFINE_integer("last", 5, "average the parameters of this many most recent checkpoints",
                       flag_values=fv)
  flags.DEFINE_string("output", None, "output file name (relative to --workdir, or absolute); "
                      "default params_avg<last>.msgpack", flag_values=fv)
  flags.DEFINE_enum("sharded", "auto", ["auto", "true", "false"],
                    "average shard by shard over every device of every process and write an orbax "
                    "directory of shards (params_avg<N>/): no host holds an array whole; auto = when "
                    "several processes run the command (a pod: launch it like txf train)",
                    flag_values=fv)
  flags.DEFINE_string("step", None, "export one checkpoint instead of averaging: best (by the run's "
                      "best_metric), latest, or a step number; default file params_<step>.msgpack",
                      flag_values=fv)


def bench(fv: flags.FlagValues) -> None:
  """``txf bench [--configs small,base] [--output runs/bench.json] [--steps 5] [--dtypes float32,bfloat16]
  [--bf16_dots auto,layout,xla]``.

  Prints the machine's fp32/bf16 matmul peaks, train-step compile seconds, tokens/s, model FLOPs
  (analytic and XLA's count), MFU, memory, and cached greedy/beam decode tokens/s, and writes them
  as JSON. The benchmarks are not part of the installed package: they live in bench/ of a source
  checkout, beside txf/ and BENCHMARKS.md (bench/run.py does the work; ``python -m bench`` runs the
  same from the checkout's root). Figures and how to read them are in BENCHMARKS.md.
  """
  flags.DEFINE_list("configs", ["small", "base"], "bench configs to run (bench/train.py BENCH_CONFIGS)",
                    flag_values=fv)
  flags.DEFINE_string("output", "runs/bench.json", "JSON results file ('' = do not write)",
                      flag_values=fv)
  flags.DEFINE_integer("steps", 5, "timed train steps per row (after 2 warm-up steps)", flag_values=fv)
  flags.DEFINE_list("dtypes", ["float32"], "model.dtype values to time: float32, bfloat16",
                    flag_values=fv)
  flags.DEFINE_list("attention_impls", ["auto"], "model.attention_impl values to time: auto, reference, fused",
                    flag_values=fv)
  flags.DEFINE_bool("decode", True, "also time cached greedy and beam decoding", flag_values=fv)
  flags.DEFINE_integer("decode_batch", 8, "sources decoded at once", flag_values=fv)
  flags.DEFINE_integer("decode_length", 32, "output tokens per decode", flag_values=fv)
  flags.DEFINE_integer("beam", 4, "beam size of the beam-search row", flag_values=fv)
  flags.DEFINE_list("bf16_dots", ["auto"], "for bfloat16 rows, the bf16 products to time: auto (txf.kernels."
                    "select's choice), layout (txf.kernels.dots), xla (XLA's own bf16 dot); one row each",
                    flag_values=fv)


def info(fv: flags.FlagValues) -> None:
  """``txf info``: what this process runs on (jax, devices, CPU, SIMD features, malloc, XLA_FLAGS)
  and the kernels txf chooses there (txf.kernels.select: bf16 products, attention, dropout, top-k).

  One ``key: value`` line each; useful in bug reports and to check that tcmalloc is in use.
  """
  del fv  # no flags of its own


def sweep(fv: flags.FlagValues) -> None:
  """``txf sweep SWEEP_FILE [--root DIR] [--parallel N] [--set FIELD=VALUE ...] [--emit commands|slurm]``
  runs every arm x seed of a sweep file as its own ``txf train`` workdir (root/<arm>/seed-<k>/), N at
  a time, skipping complete runs and resuming interrupted ones, then reports;
  ``txf sweep report ROOT`` writes the report of a sweep's runs: per-arm mean, std, 95% CI and
  Welch's t-test against the baseline (report.md, report.csv, report.png under ROOT);
  ``txf sweep report SWEEP_FILE`` does so for the sweep file's root without training. With
  ``--ledger FILE`` each complete run is recorded in FILE, a run recorded there is not trained again
  and the report reads it from its record: a study that outlives its workdirs. With
  ``--fit`` the report also fits L(N), L(D) and L(N, D) = E + A/N^alpha + B/D^beta over the runs'
  sizes with 90% bootstrap intervals (fit.md, fit.json, fit.png), ``--predict N=...,D=...`` giving
  the law's prediction there, ``--holdout ARM`` fitting without that arm and checking the
  prediction against it. See docs/sweeps.md.
  """
  flags.DEFINE_string("root", None, "the sweep's folder (default: runs/sweeps/<sweep name>)",
                      flag_values=fv)
  flags.DEFINE_integer("parallel", 1, "runs trained at once (each a `txf train` process)",
                       flag_values=fv)
  flags.DEFINE_multi_string("set", [], "FIELD=VALUE: override a config field in every arm "
                            "(repeatable), e.g. --set model.d_ff=512", flag_values=fv)
  flags.DEFINE_enum("emit", None, ["commands", "slurm"], "print the runs for a scheduler instead of "
                    "running them: one shell command per line, or a SLURM job-array script",
                    flag_values=fv)
  flags.DEFINE_multi_string("sbatch", [], "with --emit slurm: an #SBATCH option (repeatable), e.g. "
                            "--sbatch=--gres=gpu:1", flag_values=fv)
  flags.DEFINE_bool("report", True, "write the report once the runs have finished", flag_values=fv)
  flags.DEFINE_bool("pin_cpus", False, "on a CPU machine: keep each of the --parallel runs to its own "
                    "share of the cores once its backend has started (the same results, less "
                    "contention: TXF_CPUS)", flag_values=fv)
  flags.DEFINE_string("ledger", None, "a JSON-lines file that records each complete run (metrics, "
                      "final parameters' digest, CPU, commit): recorded runs are skipped and reported "
                      "from it, e.g. a file kept under version control beside the sweep file",
                      flag_values=fv)
  flags.DEFINE_bool("fit", False, "also fit scaling laws over the runs' model sizes N and training "
                    "tokens D, with 90% bootstrap intervals (fit.md, fit.json, fit.png)", flag_values=fv)
  flags.DEFINE_string("predict", "", "with --fit: N=SIZE,D=TOKENS (either or both) at which the laws "
                      "predict the metric, with its interval, e.g. --predict N=2e6,D=5e6",
                      flag_values=fv)
  flags.DEFINE_integer("bootstrap", 1000, "with --fit: bootstrap draws of the intervals", flag_values=fv)
  flags.DEFINE_string("holdout", "", "with --fit: an arm left out of the fits, whose mean the laws then "
                      "predict with their interval (does the law predict a run it has not seen?)",
                      flag_values=fv)


def coord_check(fv: flags.FlagValues) -> None:
  """``txf coord-check [--config experiments/X.py] [--config.FIELD=VALUE ...] [--widths 64,128,256,512]
  [--steps 5] [--learning_rate LR] [--out DIR]``.

  The coordinate check of a parametrization: the experiment at each width (d_model, with d_ff in
  proportion and the heads fixed), trained --steps steps on the same batches at a constant rate,
  the RMS of every layer's output recorded before each step. Prints a table (per layer: the RMS at
  each width, and the largest max/min ratio across widths over the steps) and writes
  coord_check.md, .json and .png under --out. Under model.parametrization=mup the ratios stay near
  1; in the standard parametrization they grow with the width. See docs/mup.md.
  """
  _config(fv)
  flags.DEFINE_string("widths", "64,128,256,512", "the widths (d_model), comma-separated",
                      flag_values=fv)
  flags.DEFINE_integer("steps", 5, "training steps recorded at each width", flag_values=fv)
  flags.DEFINE_integer("seeds", 16, "runs per width (seeds config.seed + 0, 1, ...) whose RMS are "
                       "averaged", flag_values=fv)
  flags.DEFINE_float("learning_rate", 0.0, "the constant rate of the steps (0 = the experiment's "
                     "optimizer.learning_rate)", flag_values=fv)
  flags.DEFINE_string("out", None, "where the table and the figure go (default: "
                      "runs/coord_check/<config.name>-<parametrization>)", flag_values=fv)


def plan(fv: flags.FlagValues) -> None:
  """``txf plan [--config experiments/X.py] [--devices N] [--device_peak_tflops T] [--json PATH]``.

  Sizes a job before launch: compiles (never runs) the config's init and train step on its mesh over
  N devices and prints per-device parameter, optimizer-state, temporary and peak bytes, the model
  FLOPs per step and, given a device's peak, the estimated step time. On a CPU, ``--devices N``
  beyond the real count re-runs itself with N fake devices
  (``XLA_FLAGS=--xla_force_host_platform_device_count=N``). The work is in txf/plan/ (sizing.py;
  topology.py for ``--topology``).
  """
  _config(fv)
  flags.DEFINE_integer("devices", 0, "devices of the mesh (0 = all there are); on a CPU, fake ones",
                       flag_values=fv)
  flags.DEFINE_integer("vocab_size", 0, "vocabulary size (0 = config.data.vocab_size)", flag_values=fv)
  flags.DEFINE_float("device_peak_tflops", 0.0, "peak TFLOP/s of one device, for the time estimate",
                     flag_values=fv)
  flags.DEFINE_float("mfu", 0.4, "model FLOPs utilisation assumed for the time estimate", flag_values=fv)
  flags.DEFINE_integer("hosts", 0, "hosts the devices stand for (per-host bytes; 0 = the devices' own "
                       "processes, one host for local devices)", flag_values=fv)
  flags.DEFINE_string("json", "", "also write the plan as JSON to this file", flag_values=fv)
  flags.DEFINE_string("topology", "", "compile for this TPU slice instead of local devices (needs libtpu: "
                      "pip install -e '.[tpu]'), e.g. v5e-8, v4-32, v5p-128, v6e-256, 2xv5e-256",
                      flag_values=fv)


def import_hf(fv: flags.FlagValues) -> None:
  """``txf import-hf SRC --workdir W [--data_config multi30k_en_de] [--max_len 128]``.

  SRC is a directory written by Hugging Face's ``save_pretrained`` (config.json, model.safetensors or
  pytorch_model.bin, the tokenizer's files), or a Hub name such as ``Helsinki-NLP/opus-mt-en-de``,
  downloaded only then (needs the network and huggingface_hub). Its ``model_type`` picks the
  architecture in txf.hf's ``ARCHITECTURES`` (Marian, BERT, GPT-2, T5, Llama, Qwen2, Mistral), which writes a complete txf
  workdir W (config.json, task.json, tokenizer/, params.msgpack) of the family it becomes: the
  serving command it prints (``txf translate``, ``txf classify``, ``txf generate``), ``txf eval``,
  ``txf export-hf`` and ``txf train --config.init_from=W`` use it like a trained run. Decoding
  settings are Hugging Face's ``generate`` defaults (docs/huggingface.md).
  """
  flags.DEFINE_string("workdir", None, "the new txf workdir (must not exist, or be empty)", required=True,
                      flag_values=fv)
  flags.DEFINE_string("data_config", None, "the experiment whose data fields (source, languages, "
                      "splits) the imported run gets: what `txf eval` reads; '' = none; default: the "
                      "architecture's (Marian: multi30k_en_de, BERT: sst2)", flag_values=fv)
  flags.DEFINE_integer("max_len", 128, "data.max_input_len / max_target_len: longer source lines are "
                       "truncated by txf translate (at most the model's max_position_embeddings); "
                       "GPT-2, Llama, Qwen2, Mistral: data.max_target_len, the context of txf generate "
                       "and eval (at most n_positions / max_position_embeddings; a Mistral "
                       "sliding_window must be at least this)", flag_values=fv)
  flags.DEFINE_string("plugins", "", "Python files or modules (comma-separated) imported first: each "
                      "may register an architecture (txf.hf.register); the run's config.plugins "
                      "keeps them, for export-hf and the serving commands", flag_values=fv)


def export_hf(fv: flags.FlagValues) -> None:
  """``txf export-hf --workdir W --output DIR [--params params_avg5.msgpack]``.

  Writes DIR for Hugging Face's ``from_pretrained``: config.json, generation_config.json,
  model.safetensors and the tokenizer's files, as the first architecture of txf.hf's
  ``ARCHITECTURES`` that claims the run (an imported BERT, Llama, Qwen2, Mistral, GPT-2 or T5,
  fine-tuned or not), else as
  Marian (``MarianMTModel``): an imported Marian, or a txf translation run with a SentencePiece
  tokenizer and Marian's options (sin_cos positions, layer_norm_eps=1e-5, post-LN). Anything else is
  refused with what stands in the way (docs/huggingface.md).
  """
  flags.DEFINE_string("workdir", None, "run directory of a translation run (or of an imported BERT, GPT-2, T5 or Llama-family model)", required=True,
                      flag_values=fv)
  flags.DEFINE_string("output", None, "the new Hugging Face model directory (must not exist, or be empty)",
                      required=True, flag_values=fv)
  flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack)",
                      flag_values=fv)


def prepare_data(fv: flags.FlagValues) -> None:
  """``txf prepare-data NAME [--data_dir DIR]``: download and prepare a tfds catalog dataset.

  Run it once on a machine with network (e.g. ``txf prepare-data wmt14_translate/de-en --data_dir
  /data/tfds``); training on ``data.source=tfds:NAME`` with the same ``data.data_dir`` (or
  ``TXF_DATA_DIR``) then reads the prepared files offline. An unknown name or no network is one
  ``txf: error:`` line, exit status 2.
  """
  flags.DEFINE_string("data_dir", "", "where the prepared dataset goes; default $TXF_DATA_DIR or "
                      "~/.cache/txf/tfds", flag_values=fv)


def inspect(fv: flags.FlagValues) -> None:
  """``txf inspect --workdir runs/x --input "TEXT" [--output DIR] [--params FILE]`` or
  ``txf inspect --workdir runs/x --list``.

  Runs one input through the trained model and writes, to --output (default workdir/inspect/),
  every named intermediate as intermediates.npz (the embeddings, each layer's residual stream in
  and out, each attention's q/k/v, weights per head and heads' outputs before W^O, the FFN hidden
  activations, the norms, the logits), the attention maps as PNGs (one per kind: rows layers,
  columns heads) and the logit lens (each layer's residual stream through the final norm and the
  output head) as logit_lens.png. A translation model's input is its source, decoded greedily
  to give the target side. --list prints the names with their shapes instead (txf.inspect).
  """
  flags.DEFINE_string("workdir", None, "run directory of a trained run", required=True,
                      flag_values=fv)
  flags.DEFINE_string("input", None, "the text to run through the model", flag_values=fv)
  flags.DEFINE_bool("list", False, "print the intermediates' names, shapes and dtypes and stop",
                    flag_values=fv)
  flags.DEFINE_string("output", None, "folder for the .npz and the PNGs (default workdir/inspect)",
                      flag_values=fv)
  flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack)",
                      flag_values=fv)


def ablate_heads(fv: flags.FlagValues) -> None:
  """``txf ablate-heads --workdir runs/x [--split val] [--mode zero|mean] [--max_examples 500]
  [--batch_size 100] [--no-decode] [--output DIR]``.

  Removes each attention head in turn (its output before W^O set to zero, or to its mean over the
  first batch) and scores the split as the family's evaluation does: loss (nats per token, per
  example for a classifier) and accuracy, plus, for translation, exact match and BLEU of greedy
  decoding. Writes heads.csv (the baseline row first, then one row per head with each metric and
  its change) and one heatmap per metric (heads_<metric>.png) to --output (default
  workdir/ablate_heads_<split>/).
  """
  flags.DEFINE_string("workdir", None, "run directory of a trained run", required=True,
                      flag_values=fv)
  flags.DEFINE_string("split", "val", "split to score", flag_values=fv)
  flags.DEFINE_enum("mode", "zero", ["zero", "mean"], "what replaces an ablated head's output",
                    flag_values=fv)
  flags.DEFINE_integer("max_examples", 500, "examples of the split scored", flag_values=fv)
  flags.DEFINE_integer("batch_size", 100, "examples per batch (a fixed shape: one compile)",
                       flag_values=fv)
  flags.DEFINE_bool("decode", True, "translation: also decode greedily for exact match and BLEU",
                    flag_values=fv)
  flags.DEFINE_string("output", None, "folder for heads.csv and the heatmaps", flag_values=fv)
  flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack)",
                      flag_values=fv)


class Command(NamedTuple):
  """One ``txf`` command: the module that runs it (imported only to run it), its one-line
  purpose (``txf --help``'s list, the first line of ``txf CMD --help``) and its declaration."""
  module: str
  purpose: str
  declare: Callable[[flags.FlagValues], None]


COMMANDS = {
    "train": Command("txf.commands.train", "train a model from an experiment config", train),
    "translate": Command("txf.commands.translate", "translate lines with a trained run (stdin or --input)",
                         translate),
    "classify": Command("txf.commands.classify", "label lines with a trained classifier (stdin or --input)",
                        classify),
    "eval": Command("txf.commands.evaluate",
                    "evaluate a trained run on a split: BLEU/chrF, accuracy, perplexity", evaluate),
    "generate": Command("txf.commands.generate", "sample text from a trained language model", generate),
    "average-checkpoints": Command("txf.commands.average",
                                   "average the parameters of the last N checkpoints", average),
    "bench": Command("txf.commands.bench", "benchmark train-step and decode speed", bench),
    "info": Command("txf.commands.info", "print jax, devices, CPU features and the malloc in use", info),
    "sweep": Command("txf.commands.sweep", "train arms x seeds of a sweep file (or emit them) and "
                     "compare the arms (t-tests)", sweep),
    "coord-check": Command("txf.commands.coord_check", "the coordinate check of a parametrization "
                           "(standard, mup): each layer's activation size across widths", coord_check),
    "plan": Command("txf.commands.plan",
                    "size a job before launch: per-device memory and step time on N devices", plan),
    "import-hf": Command("txf.commands.import_hf",
                         "import a Hugging Face model (Marian, BERT, GPT-2, T5, Llama, Qwen2, Mistral) as a txf workdir", import_hf),
    "export-hf": Command("txf.commands.export_hf",
                         "export a run as a Hugging Face model (Marian, BERT, GPT-2, T5, Llama, Qwen2, Mistral)", export_hf),
    "prepare-data": Command("txf.commands.prepare_data",
                            "download and prepare a tfds catalog dataset for offline use", prepare_data),
    "inspect": Command("txf.commands.inspect_run", "capture a run's intermediates for one input: "
                       "attention maps, logit lens, .npz", inspect),
    "ablate-heads": Command("txf.commands.ablate_heads", "remove each attention head in turn and "
                            "score a split: CSV + heatmaps", ablate_heads),
}


def define(name: str, fv: flags.FlagValues = flags.FLAGS) -> List[str]:
  """Define command ``name``'s own flags on ``fv`` (absl's FLAGS unless given) and return their
  names, in the order declared. A ``--config`` flag loads its default experiment here unless the
  command line (``sys.argv``) names one (ml_collections' config_flags)."""
  before = set(fv)
  COMMANDS[name].declare(fv)
  return [flag for flag in fv if flag not in before]
