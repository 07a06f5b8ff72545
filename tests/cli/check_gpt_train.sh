#!/bin/sh
# check_gpt_train.sh BIGBATCH
# `bigbatch train --model gpt` end to end on a text file written here (fortune(6)'s format:
# documents of uneven lengths between "%" lines): the header names the sequences, their real
# target tokens and the padding; the first logged loss is that of a model guessing among 256
# bytes (ln 256 = 5.55) and the loss falls; every log line counts its step's target tokens;
# micro-batches of 3 and of 1 sequence save the bits of the batch of 8 (fp32 and bf16, with
# dropout: the loss of every target over the step's count, the tied head completed once),
# and so does one simulated rank, while three count the whole batch's tokens;
# and so do checkpointed transformer blocks (optimal:1, every:1, budget:BYTES), whose
# step peaks are predicted to the byte; --attention efficient trains its own batch's bits in
# micro-batches, close to plain attention's;
# fp16 runs under the dynamic loss scaler; a run resumed from a snapshot ends on the bits and
# the log of the uninterrupted one, a changed setting (or model) is refused by name, SIGTERM
# leaves a snapshot; `bigbatch plan` and --plan auto plan its step; --init continues from
# --save; what the GPT's run does not take is
# refused with exit code 2, naming the flag; and `bigbatch generate` prints
# the prompt and what the saved model writes after it, each byte as it is drawn (SIGINT
# stops it cleanly, what was written kept), refusing a file that is no GPT, one whose
# metadata describes another model than its tensors, a temperature that is no number and a
# seed out of range, as train does.
set -u
bigbatch=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
fail() { echo "FAIL: $1"; exit 1; }
# A folder of its own: the other CLI tests run beside it and write files of the same names.
mkdir -p gpt_train && cd gpt_train || fail "cannot enter gpt_train"
"$(dirname "$0")/write_corpus.sh" corpus.txt || fail "cannot write corpus.txt"
gpt="--model gpt --seq-len 24 --layers 2 --width 32 --heads 4"
shape="$gpt --data text:corpus.txt"
run() {  # run NAME FLAGS...: 6 steps of batch 8, parameters saved to NAME.safetensors
  name=$1
  shift
  "$bigbatch" train $shape --batch 8 --steps 6 --lr 1e-2 --dropout 0.1 --seed 5 \
    --save "$name.safetensors" --log "$name.jsonl" "$@" > "$name.txt" 2>&1 ||
    fail "$name: exit code $? ($(tail -n 3 "$name.txt"))"
}
run whole
run micro3 --micro-batch 3
run micro1 --micro-batch 1
run bf16_whole --precision bf16
run bf16_micro3 --precision bf16 --micro-batch 3
run fp16 --precision fp16 --loss-scale dynamic --micro-batch 3
run optimal1 --micro-batch 3 --checkpoint optimal:1
run bf16_every1 --precision bf16 --micro-batch 3 --checkpoint every:1
run attention --micro-batch 3 --checkpoint attention
run bf16_every1_attention --precision bf16 --micro-batch 3 --checkpoint every:1+attention
run efficient --attention efficient
run efficient_every1 --attention efficient --micro-batch 3 --checkpoint every:1
run bf16_efficient --precision bf16 --attention efficient
run bf16_efficient_micro1 --precision bf16 --attention efficient --micro-batch 1
cat micro3.txt
grep -q '^bigbatch train: text:corpus.txt ([0-9]* sequences of 24 tokens, [0-9]* target tokens, [0-9.]*% padding), GPT of 2 blocks, width 32, 4 heads' micro3.txt ||
  fail "the header does not describe the token data and the GPT"
first=$(head -n 1 whole.jsonl | sed 's/.*"loss":\([^,]*\),.*/\1/')
last=$(tail -n 1 whole.jsonl | sed 's/.*"loss":\([^,]*\),.*/\1/')
# An untrained GPT's logits are nearly equal: its first loss lies within 0.1 of ln 256.
awk "BEGIN { exit !($first > 5.45 && $first < 5.65) }" || fail "the first loss is $first, not about ln 256"
awk "BEGIN { exit !($last < $first - 0.5) }" || fail "the loss did not fall: $first, then $last"
[ "$(grep -c '"targets":[1-9]' whole.jsonl)" -eq 6 ] || fail "a log line does not count its target tokens"
cmp -s whole.safetensors micro3.safetensors || fail "micro-batches of 3 did not give the bits of the batch of 8"
cmp -s whole.safetensors micro1.safetensors || fail "micro-batches of 1 did not give the bits of the batch of 8"
cmp -s bf16_whole.safetensors bf16_micro3.safetensors ||
  fail "bf16: micro-batches of 3 did not give the bits of the batch of 8"
