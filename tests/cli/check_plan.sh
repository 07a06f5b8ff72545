#!/bin/sh
# check_plan.sh BIGBATCH
# Chapter 06 from the command line. `bigbatch plan` lists the plans that fit --device-memory,
# fastest first, measuring the cost model once into --calibration and reusing it after;
# `bigbatch train --plan auto` trains with the fastest, and every step's measured peak (the
# log's peak_bytes_total) fits the budget and equals the planned peak, as does each
# precision's own plan (the loss scaler's and clipping's bytes included); a budget nothing fits
# exits with 3 and names the smallest peak, its plan and what no plan can trade away;
# --plan auto refuses a flag it would choose; --device-model h200 prices the plans from a
# spec sheet and says it is modelled.
# `bigbatch plan --json` gives the same answer as one JSON object: its fastest plan is the
# one --plan auto trains, with the same predicted peak in bytes; when nothing fits it exits
# with 3 too and holds the smallest plan. --ranks R plans rank 0's share on chapter 07's
# modelled cluster. A run's evaluations fit wherever its steps fit.
set -u
bigbatch=$1
shape="--data synthetic --samples 600 --depth 8 --hidden 64 --batch 256 --calibration plan-calibration.json"
run="$shape --device-memory 6MiB"
fail() { echo "FAIL: $1"; exit 1; }
rm -f plan-calibration.json
"$bigbatch" plan $run > plan.txt; code=$?
cat plan.txt
[ "$code" -eq 0 ] || fail "bigbatch plan exited with $code"
grep -q 'cost model measured now, saved to plan-calibration.json' plan.txt || fail "not measured"
grep -q '<- fastest' plan.txt || fail "no fastest plan"
"$bigbatch" plan $run > again.txt || fail "the second plan failed"
grep -q 'cost model in plan-calibration.json' again.txt || fail "the calibration was not reused"
"$bigbatch" plan $run --json > plan.json || fail "bigbatch plan --json failed"
[ "$(wc -l < plan.json)" -eq 1 ] || fail "--json wrote more than one line"
grep -q '^{"batch":256,"budget_bytes":6291456,"device":"cpu","modelled":false,"calibration":"plan-calibration.json","calibration_measured_now":false,' plan.json ||
  fail "--json does not begin with the request: $(cut -c 1-200 plan.json)"
# --device-model h200: priced from the spec sheet, measuring nothing (so it refuses a
# calibration file), saying so.
modelled="--data synthetic --samples 600 --depth 8 --hidden 64 --batch 256 --device-memory 6MiB --device-model h200"
"$bigbatch" plan $modelled --json > modelled.json || fail "--device-model h200 failed"
grep -q '"device":"NVIDIA H200 SXM (spec sheet)","modelled":true,"calibration":""' modelled.json ||
  fail "--device-model's answer does not say it is modelled: $(cut -c 1-200 modelled.json)"
grep -q '"key":"modelled, not measured: ' modelled.json || fail "the modelled cost model's key does not say so"
"$bigbatch" plan $modelled > modelled.txt || fail "--device-model h200 (table) failed"
grep -q 'modelled from its published figures (roofline), not measured' modelled.txt ||
  fail "the modelled table does not say it is modelled: $(head -n 2 modelled.txt)"
code=0
"$bigbatch" plan $run --device-model h200 > /dev/null 2> refused.txt || code=$?
[ "$code" -eq 2 ] && grep -q 'measures nothing' refused.txt ||
  fail "--device-model with --calibration: exit $code, $(cat refused.txt)"
# The fastest plan's peak, in bytes, from the train run's own line.
"$bigbatch" train $run --plan auto --steps 2 --explain --log plan.jsonl > train.txt; code=$?
cat train.txt
[ "$code" -eq 0 ] || fail "train --plan auto exited with $code"
grep -q '^plan auto: micro-batch ' train.txt || fail "the plan is not named"
predicted=$(sed -n 's/^predicted step peak .* (\([0-9]*\) bytes), at: .*/\1/p' train.txt)
[ -n "$predicted" ] || fail "no predicted step peak"
[ "$predicted" -le 6291456 ] || fail "the plan's peak $predicted exceeds 6 MiB"
micro=$(sed -n 's/^plan auto: micro-batch \([0-9]*\) .*/\1/p' train.txt)
grep -q "\"feasible\":\[{\"micro_batch\":$micro,[^}]*\"peak_bytes\":$predicted," plan.json ||
  fail "--json's fastest plan is not micro-batch $micro with peak $predicted: $(cut -c 1-400 plan.json)"
exact=$(grep -c "\"peak_bytes_total\":$predicted," plan.jsonl)
[ "$exact" -eq 2 ] || fail "the measured peaks are not the predicted $predicted: $(grep -o '"peak_bytes_total":[0-9]*' plan.jsonl | tr '\n' ' ')"
# Which precision is fastest depends on the machine's timings, so each one's plan is also
# trained on its own (--precision): fp16's dynamic loss scale, and clipping in any
# precision, keep the boundary's 12 bytes through every step, and its peak counts them.
for precision in fp32 fp16 "bf16 --clip-grad-norm 1"; do
  "$bigbatch" train $run --plan auto --precision $precision --steps 2 --explain --log one.jsonl > one.txt ||
    fail "train --plan auto --precision $precision failed: $(tail -n 3 one.txt)"
  peak=$(sed -n 's/^predicted step peak .* (\([0-9]*\) bytes), at: .*/\1/p' one.txt)
  [ -n "$peak" ] && [ "$(grep -c "\"peak_bytes_total\":$peak," one.jsonl)" -eq 2 ] ||
    fail "--precision $precision: the measured peaks are not the predicted ${peak:-?}: $(grep -o '"peak_bytes_total":[0-9]*' one.jsonl | tr '\n' ' ')"
