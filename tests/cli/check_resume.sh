#!/bin/sh
# check_resume.sh BIGBATCH
# Snapshots and --resume, on real processes: a run of 300 steps (accumulation over uneven
# micro-batches, fp16 with dynamic loss scaling that skips steps, clipping, a warm-up and
# cosine schedule, dropout, activation checkpointing) is killed with SIGKILL five times
# at moments of its own choosing (snapshots every step, so a kill often lands while one is
# being written), resumed each time, stopped once more by SIGTERM (which must finish the
# step, write a snapshot and exit with 143), and resumed to the end. Its parameters must
# equal the uninterrupted run's byte for byte, and its log the uninterrupted log line for
# line, the clock's two fields aside. A changed setting must be refused by name (exit 2),
# the trainer's and the program's alike; one that gives the same bits (the micro-batch) not.
set -u
bigbatch=$1
run="--data synthetic --samples 2000 --depth 3 --hidden 32 --dropout 0.2 --steps 300 --batch 64 --micro-batch 24 --precision fp16 --loss-scale dynamic --scale-init 1073741824 --scale-max 1073741824 --scale-interval 3 --checkpoint sqrt --lr-schedule cosine --warmup-steps 5 --clip-grad-norm 1"
fail() { echo "FAIL: $1"; exit 1; }
rm -rf snaps elsewhere run.jsonl
"$bigbatch" train $run --save straight.safetensors --log straight.jsonl > straight.txt ||
  fail "the uninterrupted run failed"

# The newest snapshot's step (empty when there is none).
latest() {
  ls snaps 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)\.safetensors$/\1/p' | sort -n | tail -n 1
}
# Waits until a snapshot of step >= $1 exists, or the process $pid has ended.
wait_for() {
  while kill -0 "$pid" 2>/dev/null; do
    step=$(latest)
    [ -n "$step" ] && [ "$step" -ge "$1" ] && return 0
    sleep 0.01
  done
}

kills=0 midwrite=0 flags="--snapshot-dir snaps"
for target in 20 70 120 170 220; do
  "$bigbatch" train $run $flags --snapshot-every 1 --log run.jsonl > killed.txt 2>&1 &
  pid=$!
  wait_for $target
  kill -9 "$pid" 2>/dev/null && kills=$((kills + 1))
  wait "$pid" 2>/dev/null
  ls snaps | grep -q '\.tmp$' && midwrite=$((midwrite + 1))
  echo "killed after snapshot $(latest)"
  flags="--resume snaps"
done

"$bigbatch" train $run --resume snaps --snapshot-every 1 --log run.jsonl > term.txt 2>&1 &
pid=$!
wait_for 250
kill -TERM "$pid"
wait "$pid"
code=$?
cat term.txt | grep -v '^step'
[ "$code" -eq 143 ] || fail "SIGTERM: exit code $code, not 143"
grep -q '^interrupted by SIGTERM after step [0-9]* of 300: snapshot snaps/step-[0-9]*\.safetensors written; continue with --resume snaps$' term.txt ||
  fail "SIGTERM: no line naming the step and the snapshot"
stopped=$(sed -n 's/^interrupted by SIGTERM after step \([0-9]*\) .*/\1/p' term.txt)
[ "$(latest)" = "$stopped" ] || fail "SIGTERM after step $stopped, but the newest snapshot is $(latest)"

"$bigbatch" train $run --resume snaps --log run.jsonl --save resumed.safetensors > last.txt ||
  fail "the last resume failed"
grep -q "^resumed from snaps/step-0*$stopped\.safetensors after step $stopped of 300$" last.txt ||
  fail "the last resume does not say where it starts"
cmp straight.safetensors resumed.safetensors || fail "the parameters differ from the uninterrupted run's"
clockless() { sed -E 's/"time_s":[^,]*,"step_time_s":[^,]*,//' "$1"; }
clockless straight.jsonl > straight.clockless
clockless run.jsonl > run.clockless
cmp straight.clockless run.clockless || fail "the log differs from the uninterrupted run's"

"$bigbatch" train $run --seed 1 --resume snaps > changed.txt 2> changed.err
code=$?
cat changed.err
[ "$code" -eq 2 ] || fail "a changed --seed: exit code $code, not 2"
grep -q -- 'written with --seed 0, this run has --seed 1' changed.err ||
  fail "a changed --seed is not named"
# The program's own settings (the data) are recorded as well as the trainer's.
# shellcheck disable=SC2046 # the arguments are words
"$bigbatch" train $(echo "$run" | sed 's/--samples 2000/--samples 3000/') --resume snaps \
  > changed.txt 2> changed.err
code=$?
[ "$code" -eq 2 ] || fail "a changed --samples: exit code $code, not 2"
grep -q -- 'written with --samples 2000, this run has --samples 3000' changed.err ||
  fail "a changed --samples is not named"
# The micro-batch gives the same bits under LayerNorm: a resume need not repeat it.
# shellcheck disable=SC2046 # the arguments are words
"$bigbatch" train $(echo "$run" | sed 's/--micro-batch 24/--micro-batch 16/') --resume snaps \
  > same.txt 2>&1 || { cat same.txt; fail "a resume with another --micro-batch was refused"; }
# --resume from one folder while --snapshot-dir writes to another: it starts from the
# --resume folder's newest snapshot, which the other folder does not have.
"$bigbatch" train $run --resume snaps --snapshot-dir elsewhere --log other.jsonl > other.txt ||
  fail "resuming into another snapshot folder failed"
grep -q "^resumed from snaps/step-00000300\.safetensors after step 300 of 300$" other.txt ||
  fail "--resume with --snapshot-dir elsewhere did not start from the --resume folder"
echo "killed $kills times with SIGKILL ($midwrite of them left a snapshot half written), stopped once by SIGTERM after step $stopped: the parameters and all $(wc -l < straight.jsonl) log lines equal the uninterrupted run's"
