#!/usr/bin/env bash
# mutation-check.sh: proves that the tests can fail. It plants each deliberate bug of
# scripts/mutations.txt, one at a time, in a build of its own, runs the tests, and checks that
# at least one of them fails; then it takes the bug out again and moves on.
#
# Usage:
#   scripts/mutation-check.sh                 every mutation on the list
#   scripts/mutation-check.sh --only ID[,ID]  the named mutations only
#   scripts/mutation-check.sh --list          print the list (with what this CPU skips) and exit
#   scripts/mutation-check.sh --cpu-features  print the instruction sets this CPU grants, as
#                                             the kernels read them, and exit
#   scripts/mutation-check.sh -j N            build and test with N jobs (default: nproc)
#   scripts/mutation-check.sh -P N            plant N mutations at a time, each worker in a
#                                             copy of its own (default: 2 on 2 or more jobs
#                                             when ccache is found, else 1)
#   scripts/mutation-check.sh --rev REV       test the committed revision REV instead of the
#                                             tracked files as they are in the working tree
#   scripts/mutation-check.sh --keep          keep the temporary copies (their folder is printed)
#   scripts/mutation-check.sh --cuda          configure the copies with BIGBATCH_CUDA=AUTO, as
#                                             scripts/build.sh does, instead of OFF (see below)
#   scripts/mutation-check.sh --baseline-tested  skip the run of every test on the unmutated
#                                             copy: the caller has just passed them on the same
#                                             sources, built alike (.ci/run's tests stage)
#   scripts/mutation-check.sh --mutations FILE  another list in the same format
#   scripts/mutation-check.sh --catchers FILE   the tests that caught each mutation before
#                                             (default scripts/mutation-catchers.txt), run first
#   scripts/mutation-check.sh --write-catchers FILE  write that file from this run's verdicts
#                                             (the mutations not run keep their catchers)
#
# The working tree is never touched: the tracked files (as they are now, edits included;
# a new file must be tracked, `git add -N` is enough) are copied into a temporary folder,
# once per worker, and each copy is configured (-DBIGBATCH_CUDA=OFF
# -DBIGBATCH_BUILD_BENCH=OFF, Release; the generator CMAKE_GENERATOR names, else Ninja when
# found) and built once (with ccache, when there is one, the copies after the first from its
# cache). Each worker plants its share of the list in its own copy, so two workers never
# touch one file or one build.
# Where CCACHE_DIR is set, the copies compile from (and into) that cache instead of a
# private one, with the caller's CCACHE_BASEDIR: a build of the same sources with the same
# flags that filled it (the project's own build, configured as the copies are: --cuda where
# that build has CUDA, the same generator) leaves the copies nothing to compile, provided
# that CCACHE_BASEDIR holds both trees (TMPDIR inside the project's folder). .ci/run does so.
# "Every test" below means the CTest tests labelled unit, chapter or cli: the GoogleTest
# cases, the chapter demos (chapter_NN_name, run with --quick) and the bigbatch smoke
# tests; not the PyTorch comparison, which trains for minutes and needs torch. Every test
# must pass on the unmutated copy (run first, unless --baseline-tested). Then, for each
# mutation: its original snippet must
# occur exactly once in its file and each program it names must have CTest tests (else
# the entry is STALE); the snippet is replaced; the test programs the entry names are
# rebuilt (incrementally, the compiles that read the plant at -O1 or -O0: see
# scripts/mutation-compile.sh; for a script, the built programs its tests' command lines name;
# for a header, with Ninja, only the files that include it whose objects the programs' links
# take, the others' objects being in no program that runs) and their CTest tests run,
# program by program in the order the entry names them (every
# test when it names none), with OpenMP's idle threads asleep as in the test presets
# (OMP_WAIT_POLICY=passive, see the README), until the first that fails; the verdict is
# KILLED, with that test's name, or SURVIVED (every test of every program passed).
# The tests that caught a mutation last time (scripts/mutation-catchers.txt: "ID TEST...",
# written by --write-catchers) run before all that, with only the programs they need built:
# when one fails, the mutation is killed without the rest (a plant in a header then
# recompiles what that catcher's program links, not every program of the entry). Only a
# catcher among the entry's own programs' tests is run, so the verdict is the one the
# programs' tests give; a catcher that passes, or that is gone, costs its run and the
# programs are built and their tests run as above. A mutation that does not compile (in
# what was built) is an error of the list. The file is restored before the next mutation.
#
# An entry whose code runs only on some CPUs says which instruction sets it needs
# (`needs: avx512f`). The script reads them as the kernels do (common/cpu_features.hpp):
# the flags of /proc/cpuinfo, less what BIGBATCH_MAX_ISA hides (avx2: AVX-512; baseline:
# AVX2, FMA and F16C too). Where one is missing the entry is SKIPPED, with the reason,
# and counted apart: neither killed nor survived. (The tests run with the same
# BIGBATCH_MAX_ISA, so they take the paths the script assumes.)
#
# Exit status: 0 when every mutation that ran was killed; 1 when one survived, was stale or
# did not compile; 2 for a usage error or when the unmutated copy does not build or pass.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
list_file="$repo/scripts/mutations.txt"
catchers_file="$repo/scripts/mutation-catchers.txt"
write_catchers=""
jobs=$(nproc)
only=""
workers=""
rev=""
list_only=0
features_only=0
keep=0
cuda=OFF
baseline_tested=0

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "mutation-check: $*" >&2; exit 2; }

