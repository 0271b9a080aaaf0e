#!/usr/bin/env bash
# Runs the sliding-window attention benchmarks: ctxpar_bench_swa at P = 2 (kernel ratios, CP
# efficiency, bytes; bench/results/swa.json, exactly as scripts/bench runs a plain benchmark), its
# portable-kernel cases at one rank with 4 threads (bench/results/swa_portable.json), and
# the growth sweep ctxpar_bench_swa_growth at P = 1..4 (oversubscribed on a small machine, one
# thread per rank), merged into bench/results/swa_growth.json. The tables and plots of docs/swa.md
# and docs/performance.md come from `scripts/bench --render-only` (bench/report/guides.py).
# usage: run_swa.sh BUILD_DIR [--quick]
set -euo pipefail
build="${1:?usage: run_swa.sh BUILD_DIR [--quick]}"
shift || true
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false KOKKOS_DISABLE_WARNINGS=ON
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
# As scripts/bench: ranks waiting in MPI yield the core instead of spinning (docs/hybrid.md).
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
flags=(--oversubscribe --bind-to none)
status=0
if [ -z "${CTXPAR_SWA_GROWTH_ONLY:-}" ]; then
  mpirun "${flags[@]}" -np 2 "$build/bench/swa/ctxpar_bench_swa" --out "$here/bench/results/swa.json" "$@" ||
    status=$?
fi
# The portable (GPU-shaped) kernels next to the host SIMD kernels, and their team-size sweep
# (1, 2, 4 threads per team): one rank with 4 OpenMP threads.
OMP_NUM_THREADS=4 mpirun "${flags[@]}" -np 1 "$build/bench/swa/ctxpar_bench_swa" --portable-only \
  --out "$here/bench/results/swa_portable.json" "$@" || status=$?
for p in 1 2 3 4; do
  mpirun "${flags[@]}" -np "$p" "$build/bench/swa/ctxpar_bench_swa_growth" --out "$tmp/P$p.json" "$@"
done
python3 "$here/bench/common/merge_records.py" "$tmp" "$here/bench/results/swa_growth.json"
exit $status
