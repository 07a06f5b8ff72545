#!/bin/sh
# check_bf16.sh BIGBATCH
# bf16 mixed precision from the command line: the header names it with its f32 masters and
# no loss scale (bf16 has fp32's range, so none is on by default); the run learns and skips
# nothing; micro-batches of 16 save the bits of the whole batch of 64 (the accumulation is
# f32 and every kernel batch invariant); a static scale of 2^10, allowed, saves the bits of
# the unscaled run (a power of two commutes with every bf16 rounding, so the scale changes
# nothing at all here); and a dynamic scale of 2^30, which overflows fp16 at its first step
# (check_fp16_dynamic.sh), overflows nothing in bf16 and saves the same bits again.
set -u
bigbatch=$1
fail() { echo "FAIL: $1"; exit 1; }
run() {  # run NAME FLAGS...: a bf16 run of 12 steps, its parameters saved to NAME.safetensors
  name=$1
  shift
  "$bigbatch" train --data synthetic --samples 2000 --depth 2 --hidden 32 --steps 12 \
    --batch 64 --precision bf16 --save "$name.safetensors" --log "$name.jsonl" "$@" > "$name.txt" ||
    fail "$name: exit code $? ($(tail -n 3 "$name.txt"))"
}
run whole --micro-batch 64
run micro --micro-batch 16
run scaled --micro-batch 16 --loss-scale static:1024
run dynamic --micro-batch 16 --loss-scale dynamic --scale-init 1073741824 --scale-max 1073741824
cat micro.txt
grep -q '^precision bf16 (f32 master weights), loss scale none' micro.txt ||
  fail "the header does not name bf16 without a loss scale"
first=$(head -n 1 micro.jsonl | sed 's/.*"loss":\([^,]*\),.*/\1/')
last=$(tail -n 1 micro.jsonl | sed 's/.*"loss":\([^,]*\),.*/\1/')
awk "BEGIN { exit !($last < $first) }" || fail "the loss did not fall: $first, then $last"
! grep -q '"skipped":true' micro.jsonl scaled.jsonl dynamic.jsonl || fail "a bf16 step was skipped"
cmp -s whole.safetensors micro.safetensors ||
  fail "micro-batches of 16 did not give the bits of the batch of 64"
cmp -s micro.safetensors scaled.safetensors ||
  fail "a static scale of 2^10 changed the bits of a bf16 run"
tail -n 1 dynamic.jsonl | grep -q '"loss_scale":1073741824.0,' ||
  fail "the dynamic scale of 2^30 backed off: $(tail -n 1 dynamic.jsonl)"
cmp -s micro.safetensors dynamic.safetensors ||
  fail "a dynamic scale of 2^30 changed the bits of a bf16 run"
"$bigbatch" train --help | grep -q 'bf16' || fail "--help does not mention bf16"
echo "ok"
