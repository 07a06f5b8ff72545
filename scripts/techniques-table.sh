#!/usr/bin/env bash
# bench/README.md's results tables: one model, one batch and the same number of epochs, trained
# with each technique of the tutorial: the batch in one piece (fp32), accumulated in
# micro-batches (fp32), fp16 with a static and with a dynamic loss scale, fp16 dynamic with
# checkpointing, bf16 with no loss scale, and the planner's choice under a device-memory
# cap (chapter 06; its cost model is measured in the run). Each row: what the held-out data
# says of the trained model, the training step's peak device bytes and the time per epoch.
#   the MLP: Fashion-MNIST, depth 2, hidden 256, AdamW lr 1e-3, seed 0, batch 1024,
#            micro-batches of 128, a 28 MiB cap; test accuracy
#   the GPT: chapter 08's on Debian's fortunes (every tenth document held out), T 64, 2
#            blocks of width 64, 4 heads, dropout 0.1, AdamW lr 3e-3, seed 0, batch 32,
#            micro-batches of 8, a 5.5 MiB cap; held-out loss and next-byte accuracy
#
# Usage: scripts/techniques-table.sh [EPOCHS] [GPT_EPOCHS]   (default 2 and 10)
# Writes, in this machine's results folder (scripts/results-folder.sh),
# fashion-mnist-techniques.md and gpt-techniques.md (each: the table, then every command).
# BIGBATCH=path/to/bigbatch uses that program instead of installing and building.
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-2}"
gpt_epochs="${2:-10}"
source scripts/bigbatch-program.sh
fortunes=/usr/share/games/fortunes/fortunes
[ -f "$fortunes" ] || scripts/install-deps.sh fortunes
rows="" commands=""
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
# run NAME FLAGS...: one training run with the table's flags (common) and FLAGS, its row.
run() {
  local name="$1"; shift
  "$BIGBATCH" train "${common[@]}" "$@" > "$out/run.log" 2>&1 || { cat "$out/run.log"; exit 1; }
  local measured peak ms steps_per_epoch
  # The held-out columns: "test (...): loss L, accuracy A" gives A (the MLP), "test (...):
  # loss L, next-byte accuracy A" gives L and A (the GPT).
  measured=$(sed -n -e 's/^test (.*): loss \([0-9.]*\), next-byte accuracy \([0-9.]*\)$/\1 | \2/p' \
                    -e 's/^test (.*): loss [0-9.]*, accuracy \([0-9.]*\)$/\1/p' "$out/run.log")
  peak=$(awk '$1 == "total" { print $2, $3; exit }' "$out/run.log")
  ms=$(sed -n 's/^trained .* (\([0-9.]*\) ms\/step on average)$/\1/p' "$out/run.log")
  steps_per_epoch=$(sed -n 's/.* steps (\([0-9]*\) per epoch).*/\1/p' "$out/run.log" | head -n 1)
  local epoch_s
  epoch_s=$(awk -v ms="$ms" -v n="$steps_per_epoch" 'BEGIN { printf "%.1f", ms * n / 1000 }')
  # The planner's choice, when it chose: "micro-batch 256 (4 per step), fp32, checkpoint ..."
  local plan
  plan=$(sed -n 's/^plan auto: //p' "$out/run.log")
  [ -z "$plan" ] || name="$name: $plan"
  rows+="| $name | $measured | $peak | $epoch_s s |"$'\n'
  commands+="    bigbatch train ${common[*]} ${*/$out\//}"$'\n'
  echo "$name: $measured, step peak $peak, $epoch_s s per epoch"
}
# table FILE TITLE HEADER RULE: the rows and commands so far into FILE, then a fresh start.
table() {
  {
    echo "$2, $(date -u +%Y-%m-%d), $(nproc) CPUs: $cpu (scripts/techniques-table.sh $epochs $gpt_epochs)"
    echo
    echo "$3"
    echo "$4"
    printf '%s' "$rows"
    echo
    echo "Commands:"
    echo
    printf '%s' "$commands"
  } > "$1"
  cat "$1"
  rows="" commands=""
}

common=(--data fashion-mnist --depth 2 --hidden 256 --optimizer adamw --lr 1e-3 --seed 0
        --batch 1024 --epochs "$epochs")
run "batch 1024 in one piece, fp32"
run "8 micro-batches of 128, fp32"    --micro-batch 128
run "fp16, static scale 1024"         --micro-batch 128 --precision fp16 --loss-scale static:1024
run "fp16, dynamic scale"             --micro-batch 128 --precision fp16 --loss-scale dynamic
run "fp16 dynamic + checkpointing"    --micro-batch 128 --precision fp16 --loss-scale dynamic --checkpoint every:1
run "bf16, no loss scale"             --micro-batch 128 --precision bf16
run "planned under a 28 MiB cap"      --device-memory 28MiB --plan auto --calibration "$out/calibration.json"
table "$results_dir/fashion-mnist-techniques.md" "Fashion-MNIST, $epochs epochs" \
  "| technique | test accuracy | training step's peak | time per epoch |" "|---|---:|---:|---:|"

common=(--model gpt --data "text:$fortunes" --seq-len 64 --layers 2 --width 64 --heads 4
        --dropout 0.1 --optimizer adamw --lr 3e-3 --seed 0 --batch 32 --epochs "$gpt_epochs")
run "batch 32 in one piece, fp32"
run "4 micro-batches of 8, fp32"      --micro-batch 8
run "fp16, static scale 1024"         --micro-batch 8 --precision fp16 --loss-scale static:1024
run "fp16, dynamic scale"             --micro-batch 8 --precision fp16 --loss-scale dynamic
run "fp16 dynamic + checkpointing"    --micro-batch 8 --precision fp16 --loss-scale dynamic --checkpoint every:1
run "bf16, no loss scale"             --micro-batch 8 --precision bf16
run "planned under a 5.5 MiB cap"     --device-memory 5.5MiB --plan auto --calibration "$out/gpt-calibration.json"
table "$results_dir/gpt-techniques.md" "The GPT on fortunes, $gpt_epochs epochs" \
  "| technique | held-out loss | next-byte accuracy | training step's peak | time per epoch |" \
  "|---|---:|---:|---:|---:|"
