#!/usr/bin/env python3
"""Rewrites the measured-figure blocks of the mechanism guides (docs/swa.md, docs/chunkwise.md,
docs/heads.md, docs/hybrid.md) from bench/results/*.json, so a guide never shows figures of
another run than docs/performance.md.

A block sits between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in its guide; its text is the
output of one generator below, each built on the figure functions of bench/report/render.py (the
definitions of docs/performance.md). Two kinds: the guides' own figures (blocks() lists them), and
the detail the report leaves to the guides (render.GUIDE_BLOCKS: profiles, sweeps, every case and
round, the projection per policy), which the report links to. `scripts/bench` runs this after
render.py, with the plots.

usage: guides.py [--check] [--plots] [ROOT]
  --check   rewrite nothing; exit 1 naming every block whose text differs from the records
            (tests/bench_report runs this on the committed tree)
  --plots   also redraw the guides' plots (needs gnuplot): docs/img/swa_kernel.png, swa_bytes.png,
            swa_growth.png, heads_crossover.png, and those of the report's detail blocks
            (perf_swa_growth_*.png, crossover_*.png, model_validation.png)
"""
import importlib.util
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load_render():
    spec = importlib.util.spec_from_file_location("render", os.path.join(HERE, "render.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = load_render()


def output_of(root, *cmd, env=None):
    """stdout of a generator script run from the repository root (it fails loudly, not silently)."""
    done = subprocess.run(list(cmd), cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))
    if done.returncode != 0:
        sys.exit(f"guides.py: {' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout.strip()


def hybrid_figures(root):
    """Per-layer CP efficiency of the hybrid stack (render.fig_cp's hybrid rows) with the P = 2
    run's phases: where the layer's time went on its slowest rank."""
    recs = render.load_records(os.path.join(root, "bench/results"))
    fmt, hs = render.fmt, render.human_seconds
    rows = [x for x in render.fig_cp(recs) if x["mechanism"].startswith("hybrid layer")]
    if not rows:
        return "No hybrid records (`scripts/bench` runs `ctxpar hybrid` at P = 1 and 2)."
    target = render.TARGETS["cp"]
    out = [f"| layer | P | T(1), P = 1 run | T(P) | CP efficiency, solo T(1) (target ≥ {target}) | "
           "contention ceiling | local compute | MPI | MPI calls (rank 0) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        name = x["mechanism"].split(", ", 1)[1]
        phases = render.need(render.need(x["layer"], "phases_seconds"), "distributed")
        eff = fmt(x["solo_eff"]) + ("" if x["solo_eff"] >= target else " (missed)")
        out.append(f"| {name} ({x['case']}) | {x['P']} | {hs(x['t1'])} | {hs(x['tp'])} | **{eff}** | "
                   f"{fmt(x['ceiling']) if x['ceiling'] else '–'} | {hs(render.num(phases, 'local_compute'))} | "
                   f"{hs(render.num(phases, 'communication'))} | {render.need(phases, 'mpi_calls_rank0')} |")
    return "\n".join(out)


def blocks(root, img=None):
    """(guide, block name, generator) for every measured-figure block of the guides; the report's detail
    blocks redraw their plots into `img` when it is given."""
    py = sys.executable
    results = os.path.join(root, "bench/results")
    recs = render.load_records(results)
    detail = [(f"docs/{guide}", name, lambda make=make: make(recs, img))
              for guide, name, _, make in render.GUIDE_BLOCKS]
    return [
        ("docs/swa.md", "swa-kernel", lambda: output_of(root, py, "bench/swa/render_section.py", root, "kernel")),
        ("docs/swa.md", "swa-cp", lambda: output_of(root, py, "bench/swa/render_section.py", root, "cp")),
        ("docs/swa.md", "swa-torch", lambda: output_of(root, py, "bench/swa/render_section.py", root, "torch")),
        ("docs/swa.md", "swa-growth",
         lambda: output_of(root, "sh", "bench/swa/plot_growth.sh", os.path.join(results, "swa_growth.json"), "-",
                           env={"CTXPAR_NO_PLOTS": "1"})),
        ("docs/chunkwise.md", "chunkwise-figures",
         lambda: output_of(root, py, "bench/chunkwise/render_section.py", root)),
        ("docs/heads.md", "heads-pack",
         lambda: output_of(root, py, "bench/heads/render_heads.py", os.path.join(results, "heads.json"),
                           "--only", "pack")),
        ("docs/heads.md", "heads-bytes",
         lambda: output_of(root, py, "bench/heads/render_heads.py", os.path.join(results, "heads.json"),
                           "--only", "bytes")),
        ("docs/hybrid.md", "hybrid-figures", lambda: hybrid_figures(root)),
    ] + detail


def replace_block(text, name, body, guide):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if text.count(begin) != 1 or text.count(end) != 1:
        sys.exit(f"guides.py: {guide} must hold exactly one '{begin}' and one '{end}'")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + "\n" + body + "\n" + end + tail


def redraw_plots(root):
    if shutil.which("gnuplot") is None:
        print("guides.py: gnuplot not found, the guides' plots are left as they are")
        return
    results = os.path.join(root, "bench/results")
    for cmd in (["sh", "bench/swa/plot.sh"],
                ["sh", "bench/swa/plot_growth.sh", os.path.join(results, "swa_growth.json"), "-"],
                [sys.executable, "bench/heads/render_heads.py", os.path.join(results, "heads.json"), "docs/img"]):
        output_of(root, *cmd)


def main(argv):
    check = "--check" in argv
    plots = "--plots" in argv
    args = [a for a in argv if not a.startswith("--")]
    root = os.path.abspath(args[0]) if args else os.path.dirname(os.path.dirname(HERE))
    texts, stale = {}, []
    img = os.path.join(root, "docs", "img") if plots and not check else None
    if img and shutil.which("gnuplot") is None:
        print("guides.py: gnuplot not found, the plots of the report's detail blocks are left as they are")
        img = None
    for guide, name, generate in blocks(root, img):
        path = os.path.join(root, guide)
        if path not in texts:
            with open(path) as f:
                texts[path] = f.read()
        updated = replace_block(texts[path], name, generate(), guide)
        if updated != texts[path]:
            stale.append(f"{guide}: {name}")
        texts[path] = updated
    if check:
        if stale:
            print("guides.py: these blocks differ from bench/results (run scripts/bench --render-only):\n  "
                  + "\n  ".join(stale))
            return 1
        print("guides.py: every measured-figure block of the guides matches bench/results")
        return 0
    for path, text in texts.items():
        with open(path, "w") as f:
            f.write(text)
    if plots:
        redraw_plots(root)
    print(f"guides.py: {len(stale)} block(s) rewritten" + (f": {', '.join(stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
