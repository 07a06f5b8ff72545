#!/bin/sh
# check_data_parallel.sh BIGBATCH MPIEXEC [PART]
# Chapter 07 from the command line, on MPI (Open MPI's mpirun; --oversubscribe: more ranks
# than this machine's cores; as root it needs OMPI_ALLOW_RUN_AS_ROOT, set here), in eight
# parts. Each PART is a CTest test of its own (bigbatch_train_data_parallel_PART), run in a
# folder of its own (data_parallel/PART) where it makes every run it compares with, so the
# parts run at once and a failing one names what failed; without PART all run, in order.
# (The runs a part repeats from another are short: a second each.)
#  ranks     R = 2, 3, 4 ranks under mpirun save the bytes of --simulate-ranks R in one
#            process: fp32 with dropout, fp16 with dynamic loss scaling, bf16 with
#            activation checkpointing (a batch of 50 in micro-batches of 7: shares of
#            17/17/16 and 13/13/12/12 samples); the same R twice gives the same bytes; one
#            rank is the single-process run exactly. An inf on one rank only (a feature of
#            70000 is inf in fp16, in rank 1's share of step 2): every rank skips that step
#            and backs the scale off (the program checks at the end that the ranks'
#            parameters still agree), and the simulation does the same.
#  zero1     ZeRO stage 1 (--zero 1): MPI equals the simulation with clipping on (fp32 and
#            fp16), stage 0 without it, the engine's reduce-scatter the deterministic one at
#            R = 2, the inf on one rank skips the step on all, rank 0 holds a third of 3
#            ranks' state; snapshots hold the shards gathered (the simulation's files) and
#            resume bit for bit.
#  zero2     ZeRO stage 2 (--zero 2): MPI equals the simulation (fp32, fp16 with
#            checkpointing, uneven micro-batch counts), stage 1 with one micro-batch per
#            rank; rank 0 holds fewer gradient bytes at the peak than at stage 0; a snapshot
#            resumes bit for bit.
#  refusals  Bad input, on every rank alike: more ranks than samples in a batch, --norm
#            batch, --reduction without --data-parallel, --zero without ranks, ranks started
#            with different settings, CUDA ranks simulated: exit code 2 and one line naming
#            the cause, no rank left running.
#  kill      A rank killed with SIGKILL mid-run: mpirun ends the others and exits non-zero
#            within 30 s (no rank waits for ever in a collective); --resume from rank 0's
#            last snapshot with the same R saves the uninterrupted run's bytes (so does
#            --simulate-ranks R from it); another R goes on, saying its bits are not the old
#            R's, as the simulation of that R does (under ZeRO stage 1 too, re-sharded).
#  overlap   Overlap (--bucket-size): the sums started in buckets during the last backward
#            save the simulation's bytes (R = 2, 3, 4; stages 0, 1 and 2; fp16,
#            checkpointing, clipping), the engine's at R = 2 too; --bucket-size without
#            --data-parallel, a size that is not one, and ranks with other bucket sizes are
#            refused.
#  plan      --plan auto on ranks: rank 0's share planned (at stage 1 with its shard of the
#            state) and trained by every rank, its measured peak the predicted one; a budget
#            that fits stage 1 and not stage 0, and one that fits stage 2 and not stage 1;
#            the plan by hand, simulated, saves the job's bytes.
#  gpt       Chapter 08's GPT: 3 ranks under mpirun save --simulate-ranks 3's bytes (fp32
#            with dropout in micro-batches, bf16 with checkpointed blocks), every rank's
#            tokens over the whole batch's count; rank 0's peaks are its share's predicted
#            step; the engine's sum runs; --plan auto plans rank 0's share, and every rank
#            trains its attention kernel.
set -u
bigbatch=$1 mpiexec=$2 part=${3:-all}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One machine: Open MPI's shared-memory point-to-point layer, not UCX's probe of the network
# at every start (tests/mpi/run_under_mpi.sh has the figures).
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
# Under AddressSanitizer (scripts/sanitize.sh) leak detection is off for MPI's processes:
# Open MPI keeps allocations from MPI_Init to exit, some in plugins it unloads before the
# leak check runs, so they are reported with no frame to suppress them by. Memory errors
# are still caught, and the same code in one process (--simulate-ranks) is leak-checked.
mpirun() { ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$mpiexec" --oversubscribe "$@"; }
fail() { echo "FAIL: $1"; exit 1; }
# Bad input: exit code 2 and one line on stderr naming the cause.
refused() {  # refused WHAT EXPECTED COMMAND...: the command must fail with 2, saying EXPECTED
  what=$1 expected=$2
  shift 2
  "$@" > refused.txt 2> refused.err
  code=$?
  [ $code -eq 2 ] || fail "$what: exit code $code, not 2 ($(cat refused.err))"
  grep -q -- "$expected" refused.err || fail "$what: stderr does not say '$expected': $(cat refused.err)"
  echo "$what: refused ($(grep -m 1 -- "$expected" refused.err))"
}
small="--data synthetic --samples 2000 --depth 3 --hidden 32 --steps 4 --batch 50 --micro-batch 7"

# ---- what the parts share ------------------------------------------------------------------
same() {  # same R NAME FLAGS...
  ranks=$1 name=$2
  shift 2
  mpirun -np "$ranks" "$bigbatch" train $small "$@" --data-parallel --save "mpi-$name.st" \
    > "mpi-$name.txt" 2>&1 || fail "mpirun -np $ranks ($name): exit code $? ($(tail -n 3 "mpi-$name.txt"))"
  "$bigbatch" train $small "$@" --simulate-ranks "$ranks" --save "sim-$name.st" \
    > "sim-$name.txt" 2>&1 || fail "--simulate-ranks $ranks ($name): $(tail -n 3 "sim-$name.txt")"
  cmp -s "mpi-$name.st" "sim-$name.st" ||
    fail "$ranks ranks under MPI and --simulate-ranks $ranks differ ($name)"
  echo "R = $ranks, $name: MPI and simulated ranks saved the same bytes"
}

overlapped() {  # overlapped R NAME BUCKET FLAGS...: mpirun with FLAGS, summing in buckets of
  ranks=$1 name=$2 bucket=$3  # BUCKET, saves the bytes of --simulate-ranks R with FLAGS
  shift 3
  "$bigbatch" train $small "$@" --simulate-ranks "$ranks" --save "sim-$name.st" > "sim-$name.txt" 2>&1 ||
    fail "--simulate-ranks $ranks ($name): $(tail -n 3 "sim-$name.txt")"
  mpirun -np "$ranks" "$bigbatch" train $small "$@" --bucket-size "$bucket" --data-parallel \
    --save "overlap-$name.st" > "overlap-$name.txt" 2>&1 ||
    fail "overlap, $ranks ranks ($name): exit code $? ($(tail -n 3 "overlap-$name.txt"))"
  cmp -s "overlap-$name.st" "sim-$name.st" ||
    fail "$ranks ranks overlapping the sum saved other bytes than --simulate-ranks $ranks ($name)"
}

# The data of an inf on rank 1 only ($spike): 50 samples of 4 features, all 1 but sample 45's
# first, 70000: batches of 25 in data order, so step 2 holds it at row 20, in rank 1's share
# [13, 25).
npy_header() {  # npy_header FILE DESCR SHAPE: a version 1.0 .npy header
  dict="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
  length=$(( ${#dict} + 1 )) pad=0
  pad=$(( (64 - (10 + length) % 64) % 64 ))
  printf '\223NUMPY\001\000' > "$1"
  printf "\\$(printf %03o $(((length + pad) % 256)))\\$(printf %03o $(((length + pad) / 256)))" >> "$1"
  printf '%s%*s\n' "$dict" "$pad" '' >> "$1"
}
write_spike_data() {  # x.npy and y.npy, the data of $spike
  npy_header x.npy '<f4' '(50, 4)'
  i=0
  while [ $i -lt 200 ]; do
    if [ $i -eq 180 ]; then printf '\000\270\210\107' >> x.npy; else printf '\000\000\200\077' >> x.npy; fi
    i=$((i + 1))
  done
  npy_header y.npy '<i8' '(50,)'; head -c 400 /dev/zero >> y.npy
}
spike="--data npy:x.npy,y.npy --shuffle off --depth 1 --hidden 16 --steps 3 --batch 25 --precision fp16 --loss-scale dynamic"

# Stage 1 with snapshots (zero1), stage 2 with them (zero2); uneven micro-batch counts at
# stage 2 (zero2, overlap).
zero1_base="--data synthetic --samples 2000 --depth 3 --hidden 32 --steps 6 --batch 50 --micro-batch 7 --clip-grad-norm 0.5"
uneven="--data synthetic --samples 2000 --depth 3 --hidden 32 --steps 4 --batch 43 --micro-batch 7 --dropout 0.2 --zero 2"

# The KiB of rank 0's optimizer state at the step's peak, from a run's memory table.
state() { sed -n 's/^  optimizer_state  *\([0-9.]*\) KiB.*/\1/p' "$1"; }

part_ranks() {
  # mpirun -np R == --simulate-ranks R, byte for byte.
  for ranks in 2 3 4; do
    same "$ranks" "fp32-$ranks" --dropout 0.2
    same "$ranks" "fp16-$ranks" --dropout 0.2 --precision fp16 --loss-scale dynamic
    same "$ranks" "bf16-$ranks" --precision bf16 --checkpoint every:2
  done
  grep -q '^data parallel: 3 ranks under MPI, shares of 16 to 17 samples of each batch of 50 (3 micro-batches per rank), gradients summed once per optimizer step (deterministic)$' mpi-fp32-3.txt ||
    fail "the header does not describe the ranks: $(grep '^data parallel' mpi-fp32-3.txt)"
  mpirun -np 3 "$bigbatch" train $small --dropout 0.2 --data-parallel --save again.st > again.txt 2>&1 &&
    cmp -s again.st mpi-fp32-3.st || fail "two runs with 3 ranks saved different bytes"
  mpirun -np 1 "$bigbatch" train $small --dropout 0.2 --data-parallel --save one.st > one.txt 2>&1 &&
    "$bigbatch" train $small --dropout 0.2 --save plain.st > plain.txt &&
    cmp -s one.st plain.st || fail "one rank did not save the single-process run's bytes"
  mpirun -np 4 "$bigbatch" train $small --data-parallel --reduction engine > engine.txt 2>&1 ||
    fail "the engine's reduction with 4 ranks: $(tail -n 3 engine.txt)"

  # An inf on rank 1 only (write_spike_data): every rank skips step 2.
  write_spike_data
  mpirun -np 2 "$bigbatch" train $spike --data-parallel --log spike.jsonl --save spike-mpi.st > spike.txt 2>&1 ||
    fail "the inf on one rank: exit code $? ($(tail -n 3 spike.txt))"
  sed -n 2p spike.jsonl | grep -q '"skipped":true' || fail "step 2 was not skipped: $(sed -n 2p spike.jsonl)"
  ! sed -n '1p;3p' spike.jsonl | grep -q '"skipped":true' || fail "a step without the inf was skipped"
  grep -q '1 of 3 steps skipped' spike.txt || fail "the run does not report one skipped step"
  "$bigbatch" train $spike --simulate-ranks 2 --save spike-sim.st > spike-sim.txt 2>&1 &&
    cmp -s spike-mpi.st spike-sim.st || fail "the simulated ranks did not skip alike"
  echo "an inf on rank 1 only: every rank skipped step 2"
}

part_zero1() {
  # ZeRO stage 1 (--zero 1: each rank steps its shard of the optimizer state): mpirun -np R
  # saves --simulate-ranks R --zero 1's bytes with clipping on (the norm measured shard by
  # shard, summed in rank order); without clipping, stage 0's bytes (the optimizer acts
  # element by element); the engine's reduce-scatter with 2 ranks (one addition per element,
  # whatever its order) the deterministic one's; the inf on one rank skips the step on all
  # (found-inf combined over ranks); rank 0 holds a third of the optimizer state of 3 ranks.
  write_spike_data
  # Stage 0's run of 3 ranks: what stage 1 without clipping saves, and what it holds.
  same 3 fp32-3 --dropout 0.2
  for ranks in 2 3 4; do
    same "$ranks" "zero1-fp32-$ranks" --dropout 0.2 --clip-grad-norm 0.5 --zero 1
    same "$ranks" "zero1-fp16-$ranks" --precision fp16 --loss-scale dynamic --clip-grad-norm 0.5 \
      --optimizer sgd --momentum 0.9 --zero 1
  done
  mpirun -np 3 "$bigbatch" train $small --dropout 0.2 --data-parallel --zero 1 --save zero1.st > zero1.txt 2>&1 &&
    cmp -s zero1.st mpi-fp32-3.st || fail "stage 1 without clipping did not save stage 0's bytes"
  grep -q 'ZeRO stage 1: each rank holds the optimizer state of its shard' zero1.txt ||
    fail "the header does not say stage 1: $(grep '^data parallel' zero1.txt)"
  awk -v one="$(state zero1.txt)" -v all="$(state mpi-fp32-3.txt)" \
    'BEGIN { exit !(one > 0 && one < all / 3 * 1.01) }' ||
    fail "rank 0's optimizer state under stage 1 is $(state zero1.txt) KiB of $(state mpi-fp32-3.txt)"
  mpirun -np 2 "$bigbatch" train $small --data-parallel --zero 1 --reduction engine --save engine1.st > engine1.txt 2>&1 &&
    mpirun -np 2 "$bigbatch" train $small --data-parallel --zero 1 --save deterministic1.st > deterministic1.txt 2>&1 &&
    cmp -s engine1.st deterministic1.st || fail "the engine's reduce-scatter with 2 ranks saved other bytes"
  mpirun -np 2 "$bigbatch" train $spike --data-parallel --zero 1 --log spike1.jsonl --save spike1.st > spike1.txt 2>&1 ||
    fail "the inf on one rank under stage 1: exit code $? ($(tail -n 3 spike1.txt))"
  sed -n 2p spike1.jsonl | grep -q '"skipped":true' || fail "stage 1: step 2 was not skipped"
  "$bigbatch" train $spike --simulate-ranks 2 --save spike-sim.st > spike-sim.txt 2>&1 &&
    cmp -s spike1.st spike-sim.st || fail "stage 1 did not skip as stage 0 (simulated) did"
  echo "ZeRO stage 1: MPI and simulated ranks saved the same bytes; stage 0's without clipping; rank 0 holds $(state zero1.txt) of $(state mpi-fp32-3.txt) KiB of optimizer state"
  # Snapshots under stage 1 hold the ranks' shards gathered: the simulation's files, byte for
  # byte; resumed from step 4 of 6 (by the job and by the simulation) they save the
  # uninterrupted run's bytes; at stage 0 the snapshot is refused, naming --zero. With 2
  # ranks instead of 3 the whole state is re-sharded: the job continues it as the simulation
  # of 2 ranks does, byte for byte.
  zero1="$zero1_base --zero 1"
  rm -rf zero1-mpi zero1-sim zero1-part zero1-part-simulated zero1-part-2 zero1-part-2-simulated
  mpirun -np 3 "$bigbatch" train $zero1 --data-parallel --snapshot-dir zero1-mpi --snapshot-every 2 \
    --save zero1-whole.st > zero1-whole.txt 2>&1 || fail "stage 1 with snapshots: $(tail -n 3 zero1-whole.txt)"
  "$bigbatch" train $zero1 --simulate-ranks 3 --snapshot-dir zero1-sim --snapshot-every 2 \
    > zero1-sim.txt 2>&1 || fail "stage 1 simulated with snapshots: $(tail -n 3 zero1-sim.txt)"
  for file in zero1-mpi/step-00000004.safetensors zero1-mpi/step-00000006.safetensors; do
    cmp -s "$file" "zero1-sim/${file#zero1-mpi/}" || fail "stage 1: $file is not the simulation's"
  done
  mkdir zero1-part && cp zero1-mpi/step-00000004.safetensors zero1-part/ && cp -r zero1-part zero1-part-simulated
  cp -r zero1-part zero1-part-2 && cp -r zero1-part zero1-part-2-simulated
  mpirun -np 3 "$bigbatch" train $zero1 --data-parallel --resume zero1-part --save zero1-resumed.st \
    > zero1-resumed.txt 2>&1 && cmp -s zero1-resumed.st zero1-whole.st ||
    fail "stage 1 resumed from step 4 did not save the uninterrupted run's bytes: $(tail -n 3 zero1-resumed.txt)"
  "$bigbatch" train $zero1 --simulate-ranks 3 --resume zero1-part-simulated --save zero1-resumed-sim.st \
    > zero1-resumed-sim.txt 2>&1 && cmp -s zero1-resumed-sim.st zero1-whole.st ||
    fail "the simulation resuming stage 1's snapshot did not save the job's bytes"
  refused "stage 0 resuming stage 1's snapshot" "was written with --zero 1, a setting this run does not have" \
    mpirun -np 3 "$bigbatch" train $zero1_base --data-parallel --resume zero1-part
  mpirun -np 2 "$bigbatch" train $zero1 --data-parallel --resume zero1-part-2 --save zero1-resumed-2.st \
    > zero1-resumed-2.txt 2>&1 || fail "2 ranks resuming 3 ranks' stage-1 snapshot: $(tail -n 3 zero1-resumed-2.txt)"
  grep -q "the snapshot was written by 3 ranks, this run has 2: .* re-sharded" zero1-resumed-2.txt ||
    fail "2 ranks resuming 3 ranks' snapshot do not say so: $(grep -A1 '^resumed from' zero1-resumed-2.txt)"
  "$bigbatch" train $zero1 --simulate-ranks 2 --resume zero1-part-2-simulated --save zero1-resumed-2-sim.st \
    > zero1-resumed-2-sim.txt 2>&1 && cmp -s zero1-resumed-2.st zero1-resumed-2-sim.st ||
    fail "2 ranks resuming 3 ranks' stage-1 snapshot: not the simulation's bytes"
  echo "ZeRO stage 1 snapshots: the simulation's bytes; resumed from step 4, the uninterrupted run's bytes; with 2 ranks, re-sharded, the simulation's"
}

part_zero2() {
  # ZeRO stage 2 (--zero 2: each rank also holds its shard of the gradients, summed after
  # every micro-batch): mpirun -np R saves --simulate-ranks R --zero 2's bytes (fp32 with
  # dropout and clipping; fp16 dynamic with SGD and checkpointing); shares of 15, 14 and 14
  # in micro-batches of 7 (3, 2 and 2: ranks 1 and 2 add zeros to the third sum); with one
  # micro-batch per rank, stage 1's bytes (one sum per step, the same additions); rank 0's
  # gradients at the step's peak are fewer than stage 0's, and in fp16 its f32 masters about
  # a third; a snapshot at stage 2 in fp16 is the simulation's, and resumed saves the
  # uninterrupted run's bytes.
  # Stage 0's runs of 3 ranks, fp32 and fp16: the gradients and masters rank 0 holds there.
  same 3 fp32-3 --dropout 0.2
  same 3 fp16-3 --dropout 0.2 --precision fp16 --loss-scale dynamic
  for ranks in 2 3 4; do
    same "$ranks" "zero2-fp32-$ranks" --dropout 0.2 --clip-grad-norm 0.5 --zero 2
    same "$ranks" "zero2-fp16-$ranks" --precision fp16 --loss-scale dynamic --clip-grad-norm 0.5 \
      --optimizer sgd --momentum 0.9 --checkpoint every:2 --zero 2
  done
  grep -q '(3 micro-batches per rank), gradients summed after every micro-batch (deterministic); ZeRO stage 2: each rank holds the optimizer state and the gradient of its shard' mpi-zero2-fp32-3.txt ||
    fail "the header does not say stage 2: $(grep '^data parallel' mpi-zero2-fp32-3.txt)"
  mpirun -np 3 "$bigbatch" train $uneven --data-parallel --save zero2-uneven.st > zero2-uneven.txt 2>&1 ||
    fail "stage 2 with 3, 2 and 2 micro-batches: $(tail -n 3 zero2-uneven.txt)"
  "$bigbatch" train $uneven --simulate-ranks 3 --save zero2-uneven-sim.st > zero2-uneven-sim.txt 2>&1 &&
    cmp -s zero2-uneven.st zero2-uneven-sim.st ||
    fail "stage 2 with 3, 2 and 2 micro-batches: MPI and the simulation differ"
  whole_share="--data synthetic --samples 2000 --depth 3 --hidden 32 --steps 4 --batch 50 --micro-batch 25 --clip-grad-norm 0.5"
  mpirun -np 2 "$bigbatch" train $whole_share --data-parallel --zero 2 --save zero2-one.st > zero2-one.txt 2>&1 &&
    mpirun -np 2 "$bigbatch" train $whole_share --data-parallel --zero 1 --save zero1-one.st > zero1-one.txt 2>&1 &&
    cmp -s zero2-one.st zero1-one.st || fail "stage 2 with one micro-batch per rank did not save stage 1's bytes"
  grads() { sed -n 's/^  gradients  *\([0-9.]*\) KiB.*/\1/p' "$1"; }
  awk -v two="$(grads mpi-zero2-fp32-3.txt)" -v all="$(grads mpi-fp32-3.txt)" \
    'BEGIN { exit !(two > 0 && two < all) }' ||
    fail "rank 0's gradients under stage 2 are $(grads mpi-zero2-fp32-3.txt) KiB at the peak, stage 0's $(grads mpi-fp32-3.txt)"
  grep -q 'ZeRO stage 2: .* (in fp16, its shard of the f32 masters too, and the working copies are what it gathers)' mpi-zero2-fp16-3.txt ||
    fail "the header does not say that stage 2 in fp16 shards the masters: $(grep '^data parallel' mpi-zero2-fp16-3.txt)"
  masters() { sed -n 's/^  master_weights  *\([0-9.]*\) KiB.*/\1/p' "$1"; }
  awk -v two="$(masters mpi-zero2-fp16-3.txt)" -v all="$(masters mpi-fp16-3.txt)" \
    'BEGIN { exit !(two > 0 && two < all / 3 * 1.01) }' ||
    fail "rank 0's f32 masters under stage 2 are $(masters mpi-zero2-fp16-3.txt) KiB at the peak, stage 0's $(masters mpi-fp16-3.txt)"
  # In fp16 each rank holds its shard of the f32 masters: a snapshot gathers them whole (the
  # simulation's bytes), and the resumed ranks shard them again.
  zero2="$zero1_base --precision fp16 --loss-scale dynamic --zero 2"
  rm -rf zero2-mpi zero2-sim zero2-part
  mpirun -np 3 "$bigbatch" train $zero2 --data-parallel --snapshot-dir zero2-mpi --snapshot-every 2 \
    --save zero2-whole.st > zero2-whole.txt 2>&1 || fail "stage 2 with snapshots: $(tail -n 3 zero2-whole.txt)"
  "$bigbatch" train $zero2 --simulate-ranks 3 --snapshot-dir zero2-sim --snapshot-every 4 \
    > zero2-sim.txt 2>&1 || fail "stage 2 simulated with snapshots: $(tail -n 3 zero2-sim.txt)"
  cmp -s zero2-mpi/step-00000004.safetensors zero2-sim/step-00000004.safetensors ||
    fail "stage 2 in fp16: the snapshot of step 4 is not the simulation's"
  mkdir zero2-part && cp zero2-mpi/step-00000004.safetensors zero2-part/
  mpirun -np 3 "$bigbatch" train $zero2 --data-parallel --resume zero2-part --save zero2-resumed.st \
    > zero2-resumed.txt 2>&1 && cmp -s zero2-resumed.st zero2-whole.st ||
    fail "stage 2 resumed from step 4 did not save the uninterrupted run's bytes: $(tail -n 3 zero2-resumed.txt)"
  echo "ZeRO stage 2: MPI and simulated ranks saved the same bytes (uneven micro-batches too); stage 1's with one micro-batch per rank; rank 0's gradients at the peak $(grads mpi-zero2-fp32-3.txt) of $(grads mpi-fp32-3.txt) KiB, its fp16 run's f32 masters $(masters mpi-zero2-fp16-3.txt) of $(masters mpi-fp16-3.txt) KiB; in fp16 a snapshot is the simulation's, and resumed from step 4 saves the uninterrupted run's bytes"
}

part_refusals() {
  # Bad input: exit code 2 and one line on stderr naming the cause.
  refused "4 ranks, batch 3" "4 ranks need a sample each in every batch: --batch is 3" \
    mpirun -np 4 "$bigbatch" train --data synthetic --samples 2000 --steps 1 --batch 3 --data-parallel
  refused "3 simulated ranks, a last batch of 2" "each epoch's last batch has 2" \
    "$bigbatch" train --data synthetic --samples 2000 --steps 1 --batch 899 --simulate-ranks 3
  refused "more simulated ranks than a batch" "--simulate-ranks 99999999999: more ranks than --batch 64" \
    "$bigbatch" train --data synthetic --samples 2000 --steps 1 --batch 64 --simulate-ranks 99999999999
  refused "--norm batch" "--norm batch with 2 ranks" \
    "$bigbatch" train --data synthetic --samples 2000 --steps 1 --norm batch --simulate-ranks 2
  refused "--reduction alone" "--reduction sums the ranks of --data-parallel" \
    "$bigbatch" train --data synthetic --samples 2000 --steps 1 --reduction engine
  refused "--zero alone" "--zero shards the ranks' state: give --data-parallel or --simulate-ranks" \
    "$bigbatch" train --data synthetic --samples 2000 --steps 1 --zero 1
  refused "--zero 3" "expected 0, 1 or 2, got '3'" \
    "$bigbatch" train --data synthetic --samples 2000 --steps 1 --simulate-ranks 2 --zero 3
  # CUDA ranks sum on NCCL; the simulation adds on the CPU: named before the device is
  # looked for, so this holds on a machine without a GPU too.
  refused "CUDA simulated ranks" "with --simulate-ranks: the simulation adds its ranks' gradients on the CPU" \
    "$bigbatch" train --data synthetic --samples 2000 --steps 1 --simulate-ranks 2 --device cuda
  refused "ranks with other settings" "rank 1 has other settings than rank 0" \
    mpirun -np 1 "$bigbatch" train $small --data-parallel : -np 1 "$bigbatch" train $small --seed 7 --data-parallel
}

part_kill() {
  # SIGKILL to one rank mid-run: the job ends, non-zero, within 30 s, no rank left; the
  # run resumes from rank 0's last snapshot with the same ranks and saves the uninterrupted
  # run's bytes, and the simulation of the same R continues the job's snapshot; another R is
  # allowed and says that its bits are not those of the old R (the rank-order sum's bits
  # depend on R): 3 ranks continue the 2 ranks' snapshot as the simulation of 3 does.
  # The kill lands once 15 of the 60 steps are logged: three quarters of the run are still
  # ahead of it, and every run after it is short. 4000 samples hold the 60 batches of 64 in
  # one epoch; each process makes the data set before its first step (20000 took 1 s of
  # every run's 2.7 s here, seven processes in all, and no step's time).
  long="--data synthetic --samples 4000 --depth 4 --hidden 256 --steps 60 --batch 64 --dropout 0.1"
  rm -rf whole part part-simulated kill.jsonl
  mpirun -np 2 "$bigbatch" train $long --data-parallel --snapshot-dir whole --snapshot-every 10 \
    --save whole.st > whole.txt 2>&1 || fail "the uninterrupted run: $(tail -n 3 whole.txt)"
  mpirun -np 2 "$bigbatch" train $long --data-parallel --snapshot-dir part --snapshot-every 10 \
    --log kill.jsonl > kill.txt 2>&1 &
  launcher=$!
  waited=0
  until [ "$( { wc -l < kill.jsonl; } 2> /dev/null || echo 0)" -ge 15 ] || [ $waited -ge 600 ]; do
    sleep 0.2; waited=$((waited + 1))
  done
  [ -s kill.jsonl ] || fail "the run to kill logged no step"
  victim=$(pgrep -n -f "^$bigbatch train .*kill.jsonl") || fail "no rank to kill"
  kill -KILL "$victim"
  killed_at=$(date +%s)
  wait $launcher
  code=$?
  took=$(( $(date +%s) - killed_at ))
  [ $code -ne 0 ] || fail "mpirun exited 0 after a rank was killed"
  [ $took -le 30 ] || fail "the job took $took s to end after a rank was killed"
  ! pgrep -f "^$bigbatch train .*kill.jsonl" > /dev/null || fail "a rank is still running"
  echo "a rank killed with SIGKILL after step $(wc -l < kill.jsonl): mpirun exited with $code after $took s, no rank left"
  ls part/step-*.safetensors > /dev/null 2>&1 || fail "no snapshot was written before the kill"
  last=$(ls part/step-*.safetensors | tail -n 1)
  cp -r part part-simulated
  mpirun -np 2 "$bigbatch" train $long --data-parallel --resume part --snapshot-every 10 \
    --save resumed.st > resumed.txt 2>&1 || fail "the resumed run: $(tail -n 3 resumed.txt)"
  grep -q "^resumed from part/step-" resumed.txt || fail "the resumed run does not say so"
  cmp -s whole.st resumed.st || fail "the resumed run did not save the uninterrupted run's bytes"
  "$bigbatch" train $long --simulate-ranks 2 --resume part-simulated --save resumed-simulated.st \
    > resumed-simulated.txt 2>&1 || fail "the simulation resuming the job's snapshot: $(tail -n 3 resumed-simulated.txt)"
  cmp -s whole.st resumed-simulated.st || fail "the simulation did not continue the job's snapshot to its bytes"
  echo "resumed from $last with 2 ranks (and simulated): the uninterrupted run's bytes"
  rm -rf by-2 by-3 by-3-simulated
  mpirun -np 2 "$bigbatch" train $small --data-parallel --snapshot-dir by-2 --snapshot-every 2 \
    > by-2.txt 2>&1 || fail "2 ranks with snapshots: $(tail -n 3 by-2.txt)"
  mkdir by-3 && cp by-2/step-00000002.safetensors by-3/ && cp -r by-3 by-3-simulated
  mpirun -np 3 "$bigbatch" train $small --data-parallel --resume by-3 --save resumed-3.st \
    > resumed-3.txt 2>&1 || fail "3 ranks resuming 2 ranks' snapshot: $(tail -n 3 resumed-3.txt)"
  grep -q "^the snapshot was written by 2 ranks, this run has 3: the same batches and state go on" resumed-3.txt ||
    fail "3 ranks resuming 2 ranks' snapshot do not say so: $(grep -A1 '^resumed from' resumed-3.txt)"
  "$bigbatch" train $small --simulate-ranks 3 --resume by-3-simulated --save resumed-3-sim.st \
    > resumed-3-sim.txt 2>&1 && cmp -s resumed-3.st resumed-3-sim.st ||
    fail "3 ranks resuming 2 ranks' snapshot: not the simulation's bytes"
  echo "3 ranks resuming 2 ranks' snapshot: the simulation of 3 ranks' bytes, and said so"
}

part_overlap() {
  # Overlap (--bucket-size): the sums start during the last micro-batch's backward (at
  # stage 2 every micro-batch's), in buckets (1 byte: every group of gradients its own; 2KiB:
  # a few groups each). Under the deterministic reduction the bytes are those of the
  # simulation (each run here, with the flags of the parts ranks, zero1 and zero2) at stages
  # 0, 1 and 2, with dropout, fp16's dynamic scale, checkpointing, clipping and uneven
  # micro-batch counts; the engine's with 2 ranks too (the deterministic run's bytes, which
  # the part ranks shows are the simulation's). Ranks with other bucket sizes would exchange
  # other messages: refused like other settings.
  for ranks in 2 3 4; do
    overlapped "$ranks" "fp32-$ranks" 1 --dropout 0.2
    overlapped "$ranks" "zero1-fp32-$ranks" 2KiB --dropout 0.2 --clip-grad-norm 0.5 --zero 1
  done
  overlapped 3 fp16-3 2KiB --dropout 0.2 --precision fp16 --loss-scale dynamic
  overlapped 3 bf16-3 1 --precision bf16 --checkpoint every:2
  # Stage 2 in buckets during every backward (the part zero2's flags): fp32 with clipping,
  # fp16 dynamic with SGD and checkpointing, and 3, 2 and 2 micro-batches (ranks 1 and 2 join
  # rank 0's third round with zeros, bucket by bucket).
  for ranks in 2 3 4; do
    overlapped "$ranks" "zero2-fp32-$ranks" 2KiB --dropout 0.2 --clip-grad-norm 0.5 --zero 2
  done
  overlapped 3 zero2-fp16-3 1 --precision fp16 --loss-scale dynamic --clip-grad-norm 0.5 \
    --optimizer sgd --momentum 0.9 --checkpoint every:2 --zero 2
  grep -q 'overlapping every backward in buckets of 2.00 KiB; ZeRO stage 2' overlap-zero2-fp32-3.txt ||
    fail "the header does not say that stage 2 overlaps every backward: $(grep '^data parallel' overlap-zero2-fp32-3.txt)"
  "$bigbatch" train $uneven --simulate-ranks 3 --save zero2-uneven-sim.st > zero2-uneven-sim.txt 2>&1 ||
    fail "stage 2 with 3, 2 and 2 micro-batches, simulated: $(tail -n 3 zero2-uneven-sim.txt)"
  mpirun -np 3 "$bigbatch" train $uneven --data-parallel --bucket-size 1 --save zero2-uneven-overlap.st \
    > zero2-uneven-overlap.txt 2>&1 && cmp -s zero2-uneven-overlap.st zero2-uneven-sim.st ||
    fail "stage 2 in buckets with 3, 2 and 2 micro-batches: not the simulation's bytes ($(tail -n 3 zero2-uneven-overlap.txt))"
  grep -q '^data parallel: 3 ranks under MPI, .* (deterministic), overlapping the last backward in buckets of 2.00 KiB$' overlap-fp16-3.txt ||
    fail "the header does not describe the buckets: $(grep '^data parallel' overlap-fp16-3.txt)"
  mpirun -np 2 "$bigbatch" train $small --dropout 0.2 --data-parallel --reduction engine --bucket-size 1 \
    --save overlap-engine.st > overlap-engine.txt 2>&1 && cmp -s overlap-engine.st sim-fp32-2.st ||
    fail "the engine's sums in buckets with 2 ranks saved other bytes than the deterministic ones"
  echo "overlap: R = 2, 3, 4 summing in buckets during the last backward (at stage 2 every backward) saved the simulation's bytes"
  refused "--bucket-size without --data-parallel" "--bucket-size overlaps the ranks' sum under --data-parallel" \
    "$bigbatch" train --data synthetic --samples 2000 --steps 1 --simulate-ranks 2 --bucket-size 1MiB
  refused "--bucket-size lots" "cannot read 'lots' as a size" \
    "$bigbatch" train --data synthetic --samples 2000 --steps 1 --data-parallel --bucket-size lots
  refused "ranks with other bucket sizes" "rank 1 has other settings than rank 0" \
    timeout 60 mpirun -np 1 "$bigbatch" train $small --data-parallel : -np 1 "$bigbatch" train $small --bucket-size 1 --data-parallel
}

part_plan() {
  # --plan auto on ranks: rank 0 plans its share (128 of 256), under --zero 1 with its
  # shard of the optimizer state, and every rank trains rank 0's plan; rank 0's measured
  # step peak is the plan's, to the byte. 4.5 MiB fits rank 0's step at stage 1 (3.63 MiB
  # at least) and none at stage 0 (4.84 MiB at least), which exits with 3, naming the
  # smallest. The plan's flags given by hand to --simulate-ranks 2 save the job's bytes;
  # --plan with --simulate-ranks is refused (the simulation holds every rank's gradients).
  planned="--data synthetic --samples 600 --depth 8 --hidden 64 --batch 256 --steps 2 --calibration plan-calibration.json"
  mpirun -np 2 "$bigbatch" train $planned --device-memory 4.5MiB --plan auto --zero 1 --data-parallel \
    --explain --log planned.jsonl --save planned.st > planned.txt 2>&1 ||
    fail "--plan auto on 2 ranks at stage 1: exit code $? ($(tail -n 3 planned.txt))"
  grep -q '^rank 0 of 2 (ZeRO stage 1): its share of 128 samples of each batch; the gradient sum is not in the step times' planned.txt ||
    fail "--plan auto on ranks does not plan rank 0's share: $(grep -m 1 '^rank 0' planned.txt)"
  predicted=$(sed -n 's/^predicted step peak .* (\([0-9]*\) bytes), at: .*/\1/p' planned.txt)
  [ -n "$predicted" ] && [ "$predicted" -le 4718592 ] || fail "the plan's peak ${predicted:-?} is not within 4.5 MiB"
  [ "$(grep -c "\"peak_bytes_total\":$predicted," planned.jsonl)" -eq 2 ] ||
    fail "rank 0's measured peaks are not the predicted $predicted: $(grep -o '"peak_bytes_total":[0-9]*' planned.jsonl | tr '\n' ' ')"
  chosen=$(sed -n 's/^plan auto: micro-batch \([0-9]*\) ([0-9]* per step), \([a-z0-9]*\).*, checkpoint \(.*\)$/--micro-batch \1 --precision \2 --checkpoint \3/p' planned.txt)
  [ -n "$chosen" ] || fail "no plan named: $(grep '^plan auto' planned.txt)"
  case $chosen in *fp16*) chosen="$chosen --loss-scale dynamic" ;; esac
  "$bigbatch" train $planned --zero 1 --simulate-ranks 2 $chosen --save planned-sim.st > planned-sim.txt 2>&1 &&
    cmp -s planned.st planned-sim.st || fail "the job's plan ($chosen) by hand, simulated, saved other bytes"
  # A 16-bit plan of the table fits too: the ranks hold their shards of the f32 masters from
  # the moment they take the model, before the optimizer's state is made (whole masters
  # beside the shards and the state would not fit the 4.5 MiB).
  mpirun -np 2 "$bigbatch" train $planned --device-memory 4.5MiB --micro-batch 64 --precision bf16 \
    --checkpoint selective --zero 1 --data-parallel > planned-bf16.txt 2>&1 ||
    fail "the bf16 plan on 2 ranks at stage 1 under 4.5 MiB: $(tail -n 3 planned-bf16.txt)"
  code=0
  mpirun -np 2 "$bigbatch" train $planned --device-memory 4.5MiB --plan auto --data-parallel \
    > planned0.txt 2> planned0.err || code=$?
  [ $code -eq 3 ] && grep -q 'no plan fits the step in 4.50 MiB: the smallest predicted peak is 4.84 MiB' planned0.err ||
    fail "--plan auto at stage 0 under 4.5 MiB: exit code $code, $(head -n 1 planned0.err)"
  # --explain predicts rank 0's step without a plan too: micro-batches of 200 over shares of
  # 128 stage 128 rows (the whole batch's step would stage 200).
  mpirun -np 2 "$bigbatch" train $planned --micro-batch 200 --data-parallel --explain --log explained.jsonl \
    > explained.txt 2>&1 || fail "--explain on 2 ranks: $(tail -n 3 explained.txt)"
  predicted200=$(sed -n 's/^predicted step peak .* (\([0-9]*\) bytes), at: .*/\1/p' explained.txt)
  [ -n "$predicted200" ] && [ "$(grep -c "\"peak_bytes_total\":$predicted200," explained.jsonl)" -eq 2 ] ||
    fail "--explain on ranks: the measured peaks are not the predicted ${predicted200:-?}: $(grep -o '"peak_bytes_total":[0-9]*' explained.jsonl | tr '\n' ' ')"
  # Stage 2 holds a shard of the gradients: 3.5 MiB fits rank 0's step there, with its
  # measured peaks the plan's, and none at stage 1 (3.63 MiB at least).
  mpirun -np 2 "$bigbatch" train $planned --device-memory 3.5MiB --plan auto --zero 2 --data-parallel \
    --explain --log planned2.jsonl > planned2.txt 2>&1 ||
    fail "--plan auto on 2 ranks at stage 2 under 3.5 MiB: exit code $? ($(tail -n 3 planned2.txt))"
  predicted2=$(sed -n 's/^predicted step peak .* (\([0-9]*\) bytes), at: .*/\1/p' planned2.txt)
  [ -n "$predicted2" ] && [ "$predicted2" -le 3670016 ] &&
    [ "$(grep -c "\"peak_bytes_total\":$predicted2," planned2.jsonl)" -eq 2 ] ||
    fail "stage 2's plan under 3.5 MiB: predicted ${predicted2:-?}, measured $(grep -o '"peak_bytes_total":[0-9]*' planned2.jsonl | tr '\n' ' ')"
  code=0
  mpirun -np 2 "$bigbatch" train $planned --device-memory 3.5MiB --plan auto --zero 1 --data-parallel \
    > planned1.txt 2> planned1.err || code=$?
  [ $code -eq 3 ] && grep -q 'no plan fits the step in 3.50 MiB: the smallest predicted peak is 3.63 MiB' planned1.err ||
    fail "--plan auto at stage 1 under 3.5 MiB: exit code $code, $(head -n 1 planned1.err)"
  echo "--plan auto on 2 ranks: rank 0's share planned ($chosen), its peak $predicted bytes as measured; stage 0 fits nothing in 4.5 MiB; --explain predicts rank 0's step ($predicted200 bytes); stage 2 fits 3.5 MiB ($predicted2 bytes, as measured), stage 1 does not"
  refused "--plan with --simulate-ranks" "--simulate-ranks does not take --plan" \
    "$bigbatch" train $planned --device-memory 4.5MiB --plan auto --simulate-ranks 2
}

part_gpt() {
  # Chapter 08's GPT on ranks: documents of uneven lengths in sequences of 24 positions, a
  # batch of 8 in shares of 3, 3 and 2 sequences, every rank dividing its target tokens' loss
  # by the whole batch's count. The job saves the simulation's bytes (fp32 with dropout, bf16
  # with checkpointed blocks); rank 0's steps peak where its share's step is predicted
  # (nn::predict_step); --plan auto plans rank 0's share for every rank.
  "$(dirname "$0")/write_corpus.sh" corpus.txt || fail "cannot write corpus.txt"
  gpt="--model gpt --data text:corpus.txt --seq-len 24 --layers 2 --width 32 --heads 4 --batch 8 --steps 4 --lr 1e-2 --seed 5"
  same_gpt() {  # same_gpt NAME FLAGS...: 3 ranks under MPI and simulated save the same bytes
    name=$1
    shift
    mpirun -np 3 "$bigbatch" train $gpt "$@" --data-parallel --save "mpi-$name.st" --log "mpi-$name.jsonl" \
      > "mpi-$name.txt" 2>&1 || fail "mpirun -np 3 ($name): exit code $? ($(tail -n 3 "mpi-$name.txt"))"
    "$bigbatch" train $gpt "$@" --simulate-ranks 3 --save "sim-$name.st" > "sim-$name.txt" 2>&1 ||
      fail "--simulate-ranks 3 ($name): $(tail -n 3 "sim-$name.txt")"
    cmp -s "mpi-$name.st" "sim-$name.st" || fail "the GPT on 3 ranks under MPI and simulated differ ($name)"
  }
  same_gpt gpt-fp32 --dropout 0.1 --micro-batch 2 --explain
  same_gpt gpt-bf16 --dropout 0.1 --precision bf16 --checkpoint every:1
  grep -q '^data parallel: 3 ranks under MPI, shares of 2 to 3 samples of each batch of 8 (2 micro-batches per rank)' mpi-gpt-fp32.txt ||
    fail "the GPT's ranks are not described: $(grep '^data parallel' mpi-gpt-fp32.txt)"
  predicted_gpt=$(sed -n 's/^predicted step peak .* (\([0-9]*\) bytes), at: .*/\1/p' mpi-gpt-fp32.txt)
  [ -n "$predicted_gpt" ] && [ "$(grep -c "\"peak_bytes_total\":$predicted_gpt," mpi-gpt-fp32.jsonl)" -eq 4 ] ||
    fail "the GPT on ranks: rank 0's peaks are not the predicted ${predicted_gpt:-?}: $(grep -o '"peak_bytes_total":[0-9]*' mpi-gpt-fp32.jsonl | tr '\n' ' ')"
  mpirun -np 2 "$bigbatch" train $gpt --data-parallel --reduction engine > gpt-engine.txt 2>&1 ||
    fail "the GPT with the engine's reduction on 2 ranks: $(tail -n 3 gpt-engine.txt)"
  planned_gpt() {  # planned_gpt NAME BYTES: --plan auto on 2 ranks under BYTES, logged to NAME.jsonl
    mpirun -np 2 "$bigbatch" train $gpt --data-parallel --plan auto --device-memory "$2" \
      --calibration gpt-cal.json --log "$1.jsonl" > "$1.txt" 2>&1 ||
      fail "--plan auto for the GPT on 2 ranks under $2 bytes: $(tail -n 3 "$1.txt")"
  }
  largest_peak() { sed 's/.*"peak_bytes_total":\([0-9]*\).*/\1/' "$1" | sort -n | tail -n 1; }
  planned_gpt gpt-planned "$predicted_gpt"
  grep -q '^plan auto: micro-batch [0-9]* ([0-9]* per step), ' gpt-planned.txt ||
    fail "--plan auto on ranks does not say what it chose: $(head -n 3 gpt-planned.txt)"
  largest_gpt=$(largest_peak gpt-planned.jsonl)
  [ "$largest_gpt" -le "$predicted_gpt" ] ||
    fail "--plan auto on ranks under $predicted_gpt bytes: rank 0's step peaked at $largest_gpt"
  # At the smallest peak of rank 0's share (4 sequences) only memory-efficient attention's plan
  # fits: every rank trains that kernel (rank 0 sends it with the plan), rank 0 peaking there.
  gpt_share="--model gpt --data text:corpus.txt --seq-len 24 --layers 2 --width 32 --heads 4 --batch 4"
  "$bigbatch" plan $gpt_share --device-memory 64KiB --calibration gpt-cal.json --json > gpt-tight.json 2> /dev/null
  smallest_gpt=$(python3 -c 'import json; s = json.load(open("gpt-tight.json"))["smallest"]
assert s["attention"] == "efficient", s; print(s["peak_bytes"])') ||
    fail "the smallest plan of rank 0's share is not efficient attention's: $(cat gpt-tight.json)"
  planned_gpt gpt-tight "$smallest_gpt"
  grep -q '^plan auto: .*, efficient attention$' gpt-tight.txt ||
    fail "--plan auto on ranks at the smallest peak did not choose efficient attention: $(grep '^plan auto' gpt-tight.txt)"
  [ "$(largest_peak gpt-tight.jsonl)" = "$smallest_gpt" ] ||
    fail "--plan auto on ranks, efficient attention: rank 0 did not peak at the predicted $smallest_gpt"
  echo "the GPT on 3 ranks: MPI and simulated saved the same bytes (fp32, bf16 checkpointed); rank 0's steps peaked at the predicted $predicted_gpt bytes; --plan auto on 2 ranks fits them, and trains efficient attention on every rank at its smallest peak"
}

# ---- the part asked for ------------------------------------------------------------------
all="ranks zero1 zero2 refusals kill overlap plan gpt"
case " $all all " in
  *" $part "*) ;;
  *) echo "check_data_parallel.sh: no part '$part': expected one of $all, or all" >&2; exit 2 ;;
esac
[ "$part" != all ] || part=$all
for name in $part; do
  echo "---- $name"
  rm -rf "data_parallel/$name" && mkdir -p "data_parallel/$name" &&
    (cd "data_parallel/$name" && "part_$name") || exit 1
done
echo "ok"