while (($#)); do
  case "$1" in
    --only) [ $# -ge 2 ] || die "--only needs a list of ids"; only="$2"; shift 2 ;;
    --only=*) only="${1#--only=}"; shift ;;
    --list) list_only=1; shift ;;
    --cpu-features) features_only=1; shift ;;
    -j) [ $# -ge 2 ] || die "-j needs a number"; jobs="$2"; shift 2 ;;
    -j*) jobs="${1#-j}"; shift ;;
    -P) [ $# -ge 2 ] || die "-P needs a number"; workers="$2"; shift 2 ;;
    -P*) workers="${1#-P}"; shift ;;
    --rev) [ $# -ge 2 ] || die "--rev needs a revision"; rev="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --cuda) cuda=AUTO; shift ;;
    --baseline-tested) baseline_tested=1; shift ;;
    --mutations) [ $# -ge 2 ] || die "--mutations needs a file"; list_file="$2"; shift 2 ;;
    --catchers) [ $# -ge 2 ] || die "--catchers needs a file"; catchers_file="$2"; shift 2 ;;
    --write-catchers) [ $# -ge 2 ] || die "--write-catchers needs a file"
                      write_catchers="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "-j needs a positive number, got '$jobs'"
[ -z "$workers" ] || [[ "$workers" =~ ^[1-9][0-9]*$ ]] ||
  die "-P needs a positive number, got '$workers'"

# ---- the CPU ---------------------------------------------------------------------------
# The instruction sets an entry may need, each with the BIGBATCH_MAX_ISA level that
# includes it (the table of common/cpu_features.cpp; tests/tools/check_cpu_features.sh
# holds the two readings against each other).
declare -A feature_level=([avx2]=1 [fma]=1 [f16c]=1
                          [avx512f]=2 [avx512bw]=2 [avx512dq]=2 [avx512vl]=2)
known_features=(avx2 fma f16c avx512f avx512bw avx512dq avx512vl)
case "${BIGBATCH_MAX_ISA:-}" in
  ""|avx512) max_level=2 ;;
  avx2) max_level=1 ;;
  baseline) max_level=0 ;;
  *) die "BIGBATCH_MAX_ISA must be avx512, avx2 or baseline, got '$BIGBATCH_MAX_ISA'" ;;
esac
cpu_flags=" $(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo 2> /dev/null | head -n 1) "
cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2> /dev/null | head -n 1)
granted=()
for feature in "${known_features[@]}"; do
  if [[ "$cpu_flags" == *" $feature "* ]] && ((feature_level[$feature] <= max_level)); then
    granted+=("$feature")
  fi
done
cpu_has_text=${granted[*]:-none of ${known_features[*]}}

# missing_features NEEDS: the features of the space-separated list NEEDS this CPU lacks.
missing_features() {
  local feature missing=() have
  for feature in $1; do
    have=0
    for g in "${granted[@]}"; do [ "$g" != "$feature" ] || have=1; done
    ((have)) || missing+=("$feature")
  done
  echo "${missing[*]}"
}

if ((features_only)); then
  echo "${granted[*]}"
  exit 0
fi

# ---- the list --------------------------------------------------------------------------
# Parallel arrays, one element per entry.
ids=() files=() descriptions=() originals=() replacements=() programs=() needs=()

add_entry() {  # the block just read, from the variables set by read_list
  [ -n "$e_id$e_file$e_description$e_original$e_replacement$e_programs$e_needs" ] || return 0
  local missing=""
  for key in id file description original replacement; do
    local var="e_$key"
    [ -n "${!var}" ] || missing+=" $key"
  done
  [ -z "$missing" ] || die "$list_file: the entry ending at line $line_number lacks:$missing"
  for existing in "${ids[@]}"; do
    [ "$existing" != "$e_id" ] || die "$list_file: id '$e_id' appears twice"
  done
  for feature in $e_needs; do
    [ -n "${feature_level[$feature]:-}" ] ||
      die "$list_file: entry '$e_id' needs '$feature'; known: ${known_features[*]}"
  done
  ids+=("$e_id") files+=("$e_file") descriptions+=("$e_description")
  originals+=("$e_original") replacements+=("$e_replacement") programs+=("$e_programs")
  needs+=("$e_needs")
}

