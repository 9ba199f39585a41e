r"""Every shell command the documentation shows is run here, or listed here as not run in CI with why.

The documents are README.md, the site's pages (docs/**/*.md), notebooks/README.md and experiments/*.md;
their commands are the lines of their ```bash (sh, shell, console) blocks, continuation lines joined and
a trailing `# comment` dropped, and the `code` in the cells of a Markdown table's ``command`` column
(README's table of the main jobs; ``\|`` is a pipe there). Each command must be a key of exactly one
table below:

* ``RUN``: executed, in reading order, by ``test_the_readme_runs_in_order_from_a_fresh_clone`` in a
  folder laid out like a fresh clone (``experiments/`` beside it, ``../shared/data`` a tiny stand-in of
  the shared data), with the value's arguments appended to its ``txf`` call to shorten it (steps,
  eval_every, small sizes). Later commands use what earlier ones made (``runs/default``, ...). The
  reading order is the site's: its pages in mkdocs.yml's ``nav`` order, then the other documents.
  README.md is the front page: every command it shows is also on a page
  (``test_the_front_page_shows_only_commands_a_page_shows``), where it runs.
* ``NOT_RUN``: not run in CI; the value says why (a download, hours of compute, an accelerator, a
  cluster, a duplicate of a run command with one flag changed). Their ``txf`` subcommands, flags,
  config files and ``--config.FIELD`` names are still checked against ``txf <cmd> --help`` and
  txf/core/config.py (``test_every_txf_call_names_commands_flags_and_fields_that_exist``), and so are
  ``python -m txf.X`` modules and their flags.

A new command in a document: add it to RUN (if it runs in a few seconds once shortened) or NOT_RUN.
The notebooks' calls run in tests/test_notebooks.py.
"""

import functools
import glob
import os
import re
import shlex
import subprocess
import sys
import time

import pytest
from absl import flags

from tests import test_data_fixtures as fx
from tests.conftest import ROOT
from txf import cli
from txf.commands import declared
from txf.core import config as config_lib

DOCUMENTS = ["README.md", "docs/**/*.md", "notebooks/README.md", "experiments/*.md"]
FRONT_PAGE = "README.md"
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")

# Arguments that shorten a run of each experiment to seconds (tiny model, a few steps, one evaluation).
_TINY = "--progress=false --config.num_train_steps=4 --config.log_every=2 --config.time_limit_minutes=0"
TINY_TRANSLATE = (f"{_TINY} --config.eval_every=4 --config.checkpoint_every=4 --config.model.d_model=32 "
                  "--config.model.num_heads=2 --config.model.d_ff=64 --config.model.num_encoder_layers=1 "
                  "--config.model.num_decoder_layers=1 --config.decode_examples=4 --config.num_samples=1")
TINY_MULTI30K = (f"{TINY_TRANSLATE} --config.data.vocab_size=300 --config.data.tokens_per_batch=512 "
                 "--config.batch_size=8")
TINY_SST2 = (f"{_TINY} --config.eval_every=2 --config.checkpoint_every=2 --config.model.d_model=32 "
             "--config.model.d_ff=64 --config.model.num_encoder_layers=1 --config.data.vocab_size=300 "
             "--config.batch_size=8 --config.optimizer.cooldown_steps=0")
TINY_CHAR = (f"{_TINY} --config.eval_every=4 --config.checkpoint_every=4 --config.eval_batches=1 "
             "--config.batch_size=4 --config.data.max_target_len=32 --config.model.max_len=64 "
             "--config.model.d_model=32 --config.model.num_heads=2 --config.model.d_ff=64 "
             "--config.model.num_decoder_layers=1 --config.optimizer.cooldown_steps=0 --config.num_samples=1")

# command as written -> arguments the test appends to its txf call ("" = run exactly as written).
# A value may also be a tuple (appended arguments, text of the command to leave out), for a command
# whose first part the test environment has already done (an install).
RUN = {
    # Quick start: the install has happened (this is the installed txf); the default run, shortened
    "pip install -e . && txf train": (TINY_TRANSLATE, "pip install -e . && "),
    # Real data
    "TXF_DATA=../shared/data txf train --config experiments/multi30k_en_de.py": TINY_MULTI30K,
    "TXF_DATA=../shared/data txf train --config experiments/sst2.py": TINY_SST2,
    "TXF_DATA=../shared/data txf train --config experiments/shakespeare_char.py": TINY_CHAR,
    # Decoding and evaluation, on the runs made above
    "printf 'the big dog sees a small cat\\nthe small cats see the dog\\n' > sources.txt": "",
    "txf translate --workdir runs/default --beam 4 --alpha 0.6 < sources.txt > hyps.txt": "",
    "txf translate --workdir runs/default --beam 4 --decode_dtype bfloat16 < sources.txt > hyps16.txt": "",
    'echo "the big dog sees a small cat" | txf translate --workdir runs/default': "",
    "txf eval --workdir runs/default --split test --beam 4": "--max_examples=8",
    "TXF_DATA=../shared/data txf eval --workdir runs/sst2 --split dev": "",
    # Inside a trained model (docs/inspect.md)
    "txf inspect --workdir runs/default --list": "",
    'txf inspect --workdir runs/default --input "the big dog sees a small cat"': "",
    "txf ablate-heads --workdir runs/default --split val": "--max_examples=8 --batch_size=8",
    "txf train --config experiments/induction.py --workdir runs/induction":
        f"{_TINY} --config.checkpoint_every=4",
    "txf ablate-heads --workdir runs/induction --split val --mode mean": "--max_examples=8 --batch_size=8",
    'txf inspect --workdir runs/shakespeare_char --input "ROMEO: But soft"': "",
    "echo \"it 's a charming and often affecting journey .\" | txf classify --workdir runs/sst2": "",
    'txf generate --workdir runs/shakespeare_char --prompt "ROMEO:" --temperature 0.8 --top_p 0.95':
        "--max_new_tokens=16",
    'txf generate --workdir runs/shakespeare_char --prompt "ROMEO:" --prompt "JULIET: O" --num_samples 2':
        "--max_new_tokens=16",
    "cp -r ../shared/data/multi30k moved-multi30k": "",
    "txf eval --workdir runs/multi30k_en_de --data_path moved-multi30k": "--max_examples=8",
    "txf eval --workdir runs/default --output report.json": "--max_examples=8",
    "txf average-checkpoints --workdir runs/sst2 --step best": "",
    "TXF_DATA=../shared/data txf eval --workdir runs/sst2 --split dev --params params_best.msgpack": "",
    "TXF_DATA=../shared/data python -m bench.data": "--batches=2 --batch_size=8",
    # Pretraining: masked language modelling (SST-2's text, labels ignored), then fill a mask
    "TXF_DATA=../shared/data txf train --config experiments/sst2_mlm.py":
        f"{TINY_SST2} --config.data.max_input_len=32",
    'txf generate --workdir runs/sst2_mlm --prompt "a <mask> movie" --top_k 5': "",
    "TXF_DATA=../shared/data txf train --config experiments/sst2.py --config.name=sst2_pretrained "
    "--config.init_from=runs/sst2_mlm": TINY_SST2,
    "txf eval --workdir runs/default --split test --bleu tok-lc": "--max_examples=8",
}

