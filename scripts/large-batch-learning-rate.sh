#!/usr/bin/env bash
# Chapter 02's large-batch experiment: Fashion-MNIST, depth 2, hidden 256, AdamW, the same
# number of epochs at batch 256 (the reference, lr 1e-3, the rate tuned for it) and at
# batch 4096 (as micro-batches of 512: 16 times fewer optimizer steps) with the
# learning-rate rules
#   unchanged   lr 1e-3, as tuned for batch 256
#   linear      lr x 4096/256 = 1.6e-2 (Goyal et al. 2017, derived for SGD)
#   sqrt        lr x sqrt(4096/256) = 4e-3 (the rule usually recommended for Adam)
# each with a linear warm-up (15 optimizer steps or longer), constant or cosine after it.
#
# Chosen the way a result can be trusted: every batch-4096 setting trains with 3 seeds on
# the first 50000 training samples and is scored on the last 10000 (`--validation 10000`),
# the test split unseen; the setting of the best mean validation accuracy is then trained
# on all 60000 with the same 3 seeds, beside the reference, and only those two are scored
# on the test split: mean and spread (min, max) over the seeds.
#
# Usage: scripts/large-batch-learning-rate.sh [EPOCHS]   (default 16)
# Writes, in this machine's results folder (scripts/results-folder.sh),
# fashion-mnist-large-batch-EPOCHS-epochs.json (every run:
# its setting, seed, split, accuracy and seconds) and rewrites chapter 02's table and text
# from it (scripts/readme_numbers.py). 17 minutes at 16 epochs on an otherwise idle 2-core
# CPU (2026-12-02): about 30 s a run, 39 runs.
# BIGBATCH=path/to/bigbatch uses that program instead of installing and building.
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-16}"
seeds=(0 1 2)
source scripts/bigbatch-program.sh
results=$results_dir/fashion-mnist-large-batch-$epochs-epochs.json
base=(--data fashion-mnist --depth 2 --hidden 256 --optimizer adamw --lr 1e-3 --epochs "$epochs")
large=(--batch 4096 --micro-batch 512)
# name|flags: the batch-4096 settings weighed.
settings=(
  "unchanged, warm-up 15|--warmup-steps 15"
  "unchanged, warm-up 15, cosine|--warmup-steps 15 --lr-schedule cosine"
  "linear, warm-up 15|--warmup-steps 15 --lr-scale linear"
  "linear, warm-up 15, cosine|--warmup-steps 15 --lr-scale linear --lr-schedule cosine"
  "linear, warm-up 60, cosine|--warmup-steps 60 --lr-scale linear --lr-schedule cosine"
  "sqrt, warm-up 15|--warmup-steps 15 --lr-scale sqrt"
  "sqrt, warm-up 15, cosine|--warmup-steps 15 --lr-scale sqrt --lr-schedule cosine"
  "sqrt, warm-up 30, cosine|--warmup-steps 30 --lr-scale sqrt --lr-schedule cosine"
  "sqrt, warm-up 45, cosine|--warmup-steps 45 --lr-scale sqrt --lr-schedule cosine"
  "sqrt, warm-up 60, cosine|--warmup-steps 60 --lr-scale sqrt --lr-schedule cosine"
  "sqrt, warm-up 90, cosine|--warmup-steps 90 --lr-scale sqrt --lr-schedule cosine"
)
: > "$out/runs.jsonl"

# run SPLIT NAME SEED FLAGS...: one training run, scored on SPLIT (validation or test).
run() {
  local split="$1" name="$2" seed="$3" start
  shift 3
  local flags=("${base[@]}" --seed "$seed" "$@")
  [ "$split" = validation ] && flags+=(--validation 10000)
  start=$(date +%s)
  "$BIGBATCH" train "${flags[@]}" > "$out/run.log" 2>&1 || { cat "$out/run.log"; exit 1; }
  local accuracy
  accuracy=$(sed -n "s/^$split (.*accuracy \([0-9.]*\)\$/\1/p" "$out/run.log")
  [ -n "$accuracy" ] || { cat "$out/run.log"; echo "no $split accuracy"; exit 1; }
  printf '{"setting": "%s", "seed": %s, "split": "%s", "accuracy": %s, "seconds": %s, "flags": "%s"}\n' \
    "$name" "$seed" "$split" "$accuracy" "$(($(date +%s) - start))" "${flags[*]}" >> "$out/runs.jsonl"
  echo "$split  $name  seed $seed: $accuracy"
}

for entry in "${settings[@]}"; do
  read -r -a flags <<< "${entry#*|}"
  for seed in "${seeds[@]}"; do run validation "4096 ${entry%%|*}" "$seed" "${large[@]}" "${flags[@]}"; done
done
chosen=$(python3 -c '
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
names = dict.fromkeys(r["setting"] for r in runs)
print(max(names, key=lambda n: statistics.mean(r["accuracy"] for r in runs if r["setting"] == n)))
' "$out/runs.jsonl")
echo "chosen on validation accuracy: $chosen"
for entry in "${settings[@]}"; do
  [ "4096 ${entry%%|*}" = "$chosen" ] || continue
  read -r -a flags <<< "${entry#*|}"
  for seed in "${seeds[@]}"; do run test "$chosen" "$seed" "${large[@]}" "${flags[@]}"; done
done
for seed in "${seeds[@]}"; do run test "256" "$seed" --batch 256; done

python3 - "$out/runs.jsonl" "$results" "$epochs" "$chosen" "$(nproc)" <<'PY'
import datetime, json, pathlib, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
document = {"description": "chapter 02's large-batch learning-rate study "
                           "(scripts/large-batch-learning-rate.sh)",
            "date": datetime.date.today().isoformat(), "cpus": int(sys.argv[5]),
            "epochs": int(sys.argv[3]), "chosen": sys.argv[4], "runs": runs}
sys.path.insert(0, "scripts")
import results_json
results_json.write(sys.argv[2], document)
PY
python3 scripts/readme_numbers.py --write
