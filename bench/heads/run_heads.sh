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
python3 - "$tmp" "$here/bench/results/heads.json" <<'PY'
import glob, json, sys
records = []
for path in sorted(glob.glob(sys.argv[1] + "/P*.json")):
    with open(path) as f:
        records += json.load(f)
with open(sys.argv[2], "w") as f:
    json.dump(records, f, indent=1)
print(f"wrote {len(records)} records to {sys.argv[2]}")
PY
rm -rf "$tmp"