A_RUN_WITH_ONE_FLAG = "the same shortened run as the default one with one flag changed: tests/test_train_e2e.py"
OPUS = ("a Hub download: tests/test_readme_opus.py runs the section's commands as written, in order, with a "
        "small local Marian model at Helsinki-NLP/opus-mt-en-de (needs .[hf])")
HUB_GPT2 = ("a Hub download: tests/test_hf_gpt2.py imports, generates with, fine-tunes (shakespeare_char, "
            "init_from) and exports a small local GPT-2")
HUB_LLAMA = ("a Hub download: tests/test_readme_llama.py runs the section's commands as written, in "
             "order, with a small random Llama saved at HuggingFaceTB/SmolLM2-135M (needs .[hf])")
VARIANT = ("the copy run with variant switches; each variant is tested in tests/test_kv_cache.py, "
           "tests/test_positions*.py, tests/test_gqa.py, tests/test_model_options.py and "
           "tests/test_optimizers.py")
SWEEP = ("a sweep of 6 copy runs (minutes): tests/test_sweep.py::test_a_tiny_sweep_end_to_end_through_the_cli "
         "runs 2 arms x 2 seeds of a few steps through the CLI, then the report")
LEDGER = ("a sweep of 6 copy runs (minutes): tests/test_sweep.py::test_a_tiny_sweep_end_to_end_through_the_cli "
          "runs a tiny sweep with --ledger and reports it from the ledger alone once its workdirs are "
          "gone; tests/test_sweep_ledger.py checks the records")
HUB_T5 = ("a Hub download: tests/test_hf_t5.py imports, translates with, fine-tunes (init_from) and "
          "exports small local T5 models (v1.0 and v1.1 shapes)")
HUB_BERT = ("a Hub download: tests/test_hf_bert.py imports, classifies, fine-tunes (init_from, "
            "config sst2) and exports small local BERTs")
EIGHT = "8 fake devices: tests/test_matrix.py runs every runner with every family"
SPAN = ("tests/test_span_corruption.py (slow) trains span_corruption on a small text file, resumes it "
        "and fills a sentinel with txf generate; the experiment's 30-step smoke run takes ~40 s")
