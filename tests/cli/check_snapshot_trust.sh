#!/bin/sh
# check_snapshot_trust.sh BIGBATCH
# Snapshots that can be trusted, on real processes:
# - a bit flipped in the newest snapshot's tensor bytes: --resume exits 2 with one line
#   that names the file and the damaged tensor and the older snapshot that is intact;
#   moved aside, the run resumes from that older one and ends with the uninterrupted
#   run's parameters, byte for byte;
# - a bit flipped in a --save file: --init exits 2 naming the file and the tensor;
# - a snapshot's header edited (python3): its counters changed consistently, its counters
#   inconsistent under a recomputed header checksum, a tensor's checksum deleted, the
#   header's checksum deleted: --resume exits 2 with one line naming the file, what is
#   wrong and the older snapshot that is intact;
# - a folder that holds another run's snapshots: a new run there exits 2 naming the folder,
#   its newest snapshot and --resume, and changes nothing in it;
# - a folder another run is using: a second run exits 2 naming the folder and the first
#   run's pid, and once the first is killed (SIGKILL) a third run takes the folder;
# - a snapshot written without ranks resumed with --simulate-ranks, and one written on
#   ranks resumed without: exit 2, one line naming --resume and the rule (no --ranks flag,
#   which does not exist).
set -u
bigbatch=$1
run="--data synthetic --samples 2000 --depth 2 --hidden 32 --batch 64 --micro-batch 24 --precision fp16 --loss-scale dynamic"
failures=0
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }
rm -rf trust && mkdir trust && cd trust || exit 1

# flip FILE: inverts one bit of FILE's last byte (the end of its byte buffer: a tensor's).
flip() {
  size=$(wc -c < "$1")
  last=$(tail -c 1 "$1" | od -An -tu1 | tr -d ' ')
  head -c $((size - 1)) "$1" > flipped.tmp
  printf "\\$(printf %03o $(( last ^ 16 )))" >> flipped.tmp
  mv flipped.tmp "$1"
}

"$bigbatch" train $run --steps 6 --save straight.safetensors > straight.txt ||
  fail "the uninterrupted run failed"
"$bigbatch" train $run --steps 6 --snapshot-dir snaps --snapshot-every 2 --snapshot-keep 3 \
  > first.txt || fail "the run that writes the snapshots failed"
[ -f snaps/step-00000006.safetensors ] && [ -f snaps/step-00000004.safetensors ] ||
  fail "the snapshots of steps 4 and 6 are not there: $(ls snaps)"

# The newest damaged, then the one before it too: the refusal names the newest intact one.
flip snaps/step-00000006.safetensors
"$bigbatch" train $run --steps 6 --resume snaps > resumed.txt 2> err.txt
code=$?
cat err.txt
[ $code -eq 2 ] || fail "a damaged snapshot was resumed (exit $code)"
[ "$(wc -l < err.txt)" -eq 1 ] || fail "the refusal is not one line"
grep -q 'step-00000006.safetensors: tensor ".*" is damaged' err.txt ||
  fail "the refusal does not name the file and the damaged tensor"
grep -q 'the older snapshot snaps/step-00000004.safetensors is intact' err.txt ||
  fail "the refusal does not name the older snapshot that is intact"
flip snaps/step-00000004.safetensors
"$bigbatch" train $run --steps 6 --resume snaps > resumed.txt 2> err.txt
cat err.txt
grep -q 'the older snapshot snaps/step-00000002.safetensors is intact' err.txt ||
  fail "with two damaged, the refusal does not name the newest intact one"

mkdir damaged && mv snaps/step-00000006.safetensors snaps/step-00000004.safetensors damaged/
"$bigbatch" train $run --steps 6 --resume snaps --save resumed.safetensors > resumed.txt ||
  fail "resuming from the intact snapshot failed"
grep -q 'resumed from snaps/step-00000002.safetensors after step 2' resumed.txt ||
  fail "the run did not resume after step 2: $(grep resumed resumed.txt)"
cmp straight.safetensors resumed.safetensors ||
  fail "resumed from the older snapshot, the run ends with other parameters"

# Edited headers. edit FILE WHAT rewrites FILE's header (the same length, padded with
# spaces as the format allows): "steps" makes it a step-4 snapshot (steps, steps taken and
# samples together), "samples" adds one to the samples seen and recomputes the header's
# checksum as bigbatch does (so only the counters' cross-check is left to catch it),
# "tensor-crc" deletes a tensor's checksum, "header-crc" the header's own.
edit() {
  python3 - "$1" "$2" <<'EDIT'
import json, struct, sys, zlib
path, what = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
(length,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + length])
meta = header["__metadata__"]
if what == "steps":
    done = int(meta["state.steps_done"])
    meta["state.samples_done"] = str(int(meta["state.samples_done"]) // done * 4)
    meta["state.optimizer_steps"] = str(int(meta["state.optimizer_steps"]) - (done - 4))
    meta["state.steps_done"] = "4"
elif what == "samples":
    meta["state.samples_done"] = str(int(meta["state.samples_done"]) + 1)
    text = "".join(f"{k}={v}\n" for k, v in sorted(meta.items())
                   if not k.startswith("crc32.") and k != "snapshot.crc32")
    meta["snapshot.crc32"] = "%08x" % zlib.crc32(text.encode())
elif what == "tensor-crc":
    del meta[next(k for k in meta if k.startswith("crc32.model."))]
elif what == "header-crc":
    del meta["snapshot.crc32"]
text = json.dumps(header, separators=(",", ":")).encode()
assert len(text) <= length, "the edit makes the header longer"
open(path, "wb").write(data[:8] + text + b" " * (length - len(text)) + data[8 + length:])
EDIT
}
"$bigbatch" train $run --steps 6 --snapshot-dir pristine --snapshot-every 2 --snapshot-keep 3 \
  > /dev/null || fail "the run that writes the snapshots to edit failed"
