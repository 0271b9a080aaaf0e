#!/usr/bin/env bash
# Builds ctxpar_bench_crossover in BUILD_DIR, runs it at P = 2, 3, 4 (one thread per rank; P > 2
# oversubscribes a 2-core machine, which the records say) and merges the records into
# bench/results/crossover.json.  usage: run.sh BUILD_DIR [extra benchmark flags]
# CTXPAR_BENCH_QUICK=1 adds --quick (tokens per rank up to 4096 instead of 16384).
set -euo pipefail
build="${1:?usage: run.sh BUILD_DIR [flags]}"
shift || true
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
flags=("$@")
[ "${CTXPAR_BENCH_QUICK:-0}" = "1" ] && flags+=(--quick)
cmake --build "$build" -j "${CTXPAR_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}" \
  --target ctxpar_bench_crossover >/dev/null
# The newest binary, should an old build tree hold a second one.
exe="$(ls -t $(find "$build/bench" -type f -name ctxpar_bench_crossover -perm -u+x) | head -1)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false KOKKOS_DISABLE_WARNINGS=ON
mpi_flags=(--oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
status=0
for p in ${CTXPAR_CROSSOVER_RANKS:-2 3 4}; do
  start=$(date +%s)
  mpirun -np "$p" "${mpi_flags[@]}" "$exe" --out "$tmp/P$p.json" ${flags[@]+"${flags[@]}"} || status=1
  echo "[crossover] P = $p took $(( $(date +%s) - start )) s"
done
python3 "$here/bench/common/merge_records.py" "$tmp" "$here/bench/results/crossover.json" --keep-if-empty
exit $status
