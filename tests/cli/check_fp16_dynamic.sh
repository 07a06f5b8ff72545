#!/bin/sh
# check_fp16_dynamic.sh BIGBATCH
# Mixed precision with dynamic loss scaling: a first scale of 2^30 overflows f16 (the
# scaled dlogits exceed 65504), so step 1 must be skipped and the scale halved; the header
# names the precision and the rule, the log carries the scale and the skip, and the run
# ends with the count of skipped steps. With --clip-grad-norm, the boundary's order shows
# in the log: the skipped step has no norm (null) and no clip, the warm-up does not
# advance on it (step 2 gets step 1's rate), and a step taken is clipped.
set -u
bigbatch=$1
"$bigbatch" train --data synthetic --samples 2000 --depth 1 --hidden 32 --steps 12 --batch 64 \
  --micro-batch 16 --precision fp16 --loss-scale dynamic --scale-init 1073741824 \
  --scale-max 1073741824 --clip-grad-norm 0.01 --warmup-steps 4 --log fp16.jsonl > fp16.txt
code=$?
cat fp16.txt
fail() { echo "FAIL: $1"; exit 1; }
[ "$code" -eq 0 ] || fail "exit code $code"
grep -q '^precision fp16 (f32 master weights), loss scale dynamic from 1.07374e+09' fp16.txt ||
  fail "the header does not name the precision and the rule"
head -n 1 fp16.jsonl | grep -q '"loss_scale":1073741824.0,"skipped":true,"grad_norm":null,"clip_factor":1.0,' ||
  fail "step 1 did not overflow at 2^30: $(head -n 1 fp16.jsonl)"
sed -n 2p fp16.jsonl | grep -q '"loss_scale":536870912.0,' ||
  fail "the scale did not halve: $(sed -n 2p fp16.jsonl)"
grep -q ' steps skipped on an overflow' fp16.txt || fail "no count of skipped steps"
lr() { sed -n "$1p" fp16.jsonl | sed 's/.*"lr":\([^,]*\),.*/\1/'; }
[ "$(lr 1)" = 0.00025 ] && [ "$(lr 2)" = 0.00025 ] ||
  fail "the skipped step moved the warm-up: lr $(lr 1), then $(lr 2)"
grep '"skipped":false' fp16.jsonl | grep -q '"clip_factor":0\.' ||
  fail "no step taken was clipped at norm 0.01"
grep -q 'norm [0-9.e+-]* (clipped)' fp16.txt || fail "the progress lines do not show the norm"
echo "ok"
