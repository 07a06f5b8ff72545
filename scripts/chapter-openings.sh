#!/usr/bin/env bash
# The runs each chapter opens and closes on, in the tutorial's running example: chapter 01's
# model (Fashion-MNIST, the residual MLP of depth 2, hidden 256, AdamW lr 1e-3), the batch
# of 4096 we want and a 48 MiB device; chapter 05 makes the model 32 blocks deep (batch 256,
# a 280 MiB device), where depth, not the batch, is what fills the memory. Each chapter's
# README shows the commands (scripts/doc-test.sh runs them) and quotes what this script
# measured (scripts/readme_numbers.py writes those paragraphs from its file).
#
# Every run is `bigbatch train` for a few steps; its record: the exit status (3: out of
# memory), and for a run that trained the largest step peak, the median step time of steps
# 2 and later (the first warms the caches), the steps skipped by a loss scaler and the last
# loss (and the test accuracy, when the run reports one). Step times come from one machine
# in one run: compare them with each other. Last, chapter 03's "Try this" runs.
#
# Usage: scripts/chapter-openings.sh
# Writes, in this machine's results folder (scripts/results-folder.sh),
# chapter-openings.json, then rewrites the READMEs' text.
# BIGBATCH=path/to/bigbatch uses that program instead of installing and building.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bigbatch-program.sh
results=$results_dir/chapter-openings.json
example=(--data fashion-mnist --depth 2 --hidden 256 --optimizer adamw --lr 1e-3 --seed 0)
deep=(--data fashion-mnist --depth 32 --hidden 256 --optimizer adamw --lr 1e-3 --seed 0
      --batch 256 --device-memory 280MiB)
: > "$out/runs.jsonl"

# run CHAPTER LABEL FLAGS...: one `bigbatch train`, its record appended.
run() {
  local chapter="$1" label="$2" code=0
  shift 2
  rm -f "$out/log.jsonl"
  "$BIGBATCH" train "$@" --log "$out/log.jsonl" > "$out/run.txt" 2>&1 || code=$?
  if [ "$code" -ne 0 ] && [ "$code" -ne 3 ]; then cat "$out/run.txt"; exit 1; fi
  python3 - "$chapter" "$label" "$code" "$out/log.jsonl" "$*" "$out/run.txt" \
    >> "$out/runs.jsonl" <<'PY'
import json, pathlib, re, statistics, sys
chapter, label, code, log, flags = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
record = {"chapter": chapter, "label": label, "flags": flags, "exit": code}
tested = re.search(r"^test \(.*accuracy ([0-9.]+)$", open(sys.argv[6]).read(), re.M)
if tested:
    record["test_accuracy"] = float(tested.group(1))
steps = [json.loads(line) for line in open(log)] if pathlib.Path(log).exists() else []
if code == 0:
    record.update(steps=len(steps),
                  peak_bytes=max(s["peak_bytes_total"] for s in steps),
                  step_s=statistics.median(s["step_time_s"] for s in steps[1:] or steps),
                  skipped=sum(1 for s in steps if s["skipped"]),
                  last_loss=steps[-1]["loss"])
print(json.dumps(record))
PY
  echo "chapter $chapter, $label: exit $code"
}

run 01 "batch 256" "${example[@]}" --batch 256 --device-memory 48MiB --steps 12
run 01 "batch 4096" "${example[@]}" --batch 4096 --device-memory 48MiB --steps 12
run 02 "16 micro-batches of 256" "${example[@]}" --batch 4096 --micro-batch 256 \
  --device-memory 48MiB --steps 12
run 02 "in one piece, no cap" "${example[@]}" --batch 4096 --steps 12
run 03 "fp32, micro-batches of 1024" "${example[@]}" --batch 4096 --micro-batch 1024 \
  --device-memory 48MiB --steps 12
run 03 "fp32, micro-batches of 512" "${example[@]}" --batch 4096 --micro-batch 512 \
  --device-memory 48MiB --steps 12
run 03 "fp16, static scale 1024, micro-batches of 1024" "${example[@]}" --batch 4096 \
  --micro-batch 1024 --device-memory 48MiB --precision fp16 --loss-scale static:1024 --steps 12
run 04 "fp16, static scale 2^30" "${example[@]}" --batch 4096 --micro-batch 1024 \
  --device-memory 48MiB --precision fp16 --loss-scale static:1073741824 --steps 12
run 04 "fp16, dynamic scale from 2^30" "${example[@]}" --batch 4096 --micro-batch 1024 \
  --device-memory 48MiB --precision fp16 --loss-scale dynamic --scale-init 1073741824 \
  --scale-max 1073741824 --steps 12
run 05 "depth 32, in one piece" "${deep[@]}" --steps 6
run 05 "depth 32, micro-batches of 64" "${deep[@]}" --micro-batch 64 --steps 6
run 05 "depth 32, micro-batches of 32" "${deep[@]}" --micro-batch 32 --steps 6
run 05 "depth 32, checkpoint sqrt" "${deep[@]}" --checkpoint sqrt --steps 6
# Chapter 03's "Try this": fp16 with no scale at a large batch, where AdamW shrugs it off.
try=("${example[@]}" --batch 8192 --micro-batch 1024 --epochs 4 --lr-scale sqrt --warmup-steps 8
     --lr-schedule cosine)
run 03-try "fp32" "${try[@]}"
run 03-try "fp16, no scale" "${try[@]}" --precision fp16 --loss-scale none
run 03-try "fp16, static scale 8192" "${try[@]}" --precision fp16 --loss-scale static:8192
run 06 "planned (--plan auto)" "${example[@]}" --batch 4096 --device-memory 48MiB --plan auto \
  --calibration "$out/calibration.json" --steps 12

python3 - "$out/runs.jsonl" "$results" <<'PY'
import datetime, json, pathlib, platform, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
              if line.startswith("model name")), platform.processor())
document = {"description": "the runs each chapter opens and closes on (scripts/chapter-openings.sh)",
            "date": datetime.date.today().isoformat(), "cpu": model,
            "runs": runs}
sys.path.insert(0, "scripts")
import results_json
results_json.write(sys.argv[2], document)
PY
python3 scripts/readme_numbers.py --write
