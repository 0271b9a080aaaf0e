#!/usr/bin/env python3
"""Markdown tables (and a gnuplot PNG of bytes vs tokens per rank) from bench/results/heads.json,
by the definitions of bench/report/render.py (verdict on the median of the rounds; a case with a
round above the physical ceiling of a copy, render.PACK_CEILING × the triad, is invalid).
usage: render_heads.py bench/results/heads.json [docs/img] [--only pack|bytes]   (prints the tables;
--only: one of them, as bench/report/guides.py puts them into docs/heads.md)"""
import importlib.util, json, os, shutil, subprocess, sys, tempfile

_spec = importlib.util.spec_from_file_location(
    "render", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "report", "render.py"))
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

args = sys.argv[1:]
only = None
if "--only" in args:
    at = args.index("--only")
    only = args[at + 1] if at + 1 < len(args) else None
    if only not in ("pack", "bytes"):
        sys.exit("render_heads.py: --only takes pack or bytes")
    del args[at:at + 2]
recs = json.load(open(args[0]))
img = args[1] if len(args) > 1 else None
show_pack, show_bytes = only in (None, "pack"), only in (None, "bytes")
P = lambda r: r["machine"]["ranks"]

# Kernels: one record per round of {triad, pack, unpack}; the table gives the median over rounds
# of the same-run ratio, with the range, the median triad and the load average.
med = lambda v: sorted(v)[len(v) // 2] if len(v) % 2 else 0.5 * (sorted(v)[len(v) // 2 - 1] + sorted(v)[len(v) // 2])
if show_pack:
    print("| P | kernel | layer | GB/s (median) | triad GB/s (median) | ratio: median (min–max over rounds) | rounds | load avg | target 0.5 |")
    ceiling = render.PACK_CEILING
    print("|---|---|---|---|---|---|---|---|---|")
    groups = {}
    for r in (r for r in recs if r["case"].startswith(("pack_", "unpack_"))):
        groups.setdefault((P(r), r["case"]), []).append(r)
    for (p, case), rs in sorted(groups.items()):
        kind, layer = ("pack", case[5:]) if case.startswith("pack_") else ("unpack + zigzag undo", case[14:])
        ratios = [r["ratio_to_triad"] for r in rs]
        loads = [r.get("load_average_after", r["machine"]["load_average"]) for r in rs]
        m = med(ratios)
        print(f"| {p} | {kind} | {layer} | {med([r['gbps'] for r in rs]):.2f} | {med([r['triad_gbps'] for r in rs]):.2f} | "
              f"{m:.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | {len(rs)} | {med(loads):.1f} | "
              f"{'invalid (a round above %.2f × triad)' % ceiling if max(ratios) > ceiling else 'meets' if m >= 0.5 else '**misses**'} |")
tr = sorted((r for r in recs if r["case"].startswith("transpose_")), key=lambda r: (P(r), r["case"], r["tokens_per_rank"]))
if show_pack and show_bytes:
    print()
if show_bytes:
    print("| P | layer | T/P | C bytes/rank (fwd) | counter ÷ plan | counter ÷ (P−1)/P·(T/P)·C·4 | C time (s, median) | B bytes/rank | B all-gather (s, median) | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in tr:
        f = r["bytes_ratio_formula"]
        print(f"| {P(r)} | {r['case'][10:]} | {r['tokens_per_rank']} | {r['mechanism_c_bytes_forward']:.0f} | {r['bytes_ratio_plan']:.3f} | "
              f"{'%.3f' % f if f >= 0 else 'n/a (' + ('uneven' if not r['even_heads'] else 'group repeat') + ')'} | "
              f"{r['mechanism_c_seconds_forward']:.4f} | {r['mechanism_b_bytes_forward']:.0f} | {r['mechanism_b_allgather_median_s']:.4f} | "
              f"{r['machine']['load_average']:.1f} |")
if img and shutil.which("gnuplot"):
    os.makedirs(img, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        lines = []
        for layer in ("gdn_M1", "gdp_M2"):
            for p in sorted({P(r) for r in tr}):
                pts = [r for r in tr if P(r) == p and r["case"] == "transpose_" + layer]
                if not pts:
                    continue
                path = os.path.join(d, f"{layer}_{p}.dat")
                with open(path, "w") as f:
                    for r in pts:
                        f.write(f"{r['tokens_per_rank']} {r['mechanism_c_bytes_forward']} {r['mechanism_b_bytes_forward']}\n")
                if p in (2, 4, 8):
                    lines.append(f"'{path}' u 1:2 w lp t 'C {layer} P={p}'")
                    if layer == "gdn_M1":
                        lines.append(f"'{path}' u 1:3 w l dt 2 t 'B summaries P={p}'")
        script = ("set terminal pngcairo size 900,560 noenhanced; set output '" + os.path.join(img, "heads_crossover.png") + "';"
                  "set logscale xy; set xlabel 'tokens per rank'; set ylabel 'bytes sent per rank (forward)';"
                  "set key left top; set title 'Head all-to-all (C) vs chunkwise summary all-gather (B), H=8, K=V=64';"
                  "plot " + ", ".join(lines))
        subprocess.run(["gnuplot", "-e", script], check=True)
