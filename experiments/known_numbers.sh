#!/usr/bin/env bash
# The README's "Known numbers on real data" table (issues 9, 23): train each run, then score it with
# `txf eval`. Needs the shared data: TXF_DATA=../shared/data (default here). Multi30k stops at its
# time_limit_minutes (90; the tiny model 110); Tiny Shakespeare (1500 steps) and SST-2 (2450) at
# their step counts, sized to end inside their limits (60, 15) on 2 cores. Each leaves
# metrics.jsonl, plots (loss curves), eval_<split>.json and samples in runs/<name>/.
#
#   bash experiments/known_numbers.sh                # one after another, both cores each (~5 h)
#   CORES=0 bash experiments/known_numbers.sh m30k   # one run, pinned to core 0 (taskset)
#   TRAIN_FLAGS="--config.time_limit_minutes=70" bash experiments/known_numbers.sh m30k  # extra train flags
#   UPDATES=5400 bash experiments/known_numbers.sh m30k_tiny_bf16   # the updates a faster CPU fits in the hour
#
# Runs: m30k (raw cased text, both BLEU protocols), m30k_tiny (the papers' lowercased tokenized
# files, Transformer-Tiny, tok-lc BLEU beside Wu et al. 2021), m30k_tiny_bf16 (the same in one hour
# with bf16 compute), m30k_span (T5's span corruption on Multi30k's training text, then
# m30k_tiny's model from it in m30k_tiny's wall time), sst2 (dev,
# then test once with the parameters dev chose), sst2_pretrained (masked-LM pretraining on SST-2's
# own training text, then the same fine-tuning and scoring), sst2_seeds (both, 3 seeds each, with
# statistics), shakespeare (default: m30k m30k_tiny sst2 shakespeare).
set -euo pipefail
cd "$(dirname "$0")/.."
export TXF_DATA="${TXF_DATA:-../shared/data}"
pin=()
if [[ -n "${CORES:-}" ]]; then pin=(taskset -c "$CORES"); fi
txf() { "${pin[@]}" python -m txf.cli "$@"; }
read -r -a extra <<< "${TRAIN_FLAGS:-}"

score_sst2() {  # score_sst2 W: dev for the final and the best-on-dev parameters, test once with
                # dev's choice, 20 dev samples
  local w=$1 chosen
  txf eval --workdir "$w" --split dev
  txf average-checkpoints --workdir "$w" --step best
  txf eval --workdir "$w" --split dev --params params_best.msgpack --output "$w/eval_dev_best.json"
  chosen=$(python -c 'import json, sys; a, b = (json.load(open(f"{sys.argv[1]}/{f}.json"))["accuracy"]
    for f in ("eval_dev", "eval_dev_best")); print("params_best.msgpack" if b > a else "params.msgpack")' "$w")
  txf eval --workdir "$w" --split test --params "$chosen"
  sed -n 2,21p "$TXF_DATA/sst2/dev.tsv" > "$w/samples.gold.tsv"  # sentence<TAB>gold label
  cut -f 1 "$w/samples.gold.tsv" | txf classify --workdir "$w" --params "$chosen" --output "$w/samples.pred"
  paste "$w/samples.pred" "$w/samples.gold.tsv" > "$w/samples.tsv"
}

