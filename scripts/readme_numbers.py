#!/usr/bin/env python3
"""Writes, or checks, the README paragraphs whose numbers come from committed results.

Usage: scripts/readme_numbers.py            check: exit 1, naming each stale paragraph
       scripts/readme_numbers.py --write    rewrite every paragraph from its results

Each paragraph sits between <!-- NAME:begin --> and <!-- NAME:end --> in its README and is
the output of one function below, of the results files it names: the text is what those
files say, so a benchmark run that changes them rewrites it (the scripts that write the
results call --write), and a README edited by hand, or results committed without the
text, fails the check (CTest readme_numbers_current, so scripts/test.sh and CI run it).
Only the standard library is needed.
"""
import json
import pathlib
import re
import statistics
import sys

import bench_summary

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cpu-2core"
MiB = 2**20


def mib(value):
    return f"{value / MiB:.2f}"


def ratio_range(values):
    low, high = min(values), max(values)
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f} to {high:.1f}"


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
    repetitions = next(b["repetitions"] for b in data["benchmarks"] if "repetitions" in b)
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


def techniques_table():
    """The README's table of every technique (scripts/techniques-table.sh), in its list item."""
    lines = (RESULTS / "fashion-mnist-techniques.md").read_text().splitlines()
    return "\n".join("  " + line for line in lines if line.startswith("|"))


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
                       f"(`bench/results/cpu-2core/fashion-mnist-large-batch-16-epochs.json`, "
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


def kernel_table():
    return bench_summary.summary(str(RESULTS / "cpu-kernels.json"))


def step_table():
    return bench_summary.step_summary(RESULTS / "cpu-training.json",
                                      RESULTS / "pytorch-training.json")


# (README, marker name, the function that writes the text between the markers)
PARAGRAPHS = [
    ("README.md", "bench", kernel_table),
    ("README.md", "steps", step_table),
    ("README.md", "techniques", techniques_table),
    ("README.md", "equivalence", equivalence_summary),
    ("README.md", "curves", curves_summary),
    ("chapters/04_dynamic_loss_scaling/README.md", "equivalence", equivalence_fp16),
    ("chapters/05_activation_checkpointing/README.md", "checkpointing-time", checkpointing_time),
    ("chapters/01_large_batch_baseline/README.md", "opening", lambda: opening("01")),
    ("chapters/02_gradient_accumulation/README.md", "opening", lambda: opening("02")),
    ("chapters/02_gradient_accumulation/README.md", "lr-study", learning_rate_study),
    ("chapters/03_fp16_static_loss_scaling/README.md", "opening", lambda: opening("03")),
    ("chapters/03_fp16_static_loss_scaling/README.md", "try-adamw", lambda: opening("03-try")),
    ("chapters/04_dynamic_loss_scaling/README.md", "opening", lambda: opening("04")),
    ("chapters/05_activation_checkpointing/README.md", "opening", lambda: opening("05")),
    ("chapters/06_planner/README.md", "opening", lambda: opening("06")),
    ("chapters/06_planner/README.md", "frontier", planner_frontier),
    ("chapters/06_planner/README.md", "modelled-gpu", modelled_gpu),
]


def wrap(text, width=90, indent=""):
    """Markdown prose wrapped at the repository's line width, every line after `indent`
    (tables, and text of several lines, are left alone)."""
    if text.lstrip().startswith(("|", "Medians")) or "\n" in text:
        return text
    width -= len(indent)
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join(indent + l for l in lines + [line])


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0
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
    if stale:
        print("stale: the results say otherwise than " + ", ".join(stale) +
              "; scripts/readme_numbers.py --write rewrites them")
        return 1
    if not write:
        print(f"{len(PARAGRAPHS)} paragraphs say what their results files say")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
