#!/usr/bin/env python3
"""Turns Google Benchmark JSON from bench_kernels into the Markdown tables in bench/README.md.

Usage: scripts/bench_summary.py [RESULTS.json]
RESULTS.json defaults to bench/results/cpu-2core-avx512/cpu-kernels.json.

Reads medians when the run has repetitions (aggregate "median"), plain runs otherwise, and
prints the kernels' table. scripts/readme_numbers.py puts it between the markers
<!-- bench:begin --> and <!-- bench:end --> in bench/README.md, and between
<!-- steps:begin --> and <!-- steps:end --> the whole-step table (step_summary):
bench_training's fp32 steps (cpu-training.json) beside PyTorch's (pytorch-training.json,
from bench/pytorch_step.py).
Only the standard library is needed, so this runs anywhere Python 3 does.
"""
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_runs(path):
    """Returns ({benchmark name: run}, context), preferring median aggregates."""
    data = json.loads(pathlib.Path(path).read_text())
    runs, medians = {}, {}
    for run in data["benchmarks"]:
        if run.get("error_occurred"):
            continue
        name = re.sub(r"/(real|manual)_time$", "", run.get("run_name", run["name"]))
        if run.get("run_type") == "aggregate":
            if run.get("aggregate_name") == "median":
                medians[name] = run
        else:
            runs.setdefault(name, run)
    runs.update(medians)
    return runs, data.get("context", {})


def cpu_result_folders(file_name):
    """[(ISA, folder)] of every bench/results/cpu-*-ISA/ folder that holds file_name,
    AVX-512 first: the machines whose results are committed, for the notebooks to draw."""
    folders = []
    for folder in sorted((ROOT / "bench" / "results").glob("cpu-*")):
        if (folder / file_name).exists():
            folders.append((folder.name.rsplit("-", 1)[-1], folder))
    return sorted(folders, key=lambda entry: entry[0] != "avx512")


def gflops(run):
    return run["FLOP/s"] / 1e9