cmp -s whole.safetensors bf16_whole.safetensors && fail "bf16 saved fp32's bits: was it bf16?"
# The same training sequences as a token file (scripts/token_rows.py writes them as
# text_corpus.hpp makes them) train to the same bits.
rows="$(cd "$(dirname "$0")/../.." && pwd)/scripts/token_rows.py"
python3 "$rows" corpus.txt 24 corpus-tokens.npy || fail "could not write corpus-tokens.npy"
python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import token_rows
token_rows.write_npy('padded-inside.npy', [[72, 105, 33], [72, -1, 33]])" "$(dirname "$rows")" ||
  fail "could not write padded-inside.npy"
"$bigbatch" train $gpt --data tokens:corpus-tokens.npy --batch 8 --steps 6 --lr 1e-2 \
  --dropout 0.1 --seed 5 --micro-batch 3 --save tokens.safetensors > tokens.txt 2>&1 ||
  fail "tokens:corpus-tokens.npy: exit code $? ($(tail -n 3 tokens.txt))"
grep -q '^bigbatch train: tokens:corpus-tokens.npy ([0-9]* sequences of 24 tokens' tokens.txt ||
  fail "the header does not describe the token file: $(head -n 1 tokens.txt)"
cmp -s whole.safetensors tokens.safetensors ||
  fail "the token file of the text's sequences did not train the text's bits"
# Chapter 07's ranks in one process: one simulated rank is the single process's bits; three
# ranks (shares of 3, 3 and 2 sequences of uneven real lengths) add their shares' gradients
# in rank order, each share's target tokens over the whole batch's count, and log that
# count. (tests/cli/check_data_parallel.sh: the same runs under mpirun save these bytes.)
run rank1 --micro-batch 3 --simulate-ranks 1
run ranks3 --micro-batch 2 --simulate-ranks 3
cmp -s whole.safetensors rank1.safetensors || fail "--simulate-ranks 1 did not give the bits of one process"
cmp -s whole.safetensors ranks3.safetensors &&
  fail "3 ranks saved one process's bits: each share starts its own sum, so were there ranks?"
grep -q '^data parallel: 3 ranks simulated in one process, shares of 2 to 3 samples' ranks3.txt ||
  fail "the ranks are not described: $(head -n 6 ranks3.txt)"