NOT_RUN = {
    "TXF_DATA=../shared/data txf train --config experiments/multi30k_span.py": SPAN,
    'txf generate --workdir runs/multi30k_span --prompt "a man <extra_id_0> a bike ."': SPAN,
    "txf import-hf google-t5/t5-small --workdir runs/t5-small": HUB_T5,
    'echo "translate English to German: A man is riding a bike." | txf translate --workdir runs/t5-small --beam 4': HUB_T5,
    "TXF_DATA=../shared/data txf train --config multi30k_en_de --workdir runs/t5-m30k "
    "--config.init_from=runs/t5-small --config.num_train_steps=300": HUB_T5,
    "txf export-hf --workdir runs/t5-m30k --output exported/t5-m30k": HUB_T5,
    "txf train --config.plugins=my_attention.py --config.model.attention=cosine":
        "a recipe: my_attention.py is the reader's own file (tests/test_variant_tables.py runs a "
        "formula registered the same way through a built model)",
    "txf translate --workdir runs/experiment --input in.txt":
        "a recipe's serving step: tests/test_recipes.py translates with each recipe's run",
    "txf train --config.plugins=my_family.py --config.model.family=bigram":
        "a recipe: tests/test_recipes.py writes my_family.py into a temporary folder, trains the "
        "family and evaluates the run (test_recipe_model_family_trains_and_is_served)",
    "txf eval --workdir runs/experiment --split test":
        "a recipe's serving step: tests/test_recipes.py evaluates the model family recipe's run",
    "txf train --config.plugins=my_loss.py --config.model.family=translation_nll":
        "a recipe: tests/test_recipes.py writes my_loss.py into a temporary folder, trains and "
        "translates with it (test_recipe_loss_trains_and_translates)",
    "txf import-hf tiny-gpt --workdir runs/tiny-gpt --plugins my_hf_arch.py":
        "a recipe: tests/test_recipe_hf.py writes my_hf_arch.py and a small GPT-2 saved as tiny_gpt "
        "into a temporary folder, imports, generates with and exports it",
    'txf generate --workdir runs/tiny-gpt --prompt "the big cat" --temperature 0':
        "a recipe's serving step: tests/test_recipe_hf.py (greedy ids against transformers' generate)",
    "txf export-hf --workdir runs/tiny-gpt --output exported/tiny-gpt":
        "a recipe: tests/test_recipe_hf.py exports the imported tiny_gpt run",
    "txf train --config.plugins=my_jsonl.py --config.data.source=text:corpus --config.data.format=jsonl "
    "--config.data.tokenizer=char --config.data.test_split=val":
        "a recipe: tests/test_recipes.py writes my_jsonl.py and a jsonl corpus into a temporary "
        "folder and trains and translates with them",
    "txf import-hf Helsinki-NLP/opus-mt-en-de --workdir runs/opus-mt-en-de": OPUS,
    'echo "A man is riding a bike." | txf translate --workdir runs/opus-mt-en-de --beam 4': OPUS,
    "TXF_DATA=../shared/data txf eval --workdir runs/opus-mt-en-de --split test_2016_flickr --beam 4": OPUS,
    "TXF_DATA=../shared/data txf train --config multi30k_en_de --workdir runs/opus-ft "
    "--config.init_from=runs/opus-mt-en-de --config.num_train_steps=300": OPUS,
    "txf export-hf --workdir runs/opus-ft --output exported/opus-ft-en-de": OPUS,
    "txf import-hf google-bert/bert-base-uncased --workdir runs/bert": HUB_BERT,
    'echo "a gripping, funny film" | txf classify --workdir runs/bert': HUB_BERT,
    "TXF_DATA=../shared/data txf train --config sst2 --workdir runs/bert-sst2 "
    "--config.init_from=runs/bert --config.num_train_steps=2000 --config.model.dropout_rate=0.1 "
    "--config.optimizer.schedule=constant --config.optimizer.learning_rate=3e-5 "
    "--config.optimizer.warmup_steps=200": HUB_BERT,
    "TXF_DATA=../shared/data txf eval --workdir runs/bert-sst2 --split dev": HUB_BERT,
    "txf export-hf --workdir runs/bert-sst2 --output exported/bert-sst2": HUB_BERT,
    "txf import-hf HuggingFaceTB/SmolLM2-135M --workdir runs/smollm2": HUB_LLAMA,
    'txf generate --workdir runs/smollm2 --prompt "1 504 3458 282" --max_new_tokens 20 --temperature 0':
        HUB_LLAMA,
    "mkdir -p ids && seq 400 | awk '{print 1, $1 * 7, $1 * 13, $1 * 29, $1 * 31}' > ids/input.txt":
        HUB_LLAMA,
    "txf train --config shakespeare_char --workdir runs/smollm2-ft --config.init_from=runs/smollm2 "
    "--config.data.source=text:ids --config.data.path=. --config.data.max_target_len=64 "
    "--config.num_train_steps=20 --config.batch_size=4": HUB_LLAMA,
    "txf export-hf --workdir runs/smollm2-ft --output exported/smollm2-ft": HUB_LLAMA,
    'txf inspect --workdir runs/smollm2 --input "1 504 3458 282" --output inspect/smollm2': HUB_LLAMA,
    "txf eval --workdir runs/smollm2-ft --split val": HUB_LLAMA,
    "txf plan --config shakespeare_char --config.init_from=runs/smollm2 --config.data.max_target_len=64":
        HUB_LLAMA,
    "txf import-hf gpt2 --workdir runs/gpt2": HUB_GPT2,
    'txf generate --workdir runs/gpt2 --prompt "ROMEO:" --max_new_tokens 60 --temperature 0': HUB_GPT2,
    "TXF_DATA=../shared/data txf train --config shakespeare_char --workdir runs/gpt2-shakespeare "
    "--config.init_from=runs/gpt2 --config.num_train_steps=300 --config.batch_size=8": HUB_GPT2,
    "TXF_DATA=../shared/data txf eval --workdir runs/gpt2-shakespeare": HUB_GPT2,
    "txf export-hf --workdir runs/gpt2-shakespeare --output exported/gpt2-shakespeare": HUB_GPT2,
    "txf train --config experiments/default.py --workdir runs/data --config.parallelism=mesh "
    "--config.mesh_shape='(-1,1,1)'": "a mesh run: tests/test_parallel.py and tests/test_matrix.py",
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 txf train --workdir runs/pmap8 --config.parallelism=pmap": EIGHT,
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 txf train --workdir runs/data8 --config.parallelism=mesh "
    "--config.mesh_shape='(8,1,1)'": EIGHT,
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 txf train --workdir runs/fsdp8 --config.parallelism=mesh "
    "--config.mesh_shape='(1,-1,1)'": EIGHT,
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 txf train --workdir runs/tensor8 --config.parallelism=mesh "
    "--config.mesh_shape='(4,1,2)'": EIGHT,
    "TXF_DATA=../shared/data python launch/local.py -n 2 -d 1 --timeout=600 -- txf train --config multi30k_en_de "
    "--workdir runs/mp_multi30k --config.data.packing=False --config.data.bucketing=True "
    "--config.data.tokens_per_batch=1024 --config.num_train_steps=3 --config.parallelism=mesh "
    '"--config.mesh_shape=(-1,1,1)" --progress=false':
        "2 processes on real data: tests/test_multiprocess_pod.py runs it shortened on 1, 2 and 4 processes",
    "txf plan --config experiments/wmt14_en_de_base.py --topology v5e-8 --config.parallelism=mesh "
    "--config.mesh_shape='(1,-1,1)'": "needs libtpu (the tpu extra): tests/test_topology.py, skipped without it",
    "txf plan --config experiments/wmt14_en_de_1b.py --devices 8 --config.mesh_shape='(1,8,1)' "
    "--config.model.remat=full": "minutes of compiling a 1B model: tests/test_stack.py checks remat on small models",
    "txf plan --config experiments/wmt14_en_de_1b.py --devices 8 --config.mesh_shape='(1,8,1)' "
    "--config.model.scan_layers=true": "minutes of compiling a 1B model: tests/test_stack.py checks scanned layers",
    "txf train --config experiments/copy.py --workdir runs/copy_profile --config.profile_steps=10:13":
        "tests/test_profile.py traces steps of a shortened copy run",
    "launch/tpu_pod.sh --dry-run --queued v5p-128 v2-alpha-tpuv5 --num-slices 2 my-qr us-east5-a "
    "--config=experiments/wmt14_en_de_1b.py --workdir=/mnt/runs/1b": "tests/test_launchers.py runs the dry runs",
    "launch/tpu_pod.sh --dry-run --stop my-qr us-east5-a": "tests/test_launchers.py runs the dry runs",
    "txf train --config experiments/wmt14_en_de_base.py --workdir gs://my-bucket/runs/base":
        "a Cloud Storage bucket: tests/test_cloud_workdir.py trains into a local stand-in for one",
    "launch/gke_jobset.sh --hosts 4 --image IMAGE -- --config=experiments/wmt14_en_de_1b.py "
    "--workdir=/data/runs/1b": "tests/test_launchers.py parses the manifest",
    "launch/gke_jobset.sh --xpk my-cluster v5p-128 --num-slices 2 --image IMAGE --dry-run -- "
    "--config=experiments/wmt14_en_de_1b.py --workdir=/data/runs/1b": "tests/test_launchers.py runs the dry runs",
    "TXF_DRY_RUN=1 bash launch/slurm.sbatch --config=experiments/wmt14_en_de_base.py "
    "--workdir=/shared/runs/base": "tests/test_launchers.py runs the dry runs",
    "pip install -e '.[test]' && pytest -n 2 -q": "the quick test tier: what CI runs first (.ci/run)",
    "pytest -n 2 -q": "the quick test tier: what CI runs first (.ci/run)",
    "pytest -n 2 -q -m slow": "the end-to-end test tier, this test among them: CI runs it (.ci/run)",
    "txf train --config experiments/default.py --workdir runs/h2 --config.model.num_heads=2 --config.seed=1":
        A_RUN_WITH_ONE_FLAG,
    "txf train --config experiments/copy.py --workdir runs/copy": "tests/test_train_e2e.py trains copy.py",
    "txf train --config experiments/default.py --workdir runs/preln --config.model.pre_ln=True "
    "--config.model.positional=learned": A_RUN_WITH_ONE_FLAG,
    "txf train --config experiments/default.py --workdir runs/pmap --config.parallelism=pmap":
        "several devices: tests/test_parallel.py and the runner x family matrix test run pmap on 8 CPU devices",
    "txf train --config experiments/default.py --workdir runs/fsdp --config.parallelism=mesh "
    "--config.mesh_shape='(1,-1,1)'": "several devices: tests/test_parallel.py and the matrix test run fsdp",
    "python launch/local.py -n 2 -d 2 -- txf train --config experiments/default.py --config.parallelism=mesh "
    "--workdir runs/mp": "2 processes: tests/test_multiprocess.py runs them on 127.0.0.1",
    "launch/tpu_pod.sh TPU_NAME ZONE --config=experiments/wmt14_en_de_base.py --config.parallelism=mesh "
    "--workdir=/mnt/shared/runs/pod": "a TPU pod and a download",
    "sbatch launch/slurm.sbatch --config=experiments/wmt14_en_de_base.py --config.parallelism=mesh "
    "--workdir=/shared/runs/base": "a SLURM cluster and a download",
    "txf plan --config experiments/wmt14_en_de_1b.py --devices 64 --json plan.json":
        "minutes of compiling a 1B model for 64 devices: tests/test_plan.py plans small configs",
    "txf plan --config experiments/wmt14_en_de_base.py --devices 8 --config.parallelism=mesh "
    "--config.mesh_shape='(1,-1,1)' --device_peak_tflops=197 --mfu=0.4":
        "a minute of compiling: tests/test_plan.py plans small configs with these flags",
    "pip install -e '.[test]' jupyterlab && jupyter lab notebooks/": "an interactive notebook server",
    "TXF_NOTEBOOK_SMALL=1 pytest tests/test_notebooks.py": "tests/test_notebooks.py is part of the suite",
    "jupytext --sync notebooks/src/*.py": "rewrites the notebooks: tests/test_notebooks.py checks they are in sync",
    "txf bench": "minutes of benchmarking: tests/test_bench.py runs it shrunk",
    "txf bench --configs base --dtypes float32,bfloat16 --attention_impls reference,fused --output bench.json":
        "minutes of benchmarking: tests/test_bench.py runs it shrunk",
    "txf bench --configs small --dtypes float32,bfloat16 --bf16_dots layout,xla --decode=false":
        "minutes of benchmarking: tests/test_bench.py::test_cli_writes_json runs it on the tiny config",
    "python -m bench.profile --config base --dtype bfloat16":
        "minutes of benchmarking: tests/test_bench_profile.py profiles the tiny config",
    "python -m bench.profile --config small --program beam4":
        "a benchmark: tests/test_bench_profile.py profiles a beam-2 call at the tiny config",
    "python -m bench.profile --config base --program beam4 --trace_dir /tmp/p && python -m bench.dots --read /tmp/p --alone":
        "a benchmark: tests/test_bench_dots.py reads the profile of a beam-2 call at the tiny config",
    "python -m bench.decode --config small": "a benchmark: tests/test_bench.py",
    "python -m bench.decode --config transformer_tiny --batch 64 --beam 5 --lengths 32 "
    "--source_len 24 --repeats 7 --num_kv_heads 4 2 1":
        "a benchmark: tests/test_bench.py runs its --num_kv_heads comparison",
    "python -m bench.memory": "a benchmark: tests/test_bench.py",
    "python -m bench.chaos --short": "a chaos run of minutes: tests/test_chaos.py runs it (slow tier)",
    "TXF_DATA=../shared/data python -m bench.chaos": "a chaos run of 20 faults on 2 processes of a Multi30k job, over ten minutes (needs the shared data)",
    "launch/requeue.sh python3 -m txf.cli train --config=experiments/copy.py "
    "--workdir=runs/copy_requeued": "a loop around a whole training: tests/test_launchers.py runs "
                                    "requeue.sh with a stand-in command",
    "python -m bench.peers --harness ../shared/bench-peers --peers_venv VENV --flaxwmt DIR":
        "the peers' own venv with torch and a Flax WMT copy (BENCHMARKS.md)",
    "python -m bench.peers ... --systems txf,flax-wmt,torch-eager,marian,txf-bf16,torch-bf16,"
    "txf-attn-dropout --before_tree OLD_CHECKOUT": "the peers' own venv with torch and an old checkout",
    "python -m bench.dropout --masks": "a benchmark: tests/test_dropout.py checks the masks",
    "python -m bench.programs --config small --program beam4 --before_tree OLD_CHECKOUT":
        "an old checkout: tests/test_bench_programs.py compares a copy of this tree",
    "python -m bench.dotlibs --programs small:beam4 transformer_tiny:train":
        "minutes of benchmarking: tests/test_bench_dotlibs.py runs it on the tiny config",
    # docs/sweeps.md
    "txf sweep experiments/sweeps/copy_norm.py --parallel 2": SWEEP,
    "txf sweep experiments/sweeps/copy_norm.py --set model.d_ff=256 --set num_train_steps=300 "
    "--root runs/sweeps/copy_norm_ff256": SWEEP,
    "txf sweep experiments/sweeps/copy_norm.py --emit commands > runs.txt":
        "tests/test_sweep.py checks the emitted commands against the runs' arguments",
    "parallel -j 4 < runs.txt": "GNU parallel, not a txf dependency",
    "txf sweep experiments/sweeps/copy_norm.py --emit slurm --sbatch=--gres=gpu:1 "
    "--sbatch=--time=01:00:00 > sweep.sbatch":
        "tests/test_sweep.py checks the script (bash -n, and one array task run with a stand-in txf)",
    "sbatch sweep.sbatch": "a SLURM cluster",
    "txf sweep report runs/sweeps/copy_norm": SWEEP,
    "txf sweep experiments/sweeps/copy_norm.py --parallel 2 --ledger results/copy_norm.jsonl": LEDGER,
    "git add results/copy_norm.jsonl && git commit -m \"copy_norm: the runs so far\"":
        "commits to the reader's own repository",
    "txf sweep report experiments/sweeps/copy_norm.py --ledger results/copy_norm.jsonl": LEDGER,
    # docs/sweeps.md, the scaling-law fits
    "txf sweep report runs/sweeps/ladder --fit --predict N=1e6,D=4e6":
        "needs the ladder's runs; tests/test_sweep_fit.py runs `txf sweep report ROOT --fit` on fake ones",
    "txf sweep report runs/sweeps/ladder --fit --holdout w=256,steps=1000":
        "needs the ladder's runs; tests/test_sweep_fit.py runs `--fit --holdout` on fake ones",
    "TXF_DATA=../shared/data txf sweep experiments/sweeps/ladder.py --parallel 2 --fit":
        "36 Tiny Shakespeare runs (45 minutes on 2 cores); the fit is tested by tests/test_sweep_fit.py",
    # docs/mup.md
    "txf coord-check --config experiments/copy.py --widths 64,128,256,512 --steps 5 "
    "--config.model.parametrization=mup":
        "minutes on 2 cores; tests/test_coord_check.py runs the check at widths 32-128 (slow tier)",
    "TXF_DATA=../shared/data txf sweep experiments/sweeps/mup_transfer.py --parallel 2 --pin_cpus":
        "168 Tiny Shakespeare runs (hours on 2 cores); the sweep runner is tested by tests/test_sweep.py",
    # docs/sweeps.md, the variants
    "txf train --config experiments/copy.py --workdir runs/copy-rope --config.model.positional=rope "
    "--config.model.num_kv_heads=1": VARIANT,
    "txf train --config experiments/copy.py --workdir runs/copy-glu --config.model.activation=swiglu "
    "--config.model.ffn_match_params=True --config.model.norm=rms_norm": VARIANT,
    "txf train --config experiments/copy.py --workdir runs/copy-muon --config.optimizer.name=muon "
    "--config.optimizer.schedule=constant --config.optimizer.learning_rate=0.02 "
    "--config.optimizer.warmup_steps=1": VARIANT,
    "TXF_DATA=../shared/data txf sweep experiments/sweeps/shakespeare_glu.py --parallel 2":
        "15 Shakespeare runs (about an hour on 2 cores); the sweep runner is tested by "
        "tests/test_sweep.py",
    "TXF_DATA=../shared/data txf sweep experiments/sweeps/sst2_pretrained.py":
        "9 SST-2 runs after a 32-minute pretraining (known_numbers.sh sst2_seeds); the sweep "
        "runner is tested by tests/test_sweep.py",
    "TXF_DATA=../shared/data txf sweep experiments/sweeps/multi30k_kv_heads.py":
        "9 Multi30k runs (about 85 minutes on 2 cores); the sweep runner is tested by "
        "tests/test_sweep.py",
    "TXF_DATA=../shared/data txf sweep experiments/sweeps/table3.py --parallel 2 --pin_cpus":
        "51 Multi30k runs (an estimated 9 hours on 2 cores); the multi-metric report beside a "
        "reference is tested by tests/test_sweep_reference.py",
    "txf sweep report runs/sweeps/table3": "needs the 51 runs of the Table 3 sweep; "
        "tests/test_sweep_reference.py reports a tiny two-metric sweep beside a reference",
    "TXF_DATA=../shared/data txf sweep experiments/sweeps/bf16_quality.py --parallel 2":
        "6 Multi30k runs (about 40 minutes on 2 cores); the sweep runner is tested by "
        "tests/test_sweep.py",
    "txf sweep report runs/sweeps/bf16_quality": "needs the 6 runs of the bf16 sweep; "
        "tests/test_sweep.py reports tiny sweeps",
    "pip install 'txf[wandb]'": "an optional extra from PyPI: tests/test_sweep.py runs the tracker "
                                "offline when wandb is installed",
    "WANDB_MODE=offline txf train --config experiments/copy.py --config.tracker=wandb":
        "needs the wandb extra: tests/test_sweep.py logs rows offline and resumes the same W&B run",
}