score_m30k_tiny() {  # score_m30k_tiny W: the last 10 (the paper's) or 5 checkpoints averaged, and the
                     # length penalty's exponent alpha 0.6 (txf's default) or 1.0, chosen on val with
                     # beam 5; test2016 once with val's choice (eval_test_2016_flickr.json)
  local w=$1 n a tried=()
  for n in 10 5; do
    txf average-checkpoints --workdir "$w" --last $n
    for a in 0.6 1.0; do
      txf eval --workdir "$w" --split val --beam 5 --alpha $a --bleu tok-lc \
        --params params_avg$n.msgpack --output "$w/eval_val_avg${n}_alpha$a.json"
      tried+=("$n $a")
    done
  done
  read -r n a < <(python -c 'import json, sys
bleu = lambda t: json.load(open("{}/eval_val_avg{}_alpha{}.json".format(sys.argv[1], *t.split())))["bleu"]
print(max(sys.argv[2:], key=bleu))' "$w" "${tried[@]}")
  echo "val chose the last $n checkpoints averaged, alpha $a" | tee "$w/val_choice.txt"
  txf eval --workdir "$w" --split test_2016_flickr --beam 5 --alpha "$a" --bleu tok-lc \
    --params "params_avg$n.msgpack"
}

for run in "${@:-m30k m30k_tiny sst2 shakespeare}"; do
  for r in $run; do
    case "$r" in
      m30k)
        txf train --config experiments/multi30k_en_de.py --progress=false "${extra[@]}"
        txf eval --workdir runs/multi30k_en_de --split test_2016_flickr --beam 4
        txf eval --workdir runs/multi30k_en_de --split test_2016_flickr --beam 4 --bleu tok-lc \
          --output runs/multi30k_en_de/eval_test_2016_flickr_tok-lc.json
        head -n 20 "$TXF_DATA/multi30k/test_2016_flickr.en" > runs/multi30k_en_de/samples.en
        txf translate --workdir runs/multi30k_en_de --beam 4 --input runs/multi30k_en_de/samples.en \
          --output runs/multi30k_en_de/samples.de ;;
      m30k_tiny)  # the last 10 (the paper's) or 5 checkpoints averaged and alpha 0.6 or 1.0, chosen on
                  # val with beam 5; test2016 once
        txf train --config experiments/multi30k_en_de_tiny.py --progress=false "${extra[@]}"
        score_m30k_tiny runs/multi30k_en_de_tiny ;;
      m30k_tiny_bf16)  # m30k_tiny in one hour of a 2-core CPU with bf16 units: bf16 compute,
                       # UPDATES updates (default 4,600, what the Intel Xeon with AMX fits; 5,400 on
                       # the AMD EPYC with AVX512-BF16; warmup 1,000 at the same peak lr 0.005, the
                       # last 800 falling linearly to 0), a 56-minute limit; scored as m30k_tiny
        txf train --config experiments/multi30k_en_de_tiny.py --config.name=multi30k_en_de_tiny_bf16 \
          --config.model.dtype=bfloat16 --config.num_train_steps="${UPDATES:-4600}" \
          --config.time_limit_minutes=56 \
          --config.optimizer.warmup_steps=1000 --config.optimizer.learning_rate_scale=1.79 \
          --config.optimizer.cooldown_steps=800 --progress=false "${extra[@]}"
        score_m30k_tiny runs/multi30k_en_de_tiny_bf16 ;;
      m30k_span)  # span corruption on train.en + train.de for 3600 steps (~20 min), then the tiny
                  # translation model from it for 6000 of its 8000 updates, so that the whole command
                  # took m30k_tiny's wall time at ~4k tokens an update; scored as m30k_tiny
        txf train --config experiments/multi30k_span.py --config.num_train_steps=3600 \
          --config.eval_every=300 --config.checkpoint_every=600 --progress=false "${extra[@]}"
        txf train --config experiments/multi30k_en_de_tiny.py --config.name=multi30k_en_de_tiny_span \
          --config.init_from=runs/multi30k_span --config.num_train_steps=6000 \
          --config.data.tokens_per_batch=4096 --config.checkpoint_every=100 \
          --config.optimizer.warmup_steps=1000 --config.optimizer.learning_rate_scale=1.79 \
          --progress=false "${extra[@]}"
        score_m30k_tiny runs/multi30k_en_de_tiny_span ;;
      sst2)  # the final model (eval_dev.json) and the best on dev (eval_dev_best.json); test once, with
             # whichever of the two dev chose (eval_test.json)
        txf train --config experiments/sst2.py --progress=false "${extra[@]}"
        score_sst2 runs/sst2 ;;
      sst2_pretrained)  # masked-LM pretraining on SST-2's training text (no labels), then sst2.py's
                        # fine-tuning from it (init_from), scored as sst2
        txf train --config experiments/sst2_mlm.py --progress=false "${extra[@]}"
        txf train --config experiments/sst2.py --config.name=sst2_pretrained \
          --config.init_from=runs/sst2_mlm --progress=false "${extra[@]}"
        score_sst2 runs/sst2_pretrained ;;
      sst2_seeds)  # sst2.py from scratch and from sst2_mlm's pretraining (trained first unless
                   # runs/sst2_mlm has its parameters), 3 seeds each: dev statistics and Welch's
                   # t-test (txf sweep), then test once per run with dev's choice, per-arm summary
        [[ -f runs/sst2_mlm/params.msgpack ]] ||
          txf train --config experiments/sst2_mlm.py --progress=false "${extra[@]}"
        txf sweep experiments/sweeps/sst2_pretrained.py
        for w in runs/sweeps/sst2_pretrained/*/seed-*; do if [[ -d "$w" ]]; then score_sst2 "$w"; fi; done
        python -c 'import glob, json, statistics as st
for arm in ("scratch", "pretrained", "pretrained_lr"):
  acc = [100 * json.load(open(f))["accuracy"] for f in
         sorted(glob.glob(f"runs/sweeps/sst2_pretrained/{arm}/seed-*/eval_test.json"))]
  seeds = ", ".join(f"{a:.2f}" for a in acc)
  print(f"{arm}: test accuracy {st.mean(acc):.2f} (seeds {seeds}; spread {max(acc) - min(acc):.2f})")' | tee runs/sweeps/sst2_pretrained/test.txt ;;
      shakespeare)
        txf train --config experiments/shakespeare_char.py --progress=false "${extra[@]}"
        txf eval --workdir runs/shakespeare_char --split val
        txf generate --workdir runs/shakespeare_char --prompt "ROMEO:" --num_samples 3 \
          --max_new_tokens 250 > runs/shakespeare_char/samples.txt ;;
      *) echo "unknown run '$r': use m30k, m30k_tiny, m30k_tiny_bf16, m30k_span, sst2, sst2_pretrained, sst2_seeds or shakespeare" >&2; exit 2 ;;
    esac
  done
done
