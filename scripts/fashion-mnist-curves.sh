#!/usr/bin/env bash
# Training curves on Fashion-MNIST: the model and settings of scripts/techniques-table.sh
# (depth 2, hidden 256, AdamW lr 1e-3, seed 0, batch 1024) trained five ways for the same
# epochs, with the training loss of every step (--log) and the test split's loss and
# accuracy every EVAL_EVERY steps (--eval-every: they go into the same log lines) and at the
# end:
#   fp32                     the batch in one piece
#   accumulated              fp32, 8 micro-batches of 128
#   fp16-dynamic             fp16, micro-batches of 128, dynamic loss scaling
#   fp16-dynamic-checkpoint  the same with --checkpoint every:1
#   bf16                     bf16, micro-batches of 128, no loss scale
# Accumulation and checkpointing are bit for bit (chapters 02 and 05): the script compares
# the saved parameters of every two runs and records the pairs that are identical, with the
# largest relative difference of their logged losses (a loss is a sum over the batch's rows,
# added in another order when the batch comes in micro-batches, so it can differ in its
# last bits while the parameters do not); it fails when accumulated and fp32 differ.
# When EVAL_EVERY does not divide the steps, the last evaluation is the end-of-run report
# (4 decimals). At 4 epochs the whole script ran in 110 s on an otherwise idle 2-core CPU
# (2026-12-01; the build not included): the four runs 17, 22, 34 and 38 s (before bf16's).
#
# Usage: scripts/fashion-mnist-curves.sh [EPOCHS [EVAL_EVERY]]   (default 4 and 10)
# Writes, in this machine's results folder (scripts/results-folder.sh),
# fashion-mnist-curves.json (per run: its flags, every
# step's epoch and loss, every evaluation's step, test accuracy and test loss) for
# notebooks/training_curves.ipynb, and prints each run's final test accuracy.
# BIGBATCH=path/to/bigbatch uses that program instead of installing and building.
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-4}"
eval_every="${2:-10}"
source scripts/bigbatch-program.sh
results=$results_dir/fashion-mnist-curves.json
common=(--data fashion-mnist --depth 2 --hidden 256 --optimizer adamw --lr 1e-3 --seed 0
        --batch 1024 --epochs "$epochs" --eval-every "$eval_every")
names=(fp32 accumulated fp16-dynamic fp16-dynamic-checkpoint bf16)
declare -A extra=(
  [fp32]=""
  [accumulated]="--micro-batch 128"
  [fp16-dynamic]="--micro-batch 128 --precision fp16 --loss-scale dynamic"
  [fp16-dynamic-checkpoint]="--micro-batch 128 --precision fp16 --loss-scale dynamic --checkpoint every:1"
  [bf16]="--micro-batch 128 --precision bf16"
)
start=$(date +%s.%N)
for name in "${names[@]}"; do
  run_start=$(date +%s.%N)
  # shellcheck disable=SC2086 # the extra flags are words
  "$BIGBATCH" train "${common[@]}" ${extra[$name]} --log "$out/$name.jsonl" \
    --save "$out/$name.safetensors" > "$out/$name.txt" 2>&1 || { cat "$out/$name.txt"; exit 1; }
  awk -v a="$run_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f\n", b - a }' > "$out/$name.seconds"
  echo "${common[*]} ${extra[$name]}" > "$out/$name.flags"
  echo "$name: $(grep -m1 '^test (' "$out/$name.txt") ($(cat "$out/$name.seconds") s)"
done
identical=""  # the pairs of runs whose saved parameters are the same bytes
for ((i = 0; i < ${#names[@]}; i++)); do
  for ((j = i + 1; j < ${#names[@]}; j++)); do
    if cmp -s "$out/${names[i]}.safetensors" "$out/${names[j]}.safetensors"; then
      identical+="${names[i]},${names[j]} "
    fi
  done
done
seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
python3 - "$out" "$results" "$epochs" "$eval_every" "$identical" "$seconds" "$(nproc)" \
  "${names[@]}" <<'PY'
import datetime, json, pathlib, re, sys
out, results = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
epochs, eval_every, identical = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split()
seconds, cpus, names = float(sys.argv[6]), int(sys.argv[7]), sys.argv[8:]
runs = []
for name in names:
    lines = [json.loads(line) for line in (out / f"{name}.jsonl").open()]
    text = (out / f"{name}.txt").read_text()
    final = re.search(r"^test \(.*\): loss ([0-9.]+), accuracy ([0-9.]+)$", text, re.M)
    evaluations = [(l["step"], l["test_accuracy"], l["test_loss"])
                   for l in lines if "test_accuracy" in l]
    if not evaluations or evaluations[-1][0] != lines[-1]["step"]:
        evaluations.append((lines[-1]["step"], float(final.group(2)), float(final.group(1))))
    runs.append({
        "name": name,
        "flags": (out / f"{name}.flags").read_text().strip(),
        "seconds": float((out / f"{name}.seconds").read_text()),
        "skipped_steps": sum(1 for l in lines if l["skipped"]),
        "final_test_accuracy": float(final.group(2)),
        "final_test_loss": float(final.group(1)),
        "step": [l["step"] for l in lines],
        "epoch": [round(l["epoch"], 4) for l in lines],
        "loss": [l["loss"] for l in lines],
        "eval_step": [e[0] for e in evaluations],
        "test_accuracy": [e[1] for e in evaluations],
        "test_loss": [e[2] for e in evaluations],
    })
by_name = {run["name"]: run for run in runs}
def relative(a, b):
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))
same = []
for pair in identical:
    a, b = (by_name[n] for n in pair.split(","))
    same.append({"runs": [a["name"], b["name"]],
                 "test_accuracy_identical": a["test_accuracy"] == b["test_accuracy"],
                 "loss_max_relative_difference": relative(a["loss"], b["loss"]),
                 "test_loss_max_relative_difference": relative(a["test_loss"], b["test_loss"])})
head = {
    "description": "Fashion-MNIST, one model trained five ways (scripts/fashion-mnist-curves.sh)",
    "date": datetime.date.today().isoformat(), "cpus": cpus, "epochs": epochs,
    "eval_every": eval_every, "seconds": seconds,
    "same_parameters": same,  # the pairs of runs that saved the same parameters
}
compact = lambda value: json.dumps(value, separators=(",", ":"))
text = "{" + ",\n ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in head.items())
text += ',\n "runs": [\n'
text += ",\n".join("  {" + ",\n   ".join(f"{json.dumps(k)}: {compact(v)}" for k, v in run.items())
                   + "}" for run in runs)
text += "\n ]}\n"
json.loads(text)  # well-formed
results.write_text(text)
for pair in same:
    print(f"{' and '.join(pair['runs'])}: the same parameters, test accuracy "
          f"{'identical' if pair['test_accuracy_identical'] else 'DIFFERENT'}, losses within "
          f"{pair['loss_max_relative_difference']:.1e} (relative)")
for run in runs:
    print(f"{run['name']}: final test accuracy {run['final_test_accuracy']:.4f}, "
          f"{run['skipped_steps']} skipped steps, {run['seconds']:.0f} s")
print(f"wrote {results} in {seconds:.0f} s")
if not any(p["runs"] == ["fp32", "accumulated"] and p["test_accuracy_identical"] for p in same):
    sys.exit("fp32 in one piece and accumulated differ: gradient accumulation is not exact")
PY
python3 scripts/readme_numbers.py --write  # bench/README.md's line on these curves