def nav_pages():
  """The site's pages (docs/...) in mkdocs.yml's ``nav`` order."""
  with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
    lines = f.read().splitlines()
  start = lines.index("nav:") + 1
  pages = []
  for line in lines[start:]:
    if line and not line.startswith(" "):
      break
    m = re.search(r"(\S+\.md)\s*$", line)
    if m:
      pages.append(os.path.join("docs", m.group(1)))
  return pages


def documents():
  """Repository paths of the documents in reading order: README.md, the site's pages in its nav
  order, the other pages under docs/, then notebooks/README.md and experiments/*.md."""
  paths = [FRONT_PAGE] + nav_pages()
  for pattern in DOCUMENTS:
    paths += [os.path.relpath(p, ROOT) for p in sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True))]
  return [p for p in dict.fromkeys(paths) if os.path.isfile(os.path.join(ROOT, p))]


@functools.lru_cache(maxsize=None)
def documented_commands():
  """[(document, line, command)] of every shell command in the documents, in reading order."""
  out = []
  for doc in documents():
    out += [(doc, line, cmd) for line, cmd in shell_commands(os.path.join(ROOT, doc))]
  return out


def table_cells(line):
  """The cells of a Markdown table row (``\\|`` is a pipe inside a cell, not a border)."""
  cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
  return [c.strip().replace("\\|", "|") for c in cells]


