#!/bin/sh
# run_under_mpi.sh MPIEXEC RANKS PROGRAM [ARGS...]: starts PROGRAM as RANKS ranks of one MPI
# job (--oversubscribe: more ranks than this machine's cores; as root Open MPI needs
# OMPI_ALLOW_RUN_AS_ROOT, set here) and exits with the job's code: non-zero when any rank
# failed. Leak detection is off under AddressSanitizer for MPI's own allocations, as in
# tests/cli/check_data_parallel.sh.
# The ranks of a test share one machine, so they talk through Open MPI's own point-to-point
# layer (pml ob1: shared memory) unless OMPI_MCA_pml says otherwise: the default, UCX,
# probes the network devices in every MPI_Init, which took 0.25 s of each job's 0.35 s
# here (an MPI_Allreduce of 2 ranks; 4 ranks of `bigbatch train` took 0.87 s instead of
# 1.44 s), and the tests start about 60 jobs. What the ranks compute is the same.
set -u
mpiexec=$1 ranks=$2
shift 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" exec "$mpiexec" --oversubscribe -np "$ranks" "$@"