read_list() {
  local line key value
  e_id="" e_file="" e_description="" e_original="" e_replacement="" e_programs="" e_needs=""
  line_number=0
  while IFS= read -r line || [ -n "$line" ]; do
    line_number=$((line_number + 1))
    line="${line%$'\r'}"
    if [[ "$line" =~ ^[[:space:]]*$ ]]; then
      add_entry
      e_id="" e_file="" e_description="" e_original="" e_replacement="" e_programs="" e_needs=""
      continue
    fi
    [[ "$line" == \#* ]] && continue
    [[ "$line" == *": "* ]] || die "$list_file:$line_number: expected 'key: value', got: $line"
    key="${line%%: *}"
    value="${line#*: }"
    case "$key" in
      id) [[ "$value" =~ ^[A-Za-z0-9-]+$ ]] || die "$list_file:$line_number: bad id '$value'"
          e_id="$value" ;;
      file) e_file="$value" ;;
      description) e_description="$value" ;;
      original) e_original="$value" ;;
      replacement) e_replacement="$value" ;;
      programs) e_programs="$value" ;;
      needs) e_needs="$value" ;;
      *) die "$list_file:$line_number: unknown key '$key'" ;;
    esac
  done < "$list_file"
  add_entry
}

[ -f "$list_file" ] || die "no mutation list at $list_file"
read_list
((${#ids[@]})) || die "$list_file holds no mutation"

# The entries to run: all, or those named by --only (each must exist).
selected=()
if [ -n "$only" ]; then
  IFS=',' read -r -a wanted <<< "$only"
  for id in "${wanted[@]}"; do
    found=""
    for i in "${!ids[@]}"; do
      if [ "${ids[$i]}" = "$id" ]; then found=$i; fi
    done
    [ -n "$found" ] || die "--only: no mutation with id '$id' (see --list)"
    selected+=("$found")
  done
else
  selected=("${!ids[@]}")
fi

# skip_reason I: why entry I cannot run on this CPU ("" when it can).
skip_reason() {
  local missing
  missing=$(missing_features "${needs[$1]}")
  [ -z "$missing" ] || echo "needs ${needs[$1]}; this CPU has $cpu_has_text"
}

if ((list_only)); then
  skipped_here=0
  for i in "${selected[@]}"; do
    printf '%-38s %s\n' "${ids[$i]}" "${descriptions[$i]}"
    printf '%-38s %s\n' "" "${files[$i]}; programs: ${programs[$i]:-all tests}"
    reason=$(skip_reason "$i")
    if [ -n "$reason" ]; then
      printf '%-38s %s\n' "" "SKIPPED ($reason)"
      skipped_here=$((skipped_here + 1))
    fi
  done
  echo "${#selected[@]} mutation(s), $skipped_here skipped on this CPU"
  exit 0
fi

# ---- private copies and their builds ---------------------------------------------------
echo "CPU: ${cpu_model:-unknown}; instruction sets granted: $cpu_has_text" \
     "(BIGBATCH_MAX_ISA=${BIGBATCH_MAX_ISA:-unset})"
start_time=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/bigbatch-mutation.XXXXXX")
cleanup() {
  if ((keep)); then echo "kept the copies in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM  # so that the copies are removed when the run is interrupted

copy="$work/src-1"
mkdir -p "$copy"
if [ -n "$rev" ]; then
  git -C "$repo" archive --format=tar "$rev" | tar -xf - -C "$copy"
  echo "copied revision $rev to $copy"
else
  # Tracked files as they are on disk; a tracked file deleted in the working tree is skipped.
  (cd "$repo" && git ls-files -z --cached |
     tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$copy"
  echo "copied the tracked files of $repo to $copy"
fi

# Each worker plants its mutations in a copy of its own, built in it. With ccache the
# copies after the first compile from its cache (the paths are made relative to $work, so
# the copies' compiler command lines are the same), which is what makes a second worker
# cheaper than the time it saves; without ccache one worker runs.
launcher=()
if command -v ccache > /dev/null; then
  if [ -n "${CCACHE_DIR:-}" ]; then
    export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$work}" CCACHE_NOHASHDIR=true
    echo "compiling with the cache $CCACHE_DIR (base $CCACHE_BASEDIR)"
  else
    export CCACHE_DIR="$work/ccache" CCACHE_BASEDIR="$work" CCACHE_NOHASHDIR=true
  fi
  # The test sources read a precompiled header (BIGBATCH_TEST_PCH): cached only so.
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=$repo/scripts/mutation-compile.sh;ccache")
  [ "$cuda" = OFF ] ||
    launcher+=("-DCMAKE_CUDA_COMPILER_LAUNCHER=$repo/scripts/mutation-compile.sh;ccache")
else
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=$repo/scripts/mutation-compile.sh")
  [ "$cuda" = OFF ] ||
    launcher+=("-DCMAKE_CUDA_COMPILER_LAUNCHER=$repo/scripts/mutation-compile.sh")
  [ -n "$workers" ] || workers=1
fi
# Where no GPU runs the CUDA code, a header's plant keeps the CUDA objects the unplanted
# build made (scripts/mutation-compile.sh says why the verdict is the same).
if [ "$cuda" != OFF ] && ! nvidia-smi -L > /dev/null 2>&1; then
  export BIGBATCH_CUDA_OBJECTS_KEPT=1
  echo "no GPU here (nvidia-smi -L): a header's plant keeps the CUDA objects unplanted"
fi
count_selected=${#selected[@]}
[ -n "$workers" ] || workers=$((jobs >= 2 ? 2 : 1))
((workers <= count_selected)) || workers=$count_selected
for ((w = 2; w <= workers; ++w)); do cp -a "$copy" "$work/src-$w"; done

logs="$work/logs"
mkdir -p "$logs"
# As scripts/build.sh: nvcc where the CUDA toolkit puts it, when it is not on PATH.
if [ "$cuda" != OFF ] && ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# Each mutation relinks the programs it tests: with gold (binutils) where it is found, which
# linked bigbatch in 0.13 s here against the default linker's 0.32 s.
linker=()
if command -v ld.gold > /dev/null; then linker=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=gold); fi
generator=()
if [ -z "${CMAKE_GENERATOR:-}" ] && command -v ninja > /dev/null; then generator=(-G Ninja); fi

# build_copy W: configures and builds copy W (Release) with -j $jobs.
build_copy() {
  local src="$work/src-$1"
  if ! cmake -S "$src" -B "$src/build-mutation" "${generator[@]}" "${launcher[@]}" "${linker[@]}" \
         -DBIGBATCH_CUDA="$cuda" -DBIGBATCH_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release \
         > "$logs/configure-$1.log" 2>&1; then
    tail -n 40 "$logs/configure-$1.log" >&2
    die "the unmutated copy does not configure"
  fi
  if ! cmake --build "$src/build-mutation" -j "$jobs" > "$logs/build-$1.log" 2>&1; then
    tail -n 40 "$logs/build-$1.log" >&2
    die "the unmutated copy does not build"
  fi
}
echo "configuring and building $workers cop$( ((workers == 1)) && echo y || echo ies)" \
     "(BIGBATCH_CUDA=$cuda, -j $jobs$(command -v ccache > /dev/null && echo ", ccache"))"
for ((w = 1; w <= workers; ++w)); do build_copy "$w"; done
echo "built in $((SECONDS - start_time)) s"

build="$copy/build-mutation"
failed_log="$build/Testing/Temporary/LastTestsFailed.log"
# The tests of a mutation that names no programs, and of the check of the unmutated copy.
all_tests=(-L '^(unit|chapter|cli)$')

# run_tests LOG [CTEST ARGS...]: runs CTest in the build folder; sets `failed_tests` to the
# names of the tests that failed (empty when all passed). CTest's record of earlier runs
# (their times, the tests that failed) is removed first: it would reorder the tests, the
# last mutation's failures first, and make the test that kills a mutation depend on which
# mutation came before it. Without it the tests run in the order they were added.
run_tests() {
  local log="$1"
  shift
  rm -f "$failed_log" "$build/Testing/Temporary/CTestCostData.txt"
  local status=0
  (cd "$build" && OMP_WAIT_POLICY=passive ctest -j "$jobs" --timeout 120 "$@") > "$log" 2>&1 ||
    status=$?
  failed_tests=()
  if [ -f "$failed_log" ]; then
    # "N:NAME"; a parameterised GoogleTest name ends in "  # GetParam() = ...": dropped.
    mapfile -t failed_tests < <(sed -e 's/^[0-9]*://' -e 's/  # GetParam() = .*//' "$failed_log")
  fi
  if ((status != 0 && ${#failed_tests[@]} == 0)); then
    failed_tests=("(ctest exited with status $status; see the log)")
  fi
}

if ((baseline_tested)); then
  echo "the unmutated copy is not tested again (--baseline-tested)"
else
  run_tests "$logs/baseline-tests.log" "${all_tests[@]}"
  if ((${#failed_tests[@]})); then
    tail -n 40 "$logs/baseline-tests.log" >&2
    die "the unmutated copy fails these tests: ${failed_tests[*]}"
  fi
  echo "the unmutated copy passes every test ($((SECONDS - start_time)) s so far)"
fi

# Which program each CTest test runs: `ctest -N -V` prints "N: Test command: PATH ARGS"
# before "Test #N: NAME". test_program[N] is the basename of PATH; test_runs[N] the
# basenames of the built programs among ARGS (a script's test names the programs it runs:
# check_plan.sh gets bigbatch's path, run_under_mpi.sh a test program's); test_targets[N]
# every built program the test needs (PATH when it is built, and those of ARGS).
declare -A test_program=() test_runs=() test_targets=()
while IFS=$'\t' read -r number path arguments; do
  test_program[$number]="${path##*/}"
  runs=()
  for argument in $arguments; do
    argument=${argument//\"/}
    if [[ "$argument" == "$build"/* && -f "$argument" && -x "$argument" ]]; then
      runs+=("${argument##*/}")
    fi
  done
  test_runs[$number]="${runs[*]}"
  test_targets[$number]="${runs[*]}"
  if [[ "$path" == "$build"/* ]]; then test_targets[$number]="${path##*/} ${runs[*]}"; fi
done < <(cd "$build" && ctest -N -V 2> /dev/null |
           sed -n 's|^ *\([0-9][0-9]*\): Test command: \([^ ]*\) *\(.*\)|\1\t\2\t\3|p')
((${#test_program[@]})) || die "could not read the tests' commands from 'ctest -N -V'"
# test_number[NAME]: the CTest number of each test (a GoogleTest parameter's comment dropped).
declare -A test_number=()
while IFS=$'\t' read -r number name; do
  test_number[$name]=$number
done < <(cd "$build" && ctest -N 2> /dev/null |
           sed -n 's|^ *Test *#\([0-9][0-9]*\): \(.*\)$|\1\t\2|p' | sed 's/  # GetParam() = .*//')

# last_catchers[ID]: the tests that caught mutation ID last time, from $catchers_file.
declare -A last_catchers=()
if [ -f "$catchers_file" ]; then
  while read -r catcher_id catcher_tests; do
    [[ -z "$catcher_id" || "$catcher_id" == \#* ]] || last_catchers[$catcher_id]="$catcher_tests"
  done < "$catchers_file"
fi

# catchers_of I: sets `catcher_numbers` to the CTest numbers of the catchers of entry I that
# are tests of its programs (empty when there are none).
catchers_of() {
  local i=$1 name number target names=()
  catcher_numbers=()
  read -r -a names <<< "${last_catchers[${ids[$i]}]:-}"
  for name in "${names[@]}"; do
    number=${test_number[$name]:-}
    [ -n "$number" ] || continue
    if [ -n "${programs[$i]}" ]; then
      for target in ${programs[$i]}; do
        [ "${test_program[$number]}" != "$target" ] || { catcher_numbers+=("$number"); break; }
      done
    else
      catcher_numbers+=("$number")
    fi
  done
}

# numbers_selection N...: the CTest arguments that run exactly the tests numbered N...
# (-I START,END,STRIDE,N,N,...).
numbers_selection() {
  echo "-I $1,$1,1,$(IFS=','; echo "$*")"
}

# ctest_selection PROGRAM...: the CTest arguments that run exactly those programs' tests;
# fails when a program has no test.
ctest_selection() {
  local numbers=() program number found
  for program in "$@"; do
    found=0
    for number in "${!test_program[@]}"; do
      if [ "${test_program[$number]}" = "$program" ]; then numbers+=("$number"); found=1; fi
    done
    ((found)) || { echo "no CTest test runs the program '$program'" >&2; return 1; }
  done
  numbers_selection "${numbers[@]}"
}

# apply FILE ORIGINAL REPLACEMENT: replaces the one occurrence of ORIGINAL; prints the
# number of occurrences and fails when it is not exactly one.
apply() {
  MUTATION_ORIGINAL="$2" MUTATION_REPLACEMENT="$3" perl -e '
    my $file = $ARGV[0];
    my ($original, $replacement) = @ENV{qw(MUTATION_ORIGINAL MUTATION_REPLACEMENT)};
    open(my $in, "<", $file) or die "cannot read $file: $!\n";
    my $text = do { local $/; <$in> };
    close($in);
    my ($count, $at, $first) = (0, 0, -1);
    while (($at = index($text, $original, $at)) >= 0) {
      $first = $at if $count == 0;
      ++$count;
      ++$at;
    }
    if ($count != 1) { print "$count\n"; exit 1; }
    substr($text, $first, length($original)) = $replacement;
    open(my $out, ">", $file) or die "cannot write $file: $!\n";
    print $out $text;
    close($out);
  ' "$1"
}

# ---- the mutations ---------------------------------------------------------------------
# build_targets ID [TARGET...]: builds the targets (every target when none is named) in the
# current copy, adding to `build_seconds`; on a compiler error sets `verdict` and `detail`.
# The compiles that read the plant run at -O1 or -O0 (scripts/mutation-compile.sh, named by
# BIGBATCH_PLANTED); for a header's plant that is every compile of the build, so the targets
# are first built with the file as it was (the previous plants' restored files, from the
# cache), then planted again.
#
# build_targets ID --linked TARGET...: the same for a header's plant with Ninja, recompiling
# only the objects the targets' links take that include the header (linked_includers): the
# plant keeps the header's old time, so nothing else looks out of date, and those objects
# are deleted, so that they are made again. Each program is then what a full rebuild would
# link. Should the plant make a link take another object that includes the header, the
# header's time is renewed and all that includes it is rebuilt, as without --linked.
build_targets() {
  local id=$1 t0=$SECONDS linked=0 header=0
  shift
  if [ "${1:-}" = --linked ]; then linked=1; shift; fi
  local args=()
  (($# == 0)) || args=(--target "$@")
  [[ "$planted" != *.hpp && "$planted" != *.h && "$planted" != *.inc ]] || header=1
  ((header && $# > 0)) && [ -f "$build/build.ninja" ] || linked=0
  if ((header)); then
    cp -p "$backup" "$file"  # its old time: what was compiled from the plant stays
    cmake --build "$build" -j "$jobs" "${args[@]}" >> "$logs/$id.build.log" 2>&1 || true
    cp "$work/planted-$id" "$file"
    if ((linked)) && linked_includers "$@" > "$work/remade-$id"; then
      touch -r "$backup" "$file"
      (cd "$build" && xargs -r rm -f < "$work/remade-$id")
    else
      linked=0
    fi
  fi
  if ! BIGBATCH_PLANTED="$planted" BIGBATCH_COPY="$copy" \
       cmake --build "$build" -j "$jobs" "${args[@]}" \
         >> "$logs/$id.build.log" 2>&1; then
    verdict="DID NOT COMPILE"
  elif ((linked)) && ! { linked_includers "$@" > "$work/remade-again-$id" &&
                         ! grep -qvxF -f "$work/remade-$id" "$work/remade-again-$id"; }; then
    echo "the planted links take another object that includes the header: all are rebuilt" \
      >> "$logs/$id.build.log"
    touch "$file"
    BIGBATCH_PLANTED="$planted" BIGBATCH_COPY="$copy" \
      cmake --build "$build" -j "$jobs" "${args[@]}" >> "$logs/$id.build.log" 2>&1 ||
      verdict="DID NOT COMPILE"
  fi
  if [ "$verdict" = "DID NOT COMPILE" ]; then
    detail="the compiler says: $(grep -m 1 -E 'error' "$logs/$id.build.log" |
                                 sed "s|$copy/||" || true)"
  fi
  ((!linked)) || touch "$file"  # the next build sees the plant as new: all of it is rebuilt
  build_seconds=$((build_seconds + SECONDS - t0))
}

# linked_includers TARGET...: prints the objects (paths in $build) that the targets' links
# read, their own and the archive members the linker takes (each link run again as the build
# ran it, with a map: -Map), and that read the planted header ($planted), by Ninja's record
# of each compile's includes; fails when a link or a query fails. The CUDA objects the build
# keeps (BIGBATCH_CUDA_OBJECTS_KEPT, scripts/mutation-compile.sh) are left out.
linked_includers() {
  local target command word archive member map="$work/link-$BASHPID.map" objects=() words=()
  for target in "$@"; do
    command=$(cd "$build" && ninja -t commands "$target" | tail -n 1) || return 1
    command=${command#: && }
    command=${command%% && *}  # the link, without the tests' discovery after it
    rm -f "$map"
    (cd "$build" && bash -c "$command -Wl,-Map=$map") > /dev/null 2>&1 && [ -s "$map" ] ||
      return 1
    read -r -a words <<< "$command"
    for word in "${words[@]}"; do [[ "$word" != *.o ]] || objects+=("$word"); done
    while IFS='(' read -r archive member; do
      member=${member%)}
      objects+=($(cd "$build" && ninja -t query "$archive" | awk -v member="$member" '
        /^  input:/ { inputs = 1; next }
        /^  [a-z]/ { inputs = 0 }
        inputs && NF == 1 { n = split($1, part, "/"); if (part[n] == member) print $1 }'))
    done < <(grep -E '^[^ /][^ ]*\.a\([^)]*\)$' "$map")
  done
  rm -f "$map"
  ((${#objects[@]})) || return 0
  (cd "$build" && ninja -t deps "${objects[@]}") |
    awk -v header="/$planted" -v kept="${BIGBATCH_CUDA_OBJECTS_KEPT:-0}" '
      /^[^ ]/ { object = $1; sub(/:$/, "", object); next }
      NF == 1 { dependency = "/" $1
        if (length(dependency) >= length(header) &&
            substr(dependency, length(dependency) - length(header) + 1) == header &&
            !(kept == 1 && object ~ /\.cu\.o$/) && !seen[object]++) print object }'
}
# run_mutation I POSITION: plants entry I in the current copy ($copy, $build), rebuilds and
# tests, restores the file; writes "VERDICT<TAB>SECONDS<TAB>DETAIL" to $work/results/I and
# prints its line.
mkdir -p "$work/results"
run_mutation() {
  local i=$1 position=$2
  local id="${ids[$i]}" file="$copy/${files[$i]}" mutation_start=$SECONDS
  local verdict="" detail="" reason occurrences selection build_seconds=0 test_seconds=0 t0
  local planted="" backup="$work/original-$id"
  local build_args=() selections=("${all_tests[*]}") targets=() test_args=() rebuild=1 part=0
  reason=$(skip_reason "$i")
  if [ -n "$reason" ]; then
    verdict="SKIPPED" detail="$reason"
  elif [ ! -f "$file" ]; then
    verdict="STALE" detail="${files[$i]} does not exist"
  else
    cp -p "$file" "$backup"
    if ! occurrences=$(apply "$file" "${originals[$i]}" "${replacements[$i]}"); then
      verdict="STALE" detail="the original snippet occurs ${occurrences:-?} times in ${files[$i]}"
    else
      planted=${files[$i]}
      cp "$file" "$work/planted-$id"
      read -r -a targets <<< "${programs[$i]}"
      if ((${#targets[@]})); then
        # A script (.py, .sh) runs from the source tree: nothing of it to build, but the
        # programs its tests' command lines name (bigbatch, a test program) are rebuilt.
        local target number built_targets=()
        for target in "${targets[@]}"; do
          if [[ "$target" == *.py || "$target" == *.sh ]]; then
            for number in "${!test_program[@]}"; do
              [ "${test_program[$number]}" != "$target" ] || built_targets+=(${test_runs[$number]})
            done
          else
            built_targets+=("$target")
          fi
        done
        build_args=("${built_targets[@]}")
        ((${#built_targets[@]})) || rebuild=0
        # One selection per program, in the entry's order (put the quickest to fail first).
        selections=()
        for target in "${targets[@]}"; do
          if ! selection=$(ctest_selection "$target" 2>&1); then
            verdict="STALE" detail="$selection"
            break
          fi
          selections+=("$selection")
        done
      fi
      # Last time's catchers first, with only the programs they need built (a header's
      # plant then recompiles what those programs link, not every program of the entry);
      # when none of them fails, every program of the entry is built and its tests run.
      # One failing test kills the mutation: CTest stops there, and so do the programs.
      failed_tests=()
      catchers_of "$i"
      if [ -z "$verdict" ] && ((${#catcher_numbers[@]})); then
        local catcher_targets=()
        for number in "${catcher_numbers[@]}"; do catcher_targets+=(${test_targets[$number]}); done
        build_targets "$id" --linked "${catcher_targets[@]}"
        if [ -z "$verdict" ]; then
          t0=$SECONDS
          run_tests "$logs/$id.tests-0.log" --stop-on-failure \
            $(numbers_selection "${catcher_numbers[@]}")
          test_seconds=$((SECONDS - t0))
        fi
      fi
      if [ -z "$verdict" ] && ((${#failed_tests[@]} == 0)); then
        if ((rebuild)); then build_targets "$id" --linked "${build_args[@]}"; fi
        t0=$SECONDS
        for selection in "${selections[@]}"; do
          part=$((part + 1))
          read -r -a test_args <<< "$selection"
          run_tests "$logs/$id.tests-$part.log" --stop-on-failure "${test_args[@]}"
          ((${#failed_tests[@]} == 0)) || break
        done
        test_seconds=$((test_seconds + SECONDS - t0))
      fi
      if [ -z "$verdict" ]; then
        if ((${#failed_tests[@]})); then
          verdict="KILLED" detail=$(IFS=','; echo "${failed_tests[*]}" | sed 's/,/, /g')
        else
          verdict="SURVIVED"
        fi
      fi
    fi
    # Restore the file: its new modification time makes the next build recompile it.
    cp "$backup" "$file"
    touch "$file"
  fi
  printf '%s\t%s\t%s\n' "$verdict" "$((SECONDS - mutation_start))" "$detail" \
    > "$work/results/$i"
  local line
  line=$(printf '[%d/%d] %s (%s) ... %s (build %d s, tests %d s)' "$position" "$count" "$id" \
         "${files[$i]}" "$verdict" "$build_seconds" "$test_seconds")
  [ "$verdict" != "SKIPPED" ] || line+=" ($detail)"
  echo "$line"
  if [ "$verdict" = "DID NOT COMPILE" ]; then
    grep -m 5 -E 'error' "$logs/$id.build.log" | sed "s|$copy/||; s/^/    /" || true
  fi
}

count=${#selected[@]}
# Worker W takes the entries at positions W, W + workers, ... of the list, in its own copy,
# with its share of the jobs; the lines come as the mutations finish.
jobs_per_worker=$((jobs / workers > 0 ? jobs / workers : 1))
echo "planting $count mutation(s), $workers at a time"
for ((w = 1; w <= workers; ++w)); do
  (
    copy="$work/src-$w"
    build="$copy/build-mutation"
    failed_log="$build/Testing/Temporary/LastTestsFailed.log"
    jobs=$jobs_per_worker
    for ((position = w; position <= count; position += workers)); do
      run_mutation "${selected[$((position - 1))]}" "$position"
    done
  ) &
done
wait

verdicts=() catchers=() seconds=()
killed=0 survived=0 stale=0 broken=0 skipped=0
for i in "${selected[@]}"; do
  [ -f "$work/results/$i" ] || die "the worker that had '${ids[$i]}' gave no verdict"
  IFS=$'\t' read -r verdicts[$i] seconds[$i] catchers[$i] < "$work/results/$i"
  case "${verdicts[$i]}" in
    KILLED) killed=$((killed + 1)) ;;
    SURVIVED) survived=$((survived + 1)) ;;
    STALE) stale=$((stale + 1)) ;;
    SKIPPED) skipped=$((skipped + 1)) ;;
    *) broken=$((broken + 1)) ;;
  esac
done

# ---- the report ------------------------------------------------------------------------
echo
printf '%-38s %-16s %5s  %s\n' "mutation" "verdict" "time" "description"
printf '%s\n' "$(printf '%.0s-' {1..110})"
for i in "${selected[@]}"; do
  printf '%-38s %-16s %4ss  %s\n' "${ids[$i]}" "${verdicts[$i]}" "${seconds[$i]}" \
    "${descriptions[$i]}"
  case "${verdicts[$i]}" in
    KILLED) echo "      caught by: ${catchers[$i]}" ;;
    SURVIVED) echo "      no test failed (programs run: ${programs[$i]:-all tests})" ;;
    *) echo "      ${catchers[$i]}" ;;
  esac
done
echo
echo "total time: $((SECONDS - start_time)) s"
summary="mutations: $killed killed, $survived survived"
((stale == 0)) || summary+=", $stale stale"
((broken == 0)) || summary+=", $broken did not compile"
((skipped == 0)) || summary+=", $skipped skipped (this CPU lacks what they need)"
echo "$summary"

if [ -n "$write_catchers" ]; then
  # The mutations of this run get their catchers of this run (none when not killed); the
  # others of the list keep theirs from the catchers read (--catchers), so that a run with
  # --only updates its entries alone, and so do those this CPU skipped (a machine without
  # AVX-512 keeps what one with it found).
  declare -A ran=()
  for i in "${selected[@]}"; do [ "${verdicts[$i]}" = SKIPPED ] || ran[$i]=1; done
  {
    echo "# The tests that caught each mutation of scripts/mutations.txt when it was last run"
    echo "# (scripts/mutation-check.sh --write-catchers): \"ID TEST...\". The script runs them"
    echo "# first, and the mutation's programs only when none of them fails."
    for i in "${!ids[@]}"; do
      if [ -n "${ran[$i]:-}" ]; then
        [ "${verdicts[$i]}" = KILLED ] || continue
        printf '%s %s\n' "${ids[$i]}" "$(echo "${catchers[$i]}" | sed 's/, / /g')"
      elif [ -n "${last_catchers[${ids[$i]}]:-}" ]; then
        printf '%s %s\n' "${ids[$i]}" "${last_catchers[${ids[$i]}]}"
      fi
    done
  } > "$write_catchers"
  echo "wrote the catchers of the killed mutations to $write_catchers (those not run or" \
       "skipped: as they were in $catchers_file)"
fi
((survived == 0 && stale == 0 && broken == 0))
