#!/usr/bin/env python3
"""Prints the measured-figure tables of docs/swa.md (kernels vs SGEMM, CP efficiency, against
PyTorch CPU) from
bench/results/*.json, through the figure functions of bench/report/render.py, so the guide and
docs/performance.md apply the same definitions (solo-baseline CP efficiency, PyTorch raw and
SGEMM-normalised) to the same records.

Usage: python3 bench/swa/render_section.py [ROOT] kernel|cp|torch > table.md
"""
import os
import sys

# The figure functions of the report: bench/report/render.py, next to this script's directory.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "report"))
import render  # noqa: E402

root = sys.argv[1] if len(sys.argv) > 2 else os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
which = sys.argv[-1]
fmt, hs = render.fmt, render.human_seconds
recs = render.load_records(os.path.join(root, "bench/results"))
T = render.TARGETS

out = []
if which == "kernel":
    out += [f"| D | W | forward GFLOP/s | ÷ SGEMM (target ≥ {T['swa_fwd']}) | backward GFLOP/s | ÷ SGEMM (target ≥ "
            f"{T['swa_bwd']}) | SGEMM GFLOP/s (around the case) |", "|---|---|---|---|---|---|---|"]
    for r in render.pick(recs, "swa", kind="local_kernel"):
        out.append(f"| {r['dim']} | {r['window']} | {fmt(render.num(r, 'forward_gflops'))} | "
                   f"{fmt(render.num(r, 'forward_ratio'))} | {fmt(render.num(r, 'backward_gflops'))} | "
                   f"{fmt(render.num(r, 'backward_ratio'))} | {fmt(render.num(r, 'sgemm_gflops'))} |")
elif which == "cp":
    out += [f"| policy | T(1) | T(2) | efficiency (target ≥ {T['cp']}) | machine ceiling |", "|---|---|---|---|---|"]
    for x in render.fig_cp(recs):
        if x["mechanism"] != "A: SWA":
            continue
        r = x["rec"]
        out.append(f"| {x['case']} | {hs(render.num(r, 't1_median_s'))} | {hs(render.num(r, 'tp_median_s'))} | "
                   f"**{fmt(x['solo_eff'])}** | {fmt(x['ceiling'])} |")
elif which == "torch":
    rows = render.fig_torch(recs)
    kern = {}
    for x in rows:
        if x["op"] in ("SWA forward", "SWA backward"):
            kern.setdefault(x["case"], {})[x["op"]] = x
    out += [f"| case | SGEMM GFLOP/s ctxpar / torch | forward raw (target ≥ {T['torch_raw']}×) | forward normalised "
            f"(≥ {T['torch_norm']}×) | backward raw (≥ {T['torch_raw']}×) | backward normalised (≥ {T['torch_norm']}×) |",
            "|---|---|---|---|---|---|"]
    for case, ops in kern.items():
        f, b = ops["SWA forward"], ops["SWA backward"]
        out.append(f"| kernel, {case} | {fmt(f['ctxpar_sgemm'])} / {fmt(f['torch_sgemm'])} | {fmt(f['raw'])}× | "
                   f"{fmt(f['norm'])}× | {fmt(b['raw'])}× | {fmt(b['norm'])}× |")
    steps = {}
    for x in rows:
        if x["op"].startswith("SWA step"):
            steps.setdefault(x["case"], {})[x["op"]] = x
    for case, ops in steps.items():
        f, b = ops["SWA step forward"], ops["SWA step backward"]
        out.append(f"| step, {case} | {fmt(f['ctxpar_sgemm'])} / {fmt(f['torch_sgemm'])} | {fmt(f['raw'])}× | "
                   f"{fmt(f['norm'])}× | {fmt(b['raw'])}× | {fmt(b['norm'])}× |")
else:
    sys.exit("usage: render_section.py [ROOT] kernel|cp|torch")
print("\n".join(out))
