#!/bin/sh
# Expression templates vs the same hand-written Kokkos loop, in one run: the time ratio (native,
# interleaved repeats) and the instruction ratio under valgrind --tool=callgrind, merged into
# bench/results/expr.json (one record per case and size).
#
# Usage: bench/expr/run_callgrind.sh BUILD_DIR [OUT.json]
#   BUILD_DIR configured with -DCTXPAR_ENABLE_BENCH=ON; needs valgrind and python3.
set -eu
build=${1:?usage: run_callgrind.sh BUILD_DIR [OUT.json]}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${2:-$root/bench/results/expr.json}
exe=$build/bench/expr/ctxpar_bench_expr
command -v valgrind >/dev/null || { echo "run_callgrind.sh: valgrind is not installed" >&2; exit 1; }

cmake --build "$build" --target ctxpar_bench_expr
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OMP_PROC_BIND=true OMP_PLACES=cores

echo "== time (native, 1 thread)"
"$exe" --mode time --out "$work/time.json"

echo "== instructions (valgrind --tool=callgrind, 1 thread)"
OMP_PROC_BIND=false valgrind --tool=callgrind --collect-atstart=no \
  --callgrind-out-file="$work/callgrind.out" "$exe" --mode callgrind 2>"$work/valgrind.log" ||
  { cat "$work/valgrind.log" >&2; exit 1; }

python3 - "$work" "$out" "$*" <<'PY'
import glob, json, re, sys
work, out, args = sys.argv[1], sys.argv[2], sys.argv[3]
counts = {}
for path in glob.glob(work + "/callgrind.out.*"):
    text = open(path, "rb").read().decode("latin-1")
    label = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
    total = re.search(r"^summary: (\d+)$", text, re.M)
    if label and total:
        counts[label.group(1).strip()] = int(total.group(1))
records = json.load(open(work + "/time.json"))
worst = 0.0
for r in records:
    name, size = r["case"].split()
    fused, hand = counts.get(f"{name} {size} fused"), counts.get(f"{name} {size} by_hand")
    if fused is None or hand is None:
        sys.exit(f"run_callgrind.sh: no callgrind count for {r['case']}")
    r["instructions_fused"] = fused
    r["instructions_by_hand"] = hand
    r["instruction_ratio"] = fused / hand
    r["instruction_ratio_target"] = 1.03
    r["command"] = "bench/expr/run_callgrind.sh " + args
    worst = max(worst, fused / hand)
    print(f"{r['case']:<16} instructions fused/by-hand {fused}/{hand} = {fused / hand:.5f}   "
          f"time ratio {r['time_ratio']:.4f} (of minima {r['time_ratio_of_minima']:.4f})")
with open(out, "w") as f:
    f.write("[\n" + ",\n".join("  " + json.dumps(r) for r in records) + "\n]\n")
print(f"worst instruction ratio {worst:.5f} (target <= 1.03); wrote {out}")
PY
