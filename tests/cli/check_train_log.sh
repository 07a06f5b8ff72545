#!/bin/sh
# check_train_log.sh LOG STEPS N BATCH DROP_LAST LR SCHEDULE WARMUP
# Checks a `bigbatch train --log` file of a run of STEPS optimizer steps (--steps or
# --epochs) over N training samples in batches of BATCH (DROP_LAST 1 or 0), base learning
# rate LR, --lr-schedule SCHEDULE and --warmup-steps WARMUP. Every line must hold every
# field, with values recomputed here from the flags: the step, the samples seen (short
# last batches included), the fractional epoch, the learning rate of the schedule's
# formula; the times must grow, and the step's peak must be the sum of its categories,
# with the host's data sets left out. Prints the first failure and exits 1.
set -eu
log=$1 steps=$2 n=$3 batch=$4 drop_last=$5 lr=$6 schedule=$7 warmup=$8

lines=$(wc -l < "$log")
if [ "$lines" -ne "$steps" ]; then
  echo "$log: $lines lines, expected $steps (one per step)"; exit 1
fi
awk -v n="$n" -v batch="$batch" -v drop_last="$drop_last" -v lr="$lr" \
    -v schedule="$schedule" -v warmup="$warmup" -v steps="$steps" '
function fail(message) { printf "%s line %d: %s\n  %s\n", FILENAME, NR, message, $0; failed = 1; exit 1 }
# The number after "key": in this line (the fields are flat, so the first match is it).
function field(key,    rest) {
  if (!match($0, "\"" key "\":")) fail("no field " key)
  rest = substr($0, RSTART + RLENGTH)
  if (!match(rest, /^-?[0-9][0-9.e+-]*/)) fail(key " is not a number")
  return substr(rest, RSTART, RLENGTH) + 0
}
function near(a, b) { d = a - b; if (d < 0) d = -d; return d <= 1e-6 * (b < 0 ? -b : b) + 1e-12 }
BEGIN {
  per_epoch = drop_last ? int(n / batch) : int((n + batch - 1) / batch)
  pi = atan2(0, -1)
}
{
  step = field("step")
  if (step != NR) fail("step " step ", expected " NR)
  # The batch: batch j of its epoch takes min(batch, n - j batch) samples.
  j = (step - 1) % per_epoch
  rows = n - j * batch; if (rows > batch) rows = batch
  samples += rows
  if (field("samples") != samples) fail("samples " field("samples") ", expected " samples)
  if (!near(field("epoch"), step / per_epoch)) fail("epoch, expected " step / per_epoch)
  # The learning rate of step i = step - 1 (nn/lr_schedule.hpp).
  i = step - 1
  if (i < warmup) expected = lr * (i + 1) / warmup
  else if (schedule == "cosine") expected = lr * (1 + cos(pi * (i - warmup) / (steps - warmup))) / 2
  else expected = lr
  if (!near(field("lr"), expected)) fail("lr " field("lr") ", expected " expected)
  loss = field("loss"); if (loss <= 0) fail("loss is not positive")
  time = field("time_s"); step_time = field("step_time_s")
  if (!(time > previous_time)) fail("time_s does not grow")
  if (!(step_time > 0 && step_time <= time)) fail("step_time_s is not in (0, time_s]")
  previous_time = time
  # The step peak: the categories at that moment add up to the total; no host data.
  if (index($0, "host_data")) fail("host_data is not device memory")
  total = field("peak_bytes_total")
  sum = 0
  split("parameters gradients optimizer_state activations workspace data master_weights checkpoints", names, " ")
  for (k in names) sum += field(names[k])
  if (total <= 0 || sum != total) fail("peak_bytes sum to " sum ", peak_bytes_total is " total)
}
END { if (!failed) printf "%s: %d lines, every field present and consistent\n", FILENAME, NR }
' "$log"