def shell_commands(path):
  """(line, command) of each command in the shell code blocks of one Markdown file, and of each
  `code` in the cells of a table's ``command`` column."""
  out, language, pending, start, column = [], None, "", 0, None
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  for number, line in enumerate(lines, 1):
    text = line.strip()
    if text.startswith("```"):
      language = (text[3:].strip() or "text") if language is None else None
      continue
    if language is None:  # prose: a table's command column
      if not text.startswith("|"):
        column = None
      elif column is None:
        cells = table_cells(text)
        column = cells.index("command") if "command" in cells else -1
      elif column >= 0 and not re.match(r"^\|[\s:|-]+\|$", text):
        cells = table_cells(text)
        if column < len(cells):
          out += [(number, normalise(code)) for code in re.findall(r"`([^`]+)`", cells[column])]
      continue
    if language not in SHELL_LANGUAGES:
      continue
    if not pending:
      start = number
      if not text or text.startswith("#"):
        continue
    if text.endswith("\\"):
      pending += text[:-1].strip() + " "
      continue
    out.append((start, normalise(pending + text)))
    pending = ""
  return out


def normalise(command):
  """The command without its trailing ``# comment`` and with runs of spaces collapsed."""
  words = []
  lexer = shlex.shlex(command, posix=False, punctuation_chars="|&;<>")
  lexer.whitespace_split = True
  lexer.commenters = "#"
  for word in lexer:
    words.append(word)
  return " ".join(words)


