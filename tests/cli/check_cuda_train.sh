#!/bin/sh
# check_cuda_train.sh BIGBATCH
# `bigbatch train --device cuda` end to end, in fp32, in fp16 with dynamic loss scaling and
# in bf16: exit 0, one log line per step with a finite loss, a test accuracy. Then chapter
# 07 on the GPU: one rank of --data-parallel, its gradients summed by NCCL (both
# reductions, ZeRO stages 0 and 1, summed after the backward or overlapping it on NCCL's
# own stream; stage 2 with one micro-batch per step, with and without buckets), saves the
# single-process run's bytes, and so does chapter 08's GPT as one rank. Exits 77
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
# One NCCL rank per GPU, so one rank here (started without a launcher: a world of one).
run="--device cuda --data synthetic --samples 2000 --depth 2 --hidden 32 --batch 64 \
  --micro-batch 24 --steps 5 --dropout 0.1 --precision fp16 --loss-scale dynamic"
# shellcheck disable=SC2086 # the run's words
"$bigbatch" train $run --save single.st > single.txt 2>&1 || { cat single.txt; echo "FAIL: the single run"; exit 1; }
for ranks in "--reduction deterministic" "--reduction engine" "--zero 1" "--zero 1 --reduction engine" \
  "--bucket-size 1" "--zero 1 --bucket-size 2KiB --reduction engine"; do
  # shellcheck disable=SC2086
  "$bigbatch" train $run --data-parallel $ranks --save rank.st > rank.txt 2>&1
  code=$?
  [ "$code" -eq 0 ] || { cat rank.txt; echo "FAIL (--data-parallel $ranks): exit code $code"; exit 1; }
  cmp -s single.st rank.st || { echo "FAIL: --data-parallel $ranks on one GPU did not save the single run's bytes"; exit 1; }
  echo "--data-parallel $ranks on one GPU (NCCL): the single run's bytes"
done
# ZeRO stage 2 sums after every micro-batch, so with one micro-batch per step it is the
# single run (more micro-batches change the order of the additions).
whole="--device cuda --data synthetic --samples 2000 --depth 2 --hidden 32 --batch 64 \
  --steps 5 --dropout 0.1 --precision fp16 --loss-scale dynamic"
# shellcheck disable=SC2086 # the run's words
"$bigbatch" train $whole --save single-whole.st > single.txt 2>&1 || { cat single.txt; echo "FAIL: the single run of one micro-batch"; exit 1; }
for buckets in 0 1; do
  # shellcheck disable=SC2086
  "$bigbatch" train $whole --data-parallel --zero 2 --bucket-size $buckets --save rank.st > rank.txt 2>&1 ||
    { cat rank.txt; echo "FAIL (--data-parallel --zero 2 --bucket-size $buckets): exit code $?"; exit 1; }
  cmp -s single-whole.st rank.st ||
    { echo "FAIL: --data-parallel --zero 2 --bucket-size $buckets on one GPU did not save the single run's bytes"; exit 1; }
  echo "--data-parallel --zero 2 --bucket-size $buckets on one GPU (NCCL), one micro-batch per step: the single run's bytes"
done
# Chapter 08's GPT on the GPU, alone and as one NCCL rank (bf16, dropout, micro-batches of
# padded sequences): the same bytes.
"$(dirname "$0")/write_corpus.sh" corpus.txt || { echo "FAIL: cannot write corpus.txt"; exit 1; }
gpt="--device cuda --model gpt --data text:corpus.txt --seq-len 24 --layers 2 --width 32 \
  --heads 4 --batch 8 --micro-batch 3 --steps 4 --dropout 0.1 --precision bf16"
# shellcheck disable=SC2086 # the run's words
"$bigbatch" train $gpt --save gpt-single.st > gpt.txt 2>&1 || { cat gpt.txt; echo "FAIL: the GPT on the GPU"; exit 1; }
# shellcheck disable=SC2086
"$bigbatch" train $gpt --data-parallel --save gpt-rank.st > gpt.txt 2>&1 ||
  { cat gpt.txt; echo "FAIL: the GPT as one rank on the GPU"; exit 1; }
cmp -s gpt-single.st gpt-rank.st || { echo "FAIL: the GPT as one NCCL rank did not save the single run's bytes"; exit 1; }
echo "the GPT as one rank on one GPU (NCCL): the single run's bytes"
# Memory-efficient attention's CUDA kernels in the model: its blocks recomputed (every:1) save
# the bytes of its run that keeps them.
# shellcheck disable=SC2086
"$bigbatch" train $gpt --attention efficient --save gpt-efficient.st > gpt.txt 2>&1 ||
  { cat gpt.txt; echo "FAIL: the GPT with --attention efficient on the GPU"; exit 1; }
# shellcheck disable=SC2086
"$bigbatch" train $gpt --attention efficient --checkpoint every:1 --save gpt-efficient-every1.st > gpt.txt 2>&1 ||
  { cat gpt.txt; echo "FAIL: the GPT with --attention efficient --checkpoint every:1 on the GPU"; exit 1; }
cmp -s gpt-efficient.st gpt-efficient-every1.st ||
  { echo "FAIL: --attention efficient with every:1 on the GPU did not save its run's bytes"; exit 1; }
cmp -s gpt-single.st gpt-efficient.st &&
  { echo "FAIL: --attention efficient on the GPU saved plain attention's bytes"; exit 1; }
echo "memory-efficient attention on one GPU, its blocks recomputed: its run's bytes"
echo ok