done
"$bigbatch" plan $shape --device-memory 1MiB > none.txt 2> none.err; code=$?
cat none.err
[ "$code" -eq 3 ] || fail "a budget nothing fits exited with $code, not 3"
grep -q 'the smallest predicted peak is' none.err || fail "the smallest peak is not named"
"$bigbatch" plan $shape --device-memory 1MiB --json > none.json 2> none.err; code=$?
[ "$code" -eq 3 ] || fail "--json: a budget nothing fits exited with $code, not 3"
grep -q '"feasible":\[\],"smallest":{"micro_batch":[0-9]*,.*},"fixed_bytes":[0-9]*}$' none.json ||
  fail "--json: no smallest plan when nothing fits: $(cat none.json)"
grep -q 'the smallest predicted peak is' none.err || fail "--json: the reason is not on stderr"
# The reason names that smallest plan (its micro-batch and policy, as the JSON holds them)
# and what no plan can trade away.
m=$(sed -n 's/.*"smallest":{"micro_batch":\([0-9]*\),.*/\1/p' none.json)
policy=$(sed -n 's/.*"smallest":{[^}]*"checkpoint":"\([^"]*\)".*/\1/p' none.json)
[ -n "$m" ] && [ -n "$policy" ] || fail "--json: the smallest plan has no micro-batch or policy"
grep -q "the smallest predicted peak is [0-9.]* [KMG]*i*B (micro-batch $m (.*, checkpoint $policy), of which [0-9.]* [KMG]*i*B are parameters" none.err ||
  fail "the reason does not name the smallest plan (micro-batch $m, $policy): $(cat none.err)"
"$bigbatch" train $run --plan auto --micro-batch 8 --steps 1 > /dev/null 2> refused.err; code=$?
[ "$code" -eq 2 ] && grep -q 'drop --micro-batch' refused.err || fail "--plan auto took --micro-batch ($code)"
# --ranks R (chapter 07): rank 0's share of the batch on the modelled cluster, the sum in
# every step time (at stage 2, growing with the plan's micro-batches); refused without --device-model, with more ranks than samples, and with
# ranks that do not fill the cluster's nodes of 8.
"$bigbatch" plan $modelled --ranks 8 --zero 1 > ranks.txt || fail "--ranks 8 failed"
grep -q '^rank 0 of 8 (ZeRO stage 1): its share of 32 samples of each batch; every step time includes the gradient sum' ranks.txt ||
  fail "--ranks 8: no rank line: $(head -n 3 ranks.txt)"
grep -q '^train it with: mpirun -np 8 bigbatch train ... --data-parallel --zero 1 --micro-batch ' ranks.txt ||
  fail "--ranks 8: no mpirun line: $(tail -n 1 ranks.txt)"
# At stage 2 each micro-batch adds a reduce-scatter, priced in each plan's time.
"$bigbatch" plan $modelled --ranks 8 --zero 2 > ranks2.txt || fail "--ranks 8 --zero 2 failed"
grep -q "^rank 0 of 8 (ZeRO stage 2): .* with one micro-batch per step, and [0-9.]* ms more for each further micro-batch (stage 2's reduce-scatters)$" ranks2.txt ||
  fail "--ranks 8 --zero 2: no rank line pricing each micro-batch: $(sed -n 2p ranks2.txt)"
for refusal in "--ranks 2|--ranks prices the gradient sum on a modelled cluster" \
               "--ranks 300 --device-model h200|--ranks 300: more ranks than --batch 256" \
               "--ranks 12 --device-model h200|--ranks 12: beyond one node of 8 GPUs"; do
  flags=${refusal%%|*} expected=${refusal#*|}
  "$bigbatch" plan --data synthetic --samples 600 --depth 8 --hidden 64 --batch 256 \
    --device-memory 6MiB $flags > /dev/null 2> ranks.err; code=$?
  [ "$code" -eq 2 ] && grep -q -- "$expected" ranks.err ||
    fail "plan $flags: exit code $code, not 2 saying '$expected' ($(cat ranks.err))"
done
# A plan at the budget's edge: its evaluations (--eval-every, and the test after the run) use
# the step's staging buffer, so they fit wherever its steps fit. Micro-batch 2048 of 4096 in
# fp16 under optimal:1+selective peaks at 46.92 MiB of 48: an evaluation with a buffer of its
# own beside the step's would need 6 MiB more.
edge="--data synthetic --samples 60000 --depth 2 --hidden 256 --batch 4096 --micro-batch 2048
      --precision fp16 --loss-scale dynamic --checkpoint optimal:1+selective --steps 2
      --eval-every 1 --device-memory 48MiB"
"$bigbatch" train $edge > edge.txt 2>&1 ||
  fail "a plan at the budget's edge did not train and evaluate under it: $(tail -n 2 edge.txt)"
grep -q '^step 2: test loss' edge.txt || fail "no evaluation after step 2: $(tail -n 3 edge.txt)"
grep -q '^test (' edge.txt || fail "no test after the run: $(tail -n 3 edge.txt)"
echo "bigbatch plan and train --plan auto: the plan fits 6 MiB and its peak is measured as predicted;"
echo "a plan at its budget's edge evaluates under the budget too"
