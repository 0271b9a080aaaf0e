#!/bin/sh
# Renders docs/img/swa_kernel.png (kernel GFLOP/s ÷ same-run SGEMM vs window) and
# docs/img/swa_bytes.png (bytes received per rank vs axis length, all-gather vs halo) from
# bench/results/swa.json. Needs python3 and gnuplot.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
python3 - "$root/bench/results/swa.json" "$tmp" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
out = sys.argv[2]
with open(out + "/kernel.dat", "w") as f:
    for dim in (64, 128):
        f.write("# D=%d\n" % dim)
        for r in records:
            if r.get("kind") == "local_kernel" and r["dim"] == dim:
                f.write("%d %g %g\n" % (r["window"], r["forward_ratio"], r["backward_ratio"]))
        f.write("\n\n")
with open(out + "/bytes.dat", "w") as f:
    for w in (512, 4096):
        f.write("# W=%d\n" % w)
        for r in records:
            if r.get("kind") == "bytes_per_rank" and r["window"] == w:
                f.write("%d %d %d\n" % (r["length"], r["allgather_bytes_received"], r["halo_bytes_received"]))
        f.write("\n\n")
PY
gnuplot <<GP
set terminal pngcairo size 800,480
set output "$root/docs/img/swa_kernel.png"
set title "SWA local kernel, fp32, 1 thread: GFLOP/s / same-run Eigen SGEMM"
set xlabel "window W"; set ylabel "ratio to SGEMM"; set logscale x 2; set yrange [0:*]; set key bottom right
plot "$tmp/kernel.dat" index 0 using 1:2 with linespoints title "forward D=64", \
     "$tmp/kernel.dat" index 0 using 1:3 with linespoints title "backward D=64", \
     "$tmp/kernel.dat" index 1 using 1:2 with linespoints title "forward D=128", \
     "$tmp/kernel.dat" index 1 using 1:3 with linespoints title "backward D=128", \
     0.5 with lines dt 2 title "forward target", 0.35 with lines dt 3 title "backward target"
set output "$root/docs/img/swa_bytes.png"
set title "SWA forward: bytes received per rank (rank 0, P = 2, D = 64)"
set xlabel "axis length L = c + t"; set ylabel "bytes"; set logscale xy; set autoscale y; set key top left
plot "$tmp/bytes.dat" index 0 using 1:2 with linespoints title "all-gather, W=512", \
     "$tmp/bytes.dat" index 0 using 1:3 with linespoints title "halo, W=512", \
     "$tmp/bytes.dat" index 1 using 1:2 with linespoints title "all-gather, W=4096", \
     "$tmp/bytes.dat" index 1 using 1:3 with linespoints title "halo, W=4096"
GP
rm -rf "$tmp"
echo "wrote docs/img/swa_kernel.png and docs/img/swa_bytes.png"
