#!/usr/bin/env bash
# Trains the model on Fashion-MNIST twice, once with one batch per step and once with the
# same batch as micro-batches, and checks that the two trained models are identical to the
# byte (the CPU backend's kernels make gradient accumulation exact). A third run trains the
# micro-batches in fp16 mixed precision with dynamic loss scaling, a fourth in bf16 with no
# loss scale, and each must end with a test accuracy within 0.5 points of fp32's.
#
# Usage: scripts/fashion-mnist-equivalence.sh [EPOCHS] [MICRO_BATCH]   (defaults: 8, 64)
# Prints both runs' test accuracy (and writes the same lines to
# fashion-mnist-equivalence.txt in this machine's results folder, scripts/results-folder.sh);
# exits non-zero when the parameters differ.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/results-folder.sh
epochs="${1:-8}"
micro="${2:-64}"
scripts/install-deps.sh
scripts/build.sh >/dev/null
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
results=$results_dir/fashion-mnist-equivalence.txt
echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs: $0 $epochs $micro" > "$results"
common=(train --data fashion-mnist --depth 2 --hidden 256 --batch 256 --epochs "$epochs" --seed 0)
for run in batch micro fp16 bf16; do
  extra=()
  [ "$run" = micro ] && extra=(--micro-batch "$micro")
  [ "$run" = fp16 ] && extra=(--micro-batch "$micro" --precision fp16 --loss-scale dynamic)
  [ "$run" = bf16 ] && extra=(--micro-batch "$micro" --precision bf16)
  start=$(date +%s)
  build/chapters/cli/bigbatch "${common[@]}" "${extra[@]}" --save "$out/$run.safetensors" \
    > "$out/$run.log" 2>&1 || { cat "$out/$run.log"; exit 1; }
  echo "$run: $(grep -m1 '^test' "$out/$run.log") ($(( $(date +%s) - start )) s)" | tee -a "$results"
done
if cmp -s "$out/batch.safetensors" "$out/micro.safetensors"; then
  echo "PASS: batch 256 and micro-batches of $micro give byte-identical parameters after $epochs epochs" |
    tee -a "$results"
else
  echo "FAIL: the trained parameters differ" | tee -a "$results"
  exit 1
fi
accuracy() { grep -m1 '^test' "$out/$1.log" | sed 's/.*accuracy //'; }
status=0
for run in fp16 bf16; do
  what="$run with dynamic loss scaling"
  [ "$run" = bf16 ] && what="bf16 with no loss scale"
  if awk -v a="$(accuracy micro)" -v b="$(accuracy $run)" 'BEGIN { d = a - b; exit !(d < 0.005 && d > -0.005) }'; then
    echo "PASS: $what is within 0.5 points of fp32 ($(accuracy $run) vs $(accuracy micro))" |
      tee -a "$results"
  else
    echo "FAIL: $what: $(accuracy $run), fp32: $(accuracy micro)" | tee -a "$results"
    status=1
  fi
done
python3 scripts/readme_numbers.py --write  # bench/README.md's and chapter 04's lines on these runs
exit $status
