#!/bin/sh
# Renders docs/img/chunkwise_gflops.png (forward GFLOP/s vs T per family, with the same-run SGEMM
# ceiling) and docs/img/chunkwise_time.png (forward time vs T, log-log: a slope-1 line is linear
# growth) from the t_sweep records of bench/results/chunkwise.json. Needs python3 and gnuplot.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
python3 - "$root/bench/results/chunkwise.json" "$tmp" <<'PY'
import json, sys
records = [r for r in json.load(open(sys.argv[1])) if r.get("kind") == "t_sweep"]
with open(sys.argv[2] + "/sweep.dat", "w") as f:
    for family in ("gdn", "scalar", "diagonal"):
        f.write("# %s: T seconds GFLOP/s SGEMM\n" % family)
        for r in sorted((r for r in records if r["family"] == family), key=lambda r: r["tokens"]):
            f.write("%d %g %g %g\n" % (r["tokens"], r["forward_median_s"], r["gflops"], r["sgemm_gflops"]))
        f.write("\n\n")
PY
gnuplot <<GP
set terminal pngcairo size 800,480
set output "$root/docs/img/chunkwise_gflops.png"
set title "chunkwise local forward, fp32, 1 thread, K = V = 128, chunk 64"
set xlabel "tokens T"; set ylabel "GFLOP/s"; set logscale x 2; set yrange [0:*]; set key bottom right
plot "$tmp/sweep.dat" index 0 using 1:3 with linespoints title "gated delta rule", \
     "$tmp/sweep.dat" index 1 using 1:3 with linespoints title "scalar decay", \
     "$tmp/sweep.dat" index 2 using 1:3 with linespoints title "diagonal gates", \
     "$tmp/sweep.dat" index 0 using 1:4 with lines dt 2 title "same-run Eigen SGEMM"
set output "$root/docs/img/chunkwise_time.png"
set title "chunkwise forward time vs T (dashed: linear growth)"
set xlabel "tokens T"; set ylabel "seconds (median)"; set logscale xy; set autoscale y; set key top left
stats "$tmp/sweep.dat" index 0 using 1:2 nooutput
g0 = STATS_min_y
plot "$tmp/sweep.dat" index 0 using 1:2 with linespoints title "gated delta rule", \
     "$tmp/sweep.dat" index 1 using 1:2 with linespoints title "scalar decay", \
     "$tmp/sweep.dat" index 2 using 1:2 with linespoints title "diagonal gates", \
     g0 * x / 512 with lines dt 2 title "linear (gated delta)"
GP
rm -rf "$tmp"
echo "wrote docs/img/chunkwise_gflops.png docs/img/chunkwise_time.png"
