#!/usr/bin/env bash
# The planner's frontier (chapter 06): the predicted step time of the fastest plan against
# the device-memory budget, for chapter 06's demo setting (Fashion-MNIST, depth 2, hidden
# 256, AdamW lr 1e-3, batch 4096). Three probes first: a budget nothing fits gives the
# smallest peak any plan reaches and the bytes no plan can trade away (parameters,
# gradients, optimizer state, one sample: F), a budget everything fits the peak of the
# batch in one piece, chapter 01's 48 MiB the plan chapter 06 trains (and, priced by
# `--device-model h200`, the plan a spec-sheet H200 would choose). Then `bigbatch plan
# --json` answers at COUNT budgets F + h, the headroom h log-spaced from a quarter of the
# smallest plan's (nothing fits there) to 1.25 times the batch in one piece's: the plans
# differ most just above F, where only small micro-batches with recomputation fit. Each
# budget's record is its fastest plan (micro-batch, precision, checkpoint policy,
# predicted peak bytes and seconds per step), the fastest fp16 and the fastest bf16 plan,
# and how many plans fit (0: nothing fits). The cost model is
# measured once, at the first probe, into a calibration file that every other call
# reuses: one measurement prices every budget (it is step timing, so measure on an idle
# machine: a loaded one can tip the choice between precisions on noise). Last, the chosen
# plans are trained for a few steps with that same calibration (`train --plan auto`), so
# that the prediction and the measurement in the figure come from one cost model.
#
# Usage: scripts/planner-frontier.sh [COUNT]   (default 28)
# Writes, in this machine's results folder (scripts/results-folder.sh),
# planner-frontier.json for notebooks/planner_frontier.ipynb
# and chapter 06's README (scripts/readme_numbers.py), and prints one line per budget.
# BIGBATCH=path/to/bigbatch uses that program instead of installing and building.
set -euo pipefail
cd "$(dirname "$0")/.."
count="${1:-28}"
source scripts/bigbatch-program.sh
results=$results_dir/planner-frontier.json
shape=(--data fashion-mnist --depth 2 --hidden 256 --optimizer adamw --lr 1e-3 --batch 4096)
start=$(date +%s.%N)
# One answer of `bigbatch plan --json` at BUDGET bytes, added to FILE; 3 (nothing fits) is
# an answer too.
plan() {
  local code=0
  "$BIGBATCH" plan "${shape[@]}" --device-memory "$1" --calibration "$out/calibration.json" \
    --json > "$out/answer.json" 2> "$out/answer.err" || code=$?
  if [ "$code" -ne 0 ] && [ "$code" -ne 3 ]; then cat "$out/answer.err"; exit 1; fi
  cat "$out/answer.json" >> "$2"
}
plan 1MiB "$out/probes.jsonl"
plan 1TiB "$out/probes.jsonl"
plan 48MiB "$out/probes.jsonl"  # chapter 01's device
# The same 48 MiB question priced for an H200 from its spec sheet (modelled, not measured).
"$BIGBATCH" plan "${shape[@]}" --device-memory 48MiB --device-model h200 --json \
  > "$out/modelled.json"
