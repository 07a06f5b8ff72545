#!/usr/bin/env bash
# Chapter 07's measurement on this machine: the same training step as 1 process with 2
# threads and as 2 MPI ranks with 1 thread each (each rank bound to a core; the
# deterministic reduction and the engine's, ZeRO stages 1 and 2, and the deterministic sum
# overlapping the last backward in buckets), the time per step, the part of it spent
# summing the gradients over the ranks (and under ZeRO gathering the parameters; with
# overlap, the calls inside the backward and the wait after it), and rank 0's peak bytes
# with its optimizer state and gradients. Fashion-MNIST, depth 4, hidden 512, batch 1024 in
# micro-batches of 256, AdamW, 12 steps each; medians of steps 3 to 12 from --log. Writes
# this machine's results folder (scripts/results-folder.sh)/data-parallel.json, which
# scripts/readme_numbers.py turns into chapter 07's table. About two minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/results-folder.sh
scripts/build.sh > /dev/null
bigbatch=build/chapters/cli/bigbatch
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run="--data fashion-mnist --depth 4 --hidden 512 --batch 1024 --micro-batch 256 --steps 12"
# Overlap: a block's gradients are 8 MiB here, so buckets of 4 MiB start each block's sum
# as soon as its backward ends (DDP's 25 MiB would hold three blocks before the first sum).
bucket=4MiB

echo "1 process, 2 threads"
OMP_NUM_THREADS=2 "$bigbatch" train $run --log "$work/one.jsonl" > "$work/one.txt"
for reduction in deterministic engine; do
  echo "2 ranks, 1 thread each, $reduction reduction"
  OMP_NUM_THREADS=1 mpirun -np 2 --bind-to core -x OMP_NUM_THREADS "$bigbatch" train $run \
    --data-parallel --reduction "$reduction" --log "$work/$reduction.jsonl" > "$work/$reduction.txt"
done
echo "2 ranks, 1 thread each, deterministic reduction, ZeRO stage 1"
OMP_NUM_THREADS=1 mpirun -np 2 --bind-to core -x OMP_NUM_THREADS "$bigbatch" train $run \
  --data-parallel --zero 1 --log "$work/zero1.jsonl" > "$work/zero1.txt"
echo "2 ranks, 1 thread each, deterministic reduction, ZeRO stage 2"
OMP_NUM_THREADS=1 mpirun -np 2 --bind-to core -x OMP_NUM_THREADS "$bigbatch" train $run \
  --data-parallel --zero 2 --log "$work/zero2.jsonl" > "$work/zero2.txt"
echo "2 ranks, 1 thread each, deterministic reduction, overlapped in buckets of $bucket"
OMP_NUM_THREADS=1 mpirun -np 2 --bind-to core -x OMP_NUM_THREADS "$bigbatch" train $run \
  --data-parallel --bucket-size "$bucket" --log "$work/overlap.jsonl" > "$work/overlap.txt"

python3 - "$work" "$results_dir/data-parallel.json" "$run" "$bucket" <<'PYTHON'
import datetime, json, pathlib, statistics, subprocess, sys
work, out, run, bucket = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4]
def medians(name):
    steps = [json.loads(line) for line in (work / f"{name}.jsonl").read_text().splitlines()][2:]
    step = statistics.median(s["step_time_s"] for s in steps)
    reduce = statistics.median(s.get("reduce_time_s", 0.0) for s in steps)
    # Rank 0's log: its step's peak and, of it, the optimizer state (the largest shard's
    # under ZeRO) and the gradients, the highest over the steps measured.
    peak = max(s["peak_bytes_total"] for s in steps)
    state = max(s["peak_bytes"]["optimizer_state"] for s in steps)
    gradients = max(s["peak_bytes"]["gradients"] for s in steps)
    return {"steps_measured": len(steps), "step_ms": 1e3 * step, "reduce_ms": 1e3 * reduce,
            "rank0_peak_bytes": peak, "rank0_optimizer_state_bytes": state,
            "rank0_gradient_bytes": gradients}
cpu = subprocess.run(["build/chapters/cli/bigbatch", "--version"], capture_output=True,
                     text=True).stdout.splitlines()[-1].removeprefix("CPU: ")
mpi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
rows = [dict(name="1 process, 2 threads", ranks=1, threads=2, reduction=None, zero=0,
             **medians("one"))]
for reduction in ("deterministic", "engine"):
    rows.append(dict(name=f"2 ranks, 1 thread each, {reduction}", ranks=2, threads=1,
                     reduction=reduction, zero=0, **medians(reduction)))
rows.append(dict(name="2 ranks, 1 thread each, deterministic, ZeRO stage 1", ranks=2,
                 threads=1, reduction="deterministic", zero=1, **medians("zero1")))
rows.append(dict(name="2 ranks, 1 thread each, deterministic, ZeRO stage 2", ranks=2,
                 threads=1, reduction="deterministic", zero=2, **medians("zero2")))
rows.append(dict(name=f"2 ranks, 1 thread each, deterministic, overlapped in {bucket} buckets",
                 ranks=2, threads=1, reduction="deterministic", zero=0, bucket=bucket,
                 **medians("overlap")))
out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "cpu": cpu, "mpi": mpi,
                           "run": run, "rows": rows}, indent=1) + "\n")
for row in rows:
    print(f"{row['name']:52s} {row['step_ms']:8.1f} ms/step, summing {row['reduce_ms']:6.1f} ms, "
          f"rank 0 peak {row['rank0_peak_bytes'] / 2**20:.2f} MiB")
print(f"wrote {out}")
PYTHON
