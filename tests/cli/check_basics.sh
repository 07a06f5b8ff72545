#!/bin/sh
# check_basics.sh BIGBATCH PART [VERSION]
# `bigbatch train` end to end, one PART per CTest test (tests/cli/CMakeLists.txt), each in
# the test's working folder; every part checks the exit status and the output:
#   smoke          trains (cosine after a warm-up), logs, saves, evaluates, reports memory;
#                  stdout is a pipe: the header lines and the first step's progress line
#                  must show. Leaves smoke.jsonl and smoke.safetensors for the parts after.
#   init           --init reads the model's shape from smoke.safetensors' metadata
#   validation     --validation 500 holds the training data's last 500 samples out and
#                  evaluates them in place of the test split, so named in the output and log
#   epochs         --epochs are whole passes (32 batches of 64, the last of 16; 31 with
#                  --drop-last); steps continue across epochs; the progress lines (every
#                  64/20 = 3 steps when piped) begin with the first step
#   checkpoint     --checkpoint optimal:2 is explained, and trains the bytes of the run
#                  without it (dropout on: recomputed blocks draw the same masks)
#   out_of_memory  a device too small fails with the allocator's message and exit code 3
#                  (this step's peak is 875.91 KiB: 800 KiB fails inside the forward)
#   version        --version (and the CPU paths the kernels may take), the exit codes at the
#                  foot of --help, and a BIGBATCH_MAX_ISA that names no level refused (exit 2)
set -u
bigbatch=$1
part=$2
here=$(dirname "$0")
# --data synthetic --samples S holds out S/10 samples: 2000 leaves N = 1800 to train on.
small_run="--data synthetic --samples 2000 --depth 1 --hidden 32"
# N = 2000 of --samples 2222 (1500 with --validation 500).
epoch_run="--data synthetic --samples 2222 --depth 1 --hidden 32 --batch 64 --micro-batch 24"
deep_run="--data synthetic --samples 2000 --depth 5 --hidden 32 --dropout 0.2 --steps 3 --batch 64 --micro-batch 24"

case $part in
  smoke)
    $bigbatch train $small_run --steps 5 --batch 64 --micro-batch 16 --lr-schedule cosine \
      --warmup-steps 2 --log smoke.jsonl --save smoke.safetensors > smoke.txt
    code=$?
    cat smoke.txt
    test $code -eq 0 &&
      grep -q '^optimizer adamw, lr 0.001 (cosine after 2 linear warm-up steps from lr/2), weight decay 0.01, seed 0, batch 64, micro-batch 16: 4 accumulation steps per optimizer step$' smoke.txt &&
      grep -q '^step 1/5  epoch 0.03  loss [0-9.]*  lr 0.0005  [0-9.]* ms/step  [0-9]* samples/s  elapsed 0:0[0-9]  ETA 0:[0-9][0-9]$' smoke.txt &&
      grep -q '^step 5/5 ' smoke.txt &&
      grep -q 'test (synthetic.*accuracy' smoke.txt &&
      grep -q 'the training step.s peak' smoke.txt ;;
  init)
    $bigbatch train --data synthetic --samples 2000 --steps 1 --batch 64 \
      --init smoke.safetensors > init.txt
    code=$?
    cat init.txt
    test $code -eq 0 && grep -q 'model depth 1 hidden 32 ' init.txt ;;
  validation)
    $bigbatch train $epoch_run --validation 500 --epochs 1 --eval-every 24 \
        --log validation.jsonl > validation.txt &&
      cat validation.txt &&
      grep -q '(1500 samples, ' validation.txt &&
      grep -q ' 24 steps (24 per epoch)' validation.txt &&
      grep -q '^validation (.*, 500 samples): loss' validation.txt &&
      ! grep -q '^test (' validation.txt &&
      tail -n 1 validation.jsonl | grep -q '"validation_accuracy":' &&
      sh "$here/check_train_log.sh" validation.jsonl 24 1500 64 0 0.001 constant 0 ;;
  epochs)
    $bigbatch train $epoch_run --epochs 2 --log epochs.jsonl > epochs.txt &&
      grep -q ' 64 steps (32 per epoch)' epochs.txt &&
      grep -q '^step 1/64 ' epochs.txt &&
      ! grep -q '^step 2/64 ' epochs.txt &&
      sh "$here/check_train_log.sh" epochs.jsonl 64 2000 64 0 0.001 constant 0 &&
      tail -n 1 epochs.jsonl | grep -q '"epoch":2.0,.*"samples":4000,' &&
      $bigbatch train $epoch_run --epochs 1 --drop-last --log dropped.jsonl > dropped.txt &&
      grep -q ' 31 steps (31 per epoch)' dropped.txt &&
      sh "$here/check_train_log.sh" dropped.jsonl 31 2000 64 1 0.001 constant 0 &&
      tail -n 1 dropped.jsonl | grep -q '"samples":1984,' ;;
  checkpoint)
    $bigbatch train $deep_run --save plain.safetensors > plain.txt &&
      $bigbatch train $deep_run --checkpoint optimal:2 --explain \
        --save checkpointed.safetensors > checkpointed.txt
    code=$?
    cat checkpointed.txt
    test $code -eq 0 &&
      grep -q '^activation checkpointing optimal:2: at most 2 block inputs kept and 1 block.s activations at a time; 11 block forwards per micro-batch instead of 5$' checkpointed.txt &&
      grep -q '^forward: store h0, ' checkpointed.txt &&
      cmp plain.safetensors checkpointed.safetensors ;;
  out_of_memory)
    $bigbatch train $small_run --steps 1 --batch 64 --device-memory 800KiB 2> err.txt
    code=$?
    cat err.txt
    test $code -eq 3 && grep -q 'out of memory' err.txt ;;
  version)
    version=$3
    $bigbatch --version > version.txt &&
      grep -qx "bigbatch $version" version.txt &&
      grep -q '^CPU: .*; kernels may use: ' version.txt &&
      BIGBATCH_MAX_ISA=baseline $bigbatch --version | grep -q 'kernels may use: x86-64 baseline only' &&
      $bigbatch train --help > help.txt &&
      grep -q '^Exit codes: 0 success; 1 any other failure; 2 bad input' help.txt &&
      grep -q -e '--drop-last' help.txt &&
      { BIGBATCH_MAX_ISA=avx3 $bigbatch --version 2> isa.txt; test $? -eq 2; } &&
      grep -qx "bigbatch: BIGBATCH_MAX_ISA must be avx512, avx2 or baseline, got 'avx3'" isa.txt ;;
  *)
    echo "check_basics.sh: no part '$part'" >&2
    exit 2 ;;
esac