targets() { sed 's/.*"targets":\([0-9]*\).*/\1/' "$1"; }
targets whole.jsonl > whole.targets && targets ranks3.jsonl > ranks3.targets
cmp -s whole.targets ranks3.targets || fail "the ranks' steps did not count the whole batch's target tokens"
last_loss() { tail -n 1 "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
# The sum's order differs from one process's, and AdamW's steps spread the last bits: the
# losses of step 6 agree to 1e-3, far closer than a per-rank token mean would leave them.
awk "BEGIN { d = $(last_loss ranks3.jsonl) - $(last_loss whole.jsonl); exit !(d < 1e-3 && d > -1e-3) }" ||
  fail "3 ranks ended on loss $(last_loss ranks3.jsonl), one process on $(last_loss whole.jsonl)"
# Checkpointing the transformer blocks recomputes them with the same dropout masks.
# One kept block input for 2 blocks: block 0 runs twice per micro-batch.
grep -q '^activation checkpointing optimal:1: at most 1 block input kept and 1 block.s activations at a time; 3 block forwards per micro-batch instead of 2$' optimal1.txt ||
  fail "the checkpointed run does not describe its schedule: $(head -n 5 optimal1.txt)"
cmp -s whole.safetensors optimal1.safetensors ||
  fail "--checkpoint optimal:1 did not give the bits of the batch of 8"
cmp -s bf16_whole.safetensors bf16_every1.safetensors ||
  fail "bf16: --checkpoint every:1 did not give the bits of the batch of 8"
# Selective attention recomputation: each block's probabilities rebuilt in its backward.
cmp -s whole.safetensors attention.safetensors ||
  fail "--checkpoint attention did not give the bits of the batch of 8"
cmp -s bf16_whole.safetensors bf16_every1_attention.safetensors ||
  fail "bf16: --checkpoint every:1+attention did not give the bits of the batch of 8"
grep -q "; each block drops its attention's probabilities after its forward and rebuilds them" attention.txt ||
  fail "--checkpoint attention does not say what it recomputes: $(grep '^activation checkpointing' attention.txt)"
# Memory-efficient attention (its rows' max and sum kept, P rebuilt tile by tile in the
# backward): micro-batches and recomputed blocks give its batch's bits, which are not plain
# attention's (the online softmax rounds otherwise), and the runs agree to 1e-3 after 6
# steps (ulp-sized differences spread by AdamW, as the ranks' sums above).
cmp -s efficient.safetensors efficient_every1.safetensors ||
  fail "--attention efficient: micro-batches of 3 with every:1 did not give the batch's bits"
cmp -s bf16_efficient.safetensors bf16_efficient_micro1.safetensors ||
  fail "bf16 --attention efficient: micro-batches of 1 did not give the batch's bits"
cmp -s whole.safetensors efficient.safetensors &&
  fail "--attention efficient saved plain attention's bits: did it run?"
grep -q '^bigbatch train: .*, GPT of 2 blocks, width 32, 4 heads (efficient attention)' efficient.txt ||
  fail "the header does not name efficient attention: $(head -n 1 efficient.txt)"
awk "BEGIN { d = $(last_loss efficient.jsonl) - $(last_loss whole.jsonl); exit !(d < 1e-3 && d > -1e-3) }" ||
  fail "efficient attention ended on loss $(last_loss efficient.jsonl), plain on $(last_loss whole.jsonl)"
# The step's memory predicted to the byte (nn::predict_step): the printed prediction is
# the largest step peak of the log (every batch of 8 is whole here), with --explain too.
predicted() { sed -n 's/^predicted step peak .* (\([0-9]*\) bytes), at: .*/\1/p' "$1"; }
largest_peak() { sed 's/.*"peak_bytes_total":\([0-9]*\).*/\1/' "$1" | sort -n | tail -n 1; }
run explained --precision fp16 --loss-scale dynamic --micro-batch 3 --explain
for name in explained optimal1 bf16_every1 attention bf16_every1_attention efficient_every1; do
  [ -n "$(predicted $name.txt)" ] && [ "$(predicted $name.txt)" = "$(largest_peak $name.jsonl)" ] ||
    fail "$name: predicted step peak $(predicted $name.txt), measured $(largest_peak $name.jsonl)"
done
# budget:BYTES at optimal:1's peak: a policy whose predicted peak fits, and the same bits.
budget=$(predicted optimal1.txt)
run budget --micro-batch 3 --checkpoint "budget:$budget"
grep -q "^checkpoint budget:[0-9A-Za-z.]*: [a-z]*:[0-9]*, the policy of fewest recomputations" budget.txt ||
  fail "budget:$budget does not say which policy it chose: $(head -n 5 budget.txt)"
[ "$(largest_peak budget.jsonl)" -le "$budget" ] ||
  fail "budget:$budget: a step peaked at $(largest_peak budget.jsonl)"
cmp -s whole.safetensors budget.safetensors || fail "budget:$budget did not give the bits of the batch of 8"
grep -q '^precision fp16 (f32 master weights), loss scale dynamic' fp16.txt || fail "fp16 is not named"
grep -q '^loss scale: ' fp16.txt || fail "the fp16 run does not report its loss scale"
# Snapshots and --resume. Writing a snapshot every 2 steps leaves the fp16 run's bits as they
# were; resumed from its step-2 snapshot alone (the dynamic scaler's state in it), the run
# ends on the uninterrupted bits, and its log, kept up to step 2 and appended to, is the
# uninterrupted log line for line, the clock's two fields aside.
rm -rf snaps
run snapped --precision fp16 --loss-scale dynamic --micro-batch 3 --snapshot-dir snaps \
  --snapshot-every 2 --snapshot-keep 3
cmp -s fp16.safetensors snapped.safetensors || fail "writing snapshots changed the run's bits"
rm -rf from2 && mkdir from2 && cp snaps/step-00000002.safetensors from2/ ||
  fail "no snapshot of step 2: $(ls snaps)"
cp snapped.jsonl resumed.jsonl
run resumed --precision fp16 --loss-scale dynamic --micro-batch 3 --resume from2
grep -q '^resumed from from2/step-00000002.safetensors after step 2 of 6$' resumed.txt ||
  fail "the resumed run does not say where it starts: $(head -n 5 resumed.txt)"
cmp -s fp16.safetensors resumed.safetensors || fail "the resumed run did not end on the uninterrupted bits"
clockless() { sed -E 's/"time_s":[^,]*,"step_time_s":[^,]*,//' "$1"; }
clockless fp16.jsonl > fp16.clockless
clockless resumed.jsonl > resumed.clockless
cmp -s fp16.clockless resumed.clockless || fail "the resumed log differs from the uninterrupted one"
resume_refused() {  # resume_refused WORDS FLAGS...: --resume from2 refused, WORDS said
  words=$1
  shift
  "$bigbatch" train "$@" --batch 8 --steps 6 --lr 1e-2 --dropout 0.1 --seed 5 --precision fp16 \
    --loss-scale dynamic --resume from2 > refused.txt 2>&1
  code=$?
  [ $code -eq 2 ] || fail "--resume with $*: exit code $code, not 2: $(cat refused.txt)"
  grep -q -- "$words" refused.txt || fail "--resume with $*: the message does not say '$words': $(cat refused.txt)"
}
resume_refused "written with --heads 4, this run has --heads 2" \
  --model gpt --data text:corpus.txt --seq-len 24 --layers 2 --width 32 --heads 2
resume_refused "written with --attention plain, this run has --attention efficient" \
  --model gpt --data text:corpus.txt --seq-len 24 --layers 2 --width 32 --heads 4 \
  --attention efficient
resume_refused "written with --model gpt, this run has --model mlp" \
  --data synthetic --samples 200 --depth 1 --hidden 8
# SIGTERM finishes the step, writes its snapshot and exits with 143 (a run too long to end
# first: 100000 steps).
rm -rf term
"$bigbatch" train $shape --batch 8 --steps 100000 --snapshot-dir term --snapshot-every 1 \
  > term.txt 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null && ! ls term 2>/dev/null | grep -q '^step-.*safetensors$'; do
  sleep 0.01
done
kill -TERM "$pid"
wait "$pid"
code=$?
[ "$code" -eq 143 ] || fail "SIGTERM: exit code $code, not 143: $(tail -n 3 term.txt)"
stopped=$(sed -n 's/^interrupted by SIGTERM after step \([0-9]*\) of 100000: snapshot term\/step-[0-9]*\.safetensors written; continue with --resume term$/\1/p' term.txt)
[ -n "$stopped" ] || fail "SIGTERM: no line naming the step and the snapshot: $(tail -n 3 term.txt)"
[ -f "term/$(printf 'step-%08d.safetensors' "$stopped")" ] ||
  fail "SIGTERM after step $stopped, but term holds $(ls term)"
"$bigbatch" train $shape --batch 8 --steps 1 --init whole.safetensors > init.txt 2>&1 ||
  fail "--init from --save: $(tail -n 2 init.txt)"
refused() {  # refused WORDS FLAGS...: exit code 2 and a message holding WORDS
  words=$1
  shift
  "$bigbatch" train --batch 8 --steps 1 "$@" > refused.txt 2>&1
  code=$?
  [ $code -eq 2 ] || fail "$* exited with $code, not 2: $(cat refused.txt)"
  grep -q -- "$words" refused.txt || fail "$*: the message does not say '$words': $(cat refused.txt)"
}
refused "give --data text:FILE" --model gpt --data synthetic
refused "give --model gpt" --data text:corpus.txt
refused "give --model gpt" --data tokens:corpus-tokens.npy
refused "--vocabulary is --model gpt's" --vocabulary 300
refused "give --vocabulary 256 or more" $shape --vocabulary 200
refused "give --seq-len 24 or more" --model gpt --data tokens:corpus-tokens.npy --seq-len 16
refused "padding may only end a row" --model gpt --data tokens:padded-inside.npy
refused "--seq-len is --model gpt's" --seq-len 16
refused "--attention is --model gpt's" --attention efficient
refused "--attention efficient never keeps" $shape --attention efficient --checkpoint every:1+attention
refused "--depth shapes the MLP" $shape --depth 3
refused "budget:1048576: no checkpoint policy fits the step" $shape --checkpoint budget:1MiB
refused "--device-memory 64.00 KiB is below the" $shape --device-memory 64KiB
refused "--checkpoint: selective recomputation keeps the MLP block's" $shape --checkpoint sqrt+selective
refused "--checkpoint: attention recomputes a transformer block's" --data synthetic --checkpoint attention
refused "--snapshot-every and --snapshot-keep need --snapshot-dir" $shape --snapshot-every 2
refused "--zero is the MLP's: --model gpt's ranks sum whole gradients" $shape --simulate-ranks 2 --zero 1
refused "--bucket-size is the MLP's" $shape --data-parallel --bucket-size 1MiB
refused "heads" --model gpt --data text:corpus.txt --seq-len 24 --width 32 --heads 3
refused "has too many parameters to count" --model gpt --data text:corpus.txt --seq-len 24 --width 4294967296 --heads 1
refused "--data: " --model gpt --data text:no-such-file.txt
refused "--init: " --model gpt --data text:corpus.txt --seq-len 24 --layers 2 --width 16 --heads 4 --init whole.safetensors
# bigbatch generate: the prompt and 20 bytes after it (29 bytes with the newline), greedy
# the same whatever the seed, sampled the same for a seed and not for another.
generate() { "$bigbatch" generate --init whole.safetensors --prompt "Sentence 1" --tokens 20 "$@"; }
generate --temperature 0 --seed 1 > greedy1.txt || fail "generate: exit code $?"
generate --temperature 0 --seed 2 > greedy2.txt || fail "generate: exit code $?"
generate --temperature 1 --seed 1 > sampled1.txt && generate --temperature 1 --seed 1 > again1.txt &&
  generate --temperature 1 --seed 2 > sampled2.txt || fail "generate with a temperature: exit code $?"
head -c 10 greedy1.txt | grep -q '^Sentence 1$' || fail "generate does not print its prompt first: $(cat greedy1.txt)"
[ "$(wc -c < greedy1.txt)" -eq 31 ] || fail "generate printed $(wc -c < greedy1.txt) bytes, not 10 + 20 + 1"
cmp -s greedy1.txt greedy2.txt || fail "greedy generation changed with the seed"
cmp -s sampled1.txt again1.txt || fail "one seed sampled two texts"
cmp -s sampled1.txt sampled2.txt && fail "two seeds sampled the same 20 bytes"
"$bigbatch" train --data synthetic --samples 200 --depth 1 --hidden 8 --steps 1 --batch 8 \
  --save mlp.safetensors > mlp.txt 2>&1 || fail "the MLP run: $(tail -n 2 mlp.txt)"
generate_refused() {  # generate_refused WORDS FLAGS...: exit code 2 and WORDS said
  words=$1
  shift
  "$bigbatch" generate "$@" > refused.txt 2>&1
  code=$?
  [ $code -eq 2 ] || fail "generate $* exited with $code, not 2: $(cat refused.txt)"
  grep -q -- "$words" refused.txt || fail "generate $*: the message does not say '$words': $(cat refused.txt)"
}
# A saved GPT whose metadata says "context": 10^12: the parameters it describes are not those
# the file holds, so no model of that size is built (its wpe alone would be 128 TiB).
python3 - whole.safetensors big-context.safetensors <<'EDIT' || fail "cannot edit whole.safetensors"
import json, struct, sys
data = open(sys.argv[1], "rb").read()
size = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + size])
header["__metadata__"]["context"] = "1000000000000"
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + size:])
EDIT
generate_refused "metadata describes a GPT of" --init big-context.safetensors --prompt "x"
generate_refused "holds no GPT" --init mlp.safetensors --prompt "x"
generate_refused "--init: " --init no-such-file.safetensors --prompt "x"
generate_refused "--prompt: give at least one" --init whole.safetensors --prompt ""
generate_refused "--temperature" --init whole.safetensors --prompt "x" --temperature -1
generate_refused "--temperature: expected a number, got 'nan'" --init whole.safetensors --prompt "x" --temperature nan
generate_refused "--seed: must be 0 or more, got -1" --init whole.safetensors --prompt "x" --seed -1
generate_refused "--seed: '18446744073709551616' is too large" --init whole.safetensors --prompt "x" --seed 18446744073709551616
# Each byte printed as it is drawn: SIGINT stops the longest run after the byte being drawn,
# with what it wrote kept (the prompt, the bytes it says, a newline) and exit code 130.
"$bigbatch" generate --init whole.safetensors --prompt "Sentence 1" --tokens 2000000000 \
  > endless.txt 2> endless.err &
