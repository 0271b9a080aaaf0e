#!/usr/bin/env bash
# Runs the chunkwise benchmark at P = 1 (local kernels), 2 (CP efficiency, summaries) and 3..8
# (summaries, oversubscribed), one thread per rank, and merges the records into
# bench/results/chunkwise.json, then the PyTorch baseline (bench/results/chunkwise_torch.json).
# usage: run_chunkwise.sh BUILD_DIR [--quick]
set -euo pipefail
build="${1:?usage: run_chunkwise.sh BUILD_DIR [--quick]}"
shift || true
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
load_start="$(cut -d' ' -f1 /proc/loadavg)"
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for p in 1 2 3 4 5 6 7 8; do
  mpirun --oversubscribe --bind-to none -np "$p" "$build/bench/chunkwise/ctxpar_bench_chunkwise" \
    --out "$tmp/P$p.json" "$@" --kokkos-disable-warnings 2>/dev/null || \
  mpirun --oversubscribe --bind-to none -np "$p" "$build/bench/chunkwise/ctxpar_bench_chunkwise" --out "$tmp/P$p.json" "$@"
done
python3 - "$tmp" "$here/bench/results/chunkwise.json" "$load_start" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import glob, json, sys
records = []
for path in sorted(glob.glob(sys.argv[1] + "/P*.json")):
    with open(path) as f:
        records += json.load(f)
records.append({"benchmark": "chunkwise", "case": "run conditions", "kind": "run",
                "load_start": float(sys.argv[3]), "load_end": float(sys.argv[4])})
with open(sys.argv[2], "w") as f:
    json.dump(records, f, indent=1)
print(f"wrote {len(records)} records to {sys.argv[2]}")
PY
rm -rf "$tmp"
# The PyTorch-CPU baseline right after, same thread count, when torch is importable; it reads the
# ctxpar medians just written for its speed-up figures.
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 "$here/bench/chunkwise/torch_baseline.py" \
    --out "$here/bench/results/chunkwise_torch.json" --ctxpar "$here/bench/results/chunkwise.json"
else
  echo "torch not importable: PyTorch baseline skipped"
fi