def test_every_documented_command_is_run_or_listed_as_not_run():
  missing = [f"{doc}:{line}: {cmd}" for doc, line, cmd in documented_commands()
             if cmd not in RUN and cmd not in NOT_RUN]
  assert not missing, (
      "these documented commands are neither run nor listed as not run in tests/test_readme_commands.py: "
      "add each to RUN (with arguments that shorten it) or to NOT_RUN (with why CI cannot run it):\n  "
      + "\n  ".join(missing))
  both = sorted(set(RUN) & set(NOT_RUN))
  assert not both, f"listed both as run and as not run: {both}"


def test_the_front_page_shows_only_commands_a_page_shows():
  on_pages = {cmd for doc, _, cmd in documented_commands() if doc != FRONT_PAGE}
  front = [(line, cmd) for doc, line, cmd in documented_commands() if doc == FRONT_PAGE]
  assert len(front) >= 10, front  # the quick start and the table of the main jobs
  missing = [f"{FRONT_PAGE}:{line}: {cmd}" for line, cmd in front if cmd not in on_pages]
  assert not missing, ("the front page shows commands no page of the site shows (add each to its page, "
                       "where it runs in reading order):\n  " + "\n  ".join(missing))


def test_commands_that_use_a_run_come_after_the_command_that_makes_it():
  """In reading order (the front page aside), a RUN command naming --workdir runs/X comes after a
  RUN command that trains runs/X."""
  made, problems = set(), []
  for doc, line, cmd in documented_commands():
    if cmd not in RUN or doc == FRONT_PAGE:
      continue
    workdir = re.search(r"--workdir[ =](runs/[\w.-]+)", cmd)
    if "txf train" in cmd:
      name = re.search(r"--config\.name=([\w.-]+)", cmd)
      config = re.search(r"--config[ =](?:experiments/)?([\w.-]+?)(?:\.py)?(?:\s|$)", cmd)
      made.add(workdir.group(1) if workdir else
               f"runs/{name.group(1) if name else config.group(1) if config else 'default'}")
    elif workdir and workdir.group(1) not in made:
      problems.append(f"{doc}:{line}: {cmd} (nothing before it trains {workdir.group(1)})")
  assert not problems, "\n".join(problems)


def test_every_listed_command_is_still_documented():
  documented = {cmd for _, _, cmd in documented_commands()}
  stale = [cmd for cmd in list(RUN) + list(NOT_RUN) if cmd not in documented]
  assert not stale, ("tests/test_readme_commands.py lists commands no document shows any more "
                     f"(remove them, or fix the document): {stale}")


# -- the txf commands, flags and fields a command names exist --------------------------------------

COMMON_FLAGS = {"v", "verbosity", "verbose_errors", "help", "helpshort", "helpfull", "version"}
# the --config/--workdir flags after these are txf train's (the others are the launcher's own)
LAUNCHERS = ("launch/tpu_pod.sh", "launch/slurm.sbatch", "launch/gke_jobset.sh")