endless=$!
waited=0
until [ "$( { wc -c < endless.txt; } 2> /dev/null || echo 0)" -ge 40 ] || [ $waited -ge 600 ]; do
  sleep 0.05
  waited=$((waited + 1))
done
kill -INT $endless
waited=0
while kill -0 $endless 2> /dev/null && [ $waited -lt 200 ]; do
  sleep 0.05
  waited=$((waited + 1))
done
if kill -0 $endless 2> /dev/null; then
  kill -KILL $endless
  fail "generate went on for 10 s after SIGINT"
fi
wait $endless
code=$?
drawn=$(sed -n 's/^bigbatch generate: stopped by SIGINT after \([0-9]*\) of 2000000000 bytes$/\1/p' endless.err)
[ $code -eq 130 ] && [ -n "$drawn" ] && [ "$(wc -c < endless.txt)" -eq $((10 + drawn + 1)) ] ||
  fail "generate stopped by SIGINT: exit $code, $(wc -c < endless.txt) bytes written, stderr: $(cat endless.err)"
# Chapter 06's planner on the GPT, its cost model measured here (kept in cal.json), under
# optimal:1's peak: --plan auto trains the plan `bigbatch plan` chose, and its steps peak
# where that plan predicted.
budget=$(predicted optimal1.txt)
"$bigbatch" plan $shape --batch 8 --dropout 0.1 --seed 5 --device-memory "$budget" \
  --calibration cal.json --json > plan.json 2> plan.err || fail "bigbatch plan --model gpt: exit code $?: $(cat plan.err)"
