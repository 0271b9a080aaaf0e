#!/usr/bin/env python3
"""Prints the "Current figures" tables of docs/chunkwise.md section 8 from bench/results/*.json,
through the figure functions of bench/report/render.py, so the guide and docs/performance.md apply
the same definitions (triangular FLOP models, the fastest recurrence, solo-baseline CP efficiency,
PyTorch raw and SGEMM-normalised) to the same records.

Usage: python3 bench/chunkwise/render_section.py [ROOT] > tables.md
"""
import importlib.util
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("render", os.path.join(root, "bench/report/render.py"))
render = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render)
fmt, table = render.fmt, render.table
recs = render.load_records(os.path.join(root, "bench/results"))
T = render.TARGETS

out = ["| family | local forward GFLOP/s (triangular model) | ÷ same-run SGEMM | shape |",
       "|---|---|---|---|"]
for x in render.fig_chunk_kernels(recs):
    out.append(f"| {x['family']} | {fmt(x['gflops'])} | **{fmt(x['ratio'])}**"
               + (f" (target ≥ {T['gdn_sgemm']})" if x["family"] == "gdn" else "") + f" | {x['shape']} |")
out.append("")
vr = render.fig_vs_recurrence(recs)
if vr:
    out.append("| chunk | speed-up over the fastest recurrence | FLOP-count ceiling | speed-up ÷ ceiling |")
    out.append("|---|---|---|---|")
    for x in vr:
        out.append(f"| {x['chunk']} | {fmt(x['speedup'])}× | {fmt(x['ceiling'])}× | {fmt(x['of_ceiling'])} |")
    out.append(f"\nFastest recurrence: {vr[0]['fastest']} ({render.human_seconds(vr[0]['t_fast'])}); target: "
               f"≥ {T['rec_ceiling']} of the ceiling at the best chunk size.\n")
cp = [x for x in render.fig_cp(recs) if "GDN" in x["mechanism"]]
if cp:
    out.append("| CP efficiency, P = 2 | T(1) baseline | efficiency, solo T(1) | contention ceiling |")
    out.append("|---|---|---|---|")
    for x in cp:
        out.append(f"| {x['mechanism']}, {x['case']} | {x['baseline']} | **{fmt(x['solo_eff'])}**"
                   + (" (estimate)" if x["estimated"] else "") + f" | {fmt(x['ceiling'])} |")
    out.append("")
tr = [x for x in render.fig_torch(recs) if x["op"].startswith("chunkwise")]
if tr:
    out.append("| vs PyTorch CPU | raw | normalised by each side's SGEMM |")
    out.append("|---|---|---|")
    for x in tr:
        out.append(f"| {x['op']} | {fmt(x['raw'])}× | {fmt(x['norm'])}× |")
print("\n".join(out))