def gemm_table(runs):
    rows = ["| n (M = N = K) | ours fp32 GFLOP/s | OpenBLAS sgemm GFLOP/s | ours / OpenBLAS | ours fp16 operands GFLOP/s |",
            "|---:|---:|---:|---:|---:|"]
    sizes = sorted({int(m.group(1)) for name in runs
                    for m in [re.fullmatch(r"BM_GemmCpuF32/n:(\d+)/path:-1", name)] if m})
    for n in sizes:
        ours = runs.get(f"BM_GemmCpuF32/n:{n}/path:-1")
        peer = runs.get(f"BM_OpenBlasSgemm/n:{n}")
        half = runs.get(f"BM_GemmCpuF16/n:{n}/path:-1")
        cells = [str(n), f"{gflops(ours):.1f}",
                 f"{gflops(peer):.1f}" if peer else "n/a",
                 f"{gflops(ours) / gflops(peer):.2f}" if peer else "n/a",
                 f"{gflops(half):.1f}" if half else "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def training_shape_table(runs):
    """bench_kernels' GEMMs of a training step (BM_GemmTrainingShape) beside OpenBLAS's."""
    rows = ["| a step's GEMM (H 512, fp32) | rows | ours GFLOP/s | OpenBLAS GFLOP/s | ours / OpenBLAS |",
            "|---|---:|---:|---:|---:|"]
    shapes = sorted(((int(m.group(3)), int(m.group(2)), int(m.group(1))), name)
                    for name in runs
                    for m in [re.fullmatch(r"BM_GemmTrainingShape/product:(\d)/layer:(\d)/rows:(\d+)",
                                           name)] if m)
    for (rows_, _, _), name in shapes:
        ours, peer = runs[name], runs.get(name.replace("BM_GemmTrainingShape", "BM_OpenBlasTrainingShape"))
        label = ours.get("label", name).split(",")[0]
        cells = [label, str(rows_), f"{gflops(ours):.1f}", f"{gflops(peer):.1f}" if peer else "n/a",
                 f"{gflops(ours) / gflops(peer):.2f}" if peer else "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) if shapes else ""


def elementwise_table(runs):
    rows = ["| op (64 MiB, fp32 unless named) | GB/s | memcpy GB/s, same run | op / memcpy |",
            "|---|---:|---:|---:|"]
    for name, run in sorted(runs.items()):
        m = re.match(r"Elementwise_(\w+?)/cpu", name)
        if not m or "vs_memcpy" not in run:
            continue
        rows.append(f"| {m.group(1)} | {run['bytes_per_second'] / 1e9:.1f} | "
                    f"{run['memcpy_bytes_per_second'] / 1e9:.1f} | {run['vs_memcpy']:.2f} |")
    return "\n".join(rows)


def other_table(runs):
    rows = ["| benchmark (CPU) | time per call, ms | GB/s |", "|---|---:|---:|"]
    for name, run in sorted(runs.items()):
        if not re.match(r"BM_(LayerNorm|CrossEntropy|Optimizer)", name) or "cuda" in name:
            continue
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[run["time_unit"]]
        rate = run.get("bytes_per_second")
        rows.append(f"| {name} | {run['real_time'] * scale:.2f} | "
                    f"{rate / 1e9:.1f} |" if rate else f"| {name} | {run['real_time'] * scale:.2f} | n/a |")
    return "\n".join(rows)


def summary(path):
    runs, context = load_runs(path)
    threads = sorted({int(r["threads"]) for r in runs.values() if "threads" in r})
    repetitions = sorted({int(r.get("repetitions", 1)) for r in runs.values()})
    where = pathlib.Path(path).resolve()
    shown = where.relative_to(ROOT) if ROOT in where.parents else where.name
    cpu = f" ({context['cpu']})" if "cpu" in context else ""
    head = (f"Measured on a {context.get('num_cpus', '?')}-CPU machine{cpu} on {context.get('date', '?')}, "
            f"{', '.join(map(str, threads)) or '?'} threads, medians of "
            f"{', '.join(map(str, repetitions))} repetitions, from `{shown}`.")
    openblas = sorted({r["label"] for n, r in runs.items() if n.startswith("BM_OpenBlasSgemm") and r.get("label")})
    if openblas:
        head += f" Peer: {openblas[0]}."
    parts = [head, "**GEMM**", gemm_table(runs)]
    shapes = training_shape_table(runs)
    if shapes:
        parts += ["**The GEMMs of a training step** (fc1: W [2048, 512], fc2: W [512, 2048]; "
                  "a micro-batch of 64 rows and a batch of 1024)", shapes]
    return "\n\n".join(parts + ["**Elementwise ops against memcpy**", elementwise_table(runs),
                                 "**Other kernels**", other_table(runs)])


def median_ms(runs, name):
    """A run's median time in ms, or None where the run is missing or in other units."""
    run = runs.get(name)
    return run["real_time"] if run and run.get("time_unit") == "ms" else None


def versus_pytorch(title, times, training_path, context, pytorch_path, peer_context):
    """The table of (label, ours ms, PyTorch ms) rows with their ratios, the ratio of the
    last row to the first in each column, and the sentence naming both files."""
    rows = [f"| {title} | bigbatch, ms | PyTorch, ms | bigbatch / PyTorch |",
            "|---|---:|---:|---:|"]
    for label, mine, theirs in times:
        rows.append(f"| {label} | {mine:.0f} | {theirs:.0f} | {mine / theirs:.2f} |"
                    if mine and theirs else
                    f"| {label} | {mine or 'n/a'} | {theirs or 'n/a'} | n/a |")
    (_, one_ours, one_peer), (_, micro_ours, micro_peer) = times[0], times[-1]
    if one_ours and micro_ours and one_peer and micro_peer:
        rows.append(f"| micro-batches / one batch | {micro_ours / one_ours:.2f} | "
                    f"{micro_peer / one_peer:.2f} | |")
    head = (f"Medians from `{pathlib.Path(training_path).resolve().relative_to(ROOT)}` "
            f"({context.get('date', '?')}) and "
            f"`{pathlib.Path(pytorch_path).resolve().relative_to(ROOT)}` "
            f"({peer_context.get('date', '?')}, {peer_context.get('library', 'torch')}, "
            f"{peer_context.get('threads', '?')} threads; bigbatch: "
            f"{context.get('num_cpus', '?')} OpenMP threads), one run of "
            "`scripts/run-benchmarks.sh`" + (f" on {context['cpu']}" if "cpu" in context else "") +
            ".")
    return head + "\n\n" + "\n".join(rows)


def step_summary(training_path, pytorch_path):
    """The fp32 whole-step rows of bench_training beside PyTorch's, and their ratios."""
    ours, context = load_runs(training_path)
    peer, peer_context = load_runs(pytorch_path)
    shapes = [("one batch of 1024", "micro:1024"), ("16 micro-batches of 64", "micro:64")]
    prefix = "TrainingStep/cpu/fp16:0/depth:4/hidden:512/batch:1024/"
    times = [(label, median_ms(ours, f"BM_{prefix}{shape}/fused:0"),
              median_ms(peer, f"PyTorch{prefix}{shape}")) for label, shape in shapes]
    return versus_pytorch("one optimizer step: depth 4, H 512, batch 1024, fp32, AdamW", times,
                          training_path, context, pytorch_path, peer_context)


def gpt_step_summary(gpt_path, pytorch_path):
    """BM_GptStep/cpu's rows (chapter 08's GPT) beside PyTorch's, and their ratios."""
    ours, context = load_runs(gpt_path)
    peer, peer_context = load_runs(pytorch_path)
    shapes = [("one batch of 64 sequences", "micro:64"), ("8 micro-batches of 8", "micro:8")]
    prefix = "GptStep/cpu/bf16:0/layers:6/width:384/heads:6/T:256/batch:64/"
    times = [(label, median_ms(ours, f"BM_{prefix}{shape}"),
              median_ms(peer, f"PyTorch{prefix}{shape}")) for label, shape in shapes]
    return versus_pytorch("one optimizer step: 6 blocks, width 384, 6 heads, T 256, batch 64, "
                          "fp32, AdamW", times, gpt_path, context, pytorch_path, peer_context)


def replace_between(content, name, text, readme="README.md"):
    """`content` with the text between <!-- name:begin --> and <!-- name:end --> replaced."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in content or end not in content:
        sys.exit(f"{readme} has no {name} markers")
    before, rest = content.split(begin, 1)
    _, after = rest.split(end, 1)
    indent = before[before.rfind("\n") + 1:]  # a marker inside a list item keeps its place
    return f"{before}{begin}\n{text}\n{indent}{end}{after}"


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0
    print(summary(argv[0] if argv else str(ROOT / "bench/results/cpu-2core-avx512/cpu-kernels.json")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
