#!/usr/bin/python3
"""The PyTorch peer of bench_training's BM_TrainingStep/cpu: one optimizer step of the
model of docs/model.md (zero_grad, forward and backward over the micro-batches with the
loss summed and divided by the global batch, AdamW), timed the same way, written as
Google Benchmark JSON so that the same notebook and summary read both.

Every configuration is (precision fp32, depth, hidden, batch, micro-batch), the rows of
bench_training's CPU grid. Inputs and labels are random (the time of a step does not depend
on their values), the model is built once per configuration, one warm-up step runs first,
then `--repetitions` repetitions of `--steps` steps each; each repetition's time per step
is a benchmark row and the median over repetitions is the row the summary quotes.

Threads: torch.set_num_threads(--threads), the count bench_training's OpenMP uses
(OMP_NUM_THREADS or the machine's cores). The BLAS behind PyTorch's CPU matmuls is named
in the context (torch.__config__.show()); scripts/run-benchmarks.sh sets OPENBLAS_CORETYPE
for this run the way it does for the OpenBLAS peer of bench_kernels.

--model gpt: the peer of BM_GptStep/cpu instead, chapter 08's GPT (scripts/gpt_module.py,
docs/model.md's module without dropout) on full sequences of random bytes, each step's loss
the sum over its target tokens divided by their count.

Run: /usr/bin/python3 bench/pytorch_step.py --out bench/results/cpu-2core-avx512/pytorch-training.json
Where torch cannot be imported it prints the reason and exits with 77 (skipped).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

EXIT_SKIPPED = 77
try:
    import torch
    from torch import nn
except ImportError as error:
    print(f"SKIPPED: pytorch_step.py needs torch, which {sys.executable} cannot import "
          f"({error}); on Debian: sudo apt-get install python3-torch, then run it with "
          "/usr/bin/python3")
    sys.exit(EXIT_SKIPPED)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import gpt_module  # noqa: E402  (scripts/gpt_module.py)

INPUTS, CLASSES, EXPANSION = 784, 10, 4
# (depth, hidden, batch, micro-batch): bench_training's fp32 CPU rows (bench_step.cpp).
CONFIGURATIONS = [(4, 512, 1024, 1024), (4, 512, 1024, 64)]
# (layers, width, heads, T, batch, micro-batch): BM_GptStep/cpu's rows (bench_gpt_step.cpp).
GPT_CONFIGURATIONS = [(6, 384, 6, 256, 64, 64), (6, 384, 6, 256, 64, 8)]
VOCABULARY = 256


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, EXPANSION * hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(EXPANSION * hidden, hidden)

    def forward(self, h):
        return h + self.fc2(self.act(self.fc1(self.ln(h))))


class Head(nn.Linear):
    def __init__(self, hidden):
        super().__init__(hidden, CLASSES)
        self.ln = nn.LayerNorm(hidden)

    def forward(self, h):
        return super().forward(self.ln(h))


class ResidualMLP(nn.Module):
    """docs/model.md's module with LayerNorm, GELU (tanh) and no dropout."""

    def __init__(self, hidden, depth):
        super().__init__()
        self.stem = nn.Linear(INPUTS, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(depth))
        self.head = Head(hidden)

    def forward(self, x):
        h = self.act(self.stem(x))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def time_configuration(depth, hidden, batch, micro_batch, steps, repetitions):
    torch.manual_seed(1)
    model = ResidualMLP(hidden, depth)
    x = torch.rand(batch, INPUTS)
    labels = torch.randint(0, CLASSES, (batch,))
    return time_steps(model, x, labels, micro_batch, steps, repetitions)


def time_gpt_configuration(layers, width, heads, T, batch, micro_batch, steps, repetitions):
    torch.manual_seed(1)
    model = gpt_module.Gpt(VOCABULARY, T, layers, width, heads)
    row = torch.randint(0, VOCABULARY, (batch, T + 1))
    return time_steps(model, row[:, :-1], row[:, 1:], micro_batch, steps, repetitions)


