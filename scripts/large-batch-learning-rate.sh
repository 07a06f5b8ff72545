#!/usr/bin/env bash
# Chapter 02's large-batch experiment: Fashion-MNIST, depth 2, hidden 256, AdamW, the same
# number of epochs (8, then 16) at batch 256 (the reference, lr 1e-3) and at batch 4096 (as
# micro-batches of 512: 16x fewer optimizer steps) with the learning-rate rules
#   unchanged   lr 1e-3, as tuned for batch 256
#   linear      lr x 4096/256 = 1.6e-2 (Goyal et al. 2017, derived for SGD)
#   sqrt        lr x sqrt(4096/256) = 4e-3 (the rule usually recommended for Adam)
# each with a linear warm-up (15 steps = one epoch, or longer), constant or cosine after it.
#
# Usage: scripts/large-batch-learning-rate.sh [EPOCHS ...]   (default: 8 16)
# Writes every run's command and test accuracy to
# bench/results/cpu-2core/fashion-mnist-large-batch-EPOCHS-epochs.txt, one file per epoch
# count.
# BIGBATCH=path/to/bigbatch uses that program instead of installing and building.
set -euo pipefail
cd "$(dirname "$0")/.."
epoch_counts=(8 16)
(($#)) && epoch_counts=("$@")
source scripts/bigbatch-program.sh
base=(--data fashion-mnist --depth 2 --hidden 256 --optimizer adamw --lr 1e-3 --seed 0)
large=(--batch 4096 --micro-batch 512)
run() {
  local name="$1"; shift
  local start=$(date +%s)
  "$BIGBATCH" train "${common[@]}" "$@" > "$out/$name.log" 2>&1 ||
    { cat "$out/$name.log"; exit 1; }
  printf '%-36s %s (%s s)\n    bigbatch train %s\n' "$name" \
    "$(grep -m1 '^test' "$out/$name.log")" "$(( $(date +%s) - start ))" "${common[*]} $*" |
    tee -a "$results"
}
for epochs in "${epoch_counts[@]}"; do
  common=("${base[@]}" --epochs "$epochs")
  results=bench/results/cpu-2core/fashion-mnist-large-batch-$epochs-epochs.txt
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs: $0 $epochs" | tee "$results"
  run "batch 256"                          --batch 256
  run "4096 unchanged, warm-up 15"         "${large[@]}" --warmup-steps 15
  run "4096 linear, warm-up 15"            "${large[@]}" --warmup-steps 15 --lr-scale linear
  run "4096 sqrt, warm-up 15"              "${large[@]}" --warmup-steps 15 --lr-scale sqrt
  run "4096 unchanged, warm-up 15, cosine" "${large[@]}" --warmup-steps 15 --lr-schedule cosine
  run "4096 linear, warm-up 15, cosine"    "${large[@]}" --warmup-steps 15 --lr-scale linear --lr-schedule cosine
  run "4096 sqrt, warm-up 15, cosine"      "${large[@]}" --warmup-steps 15 --lr-scale sqrt --lr-schedule cosine
  run "4096 linear, warm-up 60, cosine"    "${large[@]}" --warmup-steps 60 --lr-scale linear --lr-schedule cosine
  run "4096 sqrt, warm-up 30, cosine"      "${large[@]}" --warmup-steps 30 --lr-scale sqrt --lr-schedule cosine
  run "4096 sqrt, warm-up 45, cosine"      "${large[@]}" --warmup-steps 45 --lr-scale sqrt --lr-schedule cosine
  run "4096 sqrt, warm-up 60, cosine"      "${large[@]}" --warmup-steps 60 --lr-scale sqrt --lr-schedule cosine
  run "4096 sqrt, warm-up 90, cosine"      "${large[@]}" --warmup-steps 90 --lr-scale sqrt --lr-schedule cosine
done