def txf_calls(command):
  """[(subcommand or 'python -m MODULE', [args])] of every txf call in a shell command."""
  words = shlex.split(command, comments=True)
  segments, current = [], []
  for w in words:
    if w in ("|", "&&", "||", ";", "<", ">", "2>", ">>"):
      segments.append(current)
      current = []
    else:
      current.append(w)
  segments.append(current)
  calls = []
  for seg in segments:
    while seg and re.match(r"^[A-Z_][A-Z0-9_]*=", seg[0]):
      seg = seg[1:]  # VAR=value prefixes
    if "txf" in seg:
      i = seg.index("txf")
      if i + 1 < len(seg) and not seg[i + 1].startswith("-"):
        calls.append((seg[i + 1], seg[i + 2:]))
      else:
        calls.append(("", seg[i + 1:]))
    elif len(seg) >= 3 and seg[0].startswith("python") and seg[1] == "-m" and seg[2].startswith("txf."):
      calls.append((f"python -m {seg[2]}", seg[3:]))
    elif any(w.endswith(LAUNCHERS) for w in seg):
      i = next(i for i, w in enumerate(seg) if w.endswith(LAUNCHERS))
      calls.append(("train", [w for w in seg[i + 1:] if w.startswith(("--config", "--workdir"))]))
  return calls


FLAG_DEFINITIONS = re.compile(r"DEFINE_\w+\(\s*[\"'](\w+)[\"']|add_argument\(\s*[\"']--(\w+)[\"']")


def module_flags(module):
  """The flag names a module defines (absl ``DEFINE_*`` or argparse ``add_argument``), read from its
  source: a ``python -m txf.X`` module's flags, without starting JAX once per module."""
  path = os.path.join(ROOT, *module.split(".")) + ".py"
  assert os.path.isfile(path), f"no module {module} ({path})"
  with open(path, encoding="utf-8") as f:
    return {a or b for a, b in FLAG_DEFINITIONS.findall(f.read())}


@functools.lru_cache(maxsize=None)
def command_flags(sub):
  """The flags of ``txf SUB``: what txf.commands.declared declares for it (``txf SUB --help``)."""
  return frozenset(declared.define(sub, flags.FlagValues()))


def known_flag(name, known):
  """Whether --name is one of ``known`` (absl's --noFLAG form of a boolean included)."""
  return name in known or name.startswith("no") and name[2:] in known


def flag_names(args):
  """Names of the --flags in args, and the --config file and --config.FIELD names."""
  names, configs, fields = [], [], []
  for i, a in enumerate(args):
    if not a.startswith("-") or a in ("-", "--", "..."):
      continue
    name = a.lstrip("-").split("=", 1)[0]
    if name.startswith("config."):
      fields.append(name[len("config."):])
    elif name == "config":
      configs.append(a.split("=", 1)[1] if "=" in a else args[i + 1])
    names.append(name.split(".", 1)[0])
  return names, configs, fields


def test_every_txf_call_names_commands_flags_and_fields_that_exist():
  calls = [(doc, line, cmd, sub, args) for doc, line, cmd in documented_commands()
           for sub, args in txf_calls(cmd)]
  assert calls, "no txf call found in the documents"
  fields_known = config_lib.field_names()
  problems = []
  for doc, line, cmd, sub, args in calls:
    where = f"{doc}:{line}: {cmd}\n    "
    if sub.startswith("python -m "):
      module = sub.split()[-1]
      try:
        known = module_flags(module) | COMMON_FLAGS
      except AssertionError as e:
        problems.append(where + str(e))
        continue
    elif sub == "":
      known = COMMON_FLAGS
    elif sub not in cli.COMMANDS:
      problems.append(where + f"txf has no command '{sub}' (txf --help lists {sorted(cli.COMMANDS)})")
      continue
    else:
      known = command_flags(sub) | COMMON_FLAGS
    names, configs, fields = flag_names(args)
    problems += [where + f"{sub or 'txf'} has no flag --{n}" for n in names if not known_flag(n, known)]
    problems += [where + f"no config field '{f}' (txf/core/config.py)" for f in fields if f not in fields_known]
    for c in configs:
      if not sub.startswith("python -m "):
        try:
          bare = "/" not in c and not c.endswith(".py")  # a shipped experiment's name
          config_lib.experiment_path(c if os.path.isabs(c) or bare else os.path.join(ROOT, c))
        except config_lib.ConfigError as e:
          problems.append(where + str(e))
  assert not problems, "documented commands name what txf does not have:\n  " + "\n  ".join(problems)


# -- running them ------------------------------------------------------------------------------------

def stand_in_data(root):
  """A tiny copy of ../shared/data's layout: multi30k, sst2, tinyshakespeare (tests/test_data_fixtures)."""
  fx.parallel_dir(os.path.join(root, "multi30k"), n_train=120, n_val=16,
                  splits=("train", "val", "test_2016_flickr"))
  fx.tsv_dir(os.path.join(root, "sst2"), n_train=120, n_val=16)
  # the speakers the README's prompts name, so their characters are in the character vocabulary
  fx.plain_dir(os.path.join(root, "tinyshakespeare"), n_lines=200, speakers=("ROMEO", "JULIET"))


def shortened(command, extra):
  """The command with ``extra`` appended to its txf call (before any redirection or pipe after it)."""
  if isinstance(extra, tuple):
    extra, drop = extra
    command = command.replace(drop, "", 1)
  if not extra:
    return command
  words = re.split(r"(\s+)", command)
  out, in_txf = [], False
  for w in words:
    if w.strip() in ("|", "<", ">", "&&", ";", "2>") and in_txf:
      out.append(extra + " ")
      in_txf = False
      extra = ""
    if w.strip() == "txf":
      in_txf = True
    out.append(w)
  if extra:
    out.append(" " + extra)
  return "".join(out)


