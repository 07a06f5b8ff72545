#!/bin/sh
# check_bad_input.sh BIGBATCH INIT_FILE
# Runs `bigbatch train` on a table of bad inputs. Each must exit with code 2 (bad input)
# and explain itself in exactly one line on stderr that names the flag at fault, in words:
# no number of 10 or more digits (a type's limits, as CLI11's range checks print them).
# INIT_FILE is a --save of a model of depth 1, hidden 32 on --data synthetic.
set -u
bigbatch=$1 init=$2
small="--data synthetic --samples 2000 --steps 1"
failures=0
# Each row: the flag the message must name | the command line's arguments.
while IFS='|' read -r flag arguments; do
  [ -z "$flag" ] && continue
  # shellcheck disable=SC2086 # the arguments are words
  "$bigbatch" train $arguments > /dev/null 2> stderr.txt
  code=$?
  lines=$(wc -l < stderr.txt)
  if [ "$code" -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -e "$flag" stderr.txt &&
     ! grep -q -E '[0-9]{10}' stderr.txt; then
    echo "ok   exit 2: $(cat stderr.txt)"
  else
    echo "FAIL train $arguments: exit $code, $lines lines on stderr (expected exit 2 and one line naming $flag, in words):"
    cat stderr.txt
    failures=$((failures + 1))
  fi
done <<TABLE
--batch|$small --batch 0
--batch|$small --batch -64
--micro-batch|$small --micro-batch -1
--hidden|$small --hidden -3
--samples|$small --samples 0
--micro-batch|$small --batch 8 --micro-batch 9
--data|--data nonsense --steps 1
--lr-schedule|$small --lr-schedule linear
--lr-scale|$small --lr-scale quadratic
--warmup-steps|$small --warmup-steps -1
--clip-grad-norm|$small --clip-grad-norm 0
--checkpoint|$small --checkpoint every:0
--checkpoint|$small --checkpoint nonsense
--checkpoint|$small --checkpoint budget:lots
--checkpoint|$small --checkpoint budget:1KiB
--checkpoint|$small --checkpoint selective+sqrt
--resume|$small --resume no-such-folder
--snapshot-every|$small --snapshot-every 5
--clip-grad-norm|$small --clip-grad-norm -1
--features|--data synthetic --features 0 --steps 1
--lr|$small --lr -0.1
--epochs|$small --epochs 2
--norm batch|$small --norm batch --batch 65 --micro-batch 16
--save|$small --save /nonexistent-folder/x.safetensors
--hidden|$small --init $init --hidden 64
--depth|$small --init $init --depth 3
--norm|$small --init $init --norm batch
--frobnicate|$small --frobnicate
--precision|$small --precision fp8
--loss-scale|$small --loss-scale static:abc
--loss-scale|$small --loss-scale static:0
--scale-init|$small --scale-init 8
--scale-backoff|$small --loss-scale dynamic --scale-backoff 2
--scale-init|$small --loss-scale dynamic --scale-init 4 --scale-min 8
--scale-hysteresis|$small --loss-scale dynamic --scale-hysteresis 0
TABLE
rm -f stderr.txt
if [ "$failures" -ne 0 ]; then echo "$failures bad inputs were not refused as expected"; exit 1; fi
