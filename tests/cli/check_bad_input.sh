#!/bin/sh
# check_bad_input.sh BIGBATCH INIT_FILE
# Runs `bigbatch train` on a table of bad inputs: flags out of range, and data, parameter
# and snapshot files that are truncated, corrupt, of the wrong dtype or shape, empty, or
# hold labels out of range or features that are not finite. Each must exit with code 2
# (bad input), explain itself in exactly one line on stderr that names the flag or file
# at fault, in words (no number of 10 or more digits: a type's limits, as CLI11's range
# checks print them), and leave no output file behind (every row also asks for --log).
# INIT_FILE is a --save of a model of depth 1, hidden 32 on --data synthetic.
# Output paths (chapters/cli/output_files.hpp): a folder, a pipe, two outputs naming one
# file, an output naming an input are refused before training, the input left as it was;
# and a --save that names a link writes the file the link names, the link left in place.
# Last, what is past the machine's memory: exit code 3 and the bytes, before they are taken.
set -u
bigbatch=$1 init=$2
small="--data synthetic --samples 2000 --steps 1"
failures=0 cases=0
mkdir -p bad && cd bad || exit 1

# npy_header FILE DESCR SHAPE: a version 1.0 .npy header; the caller appends the data.
npy_header() {
  dict="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
  length=$(( ${#dict} + 1 ))
  pad=$(( (64 - (10 + length) % 64) % 64 ))
  total=$(( length + pad ))
  printf '\223NUMPY\001\000' > "$1"
  printf "\\$(printf %03o $((total % 256)))\\$(printf %03o $((total / 256)))" >> "$1"
  printf '%s%*s\n' "$dict" "$pad" '' >> "$1"
}
# 50 samples of 4 zero features, and labels 0 (int64): a good pair to spoil one at a time.
npy_header x.npy '<f4' '(50, 4)'; head -c 800 /dev/zero >> x.npy
npy_header y.npy '<i8' '(50,)'; head -c 400 /dev/zero >> y.npy
head -c 700 x.npy > truncated.npy
{ printf 'XNUMPY'; tail -c +7 x.npy; } > magic.npy
npy_header int.npy '<i4' '(50, 4)'; head -c 800 /dev/zero >> int.npy
npy_header nan.npy '<f4' '(50, 4)'; head -c 40 /dev/zero >> nan.npy
printf '\000\000\300\177' >> nan.npy; head -c 756 /dev/zero >> nan.npy
npy_header inf.npy '<f4' '(50, 4)'; head -c 796 /dev/zero >> inf.npy; printf '\000\000\200\177' >> inf.npy
npy_header empty.npy '<f4' '(0, 4)'
npy_header empty_y.npy '<i8' '(0,)'
npy_header negative.npy '<i8' '(50,)'; head -c 392 /dev/zero >> negative.npy
printf '\377\377\377\377\377\377\377\377' >> negative.npy
npy_header short.npy '<i8' '(49,)'; head -c 392 /dev/zero >> short.npy
npy_header float_y.npy '<f4' '(50,)'; head -c 200 /dev/zero >> float_y.npy
# Parameters: the good file cut short, and one whose header is not JSON.
head -c 200 "$init" > truncated.safetensors
printf '\020\000\000\000\000\000\000\000{not json here!}' > garbage.safetensors
# A snapshot folder holding a damaged snapshot.
mkdir -p snaps && head -c 300 "$init" > snaps/step-00000001.safetensors
# Fashion-MNIST: a folder of the four files, gzip that is not gzip, and one cut short.
mkdir -p fashion cut
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  printf 'this is not gzip' > "fashion/$f.gz"
  cp /usr/share/datasets/fashion-mnist/$f.gz cut/ 2>/dev/null || printf 'x' > "cut/$f.gz"
done
head -c 5000 /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz > cut/train-images-idx3-ubyte.gz 2>/dev/null
# Outputs that must not be written: a pipe, and copies of inputs (a wrong build that wrote
# them spoils its copies, not the files other rows read).
rm -f pipe.safetensors && mkfifo pipe.safetensors
cp x.npy x-in.npy && cp "$init" init-in.safetensors

# Each row: what the message must name | environment | the command line's arguments.
while IFS='|' read -r flag environment arguments; do
  [ -z "$flag" ] && continue
  cases=$((cases + 1))
  rm -f partial.jsonl
  # shellcheck disable=SC2086 # the arguments are words
  env $environment "$bigbatch" train $arguments --log partial.jsonl > /dev/null 2> stderr.txt
  code=$?
  lines=$(wc -l < stderr.txt)
  if [ "$code" -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -e "$flag" stderr.txt &&
     ! grep -q -E '[0-9]{10}' stderr.txt && [ ! -e partial.jsonl ]; then
    echo "ok   exit 2: $(cat stderr.txt)"
  else
    echo "FAIL train $arguments: exit $code, $lines lines on stderr, $( [ -e partial.jsonl ] && echo 'a log file left' || echo 'no log file') (expected exit 2, one line naming $flag, in words, and no file):"
    cat stderr.txt
    failures=$((failures + 1))
  fi
done <<TABLE
--batch||$small --batch 0
--batch||$small --batch -64
--micro-batch||$small --micro-batch -1
--hidden||$small --hidden -3
--samples||$small --samples 0
--micro-batch||$small --batch 8 --micro-batch 9
--data||--data nonsense --steps 1
--lr-schedule||$small --lr-schedule linear
--lr-scale||$small --lr-scale quadratic
--warmup-steps||$small --warmup-steps -1
--clip-grad-norm||$small --clip-grad-norm 0
--checkpoint||$small --checkpoint every:0
--checkpoint||$small --checkpoint nonsense
--checkpoint||$small --checkpoint budget:lots
--checkpoint||$small --checkpoint budget:1KiB
--checkpoint||$small --checkpoint selective+sqrt
--resume||$small --resume no-such-folder
--snapshot-every||$small --snapshot-every 5
--clip-grad-norm||$small --clip-grad-norm -1
--features||--data synthetic --features 0 --steps 1
--lr||$small --lr -0.1
--seed||$small --seed -1
--epochs||$small --epochs 2
--norm batch||$small --norm batch --batch 65 --micro-batch 16
--save||$small --save /nonexistent-folder/x.safetensors
--hidden||$small --init $init --hidden 64
--depth||$small --init $init --depth 3
--norm||$small --init $init --norm batch
--frobnicate||$small --frobnicate
--precision||$small --precision fp8
--loss-scale||$small --loss-scale static:abc
--loss-scale||$small --loss-scale static:0
--scale-init||$small --scale-init 8
--scale-backoff||$small --loss-scale dynamic --scale-backoff 2
--scale-init||$small --loss-scale dynamic --scale-init 4 --scale-min 8
--scale-hysteresis||$small --loss-scale dynamic --scale-hysteresis 0
truncated.npy||--data npy:truncated.npy,y.npy --steps 1
magic.npy||--data npy:magic.npy,y.npy --steps 1
int.npy||--data npy:int.npy,y.npy --steps 1
nan.npy||--data npy:nan.npy,y.npy --steps 1
inf.npy||--data npy:inf.npy,y.npy --steps 1
empty.npy||--data npy:empty.npy,empty_y.npy --steps 1
negative.npy||--data npy:x.npy,negative.npy --steps 1
short.npy||--data npy:x.npy,short.npy --steps 1
float_y.npy||--data npy:x.npy,float_y.npy --steps 1
no-such.npy||--data npy:no-such.npy,y.npy --steps 1
--data||--data npy:x.npy --steps 1
nan.npy||--data npy:x.npy,y.npy --test-data npy:nan.npy,y.npy --steps 1
truncated.safetensors||$small --init truncated.safetensors
garbage.safetensors||$small --init garbage.safetensors
step-00000001.safetensors||$small --resume snaps
train-images-idx3-ubyte.gz|BIGBATCH_FASHION_MNIST_DIR=fashion|--data fashion-mnist --steps 1
train-images-idx3-ubyte.gz|BIGBATCH_FASHION_MNIST_DIR=cut|--data fashion-mnist --steps 1
--validation||$small --validation 1800
--validation||--data npy:x.npy,y.npy --test-data npy:x.npy,y.npy --validation 10 --steps 1
--device-memory||$small --device-memory 100KiB
--device-memory||$small --device-memory lots
--eval-every: --data npy:x.npy,y.npy holds out no samples||--data npy:x.npy,y.npy --steps 1 --eval-every 1
--save: . is a folder||$small --save .
--save: pipe.safetensors is a pipe||$small --save pipe.safetensors
--save and --log both name partial.jsonl||$small --save partial.jsonl
--save: x-in.npy is the file --data reads||--data npy:x-in.npy,y.npy --steps 1 --save x-in.npy
--save: init-in.safetensors is the file --init reads||$small --init init-in.safetensors --save init-in.safetensors
TABLE
rm -f stderr.txt
# The inputs the rows above named as outputs: unchanged.
for pair in "x.npy x-in.npy" "$init init-in.safetensors"; do
  # shellcheck disable=SC2086 # two words
  if ! cmp -s $pair; then
    echo "FAIL: ${pair#* } was changed by a run that named it as an output"
    failures=$((failures + 1))
  fi
done
# A --save that names a link (to a file, or to nothing yet): the write lands on the file the
# link names, which holds what a --save of it by name holds; the link stays a link.
"$bigbatch" train $small --depth 1 --hidden 32 --save direct.safetensors > /dev/null 2>&1
for linked in existing missing; do
  cases=$((cases + 1))
  rm -f "$linked-target.safetensors" "$linked-link.safetensors"
  [ $linked = missing ] || cp "$init" "$linked-target.safetensors"
  ln -s "$linked-target.safetensors" "$linked-link.safetensors"
  "$bigbatch" train $small --depth 1 --hidden 32 --save "$linked-link.safetensors" > /dev/null 2>&1
  what="a link to a file"
  [ $linked = existing ] || what="a link to no file yet"
  if [ -L "$linked-link.safetensors" ] && cmp -s direct.safetensors "$linked-target.safetensors"; then
    echo "ok   --save to $what: the file it names written, the link kept"
  else
    echo "FAIL --save to $what: $( [ -L "$linked-link.safetensors" ] && echo 'the link kept' || echo 'the link replaced'), $(cmp -s direct.safetensors "$linked-target.safetensors" && echo 'its file written' || echo 'its file not written')"
    failures=$((failures + 1))
  fi
done
# The machine's limit: a model or data set that no micro-batch or checkpointing fits in this
# machine's memory is refused with exit code 3, naming the bytes it asks for, before it takes
# them: the run's peak resident memory stays under 1 GiB (getrusage, through python3), and
# no log is left. The sizes are past any machine's memory: a GPT of ten million blocks
# (1.8 TiB of parameters, the cap beside it not reached) or an MLP of ten million (19 TiB),
# and sequences of 10^11 positions, each short document padded to that length.
printf 'a few words\n\nand a few more\n\nthe third paragraph\n' > short.txt
limits=0
while IFS='|' read -r words command arguments; do
  [ -z "$words" ] && continue
  cases=$((cases + 1)) limits=$((limits + 1))
  rm -f partial.jsonl
  # shellcheck disable=SC2086 # the arguments are words
  result=$(python3 -c 'import resource, subprocess, sys
code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)' \
    "$bigbatch" $command $arguments 2> stderr.txt)
  code=${result% *} megabytes=${result#* }
  if [ "$code" -eq 3 ] && grep -q -e "$words" stderr.txt && grep -q -E '\([0-9]+ bytes\)' stderr.txt &&
     [ "$megabytes" -lt 1024 ] && [ ! -e partial.jsonl ]; then
    echo "ok   exit 3, $megabytes MiB resident: $(tr '\n' ' ' < stderr.txt)"
  else
    echo "FAIL $command $arguments: exit $code, $megabytes MiB resident, $( [ -e partial.jsonl ] && echo 'a log file left' || echo 'no log file') (expected exit 3 saying '$words' and the bytes, under 1 GiB, no file):"
    cat stderr.txt
    failures=$((failures + 1))
  fi
done <<TABLE
the model's parameters take|train|--model gpt --data text:short.txt --layers 10000000 --device-memory 64MiB --steps 1 --log partial.jsonl
the model's parameters take|train|--data synthetic --samples 200 --depth 10000000 --steps 1 --log partial.jsonl
the model's parameters take|plan|--data synthetic --samples 200 --depth 10000000 --batch 64
each piece padded to the full length|train|--model gpt --data text:short.txt --seq-len 100000000000 --steps 1 --log partial.jsonl
TABLE
rm -f stderr.txt
if [ "$failures" -ne 0 ]; then echo "$failures of $cases cases did not go as expected"; exit 1; fi
echo "$((cases - 2 - limits)) bad inputs refused, each with exit code 2 and one line naming the flag or file, the inputs left as they were; --save through a link, twice; $limits past the machine's memory refused with exit code 3 before taking it"