@pytest.mark.slow
def test_the_readme_runs_in_order_from_a_fresh_clone(tmp_path):
  """The RUN commands in document order, each shortened, in a folder laid out like a fresh clone."""
  clone = tmp_path / "clone"
  clone.mkdir()
  os.symlink(os.path.join(ROOT, "experiments"), clone / "experiments")
  stand_in_data(tmp_path / "shared" / "data")
  env = {k: v for k, v in os.environ.items() if not k.startswith("TXF_") and k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", TXF_DATA_DIR=str(tmp_path / "tfds"), TXF_MALLOC="system",
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  # `txf` is the txf of this interpreter, as after `pip install -e .`
  prelude = f"set -eo pipefail; txf() {{ {shlex.quote(sys.executable)} -m txf.cli \"$@\"; }}; "
  timings, done = [], set()
  for doc, line, cmd in documented_commands():
    if cmd not in RUN or doc == FRONT_PAGE or cmd in done:
      continue  # the front page's commands run where a page shows them
    done.add(cmd)
    script = shortened(cmd, RUN[cmd])
    t0 = time.perf_counter()
    r = subprocess.run(["bash", "-c", prelude + script], cwd=clone, env=env, capture_output=True,
                       text=True, timeout=900)  # seconds on a quiet CPU; minutes on a loaded one
    timings.append((round(time.perf_counter() - t0, 1), cmd))
    assert r.returncode == 0, f"{doc}:{line}: `{script}` failed ({r.returncode}):\n{r.stderr[-3000:]}"
    # U+FFFD only where a subword model's byte pieces decode to broken UTF-8: an untrained
    # model's sample hypotheses; txf's own text never has it
    own = [l for l in r.stdout.splitlines() if not l.lstrip().startswith("hyp:")]
    assert "Traceback" not in r.stderr and "\ufffd" not in "\n".join(own), f"{doc}:{line}: {r.stdout[-3000:]}"
    check_output(cmd, r, clone)
  print(timings)
  extra_checks(clone, prelude, env)


def extra_checks(clone, prelude, env):
  """What a newcomer meets beyond the documented commands, on the runs they made."""
  def sh(script, **more):
    return subprocess.run(["bash", "-c", prelude + script], cwd=clone, env={**env, **more},
                          capture_output=True, text=True, timeout=900)
  # an error's advice names flags of the command that printed it: txf eval without TXF_DATA
  r = sh("txf eval --workdir runs/sst2 --split dev")
  assert r.returncode == 2 and r.stderr.startswith("txf: error: "), r.stderr[-3000:]
  named = set(re.findall(r"--(\w+)=", r.stderr))
  assert named and named <= command_flags("eval"), (named, r.stderr)
  # a character model samples only characters: no U+FFFD even from a hot, untrained model
  r = sh("txf generate --workdir runs/shakespeare_char --prompt ROMEO: --temperature 5 "
         "--max_new_tokens 24 --num_samples 8")
  assert r.returncode == 0 and r.stdout.count("--- sample ") == 8, r.stderr[-3000:]
  assert "\ufffd" not in r.stdout, r.stdout
  # average-checkpoints on a classifier: a step number, and the commands a classifier has
  r = sh("txf average-checkpoints --workdir runs/sst2 --step latest")
  assert r.returncode == 0 and "at step 4 ->" in r.stdout and "txf classify" in r.stdout, r.stdout
  assert "translate" not in r.stdout, r.stdout


TXF_MODULES = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "txf", "**", "*.py"), recursive=True)}
ABSL_LINE = re.compile(r"^[DIWEF]\d{4} [\d:.]+\s+\d+ (\S+?):\d+\]")


def check_quiet(cmd, r):
  """Quiet by default: no library log lines (absl format, from a file outside txf), no tfds prints
  or progress bars while data is prepared, at most one txf line about a preparation."""
  out = r.stdout + r.stderr
  library = [l for l in out.splitlines() if ABSL_LINE.match(l) and ABSL_LINE.match(l).group(1)
             not in TXF_MODULES]
  assert not library, f"{cmd}: library log lines:\n" + "\n".join(library)
  assert "Downloading and preparing" not in out and "downloaded and prepared" not in out, out
  assert "\x1b[" not in r.stderr, r.stderr  # piped: no progress bar (txf's or tfds') escape codes
  assert sum(l.startswith("txf: prepared") for l in out.splitlines()) <= 1, out


def check_output(cmd, r, clone):
  """What each command printed or wrote, as the document says."""
  check_quiet(cmd, r)
  if "multi30k_en_de.py" in cmd:  # rows come from data.tokens_per_batch: the header says so
    header = next(l for l in r.stdout.splitlines() if l.startswith("txf: encoder_decoder"))
    assert "steps of 512 tokens (data.tokens_per_batch)" in header, header
  if cmd.startswith("txf translate") and "hyps.txt" in cmd:
    with open(clone / "hyps.txt", encoding="utf-8") as f:
      assert len(f.read().splitlines()) == 2  # one hypothesis a source line
  elif "| txf classify" in cmd:
    label, prob = r.stdout.strip().split("\t")
    assert label in ("0", "1") and 0.5 <= float(prob) <= 1.0
  elif cmd.startswith("txf average-checkpoints"):
    assert (clone / "runs" / "sst2" / "params_best.msgpack").is_file()
    assert re.search(r"checkpoint at step \d+ ->", r.stdout), r.stdout
    assert "translate" not in r.stdout + r.stderr and "txf classify" in r.stdout, r.stdout
  elif "txf generate" in cmd:
    headers = [l for l in r.stdout.splitlines() if l.startswith("--- prompt")]
    assert len(headers) == (4 if "--num_samples 2" in cmd else 0) or "--num_samples" not in cmd
  elif cmd.startswith("txf eval --workdir runs/default --output"):
    assert (clone / "report.json").is_file()


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_prepare_data_says_one_line_for_a_dataset_it_cannot_prepare(tmp_path):
  r = subprocess.run([sys.executable, "-m", "txf.cli", "prepare-data", "no_such_dataset_txf",
                      "--data_dir", str(tmp_path)], capture_output=True, text=True, timeout=300,
                     cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("txf: error: "), r.stderr
  assert "no_such_dataset_txf" in lines[0] and "Traceback" not in r.stderr
