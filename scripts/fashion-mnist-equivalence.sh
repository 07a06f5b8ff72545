#!/usr/bin/env bash
# Trains the model on Fashion-MNIST twice, once with one batch per step and once with the
# same batch as micro-batches, and checks that the two trained models are identical to the
# byte (the CPU backend's kernels make gradient accumulation exact).
#
# Usage: scripts/fashion-mnist-equivalence.sh [EPOCHS] [MICRO_BATCH]   (defaults: 8, 64)
# Prints both runs' test accuracy (and writes the same lines to
# bench/results/fashion-mnist-equivalence.txt); exits non-zero when the parameters differ.
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-8}"
micro="${2:-64}"
scripts/install-deps.sh
scripts/build.sh >/dev/null
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
results=bench/results/fashion-mnist-equivalence.txt
mkdir -p bench/results
echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs: $0 $epochs $micro" > "$results"
common=(train --data fashion-mnist --depth 2 --hidden 256 --batch 256 --epochs "$epochs" --seed 0)
for run in batch micro; do
  extra=()
  [ "$run" = micro ] && extra=(--micro-batch "$micro")
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