def time_steps(model, x, labels, micro_batch, steps, repetitions):
    """Seconds per optimizer step in each repetition: zero_grad, forward and backward over
    the micro-batches (each one's summed loss over the batch's count of targets), AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
    batch, targets = x.shape[0], labels.numel()

    def one_step():
        optimizer.zero_grad(set_to_none=False)
        total = 0.0
        for begin in range(0, batch, micro_batch):
            logits = model(x[begin:begin + micro_batch])
            # The loss of the global batch: each micro-batch's sum over the global count.
            loss = nn.functional.cross_entropy(
                logits, labels[begin:begin + micro_batch].reshape(-1), reduction="sum") / targets
            loss.backward()
            total += loss.item()
        optimizer.step()
        return total

    one_step()  # warm-up: the allocator and the BLAS take their buffers
    per_step = []
    for _ in range(repetitions):
        start = time.perf_counter()
        for _ in range(steps):
            one_step()
        per_step.append((time.perf_counter() - start) / steps)
    return per_step


def benchmark_rows(name, per_step, batch, steps, label):
    rows = []
    for index, seconds in enumerate(per_step):
        rows.append({"name": name, "run_name": name, "run_type": "iteration",
                     "repetitions": len(per_step), "repetition_index": index,
                     "iterations": steps, "real_time": seconds * 1e3, "time_unit": "ms",
                     "items_per_second": batch / seconds, "label": label})
    median = statistics.median(per_step)
    rows.append({"name": name + "_median", "run_name": name, "run_type": "aggregate",
                 "aggregate_name": "median", "repetitions": len(per_step),
                 "iterations": steps, "real_time": median * 1e3, "time_unit": "ms",
                 "items_per_second": batch / median, "label": label})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--threads", type=int,
                        default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    parser.add_argument("--steps", type=int, default=3, help="steps per repetition")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--model", choices=["mlp", "gpt"], default="mlp",
                        help="mlp: BM_TrainingStep/cpu's peer; gpt: BM_GptStep/cpu's")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    benchmarks = []
    for layers, width, heads, T, batch, micro_batch in (
            GPT_CONFIGURATIONS if args.model == "gpt" else []):
        name = (f"PyTorchGptStep/cpu/bf16:0/layers:{layers}/width:{width}/heads:{heads}/T:{T}/"
                f"batch:{batch}/micro:{micro_batch}/real_time")
        label = f"fp32 layers {layers} C {width} heads {heads} T {T} B {batch} micro {micro_batch}"
        per_step = time_gpt_configuration(layers, width, heads, T, batch, micro_batch,
                                          args.steps, args.repetitions)
        print(f"{name}: median {statistics.median(per_step) * 1e3:.1f} ms per step "
              f"over {args.repetitions} x {args.steps} steps", flush=True)
        benchmarks += benchmark_rows(name, per_step, batch * T, args.steps, label)
    for depth, hidden, batch, micro_batch in (CONFIGURATIONS if args.model == "mlp" else []):
        name = (f"PyTorchTrainingStep/cpu/fp16:0/depth:{depth}/hidden:{hidden}/"
                f"batch:{batch}/micro:{micro_batch}/real_time")
        label = f"fp32 depth {depth} H {hidden} B {batch} micro {micro_batch}"
        per_step = time_configuration(depth, hidden, batch, micro_batch, args.steps,
                                      args.repetitions)
        print(f"{name}: median {statistics.median(per_step) * 1e3:.1f} ms per step "
              f"over {args.repetitions} x {args.steps} steps", flush=True)
        benchmarks += benchmark_rows(name, per_step, batch, args.steps, label)

    blas = [line.strip() for line in torch.__config__.show().splitlines()
            if "BLAS_INFO" in line or "MKL-DNN" in line or "CPU capability" in line]
    cpu = "unknown CPU"
    try:  # the model name and AVX-512's presence, as the C++ programs' "cpu" names them
        with open("/proc/cpuinfo") as info:
            text = info.read()
        model = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                      if line.startswith("model name")), "unknown CPU")
        cpu = model + ("; avx512f" if " avx512f" in text else "; no avx512f")
    except OSError:
        pass
    context = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "cpu": cpu,
               "host_name": platform.node(), "executable": "bench/pytorch_step.py",
               "num_cpus": os.cpu_count(), "threads": torch.get_num_threads(),
               "library": f"torch {torch.__version__}", "torch_config": blas,
               "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
               "optimizer": "AdamW (PyTorch's defaults, foreach=False)"}
    with open(args.out, "w") as out:
        json.dump({"context": context, "benchmarks": benchmarks}, out, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
