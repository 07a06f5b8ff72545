#!/usr/bin/env bash
# Chapter 03's training comparison: fp16 without a loss scale against fp32 and against a
# static scale, where the effective batch is large enough for fp16's range to matter.
#
# The setting: synthetic data with 16 features (1,048,576 samples, 943,719 of them for
# training), the residual MLP of depth 2 and width 32, one optimizer step per epoch (the
# whole training set, B = 943,719, as micro-batches of 65,536), SGD with lr 0.5 and
# momentum 0.9, 100 steps. The loss's gradient carries 1/B: at this B every dlogits value
# below about 0.03 in magnitude rounds to zero in fp16 without a scale, and more of them do
# as the model fits. A small model keeps a step near 2 s on two CPU cores; the whole script
# takes about 12 minutes.
#
# Usage: scripts/fp16-loss-curves.sh
# Writes, in this machine's results folder (scripts/results-folder.sh),
# chapter03-loss-curves.json (every step's loss and each
# run's test accuracy) for notebooks/mixed_precision.ipynb, and prints a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/results-folder.sh
scripts/install-deps.sh
scripts/build.sh >/dev/null
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(train --data synthetic --samples 1048576 --features 16 --depth 2 --hidden 32
        --batch 1048576 --micro-batch 65536 --optimizer sgd --lr 0.5 --steps 100 --seed 0)
declare -A extra=([fp32]="" [fp16-unscaled]="--precision fp16 --loss-scale none"
                  [fp16-static]="--precision fp16 --loss-scale static:65536")
for run in fp32 fp16-unscaled fp16-static; do
  # shellcheck disable=SC2086 # the extra flags are words
  build/chapters/cli/bigbatch "${common[@]}" ${extra[$run]} --log "$out/$run.jsonl" \
    > "$out/$run.txt" 2>&1 || { cat "$out/$run.txt"; exit 1; }
  echo "$run: $(grep -m1 '^test' "$out/$run.txt")"
done
python3 - "$out" "${common[*]}" <<'PY'
import json, os, pathlib, re, sys
out, command = pathlib.Path(sys.argv[1]), sys.argv[2]
extra = {"fp32": "", "fp16-unscaled": "--precision fp16 --loss-scale none",
         "fp16-static": "--precision fp16 --loss-scale static:65536"}
runs = []
for name, flags in extra.items():
    losses = [json.loads(line)["loss"] for line in (out / f"{name}.jsonl").open()]
    test = re.search(r"^test .*loss ([0-9.]+), accuracy ([0-9.]+)",
                     (out / f"{name}.txt").read_text(), re.M)
    runs.append({"name": name, "command": f"bigbatch {command} {flags}".strip(),
                 "loss": losses, "test_loss": float(test.group(1)),
                 "test_accuracy": float(test.group(2))})
path = pathlib.Path(os.environ["results_dir"], "chapter03-loss-curves.json")
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
fp32 = runs[0]["loss"]
for run in runs[1:]:
    gap = 100 * (run["loss"][-1] / fp32[-1] - 1)
    print(f"{run['name']}: final training loss {run['loss'][-1]:.4f} ({gap:+.2f}% against "
          f"fp32's {fp32[-1]:.4f}), test accuracy {run['test_accuracy']:.4f} "
          f"(fp32 {runs[0]['test_accuracy']:.4f})")
print(f"wrote {path}")
PY
