# Sourced (not run) by every script that writes results: sets results_dir to this
# machine's folder, bench/results/cpu-<cores>core-<isa>/, named by what made it: the core
# count and the widest instruction set the kernels may use here (avx512, avx2 or baseline:
# the CPU's, lowered by BIGBATCH_MAX_ISA as common/cpu_features.hpp lowers it). Results of
# one machine never land in another's folder. The READMEs quote the folder of the machine
# that made the committed results, bench/results/cpu-2core-avx512/ (scripts/readme_numbers.py).
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
isa=baseline
if [[ "$flags" == *" avx2 "* && "$flags" == *" fma "* && "$flags" == *" f16c "* ]]; then isa=avx2; fi
if [[ "$isa" == avx2 && "$flags" == *" avx512f "* ]]; then isa=avx512; fi
case "${BIGBATCH_MAX_ISA:-avx512}" in
  avx512) ;;
  avx2) [ "$isa" = avx512 ] && isa=avx2 ;;
  baseline) isa=baseline ;;
  *) echo "BIGBATCH_MAX_ISA must be avx512, avx2 or baseline, got '$BIGBATCH_MAX_ISA'" >&2; exit 2 ;;
esac
export results_dir="bench/results/cpu-$(nproc)core-$isa"
mkdir -p "$results_dir"
if [ "$results_dir" != bench/results/cpu-2core-avx512 ]; then
  echo "results go to $results_dir (this machine's folder); the READMEs quote" \
       "bench/results/cpu-2core-avx512/" >&2
fi
unset flags isa
