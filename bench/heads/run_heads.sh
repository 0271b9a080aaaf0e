#!/usr/bin/env bash
# Runs the heads benchmark at P = 1 (pack/unpack vs triad) and P = 2..8 (oversubscribed
# transposes, bytes vs formula, crossover with the summary exchange), one thread per rank, and
# merges the records into bench/results/heads.json.  usage: run_heads.sh BUILD_DIR [--quick]
set -euo pipefail
build="${1:?usage: run_heads.sh BUILD_DIR [--quick]}"
shift || true
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for p in 1 2 3 4 5 6 7 8; do
  mpirun --oversubscribe --bind-to none -np "$p" "$build/bench/heads/ctxpar_bench_heads" --out "$tmp/P$p.json" "$@" \
    --kokkos-disable-warnings
done
python3 "$here/bench/common/merge_records.py" "$tmp" "$here/bench/results/heads.json"
rm -rf "$tmp"
