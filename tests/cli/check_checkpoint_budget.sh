#!/bin/sh
# check_checkpoint_budget.sh BIGBATCH
# --checkpoint budget:BYTES (chapter 05): the policy is chosen from the memory model's
# prediction before training, the prediction is printed, and the training steps' measured
# peak (the log's peak_bytes_total, every step) equals it to the byte and fits the budget;
# fp16 with uneven micro-batches. A budget below the smallest possible peak exits with 2
# and names that peak.
set -u
bigbatch=$1
run="--data synthetic --samples 2000 --depth 16 --hidden 64 --dropout 0.2 --steps 3 --batch 64 --micro-batch 24 --precision fp16"
budget=10900000
"$bigbatch" train $run --checkpoint budget:$budget --log budget.jsonl > budget.txt
code=$?
cat budget.txt
fail() { echo "FAIL: $1"; exit 1; }
[ "$code" -eq 0 ] || fail "exit code $code"
grep -q "^checkpoint budget:$budget: [a-z0-9:+]*, the policy of fewest recomputations" budget.txt ||
  fail "the chosen policy is not named"
predicted=$(sed -n 's/^predicted step peak .* (\([0-9]*\) bytes), at: .*/\1/p' budget.txt)
[ -n "$predicted" ] || fail "no predicted step peak"
[ "$predicted" -le "$budget" ] || fail "the prediction $predicted exceeds the budget $budget"
steps=$(grep -c . budget.jsonl)
[ "$steps" -eq 3 ] || fail "$steps log lines, not 3"
exact=$(grep -c "\"peak_bytes_total\":$predicted," budget.jsonl)
[ "$exact" -eq 3 ] || fail "the measured peaks are not the predicted $predicted: $(grep -o '"peak_bytes_total":[0-9]*' budget.jsonl | tr '\n' ' ')"
"$bigbatch" train $run --checkpoint budget:10MiB > small.txt 2> small.err
code=$?
cat small.err
[ "$code" -eq 2 ] || fail "a budget below every policy's peak exited with $code, not 2"
grep -q 'the smallest predicted peak is' small.err || fail "the smallest peak is not named"
echo "budget $budget: predicted and measured $predicted bytes"
