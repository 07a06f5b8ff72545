#!/usr/bin/python3
"""Checks chapter 04's DynamicLossScaler against PyTorch's GradScaler rule.

GradScaler.update() moves its scale with torch._amp_update_scale_(scale, growth_tracker,
found_inf, growth_factor, backoff_factor, growth_interval): on an overflow the scale is
multiplied by the backoff factor and the tracker reset; otherwise the tracker counts the
clean step and, reaching the interval, the scale grows and the tracker restarts. This
script feeds the same sequences of clean and overflowing steps (random ones, and the
defaults' edge: exactly growth_interval clean steps) to that PyTorch op and to our scaler
(the program tests/tools/scaler_trace, built as `scaler_trace`), and asks for the same
scale and counter after every step, exactly: both multiply a float32 scale by the same
float32 factors.

Run: /usr/bin/python3 scripts/compare_with_gradscaler.py --trace build/tests/scaler_trace
or as the CTest test compare_with_gradscaler (label "pytorch"). It exits with 77 (CTest:
skipped), saying why, where torch cannot be imported or where this build of PyTorch has
no _amp_update_scale_ kernel for any device it can use (PyTorch before 2.3 has it for CUDA
only).
"""
import argparse
import random
import subprocess
import sys

EXIT_SKIPPED = 77
try:
    import torch
except ImportError as error:
    print(f"SKIPPED: {sys.executable} cannot import torch ({error}); on Debian: "
          "sudo apt-get install python3-torch")
    sys.exit(EXIT_SKIPPED)


def pick_device():
    """The first device whose _amp_update_scale_ runs, or None with the reasons."""
    reasons = []
    candidates = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in candidates:
        scale = torch.tensor([1.0], device=device)
        tracker = torch.tensor([0], dtype=torch.int32, device=device)
        found_inf = torch.tensor([0.0], device=device)
        try:
            torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2)
            return device, reasons
        except (RuntimeError, NotImplementedError) as error:
            reasons.append(f"{device}: {str(error).splitlines()[0].split('. ')[0]}")
    if not torch.cuda.is_available():
        reasons.append("cuda: no CUDA device")
    return None, reasons


def pytorch_trace(device, init, growth, backoff, interval, flags):
    scale = torch.tensor([init], dtype=torch.float32, device=device)
    tracker = torch.tensor([0], dtype=torch.int32, device=device)
    trace = []
    for flag in flags:
        found_inf = torch.tensor([float(flag)], device=device)
        torch._amp_update_scale_(scale, tracker, found_inf, growth, backoff, interval)
        trace.append((scale.item(), int(tracker.item())))
    return trace


def our_trace(binary, init, growth, backoff, interval, flags):
    text = subprocess.run([binary, repr(init), repr(growth), repr(backoff), str(interval),
                           "".join(str(f) for f in flags)],
                          capture_output=True, text=True, check=True).stdout
    return [(float(scale), int(count)) for scale, count in
            (line.split() for line in text.splitlines())]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True, help="the scaler_trace program")
    args = parser.parse_args()
    device, reasons = pick_device()
    if device is None:
        print(f"SKIPPED: torch {torch.__version__} has no _amp_update_scale_ kernel here "
              f"({'; '.join(reasons)})")
        return EXIT_SKIPPED
    print(f"torch {torch.__version__}, _amp_update_scale_ on {device}")
    rng = random.Random(4)
    cases = [(65536.0, 2.0, 0.5, 2000, [0] * 2000 + [1] + [0] * 1999),   # GradScaler's defaults
             (1024.0, 2.0, 0.5, 3, [0, 0, 0, 0, 1, 0, 0, 0, 1, 1])]      # chapter 04's (a)
    for _ in range(20):
        interval = rng.choice([1, 2, 3, 5, 10])
        cases.append((2.0 ** rng.randint(0, 24), rng.choice([2.0, 1.5, 4.0]),
                      rng.choice([0.5, 0.25, 0.75]), interval,
                      [int(rng.random() < 0.2) for _ in range(200)]))
    failures = 0
    for init, growth, backoff, interval, flags in cases:
        want = pytorch_trace(device, init, growth, backoff, interval, flags)
        got = our_trace(args.trace, init, growth, backoff, interval, flags)
        first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if first is not None or len(got) != len(want):
            failures += 1
            k = first if first is not None else min(len(got), len(want))
            print(f"FAIL init {init} growth {growth} backoff {backoff} interval {interval}: "
                  f"step {k + 1}: ours {got[k:k + 1]}, GradScaler's {want[k:k + 1]}")
    print(f"{len(cases) - failures} of {len(cases)} sequences agree step for step "
          f"({sum(len(c[4]) for c in cases)} steps)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
