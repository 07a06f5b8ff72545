#!/usr/bin/python3
"""Chapter 08's GPT trained on Debian's fortunes by `bigbatch train` and by PyTorch, from the
same initial parameters on the same batches in the same order: their validation losses,
and a sample of what bigbatch's model writes.

What it does:
  1. reads /usr/share/games/fortunes/fortunes into the sequences `--data text:` makes of
     it (scripts/token_rows.py), and writes them as one --data tokens: file, the training
     rows first and the held-out rows last (`--validation` holds the last rows out);
  2. builds docs/model.md's GPT in PyTorch (scripts/gpt_module.py) under a fixed seed and
     saves its parameters for `bigbatch train --init`;
  3. trains both for STEPS steps of AdamW on --shuffle off's batches (see
     compare_with_pytorch.py's batch_indices), without dropout (DROPOUT, below, says why),
     PyTorch in float32 on as many threads;
  4. evaluates both on the held-out rows (every real target's loss, averaged), and has
     `bigbatch generate` write SAMPLE_TOKENS bytes after a prompt.
Passes when the validation losses are within TOLERANCE (2%) of each other. The runs start
alike and part by rounding, which 300 steps amplify (compare_with_pytorch.py shows the
first 18 steps agreeing to rounding); the 2% is the goal chapter 08 set, not derived.

Writes (--out, default this machine's results folder) gpt-fortunes-vs-pytorch.json: both
losses after every EVAL_EVERY steps, the final validation losses, their gap, the sample,
the commands and the machine.
Run: scripts/gpt-vs-pytorch.sh (installs torch and fortunes, builds, runs this).
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from torch import nn
except ImportError as error:
    print(f"SKIPPED: needs numpy and torch ({error}); on Debian: sudo apt-get install "
          "python3-numpy python3-torch, then run it with /usr/bin/python3")
    sys.exit(77)

import compare_with_pytorch as common  # safetensors, the batch order, inputs and targets
import gpt_module
import token_rows  # the text's sequences as rows

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORTUNES = "/usr/share/games/fortunes/fortunes"
# Dropout 0: each library draws its own masks, and on this small corpus the masks alone move
# a run's validation loss after 300 steps by far more than 2% (measured with dropout 0.1,
# bigbatch from the same parameters under --seed 0 to 3: 2.88, 2.79, 2.54 and 2.58, the
# seed choosing only the masks), so one run against one run could not test 2%. Without
# dropout the two runs differ by rounding alone, which training amplifies but not by that.
T, LAYERS, WIDTH, HEADS, DROPOUT = 64, 4, 128, 4, 0.0
BATCH, STEPS, LR, WEIGHT_DECAY, EVAL_EVERY = 32, 300, 3e-3, 1e-2, 50
SEED, PADDING = 0, token_rows.PADDING
TOLERANCE = 0.02
PROMPT, SAMPLE_TOKENS = "The ", 240


def mean_loss(model, inputs, targets):
    """The loss of every real target, averaged: evaluation, no dropout."""
    model.eval()
    with torch.no_grad():
        total, count = 0.0, 0
        for first in range(0, len(inputs), BATCH):
            logits = model(inputs[first:first + BATCH])
            y = targets[first:first + BATCH].reshape(-1)
            total += nn.functional.cross_entropy(logits, y, ignore_index=PADDING,
                                                 reduction="sum").item()
            count += int((y != PADDING).sum())
    model.train()
    return total / count


def train_pytorch(init_state, train_rows, held_out_rows):
    torch.manual_seed(SEED + 1)  # PyTorch's dropout masks
    model = gpt_module.Gpt(256, T, LAYERS, WIDTH, HEADS, dropout=DROPOUT)
    model.load_state_dict(init_state, strict=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY,
                                  foreach=False)
    inputs, targets = common.gpt_inputs_and_targets(train_rows)
    held_inputs, held_targets = common.gpt_inputs_and_targets(held_out_rows)
    curve = []
    for step in range(STEPS):
        rows = torch.from_numpy(common.batch_indices(step, len(train_rows), BATCH))
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(inputs[rows]), targets[rows].reshape(-1),
                                           ignore_index=PADDING)
        loss.backward()
        optimizer.step()
        if (step + 1) % EVAL_EVERY == 0:
            curve.append((step + 1, loss.item(), mean_loss(model, held_inputs, held_targets)))
            print(f"  torch step {step + 1}: loss {curve[-1][1]:.4f}, validation "
                  f"{curve[-1][2]:.4f}", flush=True)
    return curve


def run(command):
    """The command's output; a sampled byte need not be UTF-8, so such bytes print as U+FFFD."""
    result = subprocess.run(command, capture_output=True, text=True, errors="replace")
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}\nexited with {result.returncode}:\n"
                           f"{result.stdout}{result.stderr}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bigbatch", default=str(ROOT / "build/chapters/cli/bigbatch"))
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    documents = token_rows.documents_of(FORTUNES)
    training, held_out = token_rows.split(documents)
    train_rows = np.array(token_rows.rows_of(training, T), dtype=np.int64)
    held_out_rows = np.array(token_rows.rows_of(held_out, T), dtype=np.int64)
    print(f"{FORTUNES}: {len(documents)} documents; {len(train_rows)} training and "
          f"{len(held_out_rows)} held-out sequences of {T}")
    torch.manual_seed(SEED)
    init_state = {k: v.detach().clone()
                  for k, v in gpt_module.Gpt(256, T, LAYERS, WIDTH, HEADS).state_dict().items()
                  if k != "lm_head.weight"}

    with tempfile.TemporaryDirectory(prefix="gpt-vs-pytorch-") as name:
        folder = pathlib.Path(name)
        np.save(folder / "fortunes.npy", np.concatenate([train_rows, held_out_rows]))
        common.write_safetensors(folder / "init.safetensors", init_state)
        flags = ["--model", "gpt", "--data", f"tokens:{folder / 'fortunes.npy'}",
                 "--validation", str(len(held_out_rows)), "--seq-len", str(T),
                 "--layers", str(LAYERS), "--width", str(WIDTH), "--heads", str(HEADS),
                 "--dropout", str(DROPOUT), "--optimizer", "adamw", "--lr", str(LR),
                 "--weight-decay", str(WEIGHT_DECAY), "--batch", str(BATCH),
                 "--steps", str(STEPS), "--shuffle", "off", "--seed", str(SEED),
                 "--eval-every", str(EVAL_EVERY)]
        log = folder / "log.jsonl"
        output = run([args.bigbatch, "train", *flags, "--init", str(folder / "init.safetensors"),
                      "--save", str(folder / "gpt.safetensors"), "--log", str(log)])
        records = [json.loads(line) for line in log.read_text().splitlines()]
        ours = [(r["step"], r["loss"], r["validation_loss"]) for r in records
                if "validation_loss" in r]
        found = re.search(r"^validation \(.*\): loss ([0-9.]+)", output, re.MULTILINE)
        if not found:
            sys.exit(f"bigbatch printed no validation loss:\n{output}")
        ours_final = float(found.group(1))
        for step, loss, validation in ours:
            print(f"  bigbatch step {step}: loss {loss:.4f}, validation {validation:.4f}")
        sample = run([args.bigbatch, "generate", "--init", str(folder / "gpt.safetensors"),
                      "--prompt", PROMPT, "--tokens", str(SAMPLE_TOKENS), "--temperature",
                      "0.8", "--seed", "1"])
    theirs = train_pytorch(init_state, train_rows, held_out_rows)
    theirs_final = theirs[-1][2]
    gap = abs(ours_final - theirs_final) / theirs_final
    verdict = "PASS" if gap <= TOLERANCE else "FAIL"
    print(f"validation loss after {STEPS} steps: bigbatch {ours_final:.4f}, PyTorch "
          f"{theirs_final:.4f}: {100 * gap:.2f}% apart (at most {100 * TOLERANCE:.0f}%) -> "
          f"{verdict}")
    print(f"bigbatch generate --prompt {PROMPT!r} --tokens {SAMPLE_TOKENS} --temperature 0.8:\n"
          f"{sample}")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host_name": platform.node(), "threads": args.threads, "library": f"torch {torch.__version__}",
        "corpus": FORTUNES, "training_sequences": len(train_rows),
        "held_out_sequences": len(held_out_rows),
        "model": {"seq_len": T, "layers": LAYERS, "width": WIDTH, "heads": HEADS,
                  "dropout": DROPOUT},
        "batch": BATCH, "steps": STEPS, "lr": LR, "weight_decay": WEIGHT_DECAY,
        "bigbatch_flags": " ".join(flags[:4] + ["tokens:fortunes.npy"] + flags[4:]),
        "curve_bigbatch": ours, "curve_pytorch": theirs,
        "validation_loss_bigbatch": ours_final, "validation_loss_pytorch": theirs_final,
        "relative_gap": gap, "tolerance": TOLERANCE, "verdict": verdict,
        "sample_prompt": PROMPT, "sample": sample.rstrip("\n")}
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
