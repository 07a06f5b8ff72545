#!/usr/bin/env bash
# The README's results table: one model (Fashion-MNIST, depth 2, hidden 256, AdamW lr 1e-3,
# seed 0), one batch (1024) and the same number of epochs, trained with each technique of
# the tutorial: the batch in one piece (fp32), accumulated in micro-batches of 128 (fp32),
# fp16 with a static and with a dynamic loss scale, fp16 dynamic with checkpointing, bf16
# with no loss scale, and the planner's choice under a 28 MiB cap (chapter 06; its cost model is measured in the
# run). Each row: test accuracy, the training step's peak device bytes and the time per
# epoch.
#
# Usage: scripts/techniques-table.sh [EPOCHS]   (default 2)
# Writes, in this machine's results folder (scripts/results-folder.sh),
# fashion-mnist-techniques.md (the table, then every command).
# BIGBATCH=path/to/bigbatch uses that program instead of installing and building.
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-2}"
source scripts/bigbatch-program.sh
results=$results_dir/fashion-mnist-techniques.md
common=(--data fashion-mnist --depth 2 --hidden 256 --optimizer adamw --lr 1e-3 --seed 0
        --batch 1024 --epochs "$epochs")
rows="" commands=""
run() {
  local name="$1"; shift
  "$BIGBATCH" train "${common[@]}" "$@" > "$out/run.log" 2>&1 || { cat "$out/run.log"; exit 1; }
  local accuracy peak ms steps_per_epoch
  accuracy=$(sed -n 's/^test (.*accuracy \([0-9.]*\)$/\1/p' "$out/run.log")
  peak=$(awk '$1 == "total" { print $2, $3; exit }' "$out/run.log")
  ms=$(sed -n 's/^trained .* (\([0-9.]*\) ms\/step on average)$/\1/p' "$out/run.log")
  steps_per_epoch=$(sed -n 's/.* steps (\([0-9]*\) per epoch).*/\1/p' "$out/run.log" | head -n 1)
  local epoch_s
  epoch_s=$(awk -v ms="$ms" -v n="$steps_per_epoch" 'BEGIN { printf "%.1f", ms * n / 1000 }')
  # The planner's choice, when it chose: "micro-batch 256 (4 per step), fp32, checkpoint ..."
  local plan
  plan=$(sed -n 's/^plan auto: //p' "$out/run.log")
  [ -z "$plan" ] || name="$name: $plan"
  rows+="| $name | $accuracy | $peak | $epoch_s s |"$'\n'
  commands+="    bigbatch train ${common[*]} ${*/$out\//}"$'\n'
  echo "$name: accuracy $accuracy, step peak $peak, $epoch_s s per epoch"
}
run "batch 1024 in one piece, fp32"
run "8 micro-batches of 128, fp32"    --micro-batch 128
run "fp16, static scale 1024"         --micro-batch 128 --precision fp16 --loss-scale static:1024
run "fp16, dynamic scale"             --micro-batch 128 --precision fp16 --loss-scale dynamic
run "fp16 dynamic + checkpointing"    --micro-batch 128 --precision fp16 --loss-scale dynamic --checkpoint every:1
run "bf16, no loss scale"             --micro-batch 128 --precision bf16
run "planned under a 28 MiB cap"      --device-memory 28MiB --plan auto --calibration "$out/calibration.json"
{
  echo "Fashion-MNIST, $epochs epochs, $(date -u +%Y-%m-%d), $(nproc) CPUs (scripts/techniques-table.sh $epochs)"
  echo
  echo "| technique | test accuracy | training step's peak | time per epoch |"
  echo "|---|---:|---:|---:|"
  printf '%s' "$rows"
  echo
  echo "Commands:"
  echo
  printf '%s' "$commands"
} > "$results"
cat "$results"
