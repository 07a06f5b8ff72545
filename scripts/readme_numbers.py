#!/usr/bin/env python3
"""Writes, or checks, the README paragraphs whose numbers come from committed results.

Usage: scripts/readme_numbers.py              check: exit 1, naming each stale paragraph
                                              or sentence
       scripts/readme_numbers.py --write      rewrite every one from its results
       scripts/readme_numbers.py --self-test  the sentence check on a text of its own

Each paragraph sits between <!-- NAME:begin --> and <!-- NAME:end --> in its README and is
the output of one function below, of the results files it names: the text is what those
files say, so a benchmark run that changes them rewrites it (the scripts that write the
results call --write), and a README edited by hand, or results committed without the
text, fails the check (CTest readme_numbers_current, so scripts/test.sh and CI run it).
A hand-written sentence that quotes numbers is listed in SENTENCES with its source: the
check finds its words and compares its numbers, --write puts the source's in. The
chapters' numbers come from their demos' full reports (scripts/chapter-reports.sh) or the
results files their READMEs name. Only the standard library is needed.
"""
import json
import pathlib
import re
import statistics
import sys

import bench_summary

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cpu-2core-avx512"
MiB = 2**20


def mib(value):
    return f"{value / MiB:.2f}"


def ratio_range(values):
    low, high = min(values), max(values)
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f} to {high:.1f}"


