#!/bin/sh
# run_under_mpi.sh MPIEXEC RANKS PROGRAM [ARGS...]: starts PROGRAM as RANKS ranks of one MPI
# job (--oversubscribe: more ranks than this machine's cores; as root Open MPI needs
# OMPI_ALLOW_RUN_AS_ROOT, set here) and exits with the job's code: non-zero when any rank
# failed. Leak detection is off under AddressSanitizer for MPI's own allocations, as in
# chapters/cli/check_data_parallel.sh.
set -u
mpiexec=$1 ranks=$2
shift 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" exec "$mpiexec" --oversubscribe -np "$ranks" "$@"
