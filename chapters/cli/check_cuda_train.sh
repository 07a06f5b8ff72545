#!/bin/sh
# check_cuda_train.sh BIGBATCH
# `bigbatch train --device cuda` end to end, in fp32, in fp16 with dynamic loss scaling and
# in bf16: exit 0, one log line per step with a finite loss, a test accuracy. Exits 77
# (CTest's skip) with the reason when this machine has no usable GPU.
set -u
bigbatch=$1
for precision in "fp32" "fp16 --loss-scale dynamic" "bf16"; do
  # shellcheck disable=SC2086 # the precision's words
  "$bigbatch" train --device cuda --data synthetic --samples 2000 --depth 2 --hidden 32 \
    --batch 64 --micro-batch 24 --steps 5 --precision $precision --log cuda.jsonl \
    > cuda.txt 2> cuda.err
  code=$?
  if [ "$code" -eq 2 ] && grep -q 'CUDA is not available' cuda.err; then
    echo "CUDA test skipped: $(cat cuda.err)"
    exit 77
  fi
  cat cuda.txt cuda.err
  [ "$code" -eq 0 ] || { echo "FAIL ($precision): exit code $code"; exit 1; }
  [ "$(wc -l < cuda.jsonl)" -eq 5 ] || { echo "FAIL ($precision): not 5 log lines"; exit 1; }
  if grep -q '"loss":null' cuda.jsonl; then echo "FAIL ($precision): a loss is not finite"; exit 1; fi
  grep -q '^test (synthetic.*accuracy' cuda.txt || { echo "FAIL ($precision): no evaluation"; exit 1; }
done
echo ok