def data_parallel_time():
    """Chapter 07: scripts/data-parallel-bench.sh's step, one process against two ranks."""
    path = RESULTS / "data-parallel.json"
    result = json.loads(path.read_text())
    rows = ["| run | ms per step | summing the gradients, ms | share of the step "
            "| rank 0's peak, MiB | of it optimizer state, MiB | of it gradients, MiB |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        share = percent(row["reduce_ms"] / row["step_ms"], 1) if row["ranks"] > 1 else "-"
        summing = f"{row['reduce_ms']:.1f}" if row["ranks"] > 1 else "-"
        rows.append(f"| {row['name']} | {row['step_ms']:.1f} | {summing} | {share} "
                    f"| {mib(row['rank0_peak_bytes'])} | {mib(row['rank0_optimizer_state_bytes'])} "
                    f"| {mib(row['rank0_gradient_bytes'])} |")
    one, ranked, engine, zero1, zero2, overlap = result["rows"]
    ratio = ranked["step_ms"] / one["step_ms"]
    verdict = ("take longer than" if ratio > 1.05 else "are as fast as" if ratio >= 0.95
               else "are faster than")
    return "\n\n".join([
        wrap(f"`{path.relative_to(ROOT)}` ({result['date']}, {result['cpu']}, {result['mpi']}; "
             f"`bigbatch train {result['run']}`, medians of steps 3 to 12 of one run each):"),
        "\n".join(rows),
        wrap(f"Two ranks of one thread each {verdict} one process with two threads "
             f"({ratio:.2f} times its step), the deterministic sum taking "
             f"{percent(ranked['reduce_ms'] / ranked['step_ms'], 1)} of the step and the "
             f"engine's {percent(engine['reduce_ms'] / engine['step_ms'], 1)}. On one machine "
             f"the ranks cannot do more work than its cores: what ranks buy is more devices. "
             f"ZeRO stage 1 halves rank 0's optimizer state "
             f"({mib(ranked['rank0_optimizer_state_bytes'])} to "
             f"{mib(zero1['rank0_optimizer_state_bytes'])} MiB, its step's peak "
             f"{mib(ranked['rank0_peak_bytes'])} to {mib(zero1['rank0_peak_bytes'])} MiB: "
             f"section (e)'s prediction) for a step of {zero1['step_ms']:.1f} ms, its "
             f"reduce-scatter and all-gather taking "
             f"{percent(zero1['reduce_ms'] / zero1['step_ms'], 1)}. ZeRO stage 2 also "
             f"shards the gradients ({mib(zero1['rank0_gradient_bytes'])} to "
             f"{mib(zero2['rank0_gradient_bytes'])} MiB at rank 0's peak, which is "
             f"{mib(zero2['rank0_peak_bytes'])} MiB) and sums after each of the share's "
             f"micro-batches: a step of {zero2['step_ms']:.1f} ms, its sums taking "
             f"{percent(zero2['reduce_ms'] / zero2['step_ms'], 1)}."),
        wrap(f"Overlapped with the last micro-batch's backward (buckets of "
             f"{overlap['bucket']}), the deterministic sum still costs the step "
             f"{overlap['reduce_ms']:.1f} ms (the calls made inside the backward and the wait "
             f"after it) against {ranked['reduce_ms']:.1f} ms summed after the backward, "
             f"for a step of {overlap['step_ms']:.1f} ms against {ranked['step_ms']:.1f}: "
             f"{overlap_verdict(overlap['reduce_ms'] / ranked['reduce_ms'])}.")])


def overlap_verdict(ratio):
    """What overlapping did to the sum's cost, from its ratio to the sum after the backward."""
    if ratio < 0.8:
        return f"it hides {percent(1 - ratio, 0)} of the sum"
    if ratio <= 1.2:
        return "it hides nothing here"
    return f"here it hides nothing and the sum takes {ratio:.2f} times as long"


def planner_frontier():
    """Chapter 06: the frontier of scripts/planner-frontier.sh, predicted and measured."""
    frontier = json.loads((RESULTS / "planner-frontier.json").read_text())
    budgets = [b for b in frontier["budgets"] if b["best"]]
    smallest, one_piece = frontier["smallest_peak"], frontier["one_piece"]
    fixed = smallest["fixed_bytes"]
    small = [b for b in budgets if b["best"]["micro_batch"] <= 32]
    first_large = next(b for b in budgets if b["best"]["micro_batch"] > 32)
    chapter01 = frontier["chapter01"]  # the plan under chapter 01's 48 MiB device
    text = (
        f"Nothing fits below {mib(smallest['peak_bytes'])} MiB, of which {mib(fixed)} MiB no "
        f"plan can trade away. Within the next "
        f"{(first_large['budget_bytes'] - smallest['peak_bytes']) / MiB:.1f} MiB only "
        f"micro-batches of 1 to 32 fit, most with recomputation, predicted at "
        f"{max(b['best']['seconds'] for b in small):.2f} s down to "
        f"{min(b['best']['seconds'] for b in small):.3f} s per step; from there each larger "
        f"micro-batch gains less, to {chapter01['seconds']:.3f} s under chapter 01's 48 MiB "
        f"(micro-batches of {chapter01['micro_batch']}, {chapter01['precision']}, checkpoint "
        f"{chapter01['checkpoint']}, peak {mib(chapter01['peak_bytes'])} MiB) and "
        f"{one_piece['seconds']:.3f} s for the batch in one piece "
        f"({mib(one_piece['peak_bytes'])} MiB; the cost model of {frontier['date']}).")
    precisions = sorted({b["best"]["precision"] for b in budgets})
    if precisions == ["fp32"]:
        text += " Every budget's fastest plan is fp32"
    else:
        text += f" The fastest plans are {', '.join(precisions)}"
    slower = []
    for precision in ("bf16", "fp16"):
        pairs = [(b, b.get(f"fastest_{precision}")) for b in budgets]
        pairs = [(b, p) for b, p in pairs if p]
        if pairs:
            ratios = [p["seconds"] / b["best"]["seconds"] for b, p in pairs]
            slower.append((precision, min(b["budget_bytes"] for b, _ in pairs), ratios))
    if slower:
        said = [f"the fastest {precision} plan {ratio_range(ratios)} times"
                for precision, _, ratios in slower]
        said[0] = said[0].replace(" plan ", " plan is predicted ", 1) + " as slow"
        text += (f"; at the budgets asked where a 16-bit plan fits "
                 f"({min(s[1] for s in slower) / MiB:.1f} MiB and up), " + " and ".join(said))
    text += "."
    measured = [b for b in budgets if "measured" in b]
    if measured:
        ratios = [b["measured"]["step_s"] / b["best"]["seconds"] for b in measured]
        text += (f" Trained with the same cost model at {len(measured)} of those budgets (the "
                 f"crosses: the first budget of each plan predicted at half a second or less), "
                 f"the chosen plans' steps took {min(ratios):.2f} to {max(ratios):.2f} times "
                 f"their prediction (median {statistics.median(ratios):.2f}), every one within "
                 f"its budget.")
    return text


def modelled_gpu():
    """Chapter 06: the 48 MiB plans measured here beside those modelled for an H200."""
    frontier = json.loads((RESULTS / "planner-frontier.json").read_text())
    here, there = frontier["chapter01_plans"], frontier["h200_modelled"]["plans"]
    row = lambda p: (f"{p['micro_batch']} ({p['micro_batches']}) | {p['precision']} | "
                     f"{p['checkpoint']} | {mib(p['peak_bytes'])} MiB | {p['seconds'] * 1e3:.3f} ms")
    lines = ["| this CPU, measured: micro-batch (per step) | precision | checkpoint | peak | step "
             "| an H200, modelled: micro-batch (per step) | precision | checkpoint | peak | step |",
             "|---|---|---|---:|---:|---|---|---|---:|---:|"]
    for i in range(min(4, max(len(here), len(there)))):
        cells = [row(p[i]) if i < len(p) else " | | | | " for p in (here, there)]
        lines.append(f"| {cells[0]} | {cells[1]} |")
    best = there[0]
    cost = frontier["h200_modelled"]["cost_model"][best["precision"]]["micro_batch"]
    lines.append("")
    lines.append(wrap(
        f"There a micro-batch's fixed cost ({cost['fixed_s'] * 1e6:.0f} us of launches and "
        f"weight reads, in {best['precision']}) outweighs its rows' "
        f"({cost['per_row_s'] * 1e9:.1f} ns each), so the model takes the fewest micro-batches "
        f"that fit: {best['micro_batch']} rows ({best['micro_batches']} per step) in "
        f"{best['precision']}, checkpoint {best['checkpoint']}, {best['seconds'] * 1e3:.3f} ms "
        f"a step against the CPU's choice of {here[0]['micro_batch']} rows in "
        f"{here[0]['precision']} (both from `scripts/planner-frontier.sh`, "
        f"{frontier['date']})."))
    return "\n".join(lines)


def repetitions_of(data):
    """The repetitions of a Google Benchmark JSON's runs."""
    return next(b["repetitions"] for b in data["benchmarks"] if "repetitions" in b)


def checkpointing_time():
    """Chapter 05: what each policy's bytes cost in time (bench_checkpointing's medians)."""
    data = json.loads((RESULTS / "cpu-checkpointing.json").read_text())
    runs = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") == "median":
            policy, _, depth = b["label"].rpartition(" depth ")
            runs[(policy, int(depth))] = b
    time = lambda policy, depth: runs[(policy, depth)]["real_time"] / runs[("none", depth)]["real_time"]
    forwards = lambda policy, depth: runs[(policy, depth)]["block_forwards"] / depth
    twice = [(p, d) for p in ("sqrt", "every:4", "sqrt+selective") for d in (32, 64)]
    repetitions = repetitions_of(data)
    return (
        f"What that costs is time (right: each policy's bytes against its measured step time, "
        f"both as shares of no checkpointing's at the same depth, labelled with the block "
        f"forwards per block it ran): {min(time(*k) for k in twice):.2f} to "
        f"{max(time(*k) for k in twice):.2f} times the step at depths 32 and 64 for `sqrt`, "
        f"`every:4` and `sqrt+selective`, which run each block about twice "
        f"({min(forwards(*k) for k in twice):.2f} to {max(forwards(*k) for k in twice):.2f} "
        f"forwards per block), {time('optimal:3', 32):.2f} for the binomial schedule at depth "
        f"32 ({forwards('optimal:3', 32):.2f} forwards per block) and "
        f"{time('optimal:3', 64):.2f} at depth 64 ({forwards('optimal:3', 64):.2f}). The bars "
        f"are one standard deviation of {repetitions} repetitions on a noisy 2-core machine: "
        f"the times are rough, the bytes exact.")


def techniques_table(name="fashion-mnist-techniques.md"):
    """A README table of every technique (scripts/techniques-table.sh), in its list item."""
    lines = (RESULTS / name).read_text().splitlines()
    return "\n".join(line for line in lines if line.startswith("|"))


def openings():
    """scripts/chapter-openings.sh's runs: {chapter: {label: record}}, and the document."""
    document = json.loads((RESULTS / "chapter-openings.json").read_text())
    chapters = {}
    for run in document["runs"]:
        chapters.setdefault(run["chapter"], {})[run["label"]] = run
    return chapters, document


def fate(run, plural=False):
    """What became of a run (said of one subject, or of `plural` ones): its peak and step
    time, or out of memory."""
    if run["exit"] == 3:
        return f"run{'' if plural else 's'} out of memory (exit status 3)"
    return (f"train{'' if plural else 's'}, the steps peaking at {mib(run['peak_bytes'])} MiB, "
            f"{run['step_s']:.3f} s each")


def opening(chapter):
    """The paragraph chapter NN's README opens on, from its runs."""
    runs, document = openings()
    r = runs[chapter]
    source = (f"(`scripts/chapter-openings.sh` on {document['cpu']}, {document['date']}; "
              f"step times are medians of a few steps)")
    if chapter == "01":
        return (f"On the 48 MiB device, batch 256 {fate(r['batch 256'])}; batch 4096 "
                f"{fate(r['batch 4096'])}. {source}")
    if chapter == "02":
        micro, whole = r["16 micro-batches of 256"], r["in one piece, no cap"]
        return (f"As 16 micro-batches of 256 under the same 48 MiB, batch 4096 {fate(micro)}: "
                f"{micro['step_s'] / whole['step_s']:.2f} times the step of the batch in one "
                f"piece on a device without the cap ({whole['step_s']:.3f} s, "
                f"{mib(whole['peak_bytes'])} MiB), and the same parameters, bit for bit. "
                f"{source}")
    if chapter == "03":
        big, fits, half = (r["fp32, micro-batches of 1024"], r["fp32, micro-batches of 512"],
                           r["fp16, static scale 1024, micro-batches of 1024"])
        return (f"Under 48 MiB, fp32 micro-batches of 1024 {fate(big, True)}; micro-batches of "
                f"512 {fate(fits, True)}. In fp16 with a static loss scale of 1024, "
                f"micro-batches of 1024 {fate(half, True)}: half as many micro-batches, but on "
                f"this CPU, which converts every 16-bit value, the step takes {half['step_s'] / fits['step_s']:.2f} "
                f"times fp32's. On a GPU tensor cores turn that around (chapter 06 models an "
                f"H200; not yet measured). {source}")
    if chapter == "04":
        static, dynamic = r["fp16, static scale 2^30"], r["fp16, dynamic scale from 2^30"]
        return (f"With a static scale of 2^30, {static['skipped']} of {static['steps']} steps "
                f"overflow and are skipped: the weights never move. A dynamic scale started at "
                f"the same 2^30 skips {dynamic['skipped']}, halving the scale each time, and "
                f"trains the other {dynamic['steps'] - dynamic['skipped']} (loss "
                f"{dynamic['last_loss']:.4f} after step {dynamic['steps']}). {source}")
    if chapter == "05":
        whole, m64, m32, sqrt = (r["depth 32, in one piece"], r["depth 32, micro-batches of 64"],
                                 r["depth 32, micro-batches of 32"], r["depth 32, checkpoint sqrt"])
        ratio = sqrt["step_s"] / m32["step_s"]
        why = ("on this CPU the fixed costs of eight micro-batches outweigh one more forward "
               "pass" if ratio < 1 else
               "on this CPU one more forward pass outweighs the fixed costs of eight "
               "micro-batches")
        return (f"At depth 32, batch 256, on a 280 MiB device, the batch in one piece "
                f"{fate(whole)}, and chapter 02's fix barely helps: micro-batches of 64 "
                f"{fate(m64, True).replace(' (exit status 3)', ' too')}; micro-batches of 32 "
                f"{fate(m32, True)}. With `--checkpoint sqrt` the batch in one piece "
                f"{fate(sqrt)}: {ratio:.2f} times the step of the micro-batches of 32 ({why}). "
                f"{source}")
    if chapter == "03-try":
        fp32, none, static = r["fp32"], r["fp16, no scale"], r["fp16, static scale 8192"]
        return (f"With AdamW at `--batch 8192 --micro-batch 1024 --epochs 4 --lr-scale sqrt "
                f"--warmup-steps 8 --lr-schedule cosine` it did no visible harm: test accuracy "
                f"{fp32['test_accuracy']:.4f} in fp32, {none['test_accuracy']:.4f} in fp16 "
                f"without scaling, {static['test_accuracy']:.4f} with `static:8192` "
                f"(`scripts/chapter-openings.sh`, {document['date']}).")
    if chapter == "06":
        planned, hand = r["planned (--plan auto)"], runs["02"]["16 micro-batches of 256"]
        return (f"Under the 48 MiB, `--plan auto` {fate(planned)}, against "
                f"{hand['step_s']:.3f} s for chapter 02's micro-batches of 256, chosen by "
                f"hand. {source}")
    raise KeyError(chapter)


def learning_rate_study():
    """Chapter 02: the settings weighed on the validation split, then the chosen one and the
    reference on the test split, 3 seeds each (scripts/large-batch-learning-rate.sh)."""
    study = json.loads((RESULTS / "fashion-mnist-large-batch-16-epochs.json").read_text())
    runs = study["runs"]

    def accuracies(setting, split):
        return [r["accuracy"] for r in runs if r["setting"] == setting and r["split"] == split]

    def summary(values):
        return (f"{statistics.mean(values):.4f} ({min(values):.4f} to {max(values):.4f})")

    seeds = len(accuracies(study["chosen"], "test"))
    lines = [f"| batch 4096, learning rate, warm-up steps, after it | validation accuracy, mean "
             f"(min to max) over {seeds} seeds |", "|---|---:|"]
    for setting in dict.fromkeys(r["setting"] for r in runs if r["split"] == "validation"):
        name = setting.removeprefix("4096 ")
        cell = summary(accuracies(setting, "validation"))
        if setting == study["chosen"]:
            name, cell = f"**{name}** (chosen)", f"**{cell}**"
        lines.append(f"| {name} | {cell} |")
    reference, chosen = accuracies("256", "test"), accuracies(study["chosen"], "test")
    lines += ["", f"| trained on all 60000, {study['epochs']} epochs | test accuracy, mean (min "
              f"to max) over {seeds} seeds |", "|---|---:|",
              f"| batch 256, lr 1e-3 (the reference) | {summary(reference)} |",
              f"| batch 4096, {study['chosen'].removeprefix('4096 ')} | {summary(chosen)} |"]
    gap = (statistics.mean(chosen) - statistics.mean(reference)) * 100
    if min(chosen) > max(reference):
        verdict = (f"beats batch 256 by {gap:.2f} points on the test split, every seed of it "
                   f"above every seed of the reference")
    elif max(chosen) < min(reference):
        verdict = (f"falls short of batch 256 by {-gap:.2f} points on the test split, every "
                   f"seed of it below every seed of the reference")
    else:
        verdict = (f"matches batch 256 on the test split: the means differ by {gap:+.2f} "
                   f"points, inside the spread of the seeds")
    lines += ["", wrap(f"Chosen on the validation split, the setting {verdict} "
                       f"(`bench/results/cpu-2core-avx512/fashion-mnist-large-batch-16-epochs.json`, "
                       f"{study['date']}, {study['cpus']} CPUs).")]
    return "\n".join(lines)


def equivalence():
    """scripts/fashion-mnist-equivalence.sh's runs: {name: test accuracy}, the date, the
    parameters' verdict."""
    text = (RESULTS / "fashion-mnist-equivalence.txt").read_text()
    accuracy = {m.group(1): m.group(2) for m in
                re.finditer(r"^(\w+): test \(.*accuracy ([0-9.]+)", text, re.M)}
    date = text.split("T", 1)[0]
    identical = "PASS: batch 256 and micro-batches of 64 give byte-identical parameters" in text
    return accuracy, date, identical


def equivalence_summary():
    """The README's line on the equivalence runs."""
    accuracy, date, identical = equivalence()
    both = (f"test accuracy {accuracy['batch']} for both fp32 runs" if
            accuracy["batch"] == accuracy["micro"] else
            f"test accuracy {accuracy['batch']} in one piece, {accuracy['micro']} in micro-batches")
    return (f"On a 2-core CPU machine ({date}): {both}, parameters "
            f"{'identical' if identical else 'NOT identical'}; fp16 {accuracy['fp16']}, bf16 "
            f"{accuracy['bf16']}.")


def equivalence_fp16():
    """Chapter 04's line: fp16 with dynamic scaling against fp32, the same runs."""
    accuracy, _, _ = equivalence()
    return (f"test accuracy {accuracy['fp16']} in fp16 with dynamic scaling against "
            f"{accuracy['batch']} in fp32.")


def curves_summary():
    """The README's line on the five training curves (scripts/fashion-mnist-curves.sh): how
    far each 16-bit run's losses and test accuracies stray from fp32's."""
    curves = json.loads((RESULTS / "fashion-mnist-curves.json").read_text())
    runs = {r["name"]: r for r in curves["runs"]}
    fp32 = runs["fp32"]

    def gaps(name):
        run = runs[name]
        loss = max(abs(a - b) / b for a, b in zip(run["loss"], fp32["loss"])) * 100
        accuracy = [abs(a - b) * 100 for a, b in zip(run["test_accuracy"], fp32["test_accuracy"])]
        return loss, max(accuracy), accuracy.index(max(accuracy)) == len(accuracy) - 1

    fp16_loss, fp16_accuracy, _ = gaps("fp16-dynamic")
    bf16_loss, bf16_accuracy, bf16_at_end = gaps("bf16")
    accuracy, _, _ = equivalence()
    chapter02_gap = abs(float(accuracy["bf16"]) - float(accuracy["batch"])) * 100
    return (f"fp16's training losses stay within {fp16_loss:.1f}% of fp32's and its test "
            f"accuracy within {fp16_accuracy:.2f} points "
            f"({runs['fp16-dynamic']['final_test_accuracy']:.4f} against "
            f"{fp32['final_test_accuracy']:.4f} after {curves['epochs']} epochs); bf16's, with 8 "
            f"significant bits to fp16's 11, within {bf16_loss:.1f}% and {bf16_accuracy:.2f} "
            f"points ({runs['bf16']['final_test_accuracy']:.4f} at the end"
            f"{', its largest gap' if bf16_at_end else ''}; at chapter 02's setting, "
            f"`fashion-mnist-equivalence.sh` above, {chapter02_gap:.2f} points):")


def accumulation_summary():
    """The README's paragraph on BM_Accumulation (cpu-accumulation.json): peaks and step
    times of the naive and the memory-free way at micro-batches 1, 64 and 1024."""
    data = json.loads((RESULTS / "cpu-accumulation.json").read_text())
    runs = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") == "median":
            naive, micro = re.search(r"naive:(\d)/micro:(\d+)/", b["name"]).groups()
            runs[(naive == "1", int(micro))] = b
    gaps = {runs[(True, m)]["peak_total"] - runs[(False, m)]["peak_total"] for m in
            {m for _, m in runs}}
    gap = (f"is {mib(gaps.pop())} MiB" if len(gaps) == 1 else
           f"is {mib(min(gaps))} to {mib(max(gaps))} MiB")
    peak = lambda m, at="": (f"{mib(runs[(True, m)]['peak_total'])} against "
                             f"{mib(runs[(False, m)]['peak_total'])} MiB at {at}{m}")

    def seconds(ms):
        return f"{ms / 1e3:.1f} s" if ms >= 1e3 else f"{ms:.0f} ms"

    step = lambda m, naive: seconds(runs[(naive, m)]["real_time"])
    repetitions = repetitions_of(data)
    return (
        f"On a 2-core CPU ({data['context']['date'].split('T')[0]}, medians of {repetitions}; "
        f"`notebooks/accumulation.ipynb` draws it), the naive way's peak {gap} (one more "
        f"gradients-sized buffer) above the memory-free way's at every micro-batch: "
        f"{peak(1, 'micro-batch ')}, {peak(64)}, {peak(1024)}. A step takes {step(1, False)} the memory-free way ({step(1, True)} "
        f"naive) at micro-batch 1, {step(64, False)} ({step(64, True)}) at 64 and "
        f"{step(1024, False)} ({step(1024, True)}) at 1024.")


def checkpointing_table():
    """Chapter 05's table of the policies at depth 32 (bench_checkpointing's medians)."""
    runs = medians_by_label(RESULTS / "cpu-checkpointing.json")[1]
    none = runs["none depth 32"]
    lines = ["| policy | activations + checkpoints at the peak | less | step peak (measured = "
             "predicted) | block forwards | time per step | ratio |",
             "|---|---|---|---|---|---|---|"]
    for policy, shown in (("none", "none"), ("sqrt", "sqrt (K = 6)"), ("every:4", "every:4"),
                          ("optimal:3", "optimal:3"), ("selective", "selective"),
                          ("sqrt+selective", "sqrt+selective")):
        b = runs[f"{policy} depth 32"]
        lines.append(
            f"| {shown} | {mib(b['activation_bytes'])} MiB | "
            f"{none['activation_bytes'] / b['activation_bytes']:.2f}x | "
            f"{mib(b['step_bytes'])} MiB | {b['block_forwards']:.0f} | {b['real_time']:.1f} ms | "
            f"{b['real_time'] / none['real_time']:.2f}x |")
    return "\n".join(lines)


def medians_by_label(path):
    """A Google Benchmark file's JSON and its medians by label."""
    data = json.loads(path.read_text())
    return data, {b["label"]: b for b in data["benchmarks"] if b.get("aggregate_name") == "median"}


def medians_source(path, data, what):
    """"From `PATH` (DATE, medians of N; `scripts/run-benchmarks.sh`): WHAT", wrapped."""
    return wrap(f"From `{path.relative_to(ROOT)}` ({data['context']['date'].split('T')[0]}, "
                f"medians of {repetitions_of(data)}; `scripts/run-benchmarks.sh`): {what}")


def attention_memory_table():
    """Chapter 08: attention's memory against T (bench_training's BM_GptAttentionMemory)."""
    path = RESULTS / "cpu-attention-memory.json"
    data, runs = medians_by_label(path)
    lines = [medians_source(path, data, "one sequence through 2 blocks of width 384 with 6 "
                            "heads, fp32, one forward and backward."),
             "",
             "| T | policy | kept per block | activations at the peak (measured = predicted) "
             "| less | block forwards | time | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for T in sorted({int(b["T"]) for b in runs.values()}):
        none = runs[f"none T {T}"]
        for policy in ("none", "every:1", "attention", "efficient"):
            b = runs[f"{policy} T {T}"]
            exact = "" if b["activation_bytes"] == b["predicted_activation_bytes"] else " (predicted " + \
                f"{mib(b['predicted_activation_bytes'])})"
            lines.append(
                f"| {T} | {policy} | {mib(b['kept_per_block'])} MiB | "
                f"{mib(b['activation_bytes'])} MiB{exact} | "
                f"{none['activation_bytes'] / b['activation_bytes']:.2f}x | "
                f"{b['block_forwards']:.0f} | {b['real_time']:.0f} ms | "
                f"{b['real_time'] / none['real_time']:.2f}x |")
    return "\n".join(lines)


def attention_kernels_table():
    """Chapter 08: the plain and memory-efficient attention kernels against T (BM_Attention)."""
    path = RESULTS / "cpu-attention-kernels.json"
    data, runs = medians_by_label(path)
    lines = [medians_source(path, data, "one sequence, 6 heads of 64 channels, f32, dropout "
                            "0.1, one forward and one backward."),
             "",
             "| T | kernel | kept for the backward | peak | time | ratio |",
             "|---|---|---|---|---|---|"]
    for T in sorted({int(b["T"]) for b in runs.values()}):
        plain = runs[f"plain T {T}"]
        for kernel in ("plain", "efficient"):
            b = runs[f"{kernel} T {T}"]
            lines.append(f"| {T} | {kernel} | {mib(b['kept_bytes'])} MiB | "
                         f"{mib(b['peak_bytes'])} MiB | {b['real_time']:.0f} ms | "
                         f"{b['real_time'] / plain['real_time']:.2f}x |")
    return "\n".join(lines)


def attention_kernel_ratio(T):
    """BM_Attention at T: the memory-efficient kernels' time over the plain ones'."""
    runs = medians_by_label(RESULTS / "cpu-attention-kernels.json")[1]
    return [f"{runs[f'efficient T {T}']['real_time'] / runs[f'plain T {T}']['real_time']:.2f}"]


def attention_memory_numbers(T, *columns):
    """Of BM_GptAttentionMemory at T: "kept" (none's kept bytes per block over attention's),
    "time" (attention's time over none's), "full" (every:1's time over none's),
    "efficient_peak" (none's activation bytes at the peak over efficient's),
    "efficient_time" (efficient's time over none's)."""
    runs = medians_by_label(RESULTS / "cpu-attention-memory.json")[1]
    none, attention, full, efficient = (runs[f"{p} T {T}"] for p in
                                        ("none", "attention", "every:1", "efficient"))
    value = {"kept": none["kept_per_block"] / attention["kept_per_block"],
             "time": attention["real_time"] / none["real_time"],
             "full": full["real_time"] / none["real_time"],
             "efficient_peak": none["activation_bytes"] / efficient["activation_bytes"],
             "efficient_time": efficient["real_time"] / none["real_time"]}
    return [f"{value[c]:.2f}" for c in columns]


def checkpointing_spread():
    """The date and the spread of chapter 05's table: the coefficients of variation."""
    data = json.loads((RESULTS / "cpu-checkpointing.json").read_text())
    cv = [b["real_time"] for b in data["benchmarks"]
          if b.get("aggregate_name") == "cv" and b["label"].endswith(" depth 32")]
    repetitions = repetitions_of(data)
    return [str(repetitions), data["context"]["date"].split("T")[0], f"{min(cv):.2f}",
            f"{max(cv):.2f}"]


def bf16_costs():
    """Chapter 04's sections (d) to (f), as its demo wrote them to
    chapter04-scale-trajectory.json (scripts/chapter-figures.sh)."""
    return json.loads((RESULTS / "chapter04-scale-trajectory.json").read_text())["bf16"]


def percent(fraction, digits=2):
    """A fraction (a number, or its text from a report) as a percentage: 0.0744, 1 -> "7.4%"."""
    return f"{float(fraction) * 100:.{digits}f}%"


def bf16_accumulation_table():
    rows = {r["micro_batches"]: r for r in bf16_costs()["accumulation"]}
    shown = [4, 16, 64, 256]
    cells = lambda key: " | ".join(percent(rows[n][key]) for n in shown)
    return "\n".join([
        "| N | " + " | ".join(str(n) for n in shown) + " |",
        "|---|" + "---:|" * len(shown),
        f"| bf16: share of the update wrong | {cells('bf16')} |",
        f"| predicted | {cells('bf16_predicted')} |",
        f"| fp16 | {cells('fp16')} |"])


def bf16_lost_updates_table():
    rows = bf16_costs()["lost_updates"]
    return "\n".join([
        "| lr | " + " | ".join(f"{r['lr']:.0e}".replace("e-0", "e-") for r in rows) + " |",
        "|---|" + "---:|" * len(rows),
        "| updates that round away, measured | " +
        " | ".join(percent(r["lost"]) for r in rows) + " |",
        "| predicted | " + " | ".join(percent(r["predicted"]) for r in rows) + " |"])


def precisions_table():
    lines = ["| precision | bytes per parameter | activation bytes per sample | skipped steps | "
             "loss (last 5 steps) | test accuracy | ms per step |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in bf16_costs()["precisions"]:
        lines.append(f"| {r['precision']} | {r['bytes_per_parameter']:.2f} | "
                     f"{r['activation_bytes_per_sample']:.0f} | {r['skipped']} | "
                     f"{r['final_loss']:.4f} | {r['test_accuracy']:.4f} | "
                     f"{r['ms_per_step']:.1f} |")
    return "\n".join(lines)


def kernel_table():
    return bench_summary.summary(str(RESULTS / "cpu-kernels.json"))


AVX2 = ROOT / "bench" / "results" / "cpu-2core-avx2"
NO_AVX2 = ("No AVX2 results are committed yet: `BIGBATCH_MAX_ISA=avx2 scripts/run-benchmarks.sh` "
           "(or the script on a CPU without AVX-512) writes them to `bench/results/cpu-2core-avx2/`.")


def avx2_gemm_table():
    """The GEMM rows of bench_kernels on the AVX2 paths, beside OpenBLAS's AVX2 kernel."""
    path = AVX2 / "cpu-kernels.json"
    if not path.exists():
        return NO_AVX2
    runs, context = bench_summary.load_runs(str(path))
    return "\n\n".join([
        f"The AVX2 paths: `{path.relative_to(ROOT)}` ({context.get('date', '?')}, "
        f"{context.get('cpu', '?')}), medians of {repetitions_of(json.loads(path.read_text()))}.",
        bench_summary.gemm_table(runs), bench_summary.training_shape_table(runs)])


def avx2_step_table():
    path = AVX2 / "cpu-training.json"
    if not path.exists():
        return NO_AVX2
    return bench_summary.step_summary(path, AVX2 / "pytorch-training.json")


def step_table():
    return bench_summary.step_summary(RESULTS / "cpu-training.json",
                                      RESULTS / "pytorch-training.json")


def gpt_versus_pytorch():
    """Chapter 08's validation losses beside PyTorch's, and the sample (scripts/gpt-vs-pytorch.sh)."""
    path = RESULTS / "gpt-fortunes-vs-pytorch.json"
    data = json.loads(path.read_text())
    model = data["model"]
    prose = wrap(
        f"From `{path.relative_to(ROOT)}` ({data['date'][:10]}, {data['library']}, "
        f"{data['threads']} threads; `scripts/gpt-vs-pytorch.sh`): {model['layers']} blocks of "
        f"width {model['width']} with {model['heads']} heads, T {model['seq_len']}, dropout "
        f"{model['dropout']:g}, {data['steps']} AdamW steps of {data['batch']} sequences "
        f"({data['training_sequences']} training sequences, {data['held_out_sequences']} held "
        f"out). Validation loss: bigbatch {data['validation_loss_bigbatch']:.4f}, PyTorch "
        f"{data['validation_loss_pytorch']:.4f}, {100 * data['relative_gap']:.2f}% apart "
        f"(the goal: at most {100 * data['tolerance']:.0f}%). What bigbatch's model writes "
        f"after \"{data['sample_prompt']}\" (temperature 0.8; on 24 KB of text and 300 steps, "
        f"spelling before words; each line's trailing blanks dropped here):")
    sample = "\n".join(line.rstrip() for line in data["sample"].splitlines())
    return f"{prose}\n\n```text\n{sample}\n```"


def gpt_step_table():
    return bench_summary.gpt_step_summary(RESULTS / "cpu-gpt.json", RESULTS / "pytorch-gpt.json")




# ---- numbers inside hand-written sentences ------------------------------------------------
# A sentence that quotes a number or two is easier to read written by hand than generated.
# Each entry below holds such a sentence's words around its numbers ("{}" for each) and the
# numbers as its source says them now: the check finds the words in the README (exactly
# once, across line breaks) and compares the numbers; --write puts the source's in.

REPORTS = RESULTS / "chapter-reports"


def report_path(chapter):
    """Chapter NN's demo report (the full run, as scripts/chapter-reports.sh saved it)."""
    paths = sorted(REPORTS.glob(f"chapter_{chapter}_*.txt"))
    if len(paths) != 1:
        raise SystemExit(f"{REPORTS.relative_to(ROOT)}: no single report of chapter {chapter}")
    return paths[0]


def checkpointed_block_row(policy):
    """Chapter 08 (e): a policy's share of none's activation bytes and of its step time (a
    row whose step peak was predicted to the byte)."""
    share, ratio, _ = report("08", r"^   \| " + re.escape(policy) + r" \| \d+ \| \d+ \| \d+ \| \d+ \| "
                                   r"([\d.]+)% \| [\d.]+ \| ([\d.]+)x \| (\d+) = \3 \| "
                                   r"none's bits \|$")
    return [share, ratio]


def budget_row(way):
    """Chapter 08 (f): a way's share of plain attention's step peak and its time over plain
    attention's (a row whose peak was predicted to the byte)."""
    return report("08", r"^   \| " + re.escape(way) + r" \| (\d+) = \1 \| ([\d.]+)% \| [\d.]+ \| "
                        r"([\d.]+)x \|")[1:]


def report(chapter, pattern):
    """The groups of the first match of `pattern` in chapter NN's demo report."""
    path = report_path(chapter)
    found = re.search(pattern, path.read_text(), re.M)
    if not found:
        raise SystemExit(f"{path.relative_to(ROOT)}: nothing matches {pattern!r}")
    return list(found.groups())


def sentence_pattern(template):
    """The regular expression of a sentence: its words as written, any whitespace between
    them (lines wrap anywhere), a number (digits, a sign, a point, thousands' commas, an
    exponent, a percent sign), a date (2026-12-02) or a word of letters for each {}."""
    number = r"(\d{4}-\d\d-\d\d|[-+]?(?:\d[\d,]*)?\.?\d+(?:e[-+]?\d+)?%?|[a-z]+)"
    pieces = []
    for i, literal in enumerate(template.split("{}")):
        if i:
            pieces.append(number)
        pieces.extend(r"\s+" if part.isspace() else re.escape(part)
                      for part in re.split(r"(\s+)", literal) if part)
    return re.compile("".join(pieces))


def check_sentence(content, readme, template, values, write):
    """(content, a complaint or None): the README's sentence checked, or rewritten."""
    matches = list(sentence_pattern(template).finditer(content))
    if len(matches) != 1:
        return content, (f"{readme}: the sentence {template!r} occurs {len(matches)} times "
                         f"(it must occur once)")
    match = matches[0]
    if len(values) != len(match.groups()):
        return content, f"{readme}: {template!r} has {len(match.groups())} numbers, its source {len(values)}"
    if list(match.groups()) == values:
        return content, None
    if not write:
        return content, (f"{readme}: {template!r} says {', '.join(match.groups())}, its source "
                         f"{', '.join(values)}")
    for i in reversed(range(len(values))):
        content = content[:match.start(i + 1)] + values[i] + content[match.end(i + 1):]
    return content, None


def fmt(text, spec):
    """A number from a report, written to `spec`: fmt("0.568", ".2f") -> "0.57"."""
    return format(float(text), spec)


def mib_of(text):
    """"803840" (bytes) -> "0.77" (MiB)."""
    return mib(float(text))



def elementwise_in_place():
    """The elementwise ops at 1.5x memcpy's rate or more: how many, in words."""
    runs, _ = bench_summary.load_runs(str(RESULTS / "cpu-kernels.json"))
    fast = [r for name, r in runs.items()
            if name.startswith("Elementwise_") and r.get("vs_memcpy", 0) >= 1.5]
    words = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight"]
    return [words[len(fast)]]


def lost_update(lr):
    return next(r["lost"] for r in bf16_costs()["lost_updates"] if r["lr"] == lr)


def accumulation_error(micro_batches):
    return next(r["bf16"] for r in bf16_costs()["accumulation"]
                if r["micro_batches"] == micro_batches)


def dlogits_subnormal(batch):
    return next(r["fp16_subnormal"] for r in bf16_costs()["dlogits"] if r["batch"] == batch)


def fp16_loss_curves():
    """Chapter 03's runs at a full-data batch (scripts/fp16-loss-curves.sh), by name."""
    runs = json.loads((RESULTS / "chapter03-loss-curves.json").read_text())["runs"]
    return {r["name"]: r for r in runs}


def fp16_loss_curves_table():
    runs = fp16_loss_curves()
    fp32 = runs["fp32"]["loss"][-1]
    lines = ["| run | final training loss | test accuracy |", "|---|---|---|"]
    for name, shown in (("fp32", "fp32"), ("fp16-unscaled", "fp16, no loss scale"),
                        ("fp16-static", "fp16, `static:65536`")):
        loss = runs[name]["loss"][-1]
        gap = "" if name == "fp32" else f" ({(loss - fp32) / fp32 * 100:+.2f}%)"
        lines.append(f"| {shown} | {loss:.4f}{gap} | {runs[name]['test_accuracy']:.4f} |")
    return "\n".join(lines)


def static_scale_gap():
    """How far the statically scaled fp16 run's loss strays from fp32's, at worst."""
    runs = fp16_loss_curves()
    gap = max(abs(a - b) / b for a, b in zip(runs["fp16-static"]["loss"], runs["fp32"]["loss"]))
    return [f"{gap * 100:.1f}%"]


def checkpointing_run(policy, depth=32):
    data = json.loads((RESULTS / "cpu-checkpointing.json").read_text())
    return next(b for b in data["benchmarks"] if b.get("aggregate_name") == "median"
                and b["label"] == f"{policy} depth {depth}")


def selective_against_sqrt():
    """Selective's step time and sqrt's, each over no checkpointing's, at depth 32."""
    none = checkpointing_run("none")["real_time"]
    return [f"{checkpointing_run(p)['real_time'] / none:.2f}" for p in ("selective", "sqrt")]


def none_step_bytes():
    b = checkpointing_run("none")["step_bytes"]
    return [f"{b:,.0f}", mib(b)]


def frontier_smallest():
    frontier = json.loads((RESULTS / "planner-frontier.json").read_text())
    return [mib(frontier["smallest_peak"]["peak_bytes"]), mib(frontier["smallest_peak"]["fixed_bytes"])]


def fresh_machine_tutorial():
    """The seconds and the date of scripts/fresh-machine-tutorial.sh's run."""
    text = (RESULTS / "fresh-machine-tutorial.txt").read_text()
    return [re.search(r"^seconds: (\d+)", text, re.M).group(1),
            re.search(r"^date: (\S+)", text, re.M).group(1)]


def fp16_activation_ratio():
    """Chapter 03: fp16's activation bytes over fp32's, at two decimals."""
    return fmt(report("03", r"activations fp16 / fp32: ([\d.]+)")[0], ".2f")


def micro_batch_activations():
    """Chapter 02: the activations' own peak of a step of micro-batches of 256, in MiB."""
    return report("02", r"as micro-batches, step 1 peaks at: activations ([\d.]+) MiB")


def rank_memory(column, rows_wanted=((1, 0), (2, 1), (4, 1))):
    """Chapter 07's table of rank 0's step (section e), in MiB: by default stage 0 at R = 1,
    then stage 1 at R = 2 and 4, of the column "optimizer state", "gradients" (between
    steps), "gradients at peak" or "step peak"; rows_wanted names other (R, stage) rows."""
    columns = ("optimizer state", "gradients", "gradients at peak", "step peak")
    rows = {}
    for r, stage, *values in re.findall(
            r"^   ([124]) +([012]) +([\d.]+) +([\d.]+) \(([\d.]+)\) +([\d.]+)$",
            report_path("07").read_text(), re.M):
        rows[(int(r), int(stage))] = values[columns.index(column)]
    return [rows[row] for row in rows_wanted]


CH01 = "chapters/01_large_batch_baseline/README.md"
CH02 = "chapters/02_gradient_accumulation/README.md"
CH03 = "chapters/03_fp16_static_loss_scaling/README.md"
CH04 = "chapters/04_dynamic_loss_scaling/README.md"
CH05 = "chapters/05_activation_checkpointing/README.md"
CH06 = "chapters/06_planner/README.md"
CH07 = "chapters/07_data_parallel/README.md"
CH08 = "chapters/08_transformer/README.md"
FIXED = r"parameters \+ gradients \+ optimizer state = ([\d.]+) MiB"

# (README, the sentence with {} for each number, the function giving the numbers)
SENTENCES = [
    (CH08, "the memory-efficient kernels take {}x the plain ones' time at T = 1024 and {}x at "
           "4096",
     lambda: attention_kernel_ratio(1024) + attention_kernel_ratio(4096)),
    (CH08, "a block keeps {}x fewer bytes under `attention` at T = 1024 for {}x the time, and "
           "{}x fewer at T = 4096 for {}x.",
     lambda: attention_memory_numbers(1024, "kept", "time") +
     attention_memory_numbers(4096, "kept", "time")),
    (CH08, "at T = 4096 its step holds {}x fewer activation bytes than `none` at the peak, "
           "for {}x the time.",
     lambda: attention_memory_numbers(4096, "efficient_peak", "efficient_time")),
    (CH08, "on a device of {} MiB, the largest of the three techniques' predicted step peaks. "
           "Plain attention's step is predicted at {} MiB and runs out of memory there.",
     lambda: report("08", r"on a device of ([\d.]+) MiB$") +
     report("08", r"^   plain attention \(none\), predicted step peak ([\d.]+) MiB, under the cap: "
                  r"out of memory")),
    (CH08, "Full recomputation (`every:1`) trains in {}% of plain attention's peak for {}x its "
           "time, selective attention recomputation (`attention`) in {}% for {}x, and "
           "memory-efficient attention (`--attention efficient`) in {}% for {}x.",
     lambda: budget_row("every:1") + budget_row("attention") + budget_row("efficient")),
    (CH08, "Full recomputation (`every:1`) costs {}x at T = 1024 and {}x at 4096.",
     lambda: attention_memory_numbers(1024, "full") + attention_memory_numbers(4096, "full")),
    (CH08, "makes the mistake and measures it: the gradient is off by {}% of its norm, as predicted ({}%).",
     lambda: report("08", r"off by ([\d.]+)% of its norm \(predicted from the weights N / \(M n_k\): "
                          r"([\d.]+)%\)")),
    (CH08, "`every:2` keeps {}% of the activation bytes for {}x the step's time, and `optimal:2` "
           "keeps {}% for {}x.",
     lambda: checkpointed_block_row("every:2") + checkpointed_block_row("optimal:2")),
    (CH08, "The a s^2 b terms are attention's: at T = 1024 they are {}% of what a block keeps.",
     lambda: report("08", r"^   \| 1024 \| \d+ \| \d+ \| \d+ \| ([\d.]+)% \|$")),
    (CH07, "(24 blocks of width 1024, bf16, {} MB of f32 gradients)",
     lambda: report("07", r"a model of 24 blocks of width 1024, bf16, (\d+) MB of f32 gradients")),
    (CH07, "small share of the step (at 512 GPUs, {}% of a step of one micro-batch, {}% of 64)",
     lambda: report("07", r"at 512 GPUs the sum is (\d+)% of a step of one micro-batch per rank "
                          r"and ([\d.]+)% of a step of 64")),
    (CH07, "falls from {} MiB to {} at R = 2 and {} at R = 4, the step's peak from {} to {} and {} MiB;",
     lambda: rank_memory("optimizer state") + rank_memory("step peak")),
    (CH07, "2 the gradients between steps fall to {} and {} MiB, at the peak {} and {} (one",
     lambda: (rank_memory("gradients", ((2, 2), (4, 2))) +
              rank_memory("gradients at peak", ((2, 2), (4, 2))))),
    (CH07, "while its sum is taken), the step's peak to {} and {} MiB. One rank at stage 2 "
           "pays that block on top of whole gradients: {} MiB against {}.",
     lambda: rank_memory("step peak", ((2, 2), (4, 2), (1, 2), (1, 0)))),
    (CH07, "shard the f32 master weights too: rank 0 holds {} of their {}",
     lambda: report("07", r"keep a quarter of the f32 master weights on rank 0 too: ([\d.]+) of "
                          r"([\d.]+) MiB")),
    ("README.md", "summed in a bf16 buffer, 256 micro-batches get {} of the update wrong",
     lambda: [percent(accumulation_error(256), 1)]),
    ("README.md", "(without them, {} of AdamW's updates at lr 1e-4 round away)",
     lambda: [percent(lost_update(1e-4), 0)]),
    ("bench/README.md", "fp16 cuts the activations to {} of fp32's (chapter 03)",
     lambda: [fp16_activation_ratio()]),
    ("bench/README.md", "`bench/results/cpu-2core-avx512/fashion-mnist-techniques.md` (2-core CPU, {}, the",
     lambda: re.findall(r"epochs, (\d{4}-\d\d-\d\d),",
                        (RESULTS / "fashion-mnist-techniques.md").read_text())[:1]),
    ("bench/README.md", "The {} ops far above 1.0 (1.5x or more) work in place", elementwise_in_place),
    ("README.md", "it took {} s from the packages' download to chapter 07's report ({}, before chapter",
     fresh_machine_tutorial),
    (CH01, "its gradients and optimizer state ({} MiB) and a step of batch 256 ({} MiB at its peak)",
     lambda: report("01", FIXED) + report("01", r"one step at batch 256: peak ([\d.]+) MiB")),
    (CH01, "The first three rows are fixed: 16 bytes per parameter, {} MiB, whatever the batch.",
     lambda: report("01", FIXED)),
    (CH01, "The activations grow linearly with the batch: {} MiB at 256, about {} MiB at 4096,",
     lambda: report("01", r"^   activations +\d+ B +([\d.]+) MiB") +
     [fmt(report('01', r'at 4096 they would be about ([\d.]+) MiB')[0], ".0f")]),
    (CH01, "own peak, at the end of the forward pass: {} MiB at 256.)",
     micro_batch_activations),
    (CH01, "data sets ({} MiB of Fashion-MNIST)",
     lambda: report("01", r"the ([\d.]+) MiB of data sets are host memory")),
    (CH01, "the loss falling from about 2.4, a test accuracy of {}",
     lambda: report("01", r"^   trained in .* accuracy ([\d.]+)$")),
    (CH02, "peaks at {} MiB of 48 MiB: activations {} MiB instead of {} MiB in one piece,",
     lambda: report("02", r"as micro-batches, step 1 peaks at: activations [\d.]+ MiB, .*total "
                          r"([\d.]+) MiB") +
     micro_batch_activations() +
     report("02", r"one piece, no cap, step 1 peaks at: activations ([\d.]+) MiB")),
    (CH02, "device are one micro-batch, {} MiB, not the batch's {} MiB:",
     lambda: [mib_of(report("01", r"^   data +(\d+) B")[0])] +
     report("02", r"data ([\d.]+) MiB\)")),
    (CH02, "section (c) measures the gradient off by {} of its largest element.",
     lambda: [percent(report("02", r"per-micro-batch averaging: max relative error predicted "
                                 r"[\d.]+, measured ([\d.]+)")[0], 1)]),
    (CH02, "which the demo predicts and measures (about {} of the largest",
     lambda: [percent(report("02", r"per-micro-batch averaging: max relative error predicted "
                                 r"([\d.]+),")[0], 0)]),
    (CH03, "in 16 bits ({} of fp32's bytes here: the statistics and logits stay f32)",
     lambda: [fp16_activation_ratio()]),
    (CH03, "(the statistics and logits stay f32: {} of fp32's activations here)",
     lambda: [fp16_activation_ratio()]),
    (CH03, "end of the forward pass) {} MiB in fp32, {} MiB in fp16 ({}: the LayerNorm",
     lambda: report("03", r"^   fp32: .*activations ([\d.]+) MiB") +
     report("03", r"^   fp16: .*activations ([\d.]+) MiB") +
     [fp16_activation_ratio()]),
    (CH03, "none at 256, {} subnormal at 4096, {} at 65536;",
     lambda: [report("03", r"B = 4096: .*S = 1: [\d.]+% zero, ([\d.]+%) subnormal")[0],
              report("03", r"B = 65536: .*S = 1: [\d.]+% zero, ([\d.]+)% subnormal")[0]
              .replace(".0", "") + "%"]),
    (CH03, "fp16 gradients are off fp32's by {} without scaling and by {} with S = 2^16.",
     lambda: [percent(v, d) for v, d in zip(report(
         "03", r"fp16 gradients off fp32's by ([\d.]+) without scaling, ([\d.]+) with"), (1, 2))]),
    (CH03, "with S = 2^16 it follows fp32 to within {} at every step.", static_scale_gap),
    (CH04, "the first {} steps overflow and are skipped as S halves to 2^{}, where the first",
     lambda: [str(int(report("04", r"first step taken: (\d+) at")[0]) - 1),
              report("04", r"first step taken: \d+ at S = 2\^(\d+)")[0]]),
    (CH04, "({} of 120 steps skipped in the full run)",
     lambda: report("04", r"; (\d+) of 120 steps skipped")),
    (CH04, "falls ({} to {} over the steps taken)",
     lambda: [f"{float(v):.2f}" for v in
              report("04", r"mean loss of the first and last 5 steps taken: ([\d.]+) -> ([\d.]+)")]),
    (CH04, "gradient norm {}):",
     lambda: [fmt(report('04', r'batch 256: gradient norm ([\d.]+),')[0], ".2f")]),
    (CH04, "| {} of the update off; the replay predicts every element to {} |",
     lambda: [report("04", r"in another direction: ([\d.]+%) of the update off")[0],
              fmt(report('04', r'predicts every element to ([\d.e+-]+)')[0], ".0e")
              .replace("e-0", "e-")]),
    (CH04, "| MAX / S = 0.000488 (S = 1024) | {} |",
     lambda: [fmt(report("04", r"clip before unscaling \(S = 1024\): norm ([\d.e+-]+) after")[0],
                  ".3g")]),
    (CH04, "| lr {}, {}, {} after 2 skips vs {}, {}, {} |",
     lambda: [fmt(v, "g") for v in
              report("04", r"lr by steps taken: \S+ \S+ ([\d.e-]+) ([\d.e-]+) ([\d.e-]+)") +
              report("04", r"lr by steps run: +\S+ \S+ ([\d.e-]+) ([\d.e-]+) ([\d.e-]+)")]),
    (CH04, "S = 1: fp16 holds {} of them only as subnormals at B = 4096 and {} at B = 65536;",
     lambda: [percent(dlogits_subnormal(4096)), percent(dlogits_subnormal(65536), 0)]),
    (CH04, "fp16's gradients are off fp32's by {} (worst tensor, normalised), bf16's by {}, its",
     lambda: [f"{float(v):.2g}" if float(v) > 0.01 else f"{float(v):.4f}" for v in
              report("04", r"gradients off fp32's by ([\d.]+) in fp16, ([\d.]+) in bf16")]),
    (CH05, "(1.25 MiB per block at batch 128: {} MiB at depth 4, {} MiB at",
     lambda: report("05", r"depth 4 ([\d.]+) MiB") + report("05", r"depth 16 ([\d.]+) MiB")),
    (CH05, "medians of {} interleaved repetitions, {}, on the CPU its context names)",
     lambda: checkpointing_spread()[:2]),
    (CH05, "`real_time_cv` rows give coefficients of variation of {} to {} for these six",
     lambda: checkpointing_spread()[2:]),
    (CH05, "C 10) that is {} bytes ({} MiB), the step peak of `none` in the table above.",
     none_step_bytes),
    (CH05, "in the table above, `selective` takes {} times the step of `none` (nothing the "
           "noise would show) where `sqrt` takes {} times.", selective_against_sqrt),
    (CH06, "batch 4096 in one piece would peak at {} MiB (chapter",
     lambda: report("06", r"the step would peak at ([\d.]+) MiB")),
    (CH06, "no plan fits the step in 4.00 MiB: the smallest predicted peak is {} MiB", lambda: frontier_smallest()[:1]),
    (CH06, "optimal:1+selective), of which {} MiB", lambda: frontier_smallest()[1:]),
]


def keras_findings():
    """keras-recipes.json (scripts/keras-recipes.sh): its header and its findings by id."""
    path = RESULTS / "keras-recipes.json"
    data = json.loads(path.read_text())
    source = (f"`{path.relative_to(ROOT)}` (TensorFlow {data['tensorflow']}, Keras "
              f"{data['keras']}, one thread; `scripts/keras-recipes.sh`)")
    return source, {f["id"]: f["measured"] for f in data["findings"]}


def times_noise(value):
    """A distance in units of NOISE: 0.59 x NOISE, 2,418 x NOISE; 8.9e9 x past ten million."""
    if value >= 1e7:
        text = f"{value:.1e}".replace("e+0", "e").replace("e+", "e")
    else:
        text = f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
    return text + " x NOISE"


def listed(numbers):
    """1; 1 and 2; 1, 2 and 3."""
    if len(numbers) == 1:
        return str(numbers[0])
    return ", ".join(str(n) for n in numbers[:-1]) + " and " + str(numbers[-1])


def keras_recipes_accumulation():
    """Chapter 02: the recipes' accumulation, run (keras_recipes.py's Q1 to Q4 and Q7)."""
    source, m = keras_findings()
    loop, short, left = (m["000-loop-mean-of-equal-micro-batches"],
                         m["000-loop-short-micro-batch-unweighted"], m["000-loop-leftover-carried"])
    fires, sum001 = m["000-decorator-fires-once"], m["001-sum-not-mean"]
    short001, left001 = m["001-short-micro-batch-unweighted"], m["001-leftover-carried"]
    when004, sum004 = (m["004-schedule-first-update-after-one-micro-batch"],
                       m["004-sum-of-per-sample-gradients"])
    left004 = m["004-leftover-carried-short-micro-batch-weighted"]
    crash = m["000-decorator-short-micro-batch-crash"]
    uneven, leftover = m["corrected-vs-large-batch-uneven"], m["corrected-vs-large-batch-leftover"]
    ours = m["corrected-vs-bigbatch-micro-batch"]
    items = [
        f"{source}: each recipe's loop on this chapter's MLP beside the large batch, the "
        f"parameters' distance from it in units of NOISE (Keras's own fp32-to-float64 "
        f"distance; within 10 is the large batch's).",
        f"- 000's `GradientTape` loop applies the mean of its micro-batches' mean gradients: "
        f"with equal micro-batches it is the large batch ({times_noise(loop['x_noise'])}). "
        f"But the epoch's short window ({short['short_window_rows'][0]} + "
        f"{short['short_window_rows'][1]} rows) weights its short micro-batch "
        f"{short['short_micro_batch_weight_applied']:g} where the large batch gives it "
        f"{short['short_micro_batch_weight_large_batch']:.3f} "
        f"({times_noise(short['x_noise'])} after an epoch), and the micro-batches left at an "
        f"epoch's end are carried into the next epoch's first update "
        f"({left['epoch2_first_update_micro_batches']} micro-batches in it; "
        f"{left['updates_per_epoch'][0]} updates an epoch where the large batch takes "
        f"{left['large_batch_steps_per_epoch']}; {times_noise(left['x_noise'])}).",
        f"- 000's decorator fails on its first call with an optimizer that has slot variables "
        f"(Adam, SGD with momentum). With the optimizer built first it updates "
        f"{fires['updates']} time in {fires['micro_batches']} micro-batches where "
        f"{fires['intended_updates']} are meant (`optimizer.iterations` advances only when it "
        f"updates, so `iterations % 2` is never 0 again), that update is the first "
        f"micro-batch's gradient halved (the buffer set on the function while tracing starts "
        f"every call from zeros), and the epoch's short micro-batch fails it (call "
        f"{crash['calls_completed'] + 1}).",
        f"- 001 applies the sum: its first update is "
        f"{sum001['first_update_norm_over_large_batch_gradient']:.1f} times the large batch's "
        f"gradient ({times_noise(sum001['x_noise'])} with SGD; "
        f"{times_noise(sum001['adam_x_noise'])} with the recipe's Adam, where the factor "
        f"survives only through epsilon). Its short micro-batch weighs "
        f"{short001['short_micro_batch_weight_applied']:g} where "
        f"{short001['short_micro_batch_weight_large_batch']:.3f} is meant, and "
        f"{left001['epoch2_first_update_micro_batches']} micro-batches go into the second "
        f"epoch's first update.",
        f"- 004 as written does not run (its `tf.function` reassigns a global Python list); "
        f"with `tf.Variable` buffers it updates after micro-batches "
        f"{listed(when004['update_at_micro_batch'])} where "
        f"{listed(when004['intended_update_at_micro_batch'])} are meant, applies the sum of "
        f"per-sample gradients ({sum004['second_update_norm_over_large_batch_mean']:.1f} "
        f"times the mean for a window of 100 rows; with SGD "
        f"{times_noise(sum004['sgd_x_noise'])}), and carries "
        f"{left004['epoch_end_window_micro_batches']} micro-batches across the epoch's end.",
        f"- The corrected loop (each micro-batch's mean gradient weighted by its rows over "
        f"the window's, an explicit counter, the epoch's leftover applied as its short last "
        f"step) is the large batch's: {times_noise(uneven['x_noise'])} with uneven "
        f"micro-batches, {times_noise(leftover['x_noise'])} across an epoch's leftover; "
        f"`bigbatch train --micro-batch 25` lies {times_noise(ours['x_noise'])} from it.",
    ]
    bullets = ["- " + wrap(item[2:], width=88).replace("\n", "\n  ") for item in items[1:]]
    return wrap(items[0]) + "\n\n" + "\n".join(bullets)


def keras_recipes_loss_scale():
    """Chapter 04: where each recipe updates its loss scale (keras_recipes.py's Q6)."""
    source, m = keras_findings()
    rule = m["corrected-loss-scale-once-per-step"]
    loop, decorator = m["000-loop-loss-scale-per-step"], m["000-decorator-loss-scale-per-micro-batch"]
    builtin, vector = (m["keras3-builtin-accumulation-loss-scale-per-micro-batch"],
                       m["004-per-sample-loss-overflows"]["start_2_15_no_poison"])
    ours = rule["bigbatch_fp16_poisoned_micro_batch_6"]
    return wrap(
        f"{source}, windows of 4 micro-batches from a scale of 2^20, where steps overflow "
        f"until the scale is low enough: the corrected loop halves once per optimizer step, "
        f"after micro-batches {listed(rule['start_2^20']['halved_at_micro_batch'])}, and "
        f"000's loop does the same ({listed(loop['start_2^20']['halved_at_micro_batch'])}). "
        f"000's decorator halves after micro-batches "
        f"{listed(decorator['start_2^20']['halved_at_micro_batch'])}, once per micro-batch "
        f"(a skipped step leaves `optimizer.iterations` at 0), and so does Keras 3's own "
        f"`gradient_accumulation_steps` under `LossScaleOptimizer` "
        f"({listed(builtin['start_2^20']['halved_at_micro_batch'])}); with the 6th "
        f"micro-batch made to overflow, the latter drops that micro-batch alone and shifts "
        f"every later window (updates after micro-batches "
        f"{listed(builtin['poisoned_micro_batch_6']['parameters_moved_at_micro_batch'])} where "
        f"the rule, skipping the whole step, updates after "
        f"{listed(rule['poisoned_micro_batch_6']['parameters_moved_at_micro_batch'])}). 004 "
        f"scales its per-sample loss vector, 25 times the mean's gradient for a micro-batch "
        f"of 25, so at the default 2^15 it overflows with no bad input: halvings after "
        f"micro-batches {listed(vector['halved_at_micro_batch'])}, "
        f"{vector['updates_applied']} updates of 5 applied. On the same poisoned data "
        f"`bigbatch train --precision fp16` skips step {listed(ours['skipped_steps'])} and "
        f"goes from 2^{ours['log2_scale_per_step'][0]:.0f} to "
        f"2^{ours['log2_scale_per_step'][-1]:.0f}.")


def keras_recipes_checkpointing():
    """Chapter 05: 001's checkpointing by attribute (keras_recipes.py's Q5)."""
    source, m = keras_findings()
    q = m["001-checkpointing-attribute-is-a-no-op"]
    same = "the same bits" if q["gradients_rel_attribute_vs_plain"] == 0 else "other bits"
    return wrap(
        f"{source}: recipe 001's \"selective gradient checkpointing\", an attribute set on "
        f"layers, recomputes nothing. The gradient's graph has {q['ops_with_attribute']} "
        f"operations with it and {q['ops_plain']} without ({q['matmuls_with_attribute']} "
        f"matrix products each), and the gradients are {same}; `tf.recompute_grad` around "
        f"each block gives {q['ops_tf_recompute_grad_per_block']} operations "
        f"({q['matmuls_tf_recompute_grad_per_block']} matrix products) and "
        f"`keras.RematScope(\"full\")` {q['ops_keras_remat_scope_full']} "
        f"({q['matmuls_keras_remat_scope_full']}): recomputation shows in the graph.")


# (README, marker name, the function that writes the text between the markers)
PARAGRAPHS = [
    ("bench/README.md", "bench", kernel_table),
    ("bench/README.md", "steps", step_table),
    ("bench/README.md", "bench-avx2", avx2_gemm_table),
    ("bench/README.md", "steps-avx2", avx2_step_table),
    ("bench/README.md", "techniques", techniques_table),
    ("bench/README.md", "gpt-techniques", lambda: techniques_table("gpt-techniques.md")),
    ("bench/README.md", "gpt-steps", gpt_step_table),
    ("chapters/08_transformer/README.md", "gpt-vs-pytorch", gpt_versus_pytorch),
    ("chapters/08_transformer/README.md", "attention-memory", attention_memory_table),
    ("chapters/08_transformer/README.md", "attention-kernels", attention_kernels_table),
    ("bench/README.md", "equivalence", equivalence_summary),
    ("bench/README.md", "curves", curves_summary),
    ("bench/README.md", "accumulation", accumulation_summary),
    ("chapters/04_dynamic_loss_scaling/README.md", "bf16-accumulation", bf16_accumulation_table),
    ("chapters/04_dynamic_loss_scaling/README.md", "bf16-lost-updates", bf16_lost_updates_table),
    ("chapters/04_dynamic_loss_scaling/README.md", "precisions", precisions_table),
    ("chapters/05_activation_checkpointing/README.md", "checkpointing-table", checkpointing_table),
    ("chapters/03_fp16_static_loss_scaling/README.md", "loss-curves", fp16_loss_curves_table),
    ("chapters/04_dynamic_loss_scaling/README.md", "equivalence", equivalence_fp16),
    ("chapters/05_activation_checkpointing/README.md", "checkpointing-time", checkpointing_time),
    ("chapters/01_large_batch_baseline/README.md", "opening", lambda: opening("01")),
    ("chapters/02_gradient_accumulation/README.md", "opening", lambda: opening("02")),
    ("chapters/02_gradient_accumulation/README.md", "lr-study", learning_rate_study),
    ("chapters/02_gradient_accumulation/README.md", "keras-recipes", keras_recipes_accumulation),
    ("chapters/04_dynamic_loss_scaling/README.md", "keras-recipes", keras_recipes_loss_scale),
    ("chapters/05_activation_checkpointing/README.md", "keras-recipes", keras_recipes_checkpointing),
    ("chapters/03_fp16_static_loss_scaling/README.md", "opening", lambda: opening("03")),
    ("chapters/03_fp16_static_loss_scaling/README.md", "try-adamw", lambda: opening("03-try")),
    ("chapters/04_dynamic_loss_scaling/README.md", "opening", lambda: opening("04")),
    ("chapters/05_activation_checkpointing/README.md", "opening", lambda: opening("05")),
    ("chapters/06_planner/README.md", "opening", lambda: opening("06")),
    ("chapters/06_planner/README.md", "frontier", planner_frontier),
    ("chapters/06_planner/README.md", "modelled-gpu", modelled_gpu),
    ("chapters/07_data_parallel/README.md", "data-parallel-time", data_parallel_time),
]


def wrap(text, width=90, indent=""):
    """Markdown prose wrapped at the repository's line width, every line after `indent`
    (tables, and text of several lines, keep their lines: each is indented)."""
    if text.lstrip().startswith(("|", "Medians")) or "\n" in text:
        return "\n".join(indent + line if line else line for line in text.splitlines())
    width -= len(indent)
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join(indent + l for l in lines + [line])


def self_test():
    """The sentence check on a text of its own: a number that moved is named and rewritten
    (keeping the line break inside the sentence), a sentence found twice or not at all is
    refused, and a current one passes."""
    template = "the step peaks at {} MiB, {} times the"
    text = "Intro.\nAs measured, the step peaks at 26.96 MiB, 1.16\ntimes the batch.\n"
    failures = []
    _, complaint = check_sentence(text, "t.md", template, ["26.96", "1.16"], False)
    if complaint:
        failures.append(f"a current sentence was refused: {complaint}")
    _, complaint = check_sentence(text, "t.md", template, ["27.21", "1.16"], False)
    if not complaint or "27.21" not in complaint:
        failures.append("a moved number went unnoticed")
    rewritten, complaint = check_sentence(text, "t.md", template, ["27.21", "1.2"], True)
    if complaint or rewritten != text.replace("26.96", "27.21").replace("1.16\n", "1.2\n"):
        failures.append(f"--write did not put the new numbers in place: {rewritten!r}")
    for wrong, why in ((text + text, "twice"), ("Intro.\n", "nowhere")):
        _, complaint = check_sentence(wrong, "t.md", template, ["26.96", "1.16"], False)
        if not complaint or "occurs" not in complaint:
            failures.append(f"a sentence found {why} was not refused")
    for failure in failures:
        print(f"FAIL: {failure}")
    if not failures:
        print("the sentence check names a moved number, rewrites it and refuses a sentence "
              "found twice or not at all")
    return 1 if failures else 0


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0
    if "--self-test" in argv:
        return self_test()
    write = "--write" in argv
    stale = []
    for readme, name, render in PARAGRAPHS:
        path = ROOT / readme
        content = path.read_text()
        begin = content.find(f"<!-- {name}:begin -->")
        indent = content[content.rfind("\n", 0, begin) + 1:begin] if begin >= 0 else ""
        updated = bench_summary.replace_between(content, name, wrap(render(), indent=indent),
                                                readme)
        if updated != content:
            if write:
                path.write_text(updated)
                print(f"{readme}: rewrote {name}")
            else:
                stale.append(f"{readme} ({name})")
    complaints = []
    for readme, template, values in SENTENCES:
        path = ROOT / readme
        before = path.read_text()
        content, complaint = check_sentence(before, readme, template, values(), write)
        if complaint:
            complaints.append(complaint)
        elif content != before:
            path.write_text(content)
            print(f"{readme}: rewrote {template!r}")
    if stale or complaints:
        if stale:
            print("stale: the results say otherwise than " + ", ".join(stale) +
                  "; scripts/readme_numbers.py --write rewrites them")
        for complaint in complaints:
            print(complaint)
        if complaints and not write:
            print("(scripts/readme_numbers.py --write puts each source's numbers in)")
        return 1
    if not write:
        print(f"{len(PARAGRAPHS)} paragraphs and {len(SENTENCES)} sentences say what their "
              f"results files say")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
