#!/usr/bin/env python3
"""Runs every command of every README's (and docs/ page's) ```sh code blocks; fails on a wrong exit status.

Usage: scripts/doc_test.py [--list | --self-test] [README ...]
(scripts/doc-test.sh builds first; --self-test checks this checker on planted READMEs)

Each README's blocks run in order, as one bash script, in a scratch folder of their own
(also its HOME) whose build/ is the repository's build folder: a block may use a variable
an earlier block of its README set, and the files a command writes (a log, a snapshot, a
calibration) land in the scratch folder, not in the clone or the user's home. Every command (a line, or lines joined by a trailing backslash)
must exit 0, unless its comment says otherwise: "# exit status 3: out of memory" expects 3.

A block opts out only with a first line the reader sees, giving the reason:
    # not run by scripts/doc-test.sh: <why>
(for example: it is the test command itself, or it needs a GPU).

The commands run as written (all of them take under two minutes on two cores); one that
grows too long for that may opt out, saying so, with a shorter twin beside it.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPT_OUT = "# not run by scripts/doc-test.sh:"
EXPECTED_STATUS = re.compile(r"#.*\bexit status (\d+)")
BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


class DocError(Exception):
    """A README whose blocks cannot be run as they stand."""


class Command:
    def __init__(self, line, text):
        self.line = line  # the README line the command starts on
        self.text = text
        match = EXPECTED_STATUS.search(text)
        self.expected = int(match.group(1)) if match else 0


def commands_of(readme):
    """The commands of a README's sh blocks, in order, and the blocks it opts out (line, why)."""
    text = readme.read_text()
    commands, skipped = [], []
    for block in BLOCK.finditer(text):
        first_line = text.count("\n", 0, block.start(1)) + 1
        lines = block.group(1).splitlines()
        if lines and lines[0].startswith(OPT_OUT):
            why = lines[0][len(OPT_OUT):].strip()
            if not why:
                raise DocError(f"{readme}:{first_line}: an opted-out block must say why")
            skipped.append((first_line, why))
            continue
        pending, start = [], None
        for offset, line in enumerate(lines):
            if start is None:
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                start = first_line + offset
            pending.append(line)
            if not line.rstrip().endswith("\\"):
                commands.append(Command(start, "\n".join(pending)))
                pending, start = [], None
        if pending:
            raise DocError(f"{readme}:{start}: the block ends inside a command")
    return commands, skipped


def script_for(name, commands):
    """One bash script: each command, then a check of its exit status."""
    parts = ["set -u"]
    for command in commands:
        parts.append(f"printf '%s\\n' {quote('+ ' + command.text)}")
        parts.append(command.text)
        parts.append(
            f"status=$?; if [ $status -ne {command.expected} ]; then "
            f"echo \"FAILED {name}:{command.line}: exit status $status, "
            f"expected {command.expected}\"; exit 1; fi")
    return "\n".join(parts) + "\n"


def quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


def run_commands(name, commands):
    """Runs one README's commands in a scratch folder: (passed, their output)."""
    with tempfile.TemporaryDirectory(prefix="doc-test-") as scratch:
        os.symlink(ROOT / "build", Path(scratch) / "build")
        # HOME too, so that what a command keeps there (bigbatch plan's calibration in
        # ~/.cache) starts empty and goes with the folder.
        env = dict(os.environ, HOME=scratch, XDG_CACHE_HOME=str(Path(scratch) / ".cache"))
        result = subprocess.run(["bash", "-c", script_for(name, commands)], cwd=scratch,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    return result.returncode == 0, result.stdout


def self_test():
    """Plants the mistakes this checker exists to catch and requires it to catch each."""
    fence = "```"
    cases = {
        # name: (README text, must it pass?)
        "passes": (f"""{fence}sh
X=1
false || true
false   # exit status 1: expected
test "$X" = 1 && \\
  echo continued
{fence}

{fence}sh
# not run by scripts/doc-test.sh: a plant that must not run
exit 7
{fence}

{fence}sh
test "$X" = 1   # set by the first block
{fence}
""", True),
        "a command fails": (f"{fence}sh\ntrue\nfalse\ntrue\n{fence}\n", False),
        "the stated status is wrong": (f"{fence}sh\ntrue   # exit status 3: oom\n{fence}\n", False),
        "cmp fails inside a list": (f"{fence}sh\nfalse && echo same\ntrue\n{fence}\n", False),
        "an opt-out without a reason": (f"{fence}sh\n{OPT_OUT}\nexit 7\n{fence}\n", False),
        "a block ending in a backslash": (f"{fence}sh\necho \\\n{fence}\n", False),
    }
    wrong = []
    with tempfile.TemporaryDirectory(prefix="doc-test-self-") as folder:
        for name, (text, must_pass) in cases.items():
            readme = Path(folder) / "README.md"
            readme.write_text(text)
            try:
                passed, output = run_commands(name, commands_of(readme)[0])
            except DocError as error:
                passed, output = False, str(error)
            print(f"{name}: {'passed' if passed else 'failed'}"
                  f"{'' if passed == must_pass else ' -- WRONG'}")
            if passed != must_pass:
                wrong.append(name)
                print(output)
    return 1 if wrong else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("readmes", nargs="*", type=Path,
                        help="the READMEs to run (default: every tracked README.md and docs/*.md)")
    parser.add_argument("--list", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--self-test", action="store_true",
                        help="check the checker on planted READMEs, run no real one")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    readmes = [Path(p).resolve() for p in args.readmes] or [
        ROOT / p for p in subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "*README.md", "docs/*.md"],
            check=True, capture_output=True, text=True).stdout.split()]
    if not args.list and not (ROOT / "build/chapters/cli/bigbatch").exists():
        sys.exit("build/chapters/cli/bigbatch is missing: build first (scripts/doc-test.sh does)")

    failed, total_commands, total_skipped = [], 0, 0
    for readme in readmes:
        name = readme.relative_to(ROOT)
        try:
            commands, skipped = commands_of(readme)
        except DocError as error:
            print(error)
            failed.append(str(name))
            continue
        total_commands += len(commands)
        total_skipped += len(skipped)
        for line, why in skipped:
            print(f"{name}:{line}: block not run: {why}")
        if not commands:
            continue
        if args.list:
            for command in commands:
                print(f"{name}:{command.line}: [exit {command.expected}] {command.text}")
            continue
        print(f"==== {name}: {len(commands)} commands", flush=True)
        started = time.monotonic()
        passed, output = run_commands(name, commands)
        if not passed:
            print(output)
            failed.append(str(name))
        print(f"     {'passed' if passed else 'FAILED'} in {time.monotonic() - started:.0f} s",
              flush=True)
    print(f"{total_commands} commands in {len(readmes)} READMEs, "
          f"{total_skipped} blocks opted out; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
