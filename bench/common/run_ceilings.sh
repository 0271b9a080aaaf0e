#!/bin/sh
# Measures the machine's ceilings at 2 ranks x 1 thread and writes bench/results/ceilings.json.
# Usage: bench/common/run_ceilings.sh BUILD_DIR   (configured with -DCTXPAR_ENABLE_BENCH=ON)
set -eu
build=${1:?usage: run_ceilings.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
cmake --build "$build" --target ctxpar_bench_ceilings
OMP_NUM_THREADS=1 OMP_PROC_BIND=true OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -np 2 --oversubscribe --bind-to none "$build/bench/common/ctxpar_bench_ceilings" \
  --kokkos-threads=1 --out "$root/bench/results/ceilings.json"
