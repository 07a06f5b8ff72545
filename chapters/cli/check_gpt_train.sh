#!/bin/sh
# check_gpt_train.sh BIGBATCH
# `bigbatch train --model gpt` end to end on a text file written here (fortune(6)'s format:
# documents of uneven lengths between "%" lines): the header names the sequences, their real
# target tokens and the padding; the first logged loss is that of a model guessing among 256
# bytes (ln 256 = 5.55) and the loss falls; every log line counts its step's target tokens;
# micro-batches of 3 and of 1 sequence save the bits of the batch of 8 (fp32 and bf16, with
# dropout: the loss of every target over the step's count, the tied head completed once);
# fp16 runs under the dynamic loss scaler; --init continues from --save; what the GPT's run
# does not take is refused with exit code 2, naming the flag; and `bigbatch generate` prints
# the prompt and what the saved model writes after it, refusing a file that is no GPT.
set -u
bigbatch=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
fail() { echo "FAIL: $1"; exit 1; }
# A folder of its own: the other CLI tests run beside it and write files of the same names.
mkdir -p gpt_train && cd gpt_train || fail "cannot enter gpt_train"
# 40 documents of 1 to 9 sentences: some fit a sequence of 24 positions, most are cut.
awk 'BEGIN {
  for (d = 0; d < 40; ++d) {
    for (s = 0; s <= d % 9; ++s) printf "Sentence %d of document %d says little. ", s, d;
    printf "\n%%\n";
  }
}' > corpus.txt
shape="--model gpt --data text:corpus.txt --seq-len 24 --layers 2 --width 32 --heads 4"
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
grep -q '^precision fp16 (f32 master weights), loss scale dynamic' fp16.txt || fail "fp16 is not named"
grep -q '^loss scale: ' fp16.txt || fail "the fp16 run does not report its loss scale"
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
refused "train it with --model gpt" --data text:corpus.txt
refused "--seq-len shapes --model gpt" --seq-len 16
refused "--depth shapes the MLP" $shape --depth 3
refused "--checkpoint is not available with --model gpt" $shape --checkpoint every:1
refused "--simulate-ranks is not available with --model gpt" $shape --simulate-ranks 2
refused "heads" --model gpt --data text:corpus.txt --seq-len 24 --width 32 --heads 3
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
generate_refused "holds no GPT" --init mlp.safetensors --prompt "x"
generate_refused "--init: " --init no-such-file.safetensors --prompt "x"
generate_refused "--prompt: give at least one" --init whole.safetensors --prompt ""
generate_refused "--temperature" --init whole.safetensors --prompt "x" --temperature -1
"$bigbatch" plan $shape --batch 8 > refused.txt 2>&1
[ $? -eq 2 ] && grep -q "does not know the GPT's" refused.txt || fail "bigbatch plan took the GPT: $(cat refused.txt)"
"$bigbatch" train --help | grep -q -- '--model' || fail "--help does not list --model"
echo "ok"
