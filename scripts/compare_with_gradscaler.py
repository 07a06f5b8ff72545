#!/usr/bin/python3
"""Checks chapter 04's DynamicLossScaler against PyTorch's GradScaler rule.

GradScaler.update() moves its scale with torch._amp_update_scale_(scale, growth_tracker,
found_inf, growth_factor, backoff_factor, growth_interval): on an overflow the scale is
multiplied by the backoff factor and the tracker reset; otherwise the tracker counts the
clean step and, reaching the interval, the scale grows and the tracker restarts. This
script feeds the same sequences of clean and overflowing steps (random ones, and the
defaults' edge: exactly growth_interval clean steps) to that rule and to our scaler (the
program tests/tools/scaler_trace, built as `scaler_trace`), and asks for the same scale and
counter after every step, exactly: both multiply a float32 scale by the same factors.

Which rule: PyTorch's op itself where this PyTorch has a kernel for it on a device it can
use (its CPU kernel arrived in PyTorch 2.3; Debian 12's python3-torch 1.13 has the CUDA one
only, and PyPI's current wheels for Linux bring the CUDA libraries, about 2 GB, with them).
Everywhere else, a replay of the op transcribed from its CPU kernel
(aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp, _amp_update_scale_cpu_kernel; the CUDA
kernel in AmpKernels.cu has the same rule), written here in Python: a second, independent
reference, since it is read from PyTorch's source, not from ours. Where the op runs, the
replay is checked against it too, so the transcription itself is tested wherever it can be.

Run: /usr/bin/python3 scripts/compare_with_gradscaler.py --trace build/tests/scaler_trace
or as the CTest test compare_with_gradscaler (label "pytorch"). Needs numpy (for float32
arithmetic); exits with 77 (CTest: skipped), saying why, where numpy cannot be imported.
"""
import argparse
import random
import subprocess
import sys

EXIT_SKIPPED = 77
try:
    import numpy as np
except ImportError as error:
    print(f"SKIPPED: {sys.executable} cannot import numpy ({error}); on Debian: "
          "sudo apt-get install python3-numpy")
    sys.exit(EXIT_SKIPPED)
try:
    import torch
except ImportError:
    torch = None


def replayed_update(scale, tracker, found_inf, growth_factor, backoff_factor, interval):
    """One _amp_update_scale_ as PyTorch's CPU kernel computes it; returns (scale, tracker).

    The rule, read from the kernel: on an overflow (found_inf nonzero) the float32 scale
    becomes scale * backoff_factor (the product taken in double, the factor being a double,
    and stored as float32) and the tracker 0. Otherwise the step counts: the tracker plus
    one is compared with the interval; equal, the scale becomes scale * growth_factor,
    again computed in double and stored as float32, unless that float32 is inf or NaN (the
    scale then stays), and the tracker restarts at 0; below, the tracker keeps the count."""
    if found_inf:
        return np.float32(np.float64(scale) * backoff_factor), 0
    successful = tracker + 1
    if successful == interval:
        with np.errstate(over="ignore"):
            grown = np.float32(np.float64(scale) * growth_factor)
        return (grown if np.isfinite(grown) else scale), 0
    return scale, successful


def replayed_trace(init, growth, backoff, interval, flags):
    scale, tracker, trace = np.float32(init), 0, []
    for flag in flags:
        scale, tracker = replayed_update(scale, tracker, flag, growth, backoff, interval)
        trace.append((float(scale), tracker))
    return trace


def first_refused_growth(trace, init, growth):
    """The first step at which the scale should have grown but stayed, because the grown
    value would have been inf in float32 (None if there is none)."""
    previous = float(np.float32(init))
    for k, (scale, tracker) in enumerate(trace):
        with np.errstate(over="ignore"):
            grown = np.float32(np.float64(previous) * growth)
        if tracker == 0 and scale == previous and not np.isfinite(grown):
            return k
        previous = scale
    return None


def pick_device():
    """The first device whose _amp_update_scale_ runs, or None with the reasons."""
    if torch is None:
        return None, [f"{sys.executable} cannot import torch"]
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
    # "%.9g" identifies a float32 uniquely but is not its exact decimal value: read it back
    # as the float32 it names.
    return [(float(np.float32(scale)), int(count)) for scale, count in
            (line.split() for line in text.splitlines())]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True, help="the scaler_trace program")
    args = parser.parse_args()
    device, reasons = pick_device()
    if device is None:
        version = f"torch {torch.__version__}" if torch is not None else "no torch"
        print(f"reference: the replay of _amp_update_scale_'s CPU kernel ({version}: the op "
              f"does not run here: {'; '.join(reasons)})")
    else:
        print(f"reference: torch {torch.__version__}'s _amp_update_scale_ on {device}, and "
              "the replay of its CPU kernel checked against it")
    rng = random.Random(4)
    cases = [(65536.0, 2.0, 0.5, 2000, [0] * 2000 + [1] + [0] * 1999),   # GradScaler's defaults
             (1024.0, 2.0, 0.5, 3, [0, 0, 0, 0, 1, 0, 0, 0, 1, 1])]      # chapter 04's (a)
    for _ in range(20):
        interval = rng.choice([1, 2, 3, 5, 10])
        cases.append((2.0 ** rng.randint(0, 24), rng.choice([2.0, 1.5, 4.0]),
                      rng.choice([0.5, 0.25, 0.75]), interval,
                      [int(rng.random() < 0.2) for _ in range(200)]))
    failures = at_top = 0
    # The top of float32's range: growth past it must leave the scale where it is.
    cases.append((2.0 ** 125, 4.0, 0.5, 1, [0, 0, 0, 1, 0, 0]))
    for init, growth, backoff, interval, flags in cases:
        problems = []  # what went wrong with this sequence
        want = replayed_trace(init, growth, backoff, interval, flags)
        if device is not None:
            op = pytorch_trace(device, init, growth, backoff, interval, flags)
            if op != want:
                problems.append("the replay is not PyTorch's op")
            want = op
        got = our_trace(args.trace, init, growth, backoff, interval, flags)
        # The one place the rules part, by design: at the top of float32's range GradScaler
        # keeps the scale when growing it would give inf; ours grows it to the maximum
        # (float32's largest here). Compare up to that step, check the difference there.
        top = first_refused_growth(want, init, growth)
        if top is not None and top < len(got):
            at_top += 1
            largest = float(np.finfo(np.float32).max)
            if got[top] != (largest, 0):
                problems.append(f"at the top of the range (step {top + 1}) ours is "
                                f"{got[top]}, not clamped to {largest}")
            got, want = got[:top], want[:top]
        first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if first is not None or len(got) != len(want):
            k = first if first is not None else min(len(got), len(want))
            problems.append(f"step {k + 1}: ours {got[k:k + 1]}, GradScaler's {want[k:k + 1]}")
        if problems:
            failures += 1
            print(f"FAIL init {init} growth {growth} backoff {backoff} interval {interval}: "
                  f"{'; '.join(problems)}")
    print(f"{len(cases) - failures} of {len(cases)} sequences agree step for step "
          f"({sum(len(c[4]) for c in cases)} steps); {at_top} reach the top of float32's "
          "range, where ours clamps to its maximum and GradScaler keeps the scale")
    if at_top == 0:
        print("FAIL: no sequence reached the top of the range")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
