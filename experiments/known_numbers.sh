#!/usr/bin/env bash
# The README's "Known numbers on real data" table (issue 9): train each run, then score it with
# `txf eval`. Needs the shared data: TXF_DATA=../shared/data (default here). Multi30k stops at its
# time_limit_minutes (90); Tiny Shakespeare (1500 steps) and SST-2 (2450) at their step counts, sized
# to end inside their limits (60, 15) on 2 cores. Each leaves metrics.jsonl, plots (loss curves),
# eval_<split>.json and samples in runs/<name>/.
#
#   bash experiments/known_numbers.sh                # one after another, both cores each (~3 h)
#   CORES=0 bash experiments/known_numbers.sh m30k   # one run, pinned to core 0 (taskset)
#   TRAIN_FLAGS="--config.time_limit_minutes=70" bash experiments/known_numbers.sh m30k  # extra train flags
#
# Runs: m30k, sst2, shakespeare (default: all three).
set -euo pipefail
cd "$(dirname "$0")/.."
export TXF_DATA="${TXF_DATA:-../shared/data}"
pin=()
if [[ -n "${CORES:-}" ]]; then pin=(taskset -c "$CORES"); fi
txf() { "${pin[@]}" python -m txf.cli "$@"; }
read -r -a extra <<< "${TRAIN_FLAGS:-}"

for run in "${@:-m30k sst2 shakespeare}"; do
  for r in $run; do
    case "$r" in
      m30k)
        txf train --config experiments/multi30k_en_de.py --progress=false "${extra[@]}"
        txf eval --workdir runs/multi30k_en_de --split test_2016_flickr --beam 4
        head -n 20 "$TXF_DATA/multi30k/test_2016_flickr.en" > runs/multi30k_en_de/samples.en
        txf translate --workdir runs/multi30k_en_de --beam 4 --input runs/multi30k_en_de/samples.en \
          --output runs/multi30k_en_de/samples.de ;;
      sst2)  # the final model (eval_dev.json), then the best on dev for comparison (eval_dev_best.json)
        txf train --config experiments/sst2.py --progress=false "${extra[@]}"
        txf eval --workdir runs/sst2 --split dev
        txf average-checkpoints --workdir runs/sst2 --step best
        txf eval --workdir runs/sst2 --split dev --params params_best.msgpack \
          --output runs/sst2/eval_dev_best.json
        sed -n 2,21p "$TXF_DATA/sst2/dev.tsv" > runs/sst2/samples.gold.tsv  # sentence<TAB>gold label
        cut -f 1 runs/sst2/samples.gold.tsv | txf classify --workdir runs/sst2 --output runs/sst2/samples.pred
        paste runs/sst2/samples.pred runs/sst2/samples.gold.tsv > runs/sst2/samples.tsv ;;
      shakespeare)
        txf train --config experiments/shakespeare_char.py --progress=false "${extra[@]}"
        txf eval --workdir runs/shakespeare_char --split val
        txf generate --workdir runs/shakespeare_char --prompt "ROMEO:" --num_samples 3 \
          --max_new_tokens 250 > runs/shakespeare_char/samples.txt ;;
      *) echo "unknown run '$r': use m30k, sst2 or shakespeare" >&2; exit 2 ;;
    esac
  done
done