for case in "steps|its settings and counters are damaged: they have CRC-32" \
            "samples|its counters do not agree (Trainer::restore: 385 samples seen, but 6 steps take 384)" \
            "tensor-crc|\" has no checksum (no \"crc32.model." \
            "header-crc|its settings and counters carry no checksum (no \"snapshot.crc32\")"; do
  what=${case%%|*} expected=${case#*|}
  rm -rf "edited-$what" && cp -r pristine "edited-$what"
  edit "edited-$what/step-00000006.safetensors" "$what" || fail "cannot edit a header ($what)"
  "$bigbatch" train $run --steps 6 --resume "edited-$what" > /dev/null 2> err.txt
  code=$?
  cat err.txt
  [ $code -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] &&
    grep -qF -- "edited-$what/step-00000006.safetensors: " err.txt && grep -qF -- "$expected" err.txt &&
    grep -qF -- "the older snapshot edited-$what/step-00000004.safetensors is intact" err.txt ||
    fail "a snapshot edited ($what) was not refused by name (exit $code)"
done

cp straight.safetensors init.safetensors
flip init.safetensors
"$bigbatch" train $run --steps 1 --init init.safetensors > /dev/null 2> err.txt
code=$?
cat err.txt
[ $code -eq 2 ] && grep -q -- '--init: init.safetensors: tensor ".*" is damaged' err.txt ||
  fail "a damaged --init file was not refused by name (exit $code)"

# One run per folder: a new run (another --lr) in a folder that holds another run's
# snapshots is refused before training, naming the folder, its newest snapshot and
# --resume, and the folder is left as it was (keeping the newest would have counted the
# other run's later steps as newer and deleted the new run's); so is --resume from one
# folder with --snapshot-dir naming one that holds snapshots.
"$bigbatch" train $run --steps 6 --snapshot-dir older --snapshot-every 3 > /dev/null ||
  fail "the run that fills the folder failed"
ls -l --time-style=+%s.%N older > older.before
"$bigbatch" train $run --lr 0.05 --steps 14 --snapshot-dir older --snapshot-every 7 \
  --snapshot-keep 1 > newer.txt 2> err.txt
code=$?
cat err.txt
[ $code -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] &&
  grep -q -- '--snapshot-dir older holds the snapshots of another run (the newest: older/step-00000006.safetensors): continue that run with --resume older' err.txt ||
  fail "a new run in another run's snapshot folder was not refused by name (exit $code)"
ls -l --time-style=+%s.%N older | cmp -s - older.before ||
  fail "the refused run changed the folder: $(ls older)"
"$bigbatch" train $run --steps 8 --resume snaps --snapshot-dir older > /dev/null 2> err.txt
code=$?
[ $code -eq 2 ] && grep -q -- '--snapshot-dir older holds the snapshots of another run' err.txt ||
  fail "--resume into a folder with another run's snapshots was not refused (exit $code)"
"$bigbatch" train $run --steps 6 --resume older --snapshot-every 1 > /dev/null ||
  fail "continuing the folder's own run with --resume was refused"

# Ranks on one side only: the rule named, in the flags that exist.
"$bigbatch" train $run --steps 6 --resume older --simulate-ranks 2 > /dev/null 2> err.txt
code=$?
cat err.txt
[ $code -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] &&
  grep -q -- 'bigbatch train: --resume: older/step-00000006.safetensors was written by a run without ranks, and this run has 2: a snapshot written on ranks resumes on ranks' err.txt &&
  ! grep -q -- '--ranks' err.txt ||
  fail "a snapshot without ranks resumed with --simulate-ranks 2 was not refused by its rule (exit $code)"
"$bigbatch" train $run --steps 4 --simulate-ranks 2 --snapshot-dir ranked > /dev/null ||
  fail "the run on simulated ranks failed"
"$bigbatch" train $run --steps 4 --resume ranked > /dev/null 2> err.txt
code=$?
cat err.txt
[ $code -eq 2 ] && grep -q -- 'was written by a run on ranks, and this run has none' err.txt &&
  ! grep -q -- '--ranks' err.txt ||
  fail "a snapshot on ranks resumed without them was not refused by its rule (exit $code)"

# One run at a time per folder.
"$bigbatch" train $run --steps 100000 --snapshot-dir busy > holder.txt 2>&1 &
holder=$!
waited=0
until [ "$(cat busy/.lock 2>/dev/null)" = "$holder" ] || [ $waited -ge 600 ]; do
  sleep 0.05
  waited=$((waited + 1))
done
"$bigbatch" train $run --steps 1 --snapshot-dir busy > /dev/null 2> err.txt
code=$?
cat err.txt
[ $code -eq 2 ] || fail "a second run took a folder in use (exit $code)"
grep -q "the snapshot folder busy is in use by another run (pid $holder)" err.txt ||
  fail "the refusal does not name the folder and the holder's pid $holder"
"$bigbatch" train $run --steps 1 --resume busy > /dev/null 2> err.txt
grep -q "in use by another run (pid $holder)" err.txt ||
  fail "--resume read a folder in use: $(cat err.txt)"
kill -9 $holder
wait $holder 2> /dev/null
"$bigbatch" train $run --steps 1 --snapshot-dir busy > after.txt 2>&1 ||
  fail "after the holder was killed the folder stays locked: $(cat after.txt)"

if [ $failures -gt 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "PASSED: damaged snapshots and parameter files refused by name, a folder holds one run and serves one at a time, ranks resume on ranks"
