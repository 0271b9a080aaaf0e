#!/bin/sh
# Renders the growth of the distributed SWA step (bench/results/swa_growth.json, written by
# bench/swa/run_swa.sh) into docs/img/swa_growth.png (time and bytes vs T, W and P, one line per
# policy and key/value layout) and the tables between the "swa-growth" markers of docs/swa.md
# (DOC "-": printed instead; bench/report/guides.py takes them that way). CTXPAR_NO_PLOTS=1 skips
# the plot. Needs python3; the plot needs gnuplot. usage: plot_growth.sh [RESULTS.json [DOC.md|-]]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "${1:-$root/bench/results/swa_growth.json}" "$tmp" "${2:-$root/docs/swa.md}" <<'PY'
import json, sys
recs = [r for r in json.load(open(sys.argv[1])) if r.get("kind") == "growth"]
out, doc = sys.argv[2], sys.argv[3]
configs = [(p, l) for l in ("SegmentChunks", "WholeAxisChunks")
           for p in ("RopeBeforeGather", "RopeAfterGather", "HaloKV")]
pmax = max(r["ranks"] for r in recs)
fixed_w = min((r["window"] for r in recs if r["sweep"] == "T"), default=0)
fixed_t = min((r["chunk"] for r in recs if r["sweep"] == "W"), default=0)
mid_t = sorted({r["chunk"] for r in recs if r["sweep"] == "T"})
p_t = fixed_t if fixed_t in mid_t else mid_t[len(mid_t) // 2]

def pick(sweep, p, l, **kw):
    rs = [r for r in recs if r["sweep"] == sweep and r["policy_tag"] == p and r["layout"] == l and
          all(r[k] == v for k, v in kw.items())]
    return rs

def bytes_of(r):
    return r["forward_bytes_received_max"] + r["backward_bytes_received_max"]

sweeps = [("T", "chunk", dict(sweep="T", ranks=pmax), f"T (W = {fixed_w}, P = {pmax})"),
          ("W", "window", dict(sweep="W", ranks=pmax), f"W (T = {fixed_t}, P = {pmax})"),
          ("P", "ranks", dict(sweep="T", chunk=p_t), f"P (T = {p_t}, W = {fixed_w})")]
md = []
for name, x, sel, title in sweeps:
    kw = {k: v for k, v in sel.items() if k != "sweep"}
    xs = sorted({r[x] for r in recs if r["sweep"] == sel["sweep"] and all(r[k] == v for k, v in kw.items())})
    for what, f, fmt in (("forward + backward time (median, slowest rank)", lambda r: r["step_median_s"], "%.3f s"),
                         ("bytes received per rank, forward + backward (max over ranks)", bytes_of, "%d")):
        md.append(f"\n{what} vs {title}:\n")
        md.append("| policy | layout | " + " | ".join(f"{x}={v}" for v in xs) + " |")
        md.append("|---|---|" + "---|" * len(xs))
        for p, l in configs:
            cells = []
            for v in xs:
                rs = pick(sel["sweep"], p, l, **{x: v}, **kw)
                cells.append(fmt % f(rs[0]) if rs else "–")
            md.append(f"| {p} | {l} | " + " | ".join(cells) + " |")
    with open(f"{out}/{name}.dat", "w") as fh:
        for p, l in configs:
            fh.write(f"# {p} {l}\n")
            for v in xs:
                rs = pick(sel["sweep"], p, l, **{x: v}, **kw)
                if rs:
                    b = bytes_of(rs[0])
                    fh.write("%d %g %s\n" % (v, rs[0]["step_median_s"], b if b > 0 else "?"))
            fh.write("\n\n")
# Run facts and the whole-axis / per-segment ratios, so the prose around the tables needs no numbers.
machine = recs[0].get("machine", {}) if recs else {}
loads = sorted({r.get("machine", {}).get("load_average") for r in recs} - {None})
facts = [f"\nRecorded run: build `{machine.get('build_type', '?')}`"
         f"{' with -march=native' if machine.get('native') else ''}, backend {machine.get('backend', '?')}, "
         f"{machine.get('threads', '?')} thread(s) per rank, CPU {machine.get('cpu', '?')}, load average "
         f"{', '.join('%g' % x for x in loads) if loads else '?'} at the start of the launches (one launch per P)."]
bykey = {(r["sweep"], r["ranks"], r["chunk"], r["window"], r["policy_tag"], r["layout"]): r for r in recs}
for p, _ in configs[:3]:
    b, t = [], []
    for k, r in bykey.items():
        if k[4] != p or k[5] != "WholeAxisChunks" or k[1] < 2:
            continue
        s = bykey.get(k[:5] + ("SegmentChunks",))
        if s:
            b.append(bytes_of(r) / max(bytes_of(s), 1))
            t.append(r["step_median_s"] / s["step_median_s"])
    if b:
        t.sort()
        facts.append(f"- {p}, `WholeAxisChunks` ÷ `SegmentChunks` over the {len(b)} cases with P ≥ 2: "
                     f"bytes ×{min(b):.2f}–{max(b):.2f}; time median ×{t[len(t) // 2]:.2f} "
                     f"(range {t[0]:.2f}–{t[-1]:.2f}).")
md = facts + md
text = open(doc).read() if doc != "-" else ""
begin, end = "<!-- swa-growth:begin -->", "<!-- swa-growth:end -->"
if begin in text and end in text:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    text = head + begin + "\n" + "\n".join(md) + "\n" + end + tail
    open(doc, "w").write(text)
    print("updated the growth tables in", doc)
else:
    print("\n".join(md))
PY
if [ "${CTXPAR_NO_PLOTS:-0}" != 1 ] && command -v gnuplot >/dev/null 2>&1; then
  {
    echo "set terminal pngcairo noenhanced size 1200,700 font ',9'"
    echo "set output '$root/docs/img/swa_growth.png'"
    echo "set multiplot layout 2,3 title 'SWA distributed step, forward + backward (fp32, D = 64, Hq = 4, Hkv = 1, cache W - 1, 1 thread per rank); dashed: WholeAxisChunks'"
    echo "set datafile missing '?'"
    echo "set key top left font ',7'"
    for col in 2 3; do
      if [ "$col" = 2 ]; then ylab="seconds (median)"; else ylab="bytes received per rank"; fi
      for s in T W P; do
        if [ "$s" = P ]; then echo "unset logscale; set logscale y; set xrange [0.5:4.5]"; else echo "set logscale xy; set autoscale x"; fi
        echo "set xlabel '$s'; set ylabel '$ylab'"
        plot="plot"
        i=0
        for name in RopeBeforeGather RopeAfterGather HaloKV RopeBeforeGather/whole RopeAfterGather/whole HaloKV/whole; do
          lc=$((i % 3 + 1)); dt=1; [ $i -ge 3 ] && dt=2
          [ $i -gt 0 ] && plot="$plot,"
          plot="$plot '$tmp/$s.dat' index $i using 1:$col with linespoints lc $lc dt $dt title '$name'"
          i=$((i + 1))
        done
        echo "$plot"
      done
    done
    echo "unset multiplot"
  } > "$tmp/plot.gp"
  gnuplot "$tmp/plot.gp"
  echo "wrote docs/img/swa_growth.png" >&2
fi