planned=$(python3 -c 'import json; print(json.load(open("plan.json"))["feasible"][0]["peak_bytes"])') ||
  fail "bigbatch plan --model gpt --json: no feasible plan in $(cat plan.json)"
run planned --plan auto --device-memory "$budget" --calibration cal.json
grep -q '^plan auto: micro-batch [0-9]* ([0-9]* per step), ' planned.txt ||
  fail "--plan auto does not say what it chose: $(head -n 3 planned.txt)"
[ "$(largest_peak planned.jsonl)" = "$planned" ] ||
  fail "--plan auto: the steps peaked at $(largest_peak planned.jsonl), the plan predicted $planned"
"$bigbatch" plan $shape --batch 8 --device-memory 64KiB --calibration cal.json > refused.txt 2>&1
[ $? -eq 3 ] && grep -q "no plan fits the step in 64.00 KiB" refused.txt ||
  fail "bigbatch plan --model gpt under 64 KiB: $(cat refused.txt)"
# The planner weighs both attention kernels (a cost model each) and, with plain attention,
# the policies that rebuild its probabilities. The plan of the smallest peak is memory-
# efficient attention's (it keeps no P at all): on a device of exactly that peak,
# --plan auto trains it, under that kernel, peaking where it predicted.
python3 -c 'import json, sys; d = json.load(open("plan.json"))
assert sorted(d["cost_models"]) == ["efficient", "plain"], d["cost_models"].keys()
assert all(p["attention"] in ("plain", "efficient") for p in d["feasible"]), d["feasible"]' ||
  fail "bigbatch plan --model gpt --json does not weigh both attention kernels: $(cat plan.json)"
