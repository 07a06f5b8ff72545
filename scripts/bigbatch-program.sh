# Sourced (not run) by the scripts that train with the bigbatch program and write this
# machine's results: BIGBATCH=path/to/bigbatch uses that program, otherwise the Debian
# packages are installed and the tree is built first. Also gives them a temporary folder,
# $out, removed when the script exits, and this machine's results folder, $results_dir
# (scripts/results-folder.sh).
if [ -z "${BIGBATCH:-}" ]; then
  scripts/install-deps.sh
  scripts/build.sh >/dev/null
  BIGBATCH=build/chapters/cli/bigbatch
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
source scripts/results-folder.sh
