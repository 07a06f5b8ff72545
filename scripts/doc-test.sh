#!/usr/bin/env bash
# The README doc-test: builds (scripts/build.sh, nothing to do after scripts/test.sh), then
# runs every command of every README's sh code blocks in a scratch folder and fails on an
# exit status other than the one the command's comment states (scripts/doc_test.py says
# how a block opts out).
#   scripts/doc-test.sh                          every tracked README.md and docs/*.md
#   scripts/doc-test.sh chapters/02_*/README.md  some
#   scripts/doc-test.sh --list                   the commands, each with the exit status it must give
set -euo pipefail
cd "$(dirname "$0")/.."

[[ " $* " == *" --list "* ]] || scripts/build.sh > /dev/null
exec python3 scripts/doc_test.py "$@"