# F, the smallest plan's headroom above it, and the batch in one piece's.
read -r fixed low high < <(python3 -c '
import json, sys
nothing, everything, _ = (json.loads(line) for line in open(sys.argv[1]))
one_piece = next(p for p in everything["feasible"] if p["micro_batch"] == everything["batch"]
                 and p["precision"] == "fp32" and p["checkpoint"] == "none")
fixed = nothing["fixed_bytes"]
print(fixed, nothing["smallest"]["peak_bytes"] - fixed, one_piece["peak_bytes"] - fixed)
' "$out/probes.jsonl")
: > "$out/answers.jsonl"
for ((i = 0; i < count; i++)); do
  budget=$(awk -v f="$fixed" -v l="$low" -v h="$high" -v i="$i" -v n="$count" \
    'BEGIN { l /= 4; h *= 1.25; printf "%d", f + l * exp(log(h / l) * i / (n - 1)) }')
  plan "$budget" "$out/answers.jsonl"
done
# The chosen plans measured with the same cost model: `bigbatch train --plan auto` at the
# first budget of each plan the frontier chooses that is predicted to take at most half a
# second a step, 6 steps each; the median of steps 2 to 6 (the first warms the caches).
python3 -c '
import json, sys
last = None
for line in open(sys.argv[1]):
    answer = json.loads(line)
    best = answer["feasible"][0] if answer["feasible"] else None
    plan = best and (best["micro_batch"], best["precision"], best["checkpoint"])
    if best and plan != last and best["seconds"] <= 0.5:
        print(answer["budget_bytes"])
    last = plan
' "$out/answers.jsonl" > "$out/measure-at.txt"
: > "$out/measured.jsonl"
while read -r budget; do
  "$BIGBATCH" train "${shape[@]}" --device-memory "$budget" --plan auto --steps 6 \
    --calibration "$out/calibration.json" --log "$out/run.jsonl" > "$out/train.out"
  python3 -c '
import json, statistics, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
plan = next(line for line in open(sys.argv[2]) if line.startswith("plan auto: "))
print(json.dumps({"budget_bytes": int(sys.argv[3]), "plan": plan[len("plan auto: "):].strip(),
                  "step_s": statistics.median(s["step_time_s"] for s in steps[1:]),
                  "peak_bytes": max(s["peak_bytes_total"] for s in steps)}))
' "$out/run.jsonl" "$out/train.out" "$budget" >> "$out/measured.jsonl"
done < "$out/measure-at.txt"
seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
python3 - "$out/probes.jsonl" "$out/answers.jsonl" "$results" "$seconds" "$(nproc)" \
  "${shape[*]}" "$out/measured.jsonl" "$out/modelled.json" <<'PY'
import datetime, json, pathlib, sys
probes = [json.loads(line) for line in open(sys.argv[1])]
answers = [json.loads(line) for line in open(sys.argv[2])]
measured = {m["budget_bytes"]: m for m in map(json.loads, open(sys.argv[7]))}
modelled = json.load(open(sys.argv[8]))
assert modelled["modelled"] and modelled["cost_model"]["key"].startswith("modelled, not measured")
results, seconds, cpus, shape = pathlib.Path(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
calls = probes + answers
assert calls[0]["calibration_measured_now"], "the first call did not measure the cost model"
assert not any(a["calibration_measured_now"] for a in calls[1:]), "the cost model was measured twice"
assert all(a["cost_model"] == calls[0]["cost_model"] for a in calls)
keep = ("micro_batch", "micro_batches", "precision", "checkpoint", "recompute", "peak_bytes",
        "seconds")
pick = lambda plan: {k: plan[k] for k in keep}
nothing, everything, chapter01 = probes
smallest = {**pick(nothing["smallest"]), "fixed_bytes": nothing["fixed_bytes"]}
one_piece = next(pick(p) for p in everything["feasible"] if p["micro_batch"] == everything["batch"]
                 and p["precision"] == "fp32" and p["checkpoint"] == "none")
budgets = []
for a in answers:
    record = {"budget_bytes": a["budget_bytes"], "fits": len(a["feasible"]), "best": None}
    if a["feasible"]:
        record["best"] = pick(a["feasible"][0])
        for precision in ("fp16", "bf16"):
            plans = [p for p in a["feasible"] if p["precision"] == precision]
            record[f"fastest_{precision}"] = pick(plans[0]) if plans else None
    if a["budget_bytes"] in measured:
        run, best = measured[a["budget_bytes"]], record["best"]
        # train --plan auto chose what plan chose, with the same cost model, and fitted
        said = (f"micro-batch {best['micro_batch']} ({best['micro_batches']} per step), "
                f"{best['precision']}, checkpoint {best['checkpoint']}")
        assert run["plan"] == said, (run["plan"], said)
        assert run["peak_bytes"] <= a["budget_bytes"], run
        record["measured"] = {"step_s": run["step_s"], "peak_bytes": run["peak_bytes"]}
    budgets.append(record)
document = {
    "description": "bigbatch plan --json at log-spaced budgets (scripts/planner-frontier.sh)",
    "date": datetime.date.today().isoformat(), "cpus": cpus, "device": answers[0]["device"],
    "flags": shape, "batch": answers[0]["batch"], "seconds": seconds,
    "cost_model": answers[0]["cost_model"],
    "smallest_peak": smallest,  # the plan of smallest peak, and the bytes no plan can trade
    "one_piece": one_piece,     # the batch in one piece, fp32, no checkpointing
    "chapter01": pick(chapter01["feasible"][0]),  # the fastest plan under 48 MiB
    "chapter01_plans": [pick(p) for p in chapter01["feasible"]],
    # The same question on a spec-sheet H200 (bigbatch plan --device-model h200).
    "h200_modelled": {"cost_model": modelled["cost_model"],
                      "plans": [pick(p) for p in modelled["feasible"]]},
    "budgets": budgets,
}
compact = lambda value: json.dumps(value, separators=(", ", ": "))
text = "{" + ",\n ".join(f"{json.dumps(k)}: {compact(v)}" for k, v in document.items()
                         if k != "budgets")
text += ',\n "budgets": [\n  ' + ",\n  ".join(compact(b) for b in budgets) + "\n ]}\n"
json.loads(text)  # well-formed
results.write_text(text)
mib = lambda b: b / 2**20
for b in budgets:
    plan = b["best"]
    what = (f"micro-batch {plan['micro_batch']} ({plan['micro_batches']} per step), "
            f"{plan['precision']}, checkpoint {plan['checkpoint']}: peak "
            f"{mib(plan['peak_bytes']):.2f} MiB, {plan['seconds']:.3f} s/step"
            if plan else "nothing fits")
    if "measured" in b:
        what += f"; measured {b['measured']['step_s']:.3f} s/step"
    print(f"{mib(b['budget_bytes']):8.3f} MiB: {what}")
print(f"smallest peak of any plan: {mib(smallest['peak_bytes']):.2f} MiB, of which "
      f"{mib(smallest['fixed_bytes']):.2f} MiB no plan can trade; the batch in one piece: "
      f"{mib(one_piece['peak_bytes']):.2f} MiB")
print(f"wrote {results} in {seconds:.0f} s")
PY
python3 scripts/readme_numbers.py --write