"$bigbatch" plan $shape --batch 8 --dropout 0.1 --seed 5 --device-memory 64KiB \
  --calibration cal.json --json > tight.json 2> /dev/null
smallest=$(python3 -c 'import json; s = json.load(open("tight.json"))["smallest"]
assert s["attention"] == "efficient", s; print(s["peak_bytes"])') ||
  fail "the smallest plan is not memory-efficient attention's: $(cat tight.json)"
run tightest --plan auto --device-memory "$smallest" --calibration cal.json
grep -q '^plan auto: .*, efficient attention$' tightest.txt ||
  fail "--plan auto at the smallest peak did not choose efficient attention: $(head -n 3 tightest.txt)"
grep -q '^bigbatch train: .* (efficient attention)' tightest.txt ||
  fail "--plan auto chose efficient attention but trained another: $(head -n 3 tightest.txt)"
[ "$(largest_peak tightest.jsonl)" = "$smallest" ] ||
  fail "--plan auto, efficient attention: the steps peaked at $(largest_peak tightest.jsonl), the plan predicted $smallest"
"$bigbatch" plan $shape --batch 8 --dropout 0.1 --seed 5 --device-memory "$budget" \
  --calibration cal.json --attention plain > plain-plan.txt 2>&1 ||
  fail "bigbatch plan --attention plain: $(cat plain-plan.txt)"
grep -q 'efficient' plain-plan.txt && fail "--attention plain weighed efficient attention: $(cat plain-plan.txt)"
grep -q -- '--attention plain (or --plan auto)$' plain-plan.txt ||
  fail "bigbatch plan does not name the kernel to train with: $(tail -n 1 plain-plan.txt)"
"$bigbatch" train --help | grep -q -- '--model' || fail "--help does not list --model"
echo "ok"
