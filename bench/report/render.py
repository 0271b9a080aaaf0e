#!/usr/bin/env python3
"""Renders docs/performance.md from the JSON records in bench/results/ (python3 standard library
only; PNG plots through gnuplot when it is installed). Every number in the report comes from a
record or from a formula applied to records, by the definitions written once in DEFINITIONS
below (and at the top of the report); the only constants are the targets (TARGETS; the report's
summary table prints each one beside its verdict), the physical ceilings, the reference layer
shapes of the projection and the cluster latency/bandwidth assumptions, all printed with the report.

The report is the verdicts and each mechanism's headline figures; the detail behind them (per-shape
sweeps, profiles, per-point tables, projections) is rendered by the same functions into generated
blocks of the mechanism guides: GUIDE_BLOCKS below says which block holds what, and
bench/report/guides.py writes them.

A record that lacks a field a figure needs stops the renderer with a RecordKeyError (a KeyError)
naming the file, the record and the key: a renamed key must not fall back to another figure.

usage: render.py --results bench/results --out docs/performance.md --img docs/img
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

# ----------------------------------------------------------------------------------------------
# Loading and strict access


class RecordKeyError(KeyError):
    """A figure needs `key` and the record does not have it (or has a non-number)."""

    def __init__(self, rec, key, what="has no key"):
        self.record = f"{rec.get('_file', '?')}: {rec.get('benchmark', '?')} record '{rec.get('case', '?')}'"
        self.key = key
        super().__init__(f"{self.record} {what} '{key}'")

    def __str__(self):
        return self.args[0]


def need(rec, key):
    """rec[key], or a RecordKeyError naming the record and the key."""
    if not isinstance(rec, dict) or key not in rec:
        raise RecordKeyError(rec if isinstance(rec, dict) else {}, key)
    return rec[key]


def num(rec, key):
    """rec[key] as a number, or a RecordKeyError."""
    v = need(rec, key)
    if not isnum(v):
        raise RecordKeyError(rec, key, "has a non-number in")
    return v


def load_records(results):
    recs = []
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        with open(path) as f:
            data = json.load(f)  # a broken record file is an error, not a skipped one
        items = data if isinstance(data, list) else [data]
        for r in items:
            if isinstance(r, dict):
                r.setdefault("_file", os.path.basename(path))
                recs.append(r)
    return recs


def pick(recs, benchmark=None, **fields):
    out = []
    for r in recs:
        if benchmark is not None and r.get("benchmark") != benchmark:
            continue
        if all(r.get(k) == v for k, v in fields.items()):
            out.append(r)
    return out


def isnum(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, digits=3):
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}".replace(",", " ")
    if x == 0:
        return "0"
    a = abs(x)
    if 1e3 <= a < 1e9:
        return f"{x:.0f}"
    if a >= 1e9 or a < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def human_bytes(b):
    if b is None:
        return "–"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:.4g} {unit}" if b / size >= 100 else f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def human_seconds(s):
    if s is None:
        return "–"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out) + "\n"


def span(rs, key):
    return span_of(r.get(key) for r in rs)


def span_of(values):
    """'lo–hi' of the numbers among `values` (one figure when they agree; None without any)."""
    vs = [v for v in values if isnum(v)]
    if not vs:
        return None
    return fmt(vs[0]) if min(vs) == max(vs) else f"{fmt(min(vs))}–{fmt(max(vs))}"


def run_facts(rs):
    """Where the figures come from: files and the load average the records carry."""
    files = sorted({r.get("_file", "?") for r in rs})
    loads = [r["machine"]["load_average"] for r in rs if isinstance(r.get("machine"), dict)
             and isnum(r["machine"].get("load_average")) and r["machine"]["load_average"] >= 0]
    s = f"{len(rs)} record(s) in {', '.join(files)}"
    # Records made before the machine's vector width was recorded carry no "simd".
    cpus = sorted({f"{r['machine'].get('cpu', '?')} ({r['machine']['simd']})" for r in rs
                   if isinstance(r.get("machine"), dict) and r["machine"].get("simd")})
    if cpus:
        s += f" on {', '.join(cpus)}"
    if loads:
        s += (f"; load average {fmt(min(loads))}" if min(loads) == max(loads) else
              f"; load average {fmt(min(loads))}–{fmt(max(loads))}") + " at the start of the run(s) (2 cores)"
    return s


# ----------------------------------------------------------------------------------------------
# Definitions: written once, printed at the top of the report, used by every figure below.

TARGETS = {
    "swa_fwd": 0.5, "swa_bwd": 0.35, "gdn_sgemm": 0.6, "rec_ceiling": 0.8, "torch_raw": 2.0,
    "torch_norm": 1.3, "cp": 0.9, "per_token": 1.2, "bytes": 1.0, "expr": 1.03, "pack": 0.5,
    "step_over_kernel": 1.25, "isa_default": 1.15,
}

# A copy counted as read + write bytes can beat the triad's counted rate by at most 4/3: the triad
# counts 24 bytes per element and moves 32 with write-allocate, a streaming copy moves what it
# counts. A pack/unpack ratio above this is a timing artefact (a rank timed while its peers were
# descheduled, data in cache) and the case is flagged invalid, never pooled.
PACK_CEILING = 4.0 / 3.0

# The contention ceiling (SGEMM on P ranks at once ÷ one alone) is at most 1; up to 1.05 is taken
# as the noise of two SGEMM timings, above it the case is invalid (the load changed during it).
CONTENTION_CEILING_MAX = 1.05

DEFINITIONS = f"""## Definitions (every figure below, every benchmark)

- **Verdict rule.** Each case's figure is the **median over its timed repeats** in one run (the
  records keep min and max beside it); where a run repeats a case in rounds, the case's figure is
  the median of its rounds. A target is **met only when every valid case in its scope meets it**
  (the worst case decides; the table shows it and the range). The load average of each run is
  printed with its figures: a verdict from a loaded run is provisional until a quiet run confirms it.
- **Invalid runs.** A ratio above its physical ceiling marks the case invalid: it is listed, not
  pooled (pack/unpack: {fmt(PACK_CEILING)} × the same-run triad; chunkwise vs recurrence: the
  FLOP-count ceiling; the contention ceiling: 1, taken as {fmt(CONTENTION_CEILING_MAX)} for timing noise).
- **CP efficiency** = `T(1) / (P · T(P))`, where **T(1) is the single-rank job with one rank alone
  on the machine** (the other ranks wait; nothing else of the benchmark runs), for every mechanism
  and the hybrid stack. The records say `"baseline": "solo"`. The SWA and GDN benchmarks time T(1)
  and T(P) in alternating rounds (one call of each per round; their records say `"timing"`), so
  both see the same load. The machine's **contention ceiling**
  (SGEMM on all P ranks at once ÷ one rank alone, same run, measured in alternating rounds; a
  record's `ceiling_rounds` says how many, and older records without it measured one pair) is
  shown beside it and never folded into T(1). A record with another baseline (`"concurrent"`: every rank runs the single-rank job at
  the same time) is not a CP efficiency by this definition; the report shows the estimate
  `efficiency × ceiling` for it and the verdict follows the estimate.
- **Chunkwise vs recurrence** = time of the **fastest** token-by-token recurrence in the run (the
  library's Kokkos recurrence or the benchmark's plain loop, whichever is faster) ÷ the chunkwise
  time. Its **FLOP-count ceiling** = that recurrence's time ÷ (chunkwise FLOPs at the same-run
  SGEMM rate).
- **FLOP models** count what the algorithm must do: **triangular products at triangular size**
  (`C²K` for a causal `C×C` score block, not `2C²K`), the same convention for every chunkwise
  family; the formula is printed next to each table. Records written with the older gated delta
  model (triangular products at full size) are converted by the ratio of the two models for the
  record's `C, K, V`.
- **Against PyTorch** every comparison shows the **raw speed-up** (torch time ÷ ctxpar time, same
  op, same threads) and the speed-up **normalised by each side's SGEMM measured in the same run**:
  `raw ÷ (ctxpar SGEMM ÷ torch SGEMM)` — what is left once the BLAS gap is taken out.
- **α–β model**: fitted **per collective kind** (ping-pong, all-gather, all-to-all) by least
  squares on relative error to the measured collectives at every P in the run; its error is the
  largest |measured ÷ predicted − 1| over those points, and projections carry that error as a band.
"""


# ----------------------------------------------------------------------------------------------
# α–β model, fitted per collective kind


def log2ceil(p):
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def t_allgather(a, b, p, m):
    """Per-rank contribution m bytes: ⌈log2 P⌉ latency terms, (P−1)·m bytes through each rank."""
    return log2ceil(p) * a + (p - 1) * m * b


def t_alltoall(a, b, p, m):
    """Block m bytes per destination: P−1 pairwise exchanges."""
    return (p - 1) * (a + m * b)


def t_pingpong(a, b, p, m):
    """One message of m bytes, one way."""
    return a + m * b


MODEL = {"pingpong": t_pingpong, "allgather": t_allgather, "alltoall": t_alltoall}
MODEL_TEXT = {"pingpong": "`α + m·β` (one way, m bytes)",
              "allgather": "`⌈log2 P⌉·α + (P−1)·m·β` (m bytes per rank)",
              "alltoall": "`(P−1)·(α + m·β)` (m bytes per destination)"}


def fit_kind(kind, points):
    """Least squares of t = model(α, β; P, m) over (P, m, t), weighted by 1/t² (relative error),
    with α, β ≥ 0 (a negative one is fixed at 0 and the other refitted). Returns (α, β)."""
    f = MODEL[kind]
    rows = [(f(1.0, 0.0, p, m), f(0.0, 1.0, p, m), t) for p, m, t in points]  # t = α·x + β·y
    w = [1.0 / (t * t) for _, _, t in rows]
    sxx = sum(wi * x * x for wi, (x, _, _) in zip(w, rows))
    syy = sum(wi * y * y for wi, (_, y, _) in zip(w, rows))
    sxy = sum(wi * x * y for wi, (x, y, _) in zip(w, rows))
    sxt = sum(wi * x * t for wi, (x, _, t) in zip(w, rows))
    syt = sum(wi * y * t for wi, (_, y, t) in zip(w, rows))
    den = sxx * syy - sxy * sxy
    a = (sxt * syy - syt * sxy) / den if den else 0.0
    b = (syt * sxx - sxt * sxy) / den if den else 0.0
    if a < 0 or not den:
        a, b = 0.0, (syt / syy if syy else 0.0)
    if b < 0:
        a, b = (sxt / sxx if sxx else 0.0), 0.0
    return a, b


# Cores of the machine the committed records come from (the report's intro and every section's run
# facts say so): runs with more ranks than cores time the scheduler as much as the transport.
CORES = 2


def fit_network(recs, cores=CORES):
    """Per kind: α, β fitted to the points with P ≤ cores (one core per rank: what a cluster
    node's transport looks like), the points with their prediction, the largest relative error on
    the fitted points (the projection's band) and over every P in the records (the validation)."""
    out = {}
    for kind in ("pingpong", "allgather", "alltoall"):
        rs = [r for r in pick(recs, "network") if need(r, "kind") == kind]
        pts = sorted((num(r, "ranks"), num(r, "bytes"), num(r, "time_median_s")) for r in rs)
        fit_pts = [x for x in pts if x[0] <= cores]
        if len(fit_pts) < 2:
            continue
        a, b = fit_kind(kind, fit_pts)
        checked = [(p, m, t, MODEL[kind](a, b, p, m)) for p, m, t in pts]
        rel = lambda xs: max((abs(t / pr - 1) for _, _, t, pr in xs if pr > 0), default=0.0)
        out[kind] = {"alpha": a, "beta": b, "points": checked, "fit_points": len(fit_pts),
                     "error": rel([x for x in checked if x[0] <= cores]), "error_all": rel(checked)}
    return out




# Cluster assumptions (stated in the report with their sources).
CLUSTER = {
    "intra": {"name": "NVLink (≤ 8 ranks per node)", "alpha": 5e-6, "bw": 150e9,
              "source": "A100 SXM NVLink 3: 600 GB/s bidirectional per GPU (NVIDIA A100 datasheet); "
                        "collectives reach about half of that per direction in practice (nccl-tests bus "
                        "bandwidth), hence 150 GB/s; 5 µs per collective step for kernel launch and protocol"},
    "inter": {"name": "InfiniBand HDR (> 8 ranks)", "alpha": 2e-6, "bw": 23e9,
              "source": "HDR InfiniBand 200 Gb/s = 25 GB/s per port, one port per GPU (e.g. DGX A100 with "
                        "8 HDR adapters), ~23 GB/s achievable; MPI latency 1–2 µs (ConnectX-6 product brief: "
                        "0.6 µs adapter latency, plus switch hops)"},
}



def collective_factors(fits):
    """Per kind: how much slower this machine's fitted collective is than its fitted point-to-point
    link per latency term and per byte (α_kind ÷ α_ping-pong, β_kind ÷ β_ping-pong). The projection
    applies these to the cluster link, so the collectives' measured algorithmic cost travels with
    it; 1 where the fit is missing."""
    pp = fits.get("pingpong")
    out = {}
    for kind in ("pingpong", "allgather", "alltoall"):
        f = fits.get(kind)
        if not pp or not f:
            out[kind] = (1.0, 1.0)
            continue
        out[kind] = (f["alpha"] / pp["alpha"] if pp["alpha"] > 0 else 1.0,
                     f["beta"] / pp["beta"] if pp["beta"] > 0 else 1.0)
    return out


def cluster_ab(p, factors):
    """(α, β) per collective kind on the cluster at P ranks: the stated link, times the kind's
    fitted factors."""
    c = CLUSTER["intra"] if p <= 8 else CLUSTER["inter"]
    return {k: (c["alpha"] * fa, fb / c["bw"]) for k, (fa, fb) in factors.items()}

# ----------------------------------------------------------------------------------------------
ACCELERATOR = {"name": "an A100-class GPU", "flops": 156e12, "efficiency": 0.4,
               "source": "NVIDIA A100 datasheet: 156 TFLOP/s dense TF32 tensor-core peak; 40% is an assumed share, "
                         "below the 50–73 % of peak the FlashAttention-2 paper (Dao, 2023) reports for its "
                         "attention kernels on an A100"}
MEMORY_LIMIT = 8 * 2**30

# Reference layer shapes for the projection (fp32 activations, as the library's float path)

SHAPES = {
    "swa": {"Hq": 32, "Hkv": 8, "D": 128, "W": 4096},
    "gdn": {"H": 16, "K": 128, "V": 128, "chunk": 64},
    "gdp": {"H": 16, "d": 128, "N": 128, "M": 2, "G": 1, "chunk": 64},
}
F32 = 4


def gdn_full_local_chunk_flops(c, k, v):
    """The model older GDN records were written with (their `flop_model` does not start with
    "triangular"): the same terms as gdn_local_chunk_flops, but Ũ, W̃, QKᵀ⊙L and (QKᵀ⊙L)·U counted at
    full size. Only used to convert those records (the report's Definitions, "FLOP models", say how;
    docs/chunkwise.md §5, "Gated delta rule and product", states the full-size model term by term and
    §8 the triangular one)."""
    return (c * c * k + c ** 3 / 3 + 2 * c * c * v + 2 * c * c * k + 2 * c * c * k + 2 * c * k * v
            + 2 * c * k * v + 2 * c * c * v + 2 * c * k * v)


def gdn_local_chunk_flops(c, k, v):
    """Single-device chunk (no CP summary), triangular products at triangular size:
    A C²K; solve C³/3; Ũ, W̃ C²V + C²K; QKᵀ⊙L C²K; U 2CKV; outputs 2CKV + C²V; state 2CKV."""
    return (c * c * k + c ** 3 / 3 + (c * c * v + c * c * k) + c * c * k + 2 * c * k * v
            + (2 * c * k * v + c * c * v) + 2 * c * k * v)


GDN_FLOP_MODEL = "C²K + C³/3 + (C²V + C²K) + C²K + 2CKV + (2CKV + C²V) + 2CKV per chunk (+ 2CK² + 2K³ with a CP summary)"
SCALAR_FLOP_MODEL = "C²K + C²V + 4CKV per chunk"


def gdn_chunk_flops(c, k, v):
    """With the CP summary: the dense transition M_c (2CK²) and its chaining (2K³)."""
    return gdn_local_chunk_flops(c, k, v) + 2 * c * k * k + 2 * k ** 3


def gdn_forward_flops(tokens, heads, k, v, chunk, n_h=1):
    rows, c = tokens * n_h, chunk * n_h
    full, rest = rows // c, rows % c
    per = full * gdn_chunk_flops(c, k, v) + (gdn_chunk_flops(rest, k, v) if rest else 0)
    return per * heads


def mechanisms():
    """(key, mechanism, policy) for every projected policy."""
    return [("swa_ag", "A: sliding-window attention", "RopeBeforeGather (all-gather)"),
            ("swa_ra", "A: sliding-window attention", "RopeAfterGather (all-gather)"),
            ("swa_halo", "A: sliding-window attention", "HaloKV"),
            ("gdn_gf", "B: chunkwise (GDN)", "GatherFold"),
            ("gdn_sc", "B: chunkwise (GDN)", "ScanCompose"),
            ("gdp_a2a", "C: heads (GDP)", "all-to-all (EvenHeads)"),
            ("gdn_a2a", "C applied to the GDN layer", "all-to-all")]


PROJECT_KIND = {"swa_ag": "allgather", "swa_ra": "allgather", "swa_halo": "pingpong", "gdn_gf": "allgather",
                "gdn_sc": "pingpong", "gdp_a2a": "alltoall", "gdn_a2a": "alltoall"}


def project(key, L, P, ab):
    """Per rank per layer, forward + backward: bytes received, communication time, transient
    communication memory, extra (fold) flops, whether the mechanism can run at all. `ab` maps each
    collective kind (pingpong, allgather, alltoall) to its (α, β)."""
    s = SHAPES
    t = L / P
    if key.startswith("swa"):
        sh = s["swa"]
        rec = 2 * sh["Hkv"] * sh["D"] * F32 + 16
        g = 2 * sh["Hkv"] * sh["D"] * F32
        if key in ("swa_ag", "swa_ra"):
            a, b = ab["allgather"]
            recv = (L - t) * rec + t * g * (P - 1)
            time_ = t_allgather(a, b, P, t * rec) + t_allgather(a, b, P, t * g)
            mem = L * (rec + g)
        else:
            a, b = ab["pingpong"]
            halo = min(sh["W"] - 1, L - t)
            msgs = math.ceil(halo / t) if t > 0 else 0
            recv = halo * (rec + g)
            time_ = 2 * (msgs * a + halo * rec * b) if P > 1 else 0
            mem = (halo + t) * (rec + g)
        return {"recv": recv if P > 1 else 0, "time": time_ if P > 1 else 0, "mem": mem, "extra_flops": 0, "ok": True}
    if key.startswith("gdn_g") or key == "gdn_sc":
        sh = s["gdn"]
        rec = sh["H"] * (sh["K"] * sh["V"] + sh["K"] ** 2) * F32
        comp = sh["H"] * (2 * sh["K"] ** 3 + 2 * sh["K"] ** 2 * sh["V"])
        a, b = ab["allgather" if key == "gdn_gf" else "pingpong"]
        if key == "gdn_gf":
            return {"recv": 2 * (P - 1) * rec, "time": 2 * t_allgather(a, b, P, rec), "mem": P * rec,
                    "extra_flops": 2 * (P - 1) * comp, "ok": True}
        r = log2ceil(P)
        return {"recv": 2 * r * rec, "time": 2 * r * (a + rec * b), "mem": 2 * rec, "extra_flops": 2 * r * comp,
                "ok": True}
    if key == "gdp_a2a":
        sh = s["gdp"]
        d_inner = sh["H"] * sh["d"]
        c_in = d_inner * (1 + sh["M"]) + sh["G"] * sh["N"] * (sh["M"] + 1) + sh["H"] * (sh["M"] + 1)
        c_out = 2 * d_inner
    else:  # the GDN layer's own channels through the all-to-all: q, k, v, g, β in, o out
        sh = s["gdn"]
        c_in = sh["H"] * (2 * sh["K"] + sh["V"] + 2)
        c_out = sh["H"] * sh["V"]
    heads = sh["H"]
    if P > heads:
        return {"recv": None, "time": None, "mem": None, "extra_flops": 0, "ok": False}
    a, b = ab["alltoall"]
    per_in = t * (c_in / P) * F32
    per_out = t * (c_out / P) * F32
    recv = 2 * (P - 1) * (per_in + per_out)
    time_ = 2 * (t_alltoall(a, b, P, per_in) + t_alltoall(a, b, P, per_out))
    return {"recv": recv, "time": time_, "mem": L * (c_in + c_out) / P * F32, "extra_flops": 0, "ok": True}


def compute_flops(key, L, P):
    """Local flops per rank per layer, forward + backward (backward = 2.5× forward for attention,
    2× for the chunkwise kernels; the FLOP models of docs/swa.md §6 and docs/chunkwise.md §8)."""
    t = L / P
    if key.startswith("swa"):
        sh = SHAPES["swa"]
        w = min(sh["W"], L)
        return (4 + 10) * sh["D"] * sh["Hq"] * t * w
    if key in ("gdn_gf", "gdn_sc", "gdn_a2a"):
        sh = SHAPES["gdn"]
        if key == "gdn_a2a":
            return 3 * gdn_forward_flops(int(L), sh["H"] / P, sh["K"], sh["V"], sh["chunk"])
        return 3 * gdn_forward_flops(int(t), sh["H"], sh["K"], sh["V"], sh["chunk"])
    sh = SHAPES["gdp"]
    return 3 * gdn_forward_flops(int(L), sh["H"] / P, sh["N"], sh["d"], sh["chunk"], sh["M"])



# ----------------------------------------------------------------------------------------------
# Plots


def gnuplot(script, out_png):
    if shutil.which("gnuplot") is None:
        return False
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True, capture_output=True, timeout=60)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"render.py: gnuplot failed for {out_png}: {e}", file=sys.stderr)
        return False
    return os.path.exists(out_png)


def write_data(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(" ".join(str(x) for x in r) + "\n")




# ----------------------------------------------------------------------------------------------
# Figures by the definitions. Each returns plain rows (dicts) that the summary and the sections
# both read, so a figure is computed once.


def gdn_flop_factor(r):
    """Multiplier that turns a GDN record's rate into the triangular-size model's rate: 1 for a
    record written with the triangular model, the ratio of the two models for an older one."""
    model = str(need(r, "flop_model"))
    if model.startswith("triangular"):
        return 1.0
    c, k, v = num(r, "chunk"), num(r, "key_dim"), num(r, "value_dim")
    return gdn_local_chunk_flops(c, k, v) / gdn_full_local_chunk_flops(c, k, v)


def fig_swa_kernel(recs):
    rows = []
    for r in sorted(pick(recs, "swa", kind="local_kernel"), key=lambda r: (r.get("dim"), r.get("window"))):
        rows.append({"case": f"D = {need(r, 'dim')}, W = {need(r, 'window')}", "rec": r,
                     "fwd_gflops": num(r, "forward_gflops"), "bwd_gflops": num(r, "backward_gflops"),
                     "sgemm": num(r, "sgemm_gflops"), "fwd": num(r, "forward_ratio"),
                     "bwd": num(r, "backward_ratio")})
    return rows


# The mechanisms whose step a user calls is timed against the local kernels it runs (records of kind
# "step_vs_kernel"): the name the report gives it, its benchmark, the section it belongs to, how a
# record's shape is written, and the order of its cases.
STEP_MECHANISMS = (
    ("SWA", "swa", "[A](#a-sliding-window-attention)",
     lambda r: f"t = {need(r, 'queries')}, W = {need(r, 'window')}, Hq = {need(r, 'q_heads')}, "
               f"Hkv = {need(r, 'kv_heads')}, D = {need(r, 'dim')}",
     lambda r: -num(r, "kv_heads")),
    ("chunkwise GDN", "chunkwise", "[B](#b-chunkwise-linear-attention)",
     lambda r: f"T = {need(r, 'tokens')}, H = {need(r, 'heads')}, K = {need(r, 'key_dim')}, "
               f"V = {need(r, 'value_dim')}, chunk {need(r, 'chunk')}",
     lambda r: num(r, "tokens")),
    ("heads GDP", "heads", "[C](#c-head-parallel-all-to-all)",
     lambda r: f"T = {need(r, 'tokens')}, H = {need(r, 'heads')}, d = {need(r, 'headdim')}, "
               f"G = {need(r, 'groups')}, N = {need(r, 'd_state')}, M = {need(r, 'householder')}, "
               f"chunk {need(r, 'chunk')}",
     lambda r: num(r, "tokens")),
)


def fig_step_vs_kernel(recs):
    """The step a user calls ÷ the local kernels it runs (one rank, same run, same shapes), every
    mechanism: rows with the mechanism's name, the case, and forward and backward ratios."""
    rows = []
    for mech, bench, _, case, order in STEP_MECHANISMS:
        for r in sorted(pick(recs, bench, kind="step_vs_kernel"), key=order):
            rows.append({"mechanism": mech, "case": case(r), "rec": r,
                         "fwd": num(r, "forward_step_over_kernel"), "bwd": num(r, "backward_step_over_kernel")})
    return rows


def step_vs_kernel_table(rows):
    """The step ÷ kernel table of one mechanism's rows, with the medians the ratios come from and what
    the warm step still allocates."""
    return table(["case", "forward step ÷ kernel", "backward step ÷ kernel", "forward step, s", "forward kernel, s",
                  "backward step, s", "backward kernel, s", "steady-state allocations"],
                 [[x["case"], fmt(x["fwd"]), fmt(x["bwd"]), fmt(num(x["rec"], "step_forward_median_s")),
                   fmt(num(x["rec"], "kernel_forward_median_s")), fmt(num(x["rec"], "step_backward_median_s")),
                   fmt(num(x["rec"], "kernel_backward_median_s")), steady_state_text(x["rec"])] for x in rows])


def steady_state_text(r):
    """'0 in 3 calls', or the count with the labels that allocated."""
    n = int(num(r, "steady_state_allocations"))
    text = f"{n} in {int(num(r, 'steady_state_calls'))} forward + backward calls"
    return text + (f" ({need(r, 'steady_state_allocation_labels')})" if n else "")


def read_profile(r, prefix=""):
    """A profiled call as bench/common/kernel_profile.hpp writes it under `prefix`: wall, kernels, outside
    and other-kernel seconds, and the heaviest labels as (label, seconds, calls)."""
    labels = [(need(r, f"{prefix}label{i}"), num(r, f"{prefix}label{i}_s"), num(r, f"{prefix}label{i}_calls"))
              for i in range(int(num(r, f"{prefix}labels")))]
    return {"wall": num(r, f"{prefix}wall_s"), "kernels": num(r, f"{prefix}kernels_s"),
            "outside": num(r, f"{prefix}outside_kernels_s"), "other": num(r, f"{prefix}other_kernels_s"),
            "labels": labels}


STEP_PROFILE_METHOD = ("Where the step's time goes: one call of the step and one of the local kernels alone, each "
                       "profiled by kernel label (the fastest of 3 untimed calls after the timed ones; Kokkos Tools "
                       "begin/end callbacks of every kernel and deep copy; *outside kernels* is host work and "
                       "communication). *Step − kernels* is what the step adds: in a kernel both run, the extra time; "
                       "in a label the kernels never launch, all of it. Shares are of the profiled step call.")


def step_profile_rows(r, pas):
    """(label, step launches, step s, kernels-alone s, step − kernels s) of one pass of a step record, the
    labels of both profiles, heaviest step time first, then the other kernels and the time outside kernels."""
    st, ke = read_profile(r, f"step_{pas}_profile_"), read_profile(r, f"kernel_{pas}_profile_")
    s_by = {lab: (sec, calls) for lab, sec, calls in st["labels"]}
    k_by = {lab: sec for lab, sec, _ in ke["labels"]}
    rows = []
    for lab, sec, calls in sorted(st["labels"], key=lambda x: -x[1]):
        rows.append((f"`{lab}`", calls, sec, k_by.get(lab, 0.0), sec - k_by.get(lab, 0.0)))
    # A kernels-alone label outside the step's heaviest is among the step's other kernels.
    k_other = ke["other"] + sum(sec for lab, sec in k_by.items() if lab not in s_by)
    rows.append(("other kernels", None, st["other"], k_other, st["other"] - k_other))
    rows.append(("outside kernels", None, st["outside"], ke["outside"], st["outside"] - ke["outside"]))
    return rows, st["wall"], ke["wall"]


def step_excess(r, pas, n=3):
    """The `n` rows of a pass that add the most time to the step, as 'label +share' text."""
    rows, wall, _ = step_profile_rows(r, pas)
    top = sorted(rows, key=lambda x: -x[4])[:n]
    return ", ".join(f"{lab} {100 * extra / wall:.0f} %" for lab, _, _, _, extra in top if extra > 0)


def step_profile_table(rows):
    """For each step ÷ kernel row and pass, the step's and the kernels' time per label, what the step adds,
    and the two profiled calls' wall times."""
    out = []
    for x in rows:
        for pas in ("forward", "backward"):
            prow, wall, kwall = step_profile_rows(x["rec"], pas)
            share = lambda v: f"{100 * v / wall:.1f} %" if wall > 0 else "–"
            lead = f"{x['case']}, {pas}"
            for lab, calls, sec, ksec, extra in prow:
                out.append([lead, lab, "" if calls is None else int(calls), human_seconds(sec), share(sec),
                            human_seconds(ksec), human_seconds(extra), share(extra)])
                lead = ""
            out.append(["", "**the profiled call**", "", human_seconds(wall), "100 %", human_seconds(kwall),
                        human_seconds(wall - kwall), share(wall - kwall)])
    return table(["case, pass", "label", "step launches", "step", "share of step", "kernels alone",
                  "step − kernels", "share of step"], out)


CP_PROFILE_METHOD = ("Each CP-efficiency record that carries a profile: rank 0's single-rank call (T(1)) and rank 0's "
                     "call at P ranks (T(P)), each profiled by kernel label (the fastest of 3 untimed calls after the "
                     "timed ones; Kokkos Tools begin/end callbacks of every kernel and deep copy). At efficiency 1 every "
                     "label would take 1/P of its single-rank time; *excess* is the CP call's time less that. *Outside "
                     "kernels* is the exchange of summaries and the wait for the other ranks. *Kernels-only efficiency* "
                     "= kernels of T(1) ÷ (P × the slowest rank's kernels of T(P)): the efficiency if the call spent "
                     "nothing outside its kernels.")


# Why a mechanism's CP call spends time outside its kernels, where its profile shows it (the figures are the
# table's; this is the algorithm's reason).
CP_PROFILE_WHY = {
    "B: chunkwise GDN": (
        "At P = 2 no rank needs a transition M (nobody would read it), so the state passes run one after the "
        "other: rank 0 runs its `forward_pass` from zero and sends its final state, and only then can rank 1 run "
        "its own; the backward mirrors it with `reverse_pass`, rank 1 first. The kernels split evenly between "
        "the ranks, but each rank waits through the other's state pass: its time outside kernels is about the "
        "other rank's `forward_pass` + `reverse_pass`. With S the single-rank call's kernel time and F, R its two "
        "passes, each rank waits (F + R)/2 per call and a call at P = 2 takes (S − F − R)/2 + F + R: the "
        "algorithm's efficiency is S / (S + F + R) on any machine. The start of this note computes both from the "
        "single-rank profile, next to what the profiled CP call spent outside its kernels. "
        "Computing rank 1's transition would let the passes overlap, at the price of a K×K product per chunk "
        "on that rank."),
}


def cp_profile_note(x):
    """`kernels-only efficiency …, outside kernels …` of a CP row with a profile, else ''."""
    r = x["rec"]
    if "single_rank_profile_wall_s" not in r:
        return ""
    k1, kmax = num(r, "single_rank_profile_kernels_s"), num(r, "two_ranks_profile_max_kernels_s")
    cp = read_profile(r, "two_ranks_profile_")
    dep = (f"; the chained state passes predict efficiency {fmt(num(r, 'chain_efficiency'))} "
           f"({need(r, 'chain_formula').split(',')[0]}) and a wait of {human_seconds(num(r, 'chain_wait_s'))} "
           f"per call, rank 0's profiled call spent {human_seconds(cp['outside'])} outside kernels"
           if "chain_efficiency" in r else "")
    return (f"kernels-only efficiency {fmt(k1 / (x['P'] * kmax)) if kmax > 0 else '–'}, outside kernels "
            f"{100 * cp['outside'] / cp['wall']:.0f} % of rank 0's T(P) call{dep}")


def cp_profile_rows(x):
    """(label, T(1) s, T(P) rank-0 s, excess over T(1)/P) per label of both profiles of a CP row, heaviest
    CP-call time first, then the other kernels, the time outside kernels and the whole call."""
    r, p = x["rec"], x["P"]
    one, cp = read_profile(r, "single_rank_profile_"), read_profile(r, "two_ranks_profile_")
    one_by = {lab: sec for lab, sec, _ in one["labels"]}
    cp_by = {lab: sec for lab, sec, _ in cp["labels"]}
    labels = sorted(set(one_by) | set(cp_by), key=lambda lab: -cp_by.get(lab, 0.0))
    rows = [(f"`{lab}`", one_by.get(lab, 0.0), cp_by.get(lab, 0.0)) for lab in labels]
    rows.append(("other kernels", one["other"], cp["other"]))
    rows.append(("outside kernels", one["outside"], cp["outside"]))
    rows.append(("**the profiled call**", one["wall"], cp["wall"]))
    return [(lab, t1, tp, tp - t1 / p) for lab, t1, tp in rows]


def cp_profile_table(rows):
    out = []
    for x in rows:
        calls = cp_profile_rows(x)
        wall = calls[-1][2]
        lead = f"{x['mechanism']} {x['case']}, P = {x['P']}"
        for lab, t1, tp, extra in calls:
            out.append([lead, lab, human_seconds(t1), human_seconds(tp), human_seconds(extra),
                        f"{100 * extra / wall:.1f} %" if wall > 0 else "–"])
            lead = ""
    notes = []
    for x in rows:
        r = x["rec"]
        k1, kmax = num(r, "single_rank_profile_kernels_s"), num(r, "two_ranks_profile_max_kernels_s")
        notes.append(f"- {x['mechanism']} {x['case']}, P = {x['P']}: {cp_profile_note(x)} (T(1) kernels "
                     f"{human_seconds(k1)}, slowest rank's T(P) kernels {human_seconds(kmax)}). "
                     f"{CP_PROFILE_WHY.get(x['mechanism'], '')}\n")
    return table(["case", "label", "T(1) call", "T(P) call, rank 0", "excess over T(1)/P", "share of T(P) call"],
                 out) + "\n" + "".join(notes)


def fig_chunk_kernels(recs):
    """Local forward rate ÷ same-run SGEMM, per family, triangular FLOP model."""
    rows = []
    for kind, fam in (("local_kernel", "gdn"), ("local_kernel_scalar", "scalar"), ("local_kernel_diagonal", "diagonal")):
        for r in pick(recs, "chunkwise", kind=kind):
            f = gdn_flop_factor(r) if fam == "gdn" else 1.0
            g = num(r, "gflops") * f
            rows.append({"family": fam, "rec": r, "gflops": g, "recorded_gflops": num(r, "gflops"), "factor": f,
                         "sgemm": num(r, "sgemm_gflops"), "ratio": g / num(r, "sgemm_gflops"),
                         "shape": f"T = {need(r, 'tokens')}, H = {need(r, 'heads')}, K = {need(r, 'key_dim')}, "
                                  f"V = {need(r, 'value_dim')}, C = {need(r, 'chunk')}"})
    return rows


def fig_vs_recurrence(recs):
    """GDN single-device forward per chunk size against the fastest recurrence of the run."""
    sweep = sorted(pick(recs, "chunkwise", kind="gdn_vs_recurrence"), key=lambda r: num(r, "chunk"))
    if not sweep:
        return []
    shape = lambda r: (need(r, "tokens"), need(r, "heads"), need(r, "key_dim"), need(r, "value_dim"))
    recs_t = []  # (time, what) of every recurrence timed on this shape
    for r in sweep:
        recs_t.append((num(r, "recurrence_median_s"), "library Kokkos recurrence"))
        if "loop_recurrence_median_s" in r:
            recs_t.append((num(r, "loop_recurrence_median_s"), "plain-loop recurrence (bench)"))
    for r in pick(recs, "chunkwise", kind="local_kernel", family="gdn"):
        if shape(r) == shape(sweep[0]):
            recs_t.append((num(r, "recurrence_median_s"), "plain-loop recurrence (bench)"))
    t_fast, what = min(recs_t)
    rows = []
    for r in sweep:
        T, H = num(r, "tokens"), num(r, "heads")
        f = gdn_flop_factor(r)
        flops = num(r, "flops_per_token_chunkwise") * f * T * H
        t_chunk = num(r, "chunkwise_median_s")
        ceiling = t_fast / (flops / (num(r, "sgemm_gflops") * 1e9))
        speedup = t_fast / t_chunk
        rows.append({"chunk": num(r, "chunk"), "rec": r, "t_chunk": t_chunk, "t_fast": t_fast, "fastest": what,
                     "speedup": speedup, "ceiling": ceiling, "of_ceiling": speedup / ceiling,
                     "recorded": num(r, "local_speedup_vs_recurrence"), "valid": speedup <= ceiling,
                     "recurrences": sorted(set(recs_t))})
    return rows


RECURRENCE_PROFILE_LABELS = {"intra_chunk": "intra_chunk_flops", "forward_pass": "forward_pass_flops"}


def recurrence_profile(row):
    """Where a vs-recurrence row's chunkwise forward spends its time: its record's profiled call
    (`chunkwise_profile_*`) per label, with the FLOP model's share of the two kernels that do the
    arithmetic, as [(label, seconds, share of the call, GFLOP/s or None, ÷ SGEMM or None)] plus the other
    kernels and the time outside kernels; None for a record without a profile."""
    r = row["rec"]
    if "chunkwise_profile_wall_s" not in r:
        return None
    p = read_profile(r, "chunkwise_profile_")
    sgemm = num(r, "sgemm_gflops")
    out = []
    for lab, sec, _ in p["labels"]:
        key = next((k for name, k in RECURRENCE_PROFILE_LABELS.items() if lab.endswith("::" + name)), None)
        rate = num(r, key) / sec * 1e-9 if key and sec > 0 else None
        out.append((f"`{lab}`", sec, sec / p["wall"], rate, rate / sgemm if rate is not None else None))
    out.append(("other kernels", p["other"], p["other"] / p["wall"], None, None))
    out.append(("outside kernels", p["outside"], p["outside"] / p["wall"], None, None))
    return out


def recurrence_profile_note(row):
    """'profile at C = 32: `…intra_chunk` 0.5 of SGEMM (20 % of the call), …' for the rows with FLOPs."""
    prof = recurrence_profile(row)
    if not prof:
        return ""
    parts = [f"{lab} {fmt(of)} of SGEMM ({100 * share:.0f} % of the call)" for lab, _, share, _, of in prof
             if of is not None]
    return f"profile at C = {row['chunk']}: " + ", ".join(parts) if parts else ""


def fig_isa(recs):
    """The default build (no architecture flag; host kernels chosen at run time) against the same
    source built with -march=native, side by side in one run (scripts/bench-isa)."""
    return [{"call": need(r, "case"), "ratio": num(r, "default_over_native"), "rec": r} for r in pick(recs, "isa")]


def fig_torch(recs):
    """Every PyTorch comparison: raw speed-up and normalised by each side's same-run SGEMM."""
    rows = []
    kern = {(r.get("dim"), r.get("window")): r for r in pick(recs, "swa", kind="local_kernel")}
    for r in pick(recs, "swa_torch"):
        if "ctxpar_forward_speedup" not in r:
            continue  # the torch SGEMM ceiling record
        mine = kern.get((need(r, "dim"), need(r, "window")))
        if mine is None:
            # a shape this run's bench/swa did not time (e.g. its --quick subset): nothing to pair
            # it with; listed by unpaired_torch(), not a key error
            continue
        gap = num(mine, "sgemm_gflops") / num(r, "sgemm_gflops")
        for op, key in (("SWA forward", "ctxpar_forward_speedup"), ("SWA backward", "ctxpar_backward_speedup")):
            raw = num(r, key)
            rows.append({"op": op, "case": f"D = {r['dim']}, W = {r['window']}", "rec": r, "raw": raw,
                         "norm": raw / gap, "ctxpar_sgemm": num(mine, "sgemm_gflops"),
                         "torch_sgemm": num(r, "sgemm_gflops"), "raw_of_minima": r.get(key + "_min")})
    # The step a user calls (plan.forward / plan.backward) against torch at the same shape: paired
    # here from both files' medians, normalised by the SGEMM of the ctxpar run that timed the step.
    steps = {step_shape(r): r for r in pick(recs, "swa", kind="step_vs_kernel")}
    ceilings = pick(recs, "swa", kind="ceiling")
    for r in pick(recs, "swa_torch", kind="step"):
        mine = steps.get(step_shape(r))
        if mine is None:
            continue  # listed by unpaired_torch()
        if not ceilings:
            raise RecordKeyError({"benchmark": "swa", "case": "sgemm ceiling"}, "gflops")
        own_sgemm = sum(num(c, "gflops") for c in ceilings) / len(ceilings)
        gap = own_sgemm / num(r, "sgemm_gflops")
        for op in ("forward", "backward"):
            raw = num(r, f"{op}_median_s") / num(mine, f"step_{op}_median_s")
            rows.append({"op": f"SWA step {op}", "case": f"t = {r['queries']}, W = {r['window']}, Hq = {r['q_heads']}, "
                         f"Hkv = {r['kv_heads']}, D = {r['dim']}", "rec": r, "raw": raw, "norm": raw / gap,
                         "ctxpar_sgemm": own_sgemm, "torch_sgemm": num(r, "sgemm_gflops"),
                         "raw_of_minima": num(r, f"{op}_min_s") / num(mine, f"step_{op}_min_s")})
    for r in pick(recs, "chunkwise_torch"):
        if "speedup_forward" not in r:
            continue
        gap = num(r, "ctxpar_sgemm_gflops") / num(r, "torch_sgemm_gflops")
        for op, key in (("forward", "speedup_forward"), ("forward + backward", "speedup_forward_backward")):
            raw = num(r, key)
            rows.append({"op": f"chunkwise {need(r, 'family')} {op}", "case": f"T = {need(r, 'tokens')}, K = V = "
                         f"{need(r, 'key_dim')}, C = {need(r, 'chunk')}", "rec": r, "raw": raw, "norm": raw / gap,
                         "ctxpar_sgemm": num(r, "ctxpar_sgemm_gflops"), "torch_sgemm": num(r, "torch_sgemm_gflops"),
                         "raw_of_minima": None})
    return rows


def step_shape(r):
    """The shape key of an SWA step record (ctxpar's step_vs_kernel or torch's step)."""
    return tuple(need(r, k) for k in ("queries", "window", "q_heads", "kv_heads", "dim"))


def unpaired_torch(recs):
    """Torch cases with no ctxpar case of the same shape in these records."""
    kern = {(r.get("dim"), r.get("window")) for r in pick(recs, "swa", kind="local_kernel")}
    steps = {step_shape(r) for r in pick(recs, "swa", kind="step_vs_kernel")}
    return ([str(r.get("case")) for r in pick(recs, "swa_torch")
             if "ctxpar_forward_speedup" in r and (r.get("dim"), r.get("window")) not in kern] +
            [str(r.get("case")) for r in pick(recs, "swa_torch", kind="step") if step_shape(r) not in steps])


def cp_baseline(r):
    """How the record measured T(1). Records written before the `baseline` key: the SWA benchmark
    always timed rank 0 alone (swa_bench.cpp, cp_case); a `t1_method` saying both ranks ran at the
    same time is the concurrent baseline. Anything else must say it."""
    if "baseline" in r:
        return need(r, "baseline")
    method = str(r.get("t1_method", ""))
    if "same time" in method:
        return "concurrent"
    if r.get("benchmark") == "swa":
        return "solo"
    raise RecordKeyError(r, "baseline")


def contention_ceiling(recs, p):
    c = [r for r in pick(recs, "ceilings") if r.get("ranks") == p and "machine_efficiency_ceiling" in r]
    return num(c[0], "machine_efficiency_ceiling") if c else None


def fig_cp(recs):
    rows = []
    for r in pick(recs, "swa", kind="cp_efficiency"):
        rows.append({"mechanism": "A: SWA", "case": str(need(r, "policy")), "P": num(r, "ranks"), "rec": r,
                     "baseline": cp_baseline(r), "eff": num(r, "efficiency"),
                     "ceiling": num(r, "machine_efficiency_ceiling")})
    for r in pick(recs, "chunkwise", kind="cp_efficiency"):
        rows.append({"mechanism": "B: chunkwise GDN", "case": f"fwd + bwd, T = {need(r, 'tokens')}",
                     "P": r.get("ranks", 2), "rec": r, "baseline": cp_baseline(r), "eff": num(r, "cp_efficiency"),
                     "ceiling": num(r, "machine_efficiency_ceiling")})
    hyb = {num(h, "ranks"): h for h in pick(recs, "hybrid")}
    if 1 in hyb:
        one = hyb[1]
        # The P = 1 run is one rank alone on the machine (scripts/bench runs nothing beside it).
        base = one.get("baseline", "solo")
        for p, h in sorted(hyb.items()):
            if p == 1:
                continue
            l1 = {need(l, "layer"): l for l in need(need(one, "steps")[0], "layers")}
            # Runs made with --repeat carry the steady state: per layer the median over the repeated
            # calls of the slowest rank's time, the figure every other CP efficiency divides. Older
            # runs have only the checked step's single call.
            steady = "steady_state" in one and "steady_state" in h
            s1 = {need(l, "layer"): l for l in need(one["steady_state"], "layers")} if steady else {}
            sp = {need(l, "layer"): l for l in need(h["steady_state"], "layers")} if steady else {}
            for l in need(need(h, "steps")[0], "layers"):
                lay = need(l, "layer")
                if steady:
                    t1 = num(s1[lay], "forward_median_seconds") + num(s1[lay], "backward_median_seconds")
                    tp = num(sp[lay], "forward_median_seconds") + num(sp[lay], "backward_median_seconds")
                    how = f", median of {num(h['steady_state'], 'repeat')} steady-state calls"
                else:
                    ref = l1[lay]
                    t1 = num(ref, "forward_seconds") + num(ref, "backward_seconds")
                    tp = num(l, "forward_seconds") + num(l, "backward_seconds")
                    how = ", the checked step's one call"
                name = {"swa": "A: SWA", "gdn": "B: GDN", "gdp": "C: GDP"}.get(lay, lay)
                rows.append({"mechanism": f"hybrid layer, {name}",
                             "case": f"{need(l, 'policy')}, L = {need(h, 'length')}{how}",
                             "P": p, "rec": h, "baseline": base, "eff": t1 / (p * tp),
                             "ceiling": contention_ceiling(recs, p), "t1": t1, "tp": tp, "layer": l})
    for row in rows:
        row["solo_eff"] = row["eff"] if row["baseline"] == "solo" else (
            row["eff"] * row["ceiling"] if row["ceiling"] else None)
        row["estimated"] = row["baseline"] != "solo"
        # P ranks at once cannot compute faster than one alone: a ceiling above 1 (beyond the
        # SGEMM timing's own noise) means the machine's load changed during the case.
        row["valid"] = row["ceiling"] is None or row["ceiling"] <= CONTENTION_CEILING_MAX
    return rows


def fig_pack(recs):
    """Pack/unpack GB/s ÷ same-run triad per (case, P): median over the rounds; invalid above the
    physical ceiling."""
    groups, copies = {}, {}
    for r in pick(recs, "heads"):
        if "ratio_to_triad" not in r:
            continue
        p = need(need(r, "machine"), "ranks")
        groups.setdefault((str(need(r, "case")), p), []).append(num(r, "ratio_to_triad"))
        # Newer records also divide by a same-run contiguous copy of the same bytes.
        if "copy_gbps" in r:
            copies.setdefault((str(need(r, "case")), p), []).append(num(r, "ratio_to_copy"))
    rows = []
    for (case, p), vs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        m = median(vs)
        cs = copies.get((case, p))
        rows.append({"case": case, "P": p, "ratio": m, "rounds": vs, "valid": max(vs) <= PACK_CEILING,
                     "oversubscribed": p > 2, "copy_ratio": median(cs) if cs else None})
    return rows


def pack_copy_note(pk):
    """`; ÷ a same-run contiguous copy …` over the valid cases that carry it (empty when none does)."""
    cs = [x for x in pk if x["valid"] and x["copy_ratio"] is not None]
    if not cs:
        return ""
    lo, hi = min(cs, key=lambda x: x["copy_ratio"]), max(x["copy_ratio"] for x in cs)
    return (f"; ÷ a same-run contiguous copy of the same bytes: {fmt(lo['copy_ratio'])}–{fmt(hi)} "
            f"(lowest: {lo['case']}, P = {lo['P']})")


def fig_per_token(recs):
    """Per-token time at the largest length ÷ at the smallest, per series of a length sweep."""
    rows = []
    series = {}
    for r in pick(recs, "swa_growth"):
        if r.get("sweep") == "T" and num(r, "ranks") >= 1:
            series.setdefault(("A: SWA", f"{need(r, 'policy')} {need(r, 'layout')} P = {r['ranks']}"), []).append(
                (num(r, "tokens"), num(r, "step_median_s")))
    profiles = {}
    for r in pick(recs, "chunkwise", kind="t_sweep"):
        key = ("B: chunkwise", f"{need(r, 'family')} forward")
        series.setdefault(key, []).append((num(r, "tokens"), num(r, "forward_median_s")))
        if "profile_wall_s" in r:
            profiles.setdefault(key, {})[num(r, "tokens")] = read_profile(r, "profile_")
    for key, pts in sorted(series.items()):
        pts.sort()
        if len(pts) < 2:
            continue
        (t0, s0), (t1, s1) = pts[0], pts[-1]
        prof = profiles.get(key, {})
        rows.append({"mechanism": key[0], "case": key[1], "from": t0, "to": t1, "ratio": (s1 / t1) / (s0 / t0),
                     "profile": growth_by_label(prof[t0], t0, prof[t1], t1) if t0 in prof and t1 in prof else None})
    return rows


def per_token_labels(p, tokens, per=1):
    """Seconds per `per` tokens of each label of a profiled call (`read_profile`), with its time outside
    kernels as the label "outside kernels"."""
    out = {lab: sec / tokens * per for lab, sec, _ in p["labels"]}
    out["outside kernels"] = p["outside"] / tokens * per
    return out


def growth_by_label(lo, t_lo, hi, t_hi):
    """Where a per-token growth sits, from the profiled calls at the two ends of a sweep: the fastest
    profiled call's per-token growth, and the label whose per-token time rose most (its own ratio and its
    share of the rise of the whole call)."""
    per_lo, per_hi = per_token_labels(lo, t_lo), per_token_labels(hi, t_hi)
    rise = {lab: per_hi[lab] - per_lo[lab] for lab in per_hi if per_lo.get(lab)}
    wall_rise = hi["wall"] / t_hi - lo["wall"] / t_lo
    lab = max(rise, key=rise.get) if rise else None
    return {"wall_ratio": (hi["wall"] / t_hi) / (lo["wall"] / t_lo), "label": lab,
            "label_ratio": per_hi[lab] / per_lo[lab] if lab else None,
            "label_share": rise[lab] / wall_rise if lab and wall_rise > 0 else None}


def per_token_profile_note(x):
    """One line on where a per-token growth sits (empty without profiles)."""
    g = x.get("profile")
    if not g or not g["label"]:
        return ""
    share = f", {fmt(g['label_share'] * 100)} % of the rise" if g["label_share"] is not None else ""
    return (f"fastest profiled call ×{fmt(g['wall_ratio'])}; grows most: `{g['label']}` "
            f"×{fmt(g['label_ratio'])}{share}")


def fig_bytes(recs):
    """Counter ÷ formula over every record that carries both."""
    vals, off, skipped = [], [], []
    pairs = (("allgather_bytes_received", "allgather_formula"), ("halo_bytes_received", "halo_formula"),
             ("bytes_received", "bytes_formula_value"), ("bytes_sent_counted", "bytes_sent_formula"),
             ("bytes_sent_max", "bytes_sent_formula_max"), ("bytes_received_max", "bytes_received_formula_max"))
    for r in recs:
        for meas, form in pairs:
            if meas not in r or form not in r:
                continue
            if meas == "bytes_sent_counted" and isnum(r.get("bytes_ratio_formula")) and r["bytes_ratio_formula"] < 0:
                # the record says its closed formula does not apply (repeated key groups, uneven heads);
                # it is checked against the plan's own byte count instead
                skipped.append(r)
                if num(r, "bytes_sent_counted") != num(r, "bytes_sent_plan"):
                    off.append(f"{r.get('case')}: counted ≠ plan")
                vals.append(num(r, "bytes_sent_counted") / num(r, "bytes_sent_plan"))
                continue
            if num(r, form):
                vals.append(num(r, meas) / num(r, form))
                if r[meas] != r[form]:
                    off.append(f"{r.get('benchmark')} {r.get('case')}: {meas} {r[meas]} vs {form} {r[form]}")
    for h in pick(recs, "hybrid"):
        for st in need(h, "steps"):
            for lj in need(st, "layers"):
                if num(lj, "formula_received_rank0") > 0:
                    vals.append(num(lj, "bytes_received_rank0") / num(lj, "formula_received_rank0"))
                    if lj["bytes_received_rank0"] != lj["formula_received_rank0"]:
                        off.append(f"hybrid P={h.get('ranks')} {lj.get('layer')}")
    return vals, off, skipped


# ----------------------------------------------------------------------------------------------
# Long-context cost (bench/longctx): per-token time and peak memory per rank vs T per rank.

# Every timing record of the sweep must carry these; one without is a RecordKeyError.
LONGCTX_KEYS = ("mechanism", "pass", "P", "concurrent_jobs", "T_per_rank", "repeats", "median_s", "min_s",
                "per_token_ns_median", "per_token_ns_min", "peak_rss_bytes", "load_average")
# The target's two lengths (tokens per rank): 128 Ki against 4 Ki, the long-context rows of the
# report's summary table (per-token time at 128 Ki at most TARGETS["per_token"] × its value at 4 Ki).
LONGCTX_FROM, LONGCTX_TO = 4096, 131072
LONGCTX_NAMES = {"swa": "A: SWA", "chunkwise": "B: chunkwise GDN", "heads": "C: head-parallel GdpContextParallel"}
# What the code of a kernel does that makes its per-token time grow with T, printed when the
# profile names it as the part of a call that grows most (read from the kernel, not measured).
LONGCTX_CAUSES = {
    "ctxpar::heads::conv_backward_weights":
        "`ConvBackwardWeights` (include/ctxpar/heads/impl/layer_kernels.hpp) runs one thread per conv channel "
        "that walks all rows (T·P tokens: the head-parallel layout holds the whole sequence) of the row-major "
        "`[rows, C]` `dpre` and `u`, 1 + 2·width times: a column walk touches one 64-byte line per 4-byte element, "
        "which the next channel reuses only while those lines of both arrays stay in cache (4 Ki rows: 0.5 MiB, "
        "inside a 1 MiB L2; 128 Ki rows: 16 MiB, not). Its per-token time then grows with T. A blocked reduction over tokens (all channels of a block of rows per step, partial sums per channel) "
        "would read each line once; reported to the heads owner, not changed here.",
}
# Linear in T/P means a straight line through every point: the largest |fit − measured| ÷
# measured over the sweep's lengths at most this.
LONGCTX_LINEAR_RESIDUAL = 0.05


def longctx_records(recs):
    rs = [r for r in pick(recs, "longctx") if r.get("kind", "longctx") == "longctx"]
    for r in rs:
        for k in LONGCTX_KEYS:
            need(r, k)
        for k in LONGCTX_KEYS[2:]:
            num(r, k)
    return rs


def longctx_series_label(p, jobs):
    """The P column: the rank count, or the control (`jobs` single-rank jobs at once)."""
    return str(p) if jobs == 1 else f"1 ×{jobs} (control)"


def fig_longctx(recs):
    """Per (mechanism, pass, P, concurrent jobs): the sweep's points (T, per-token ns median and min,
    load) and the per-token ratio at LONGCTX_TO ÷ LONGCTX_FROM, by the median (the verdict rule) and
    by the minimum over repeats. A sweep cut short takes its largest T as `to` and says so. A series
    with concurrent_jobs > 1 is the control of P = concurrent_jobs: that many single-rank jobs at once.
    A length run in several processes (run_longctx.sh does at the two ends) is one point: the median
    over the processes of each one's median, the minimum of their minima; `spread` is the largest
    process median ÷ the smallest (1 for one process)."""
    series = {}
    for r in longctx_records(recs):
        key = (need(r, "mechanism"), need(r, "pass"), num(r, "P"), num(r, "concurrent_jobs"))
        series.setdefault(key, {}).setdefault(num(r, "T_per_rank"), []).append(r)
    rows = []
    order = lambda kv: (LONGCTX_NAMES.get(kv[0][0], kv[0][0]), kv[0][1], kv[0][2] * kv[0][3], kv[0][3])
    for (mech, pas, p, jobs), by_t in sorted(series.items(), key=order):
        ts = sorted(by_t)
        pts = {}
        for t in ts:
            meds = [num(r, "per_token_ns_median") for r in by_t[t]]
            pts[t] = {"median": statistics.median(meds), "min": min(num(r, "per_token_ns_min") for r in by_t[t]),
                      "load": max(num(r, "load_average") for r in by_t[t]),
                      "repeats": min(num(r, "repeats") for r in by_t[t]), "processes": len(meds),
                      "spread": max(meds) / min(meds)}
        row = {"mechanism": mech, "name": LONGCTX_NAMES.get(mech, mech), "pass": pas, "P": p, "jobs": jobs,
               "label": longctx_series_label(p, jobs),
               "points": [(t, pts[t]["median"], pts[t]["min"], pts[t]["load"], pts[t]["repeats"]) for t in ts],
               "ends": None, "from": None, "to": None, "ratio_median": None, "ratio_min": None}
        top = max(ts)
        if LONGCTX_FROM in by_t and top > LONGCTX_FROM:
            a, b = pts[LONGCTX_FROM], pts[top]
            row.update({"from": LONGCTX_FROM, "to": top, "ends": (a, b),
                        "ratio_median": b["median"] / a["median"], "ratio_min": b["min"] / a["min"],
                        "load": (a["load"], b["load"])})
        rows.append(row)
    return rows


def longctx_control(xs, x):
    """The control series of series `x` (P single-rank jobs at once), or None."""
    if x["jobs"] != 1 or x["P"] == 1:
        return None
    return next((c for c in xs if c["mechanism"] == x["mechanism"] and c["pass"] == x["pass"] and c["P"] == 1
                 and c["jobs"] == x["P"]), None)


def longctx_against_control(xs, x):
    """For a P > 1 series with its control over the same two lengths: the control's ratio and P ÷ control
    (per-token medians) at both ends, or None."""
    c = longctx_control(xs, x)
    if c is None or x["ends"] is None or c["ends"] is None or (c["from"], c["to"]) != (x["from"], x["to"]):
        return None
    lo, hi = (e["median"] / ce["median"] for e, ce in zip(x["ends"], c["ends"]))
    return {"control": c["ratio_median"], "control_min": c["ratio_min"], "over_lo": lo, "over_hi": hi,
            "over_growth": hi / lo}


def fit_line(points):
    """Least squares y = a + b·x; returns (a, b, largest |fit − y| ÷ y)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    a = my - b * mx
    return a, b, max(abs(a + b * x - y) / y for x, y in points)


def fig_longctx_memory(recs):
    """Per (mechanism, P): peak resident memory per rank (VmHWM, largest rank) against T/P =
    T_per_rank, fitted to a + b·T/P over the records whose process ran that case alone."""
    pts = {}
    for r in longctx_records(recs):
        if need(r, "pass") != "forward" or r.get("rss_own_process") is not True:
            continue  # both passes of a case share one process: one point per case
        if num(r, "concurrent_jobs") != 1:
            continue  # the control's memory is the P = 1 case's
        # A length run in several processes: the largest peak of them.
        by_t = pts.setdefault((need(r, "mechanism"), num(r, "P")), {})
        by_t[num(r, "T_per_rank")] = max(by_t.get(num(r, "T_per_rank"), 0), num(r, "peak_rss_bytes"))
    rows = []
    for (mech, p), by_t in sorted(pts.items(), key=lambda kv: (LONGCTX_NAMES.get(kv[0][0], kv[0][0]), kv[0][1])):
        xy = sorted(by_t.items())
        if len(xy) < 3:
            continue
        a, b, resid = fit_line(xy)
        rows.append({"mechanism": mech, "name": LONGCTX_NAMES.get(mech, mech), "P": p, "points": xy,
                     "a": a, "b": b, "residual": resid})
    return rows


def longctx_profiles(recs):
    out = {}
    for r in pick(recs, "longctx", kind="longctx_profile"):
        key = (need(r, "mechanism"), need(r, "pass"), num(r, "P"), num(r, "concurrent_jobs"), num(r, "T_per_rank"))
        out[key] = dict(read_profile(r), load=num(r, "load_average"))
    return out


def longctx_summary(recs, add):
    xs = fig_longctx(recs)
    for mech in sorted({x["mechanism"] for x in xs}, key=lambda m: LONGCTX_NAMES.get(m, m)):
        ms = [x for x in xs if x["mechanism"] == mech and x["ratio_median"] is not None and x["jobs"] == 1]
        if not ms:
            continue
        worst = max(ms, key=lambda x: x["ratio_median"])
        short = [x for x in ms if x["to"] != LONGCTX_TO]
        loads = [l for x in ms for l in x["load"]]
        note = (f"worst: {worst['pass']} P = {worst['P']}; by the minimum over repeats "
                f"{fmt(min(x['ratio_min'] for x in ms))}–{fmt(max(x['ratio_min'] for x in ms))}; "
                f"load average {fmt(min(loads))}–{fmt(max(loads))}")
        spreads = [e["spread"] for x in ms for e in x["ends"]]
        processes = sorted({e["processes"] for x in ms for e in x["ends"]})
        if max(processes) > 1:
            note += (f"; each end the median of {'–'.join(str(n) for n in processes)} processes, whose medians "
                     f"differ by up to ×{fmt(max(spreads))}")
        vs = longctx_against_control(xs, worst)
        if vs:
            note += (f"; its control ({worst['P']} single-rank jobs at once) {fmt(vs['control'])}, "
                     f"P = {worst['P']} ÷ control ×{fmt(vs['over_growth'])}")
        if short:
            note += f"; **sweep cut short: to T = {max(x['to'] for x in short)}**"
        add(f"per-token time at 128 Ki ÷ 4 Ki tokens per rank — {LONGCTX_NAMES.get(mech, mech)}",
            "per-token time ratio, median of repeats (forward and forward+backward, P = 1, 2)",
            f"≤ {TARGETS['per_token']}", [x["ratio_median"] for x in ms], lambda v: v <= TARGETS["per_token"],
            "[long context](#long-context-cost-per-token-and-memory-per-rank)", note, lower_is_worse=False)
    mem = fig_longctx_memory(recs)
    if mem:
        ts = [t for x in mem for t, _ in x["points"]]
        add(f"peak memory per rank linear in T/P ({tokens_label(min(ts))}–{tokens_label(max(ts))} per rank)",
            "largest abs(fit − measured) ÷ measured, fit a + b·T/P", f"≤ {fmt(LONGCTX_LINEAR_RESIDUAL)}",
            [x["residual"] for x in mem], lambda v: v <= LONGCTX_LINEAR_RESIDUAL,
            "[long context](#long-context-cost-per-token-and-memory-per-rank)",
            "; ".join(f"{x['name']} P = {x['P']}: b = {fmt(x['b'])} B/token" for x in mem), lower_is_worse=False)


def tokens_label(t):
    return f"{t // 1024} Ki" if t >= 1024 and t % 1024 == 0 else str(t)


def section_longctx(recs, img, img_rel):
    md = ["\n## Long context: cost per token and memory per rank\n"]
    rs = longctx_records(recs)
    if not rs:
        md.append("_No records (bench/results/longctx.json: `bench/longctx/run_longctx.sh BUILD_DIR`)._\n")
        return md
    xs = fig_longctx(recs)
    first = lambda mech, key: span([r for r in rs if r["mechanism"] == mech], key)
    md.append(f"From {run_facts(rs)}. `bench/longctx/run_longctx.sh` runs every mechanism at P = 1 and P = 2 "
              "(one thread per rank), T per rank from 1 Ki to 128 Ki tokens in powers of 2, **one process per "
              "(mechanism, P, T)** so that each peak resident memory (VmHWM, the largest rank's) is that case's own. "
              "Each case builds its plan once, makes one untimed forward + backward, then times "
              f"{span(rs, 'repeats')} calls of the forward and {span(rs, 'repeats')} of forward + backward (slowest "
              "rank, after a barrier). Per-token time = seconds ÷ T per rank. Shapes (fp32): SWA `StepPlan<HaloKV, "
              f"SegmentChunks>` after a full cache, W = {first('swa', 'window')}, Hq = {first('swa', 'q_heads')}, "
              f"Hkv = {first('swa', 'kv_heads')}, D = {first('swa', 'dim')}; chunkwise gated delta rule "
              f"`CpPlan<GatherFold>`, H = {first('chunkwise', 'heads')}, K = {first('chunkwise', 'key_dim')}, "
              f"V = {first('chunkwise', 'value_dim')}, chunk {first('chunkwise', 'chunk')}; heads "
              f"`GdpContextParallel<EvenHeads>`, H = {first('heads', 'heads')}, d = {first('heads', 'headdim')}, "
              f"N = {first('heads', 'd_state')}, G = {first('heads', 'groups')}. The target: per-token time at "
              f"128 Ki ≤ {TARGETS['per_token']} × its value at 4 Ki; the verdict takes the median of the repeats "
              "(Definitions), the minimum is shown beside it.\n\n"
              "**The control** (P column `1 ×2 (control)`, `--independent`): two single-rank jobs at once, in lock-step "
              "and timed as the slower of the two, that never communicate. At P = 2 the two ranks share the cores' "
              "last-level cache and memory bandwidth; so does the control, without the exchange or the CP algorithm's "
              "own work. Where P = 2 grows with T as much as its control does, the growth is what this machine does to "
              "any two processes, and *P = 2 ÷ control* (the part P = 2 adds) stays flat. The control is not a "
              "target series.\n\n")
    top_load = max(num(r, "load_average") for r in rs)
    if top_load > CORES:
        md.append(f"**A loaded run**: load average up to {fmt(top_load)} on {CORES} cores while it ran (each record "
                  "carries the load at its end); the verdicts below are provisional until a quiet run of "
                  "`bench/longctx/run_longctx.sh build/bench` confirms them.\n\n")
    ts = sorted({t for x in xs for t, *_ in x["points"]})
    header = ["mechanism", "pass", "P"] + [tokens_label(t) for t in ts] + ["128 Ki ÷ 4 Ki (median)", "(min)",
                                                                          "process spread (4 Ki, 128 Ki)"]
    rows = []
    for x in xs:
        by_t = {t: (med, mn) for t, med, mn, _, _ in x["points"]}
        ratio = "–" if x["ratio_median"] is None else (
            fmt(x["ratio_median"]) + ("" if x["to"] == LONGCTX_TO else f" (to {tokens_label(x['to'])})"))
        spread = "–" if x["ends"] is None else ", ".join(
            f"×{fmt(e['spread'])} of {e['processes']}" if e["processes"] > 1 else "one process" for e in x["ends"])
        rows.append([x["name"], x["pass"], x["label"]] +
                    [f"{by_t[t][0] / 1e3:.3g}" if t in by_t else "–" for t in ts] +
                    [ratio, fmt(x["ratio_min"]), spread])
    md.append("Per-token time, µs per token per rank (median of the repeats; at the two ends the median over the "
              "processes that ran it). *Process spread*: the largest ÷ the smallest of those processes' medians. "
              "The same case in a new process can run at a different speed on this machine, so one process per "
              "end can show a growth, or hide one, of that size:\n\n")
    md.append(table(header, rows))
    # Plot 1: per-token time vs T (log2 x), one line per series.
    files, plots = [], []
    mechs = sorted({x["mechanism"] for x in xs}, key=lambda m: LONGCTX_NAMES.get(m, m))
    for i, x in enumerate(xs):
        f = os.path.join(img, f"longctx_t_{i}.dat")
        write_data(f, [[t, med / 1e3] for t, med, *_ in x["points"]])
        files.append(f)
        style = (f"w lp lc {mechs.index(x['mechanism']) + 1} dt {1 if x['pass'] == 'forward' else 2} "
                 f"pt {4 + 2 * int(x['P']) if x['jobs'] == 1 else 9}")
        plots.append(f"'{f}' u 1:2 {style} t '{x['name']} {x['pass']} P={x['label']}'")
    png = os.path.join(img, "perf_longctx_time.png")
    ok = gnuplot(f"""set terminal pngcairo noenhanced size 820,440 font ',8'
set output '{png}'
set logscale x 2
set logscale y
set xlabel 'T tokens per rank'
set ylabel 'µs per token per rank (median of repeats)'
set key outside right font ',7'
set title 'long context: per-token time vs T (flat = linear cost; bench/results/longctx.json)'
plot {', '.join(plots)}
""", png) if plots else False
    if ok:
        md.append(f"\n![per-token time vs T]({img_rel}/perf_longctx_time.png)\n")
    # Memory: peak RSS per rank vs T/P with the fitted line.
    mem = fig_longctx_memory(recs)
    if mem:
        md.append("\nPeak resident memory per rank (VmHWM of the case's own process, largest rank) against T/P "
                  "(= T per rank), fitted by least squares to `a + b·T/P`: `b` is the memory per token per rank, "
                  "`a` what a process holds before the sequence (libraries, MPI, Kokkos). The residual is the "
                  f"largest |fit − measured| ÷ measured over the sweep (linear: ≤ {fmt(LONGCTX_LINEAR_RESIDUAL)}).\n\n")
        mts = sorted({t for x in mem for t, _ in x["points"]})
        md.append(table(["mechanism", "P"] + [tokens_label(t) for t in mts] +
                        ["b (bytes per token per rank)", "a", "residual"],
                        [[x["name"], x["P"]] + [human_bytes(dict(x["points"]).get(t)) for t in mts] +
                         [fmt(x["b"]), human_bytes(x["a"]), fmt(x["residual"])] for x in mem]))
        plots = []
        for i, x in enumerate(mem):
            f = os.path.join(img, f"longctx_m_{i}.dat")
            write_data(f, [[t, v / 2**20, (x["a"] + x["b"] * t) / 2**20] for t, v in x["points"]])
            files.append(f)
            c = mechs.index(x["mechanism"]) + 1 if x["mechanism"] in mechs else i + 1
            plots.append(f"'{f}' u 1:2 w p lc {c} pt {4 + 2 * int(x['P'])} t '{x['name']} P={x['P']}'")
            plots.append(f"'{f}' u 1:3 w l lc {c} dt {int(x['P'])} t 'fit: {fmt(x['b'])} B/token'")
        png = os.path.join(img, "perf_longctx_memory.png")
        ok = gnuplot(f"""set terminal pngcairo noenhanced size 820,440 font ',8'
set output '{png}'
set logscale xy 2
set xlabel 'T/P tokens per rank'
set ylabel 'peak resident MiB per rank (VmHWM)'
set key outside right font ',7'
set title 'long context: peak memory per rank vs T/P, with a + b T/P fits'
plot {', '.join(plots)}
""", png) if plots else False
        if ok:
            md.append(f"\n![peak memory per rank vs T/P]({img_rel}/perf_longctx_memory.png)\n")
    for f in files:
        os.remove(f)
    # Where the time goes, for a series above the target: the measured profile of one call at both ends.
    prof = longctx_profiles(recs)
    missed = [x for x in xs
              if x["jobs"] == 1 and x["ratio_median"] is not None and x["ratio_median"] > TARGETS["per_token"]]
    if missed:
        md.append(f"\n**Above the target ({TARGETS['per_token']})**: "
                  + "; ".join(f"{x['name']} {x['pass']} P = {x['P']}: {fmt(x['ratio_median'])} by the median, "
                              f"{fmt(x['ratio_min'])} by the minimum (load {fmt(x['load'][0])} at 4 Ki, "
                              f"{fmt(x['load'][1])} at {tokens_label(x['to'])}; process spread "
                              f"×{fmt(x['ends'][0]['spread'])} and ×{fmt(x['ends'][1]['spread'])})" for x in missed)
                  + ".\n")
    ends_of = lambda key: sorted(t for (*k, t) in prof if tuple(k) == key)
    shown = []
    for x in missed:
        # A P > 1 series is shown with its control's profile: the same labels, without the exchange.
        for key in [(x["mechanism"], x["pass"], x["P"], 1)] + ([(x["mechanism"], x["pass"], 1, x["P"])] if x["P"] > 1 else []):
            if len(ends_of(key)) >= 2 and key not in shown:
                shown.append(key)
    if shown:
        md.append("\nMeasured profile of each series above the target, a P = 2 series with its control's beside it "
                  "(`--profile`: rank 0, the fastest of a few calls after a warm-up, Kokkos Tools begin/end callbacks of "
                  "every kernel and deep copy; *outside kernels* is communication and host work). Seconds per 1 Ki tokens "
                  "per rank, at the sweep's two ends, for the heaviest labels:\n\n")
        prow = []
        for m, pas, p, jobs in shown:
            ends = ends_of((m, pas, p, jobs))
            lo, hi = prof[(m, pas, p, jobs, ends[0])], prof[(m, pas, p, jobs, ends[-1])]
            label = longctx_series_label(p, jobs)
            per = lambda s, t: s / t * 1024
            names = [lab for lab, _, _ in hi["labels"]]
            lo_by = {lab: s for lab, s, _ in lo["labels"]}
            hi_by = {lab: s for lab, s, _ in hi["labels"]}
            for lab in names:
                a = lo_by.get(lab)
                prow.append([LONGCTX_NAMES.get(m, m), pas, label, f"`{lab}`",
                             fmt(per(a, ends[0])) if a is not None else "(not in the top 6)",
                             fmt(per(hi_by[lab], ends[-1])),
                             fmt(per(hi_by[lab], ends[-1]) / per(a, ends[0])) if a else "–"])
            for what in ("other", "outside", "wall"):
                a, b = per(lo[what], ends[0]), per(hi[what], ends[-1])
                prow.append([LONGCTX_NAMES.get(m, m), pas, label, {"other": "other kernels", "outside": "outside kernels",
                                                             "wall": "**whole call**"}[what],
                             fmt(a), fmt(b), fmt(b / a) if a > 0 else "–"])
        if prow:
            md.append(table(["mechanism", "pass", "P", "label", "s per Ki tokens at the smallest T",
                             "at the largest T", "ratio"], prow))
    # For each series above the target with a profile at both ends: which part grew the most.
    for x in missed:
        vs = longctx_against_control(xs, x)
        if vs:
            text = (f"\n{x['name']} {x['pass']} P = {x['P']} against its control ({x['P']} single-rank jobs at once): the "
                    f"control grows ×{fmt(vs['control'])} from {tokens_label(x['from'])} to {tokens_label(x['to'])} "
                    f"(×{fmt(vs['control_min'])} by the minimum), P = {x['P']} ×{fmt(x['ratio_median'])}; P = {x['P']} ÷ "
                    f"control is {fmt(vs['over_lo'])} at {tokens_label(x['from'])} and {fmt(vs['over_hi'])} at "
                    f"{tokens_label(x['to'])} (×{fmt(vs['over_growth'])}). ")
            if vs["over_growth"] <= TARGETS["per_token"]:
                text += (f"What P = {x['P']} adds stays within the target; the growth above it is the machine's: "
                         f"{x['P']} processes sharing the cores' last-level cache and memory bandwidth, measured "
                         "without any communication.")
            else:
                text += (f"P = {x['P']} grows beyond its control: the exchange or the CP algorithm's own work adds "
                         "the excess.")
            md.append(text + "\n")
        key = (x["mechanism"], x["pass"], x["P"], 1)
        ends = ends_of(key)
        if len(ends) < 2:
            continue
        lo, hi = prof[key + (ends[0],)], prof[key + (ends[-1],)]
        per_lo, per_hi = per_token_labels(lo, ends[0], 1024), per_token_labels(hi, ends[-1], 1024)
        growth = {lab: per_hi[lab] - per_lo.get(lab, 0.0) for lab in per_hi}
        w_lo, w_hi = lo["wall"] / ends[0] * 1024, hi["wall"] / ends[-1] * 1024
        lab = max(growth, key=growth.get)
        grows = per_lo.get(lab) and per_hi[lab] / per_lo[lab] > TARGETS["per_token"] and growth[lab] > 0
        text = (f"\n{x['name']} {x['pass']} P = {x['P']}: the profiled call goes from {fmt(w_lo)} to {fmt(w_hi)} s "
                f"per Ki tokens ({tokens_label(ends[0])} → {tokens_label(ends[-1])}, ×{fmt(w_hi / w_lo)}; load "
                f"{fmt(lo['load'])} and {fmt(hi['load'])})")
        text += (", within the target: the fastest call does not grow as the median of the timed calls does"
                 if w_hi / w_lo <= TARGETS["per_token"] else ", above the target as timed")
        if grows:
            text += (f"; the part that grows most is `{lab}`, {fmt(per_lo[lab])} → {fmt(per_hi[lab])} s per Ki tokens "
                     f"(×{fmt(per_hi[lab] / per_lo[lab])}, {fmt(growth[lab] / hi['wall'] * ends[-1] / 1024 * 100)} % "
                     f"of the call at {tokens_label(ends[-1])})."
                     + (" " + LONGCTX_CAUSES[lab] if lab in LONGCTX_CAUSES else ""))
        else:
            text += "; no part of it grows past the target."
        md.append(text + "\n")
    return md


# ----------------------------------------------------------------------------------------------
# The summary: one row per target, verdict by the rule of DEFINITIONS.


def verdict(values, ok):
    """values: figures of the valid cases in scope. Met only when every one meets the target."""
    if not values:
        return "not measured"
    return "**met**" if all(ok(v) for v in values) else "**missed**"


def worst_and_range(values, lower_is_worse=True):
    if not values:
        return "–"
    w = min(values) if lower_is_worse else max(values)
    return fmt(w) if len(values) == 1 else f"{fmt(w)} (worst of {len(values)}; {fmt(min(values))}–{fmt(max(values))})"


def summary_rows(recs):
    rows = []

    def add(what, measure, target, values, ok, section, note="", lower_is_worse=True):
        rows.append([what, measure, target, worst_and_range(values, lower_is_worse), verdict(values, ok), section,
                     note])

    sk = fig_swa_kernel(recs)
    add("SWA local forward (fp32, D = 64/128, W = 512–4096)", "GFLOP/s ÷ same-run SGEMM", f"≥ {TARGETS['swa_fwd']}",
        [x["fwd"] for x in sk], lambda v: v >= TARGETS["swa_fwd"], "[A](#a-sliding-window-attention)")
    add("SWA backward", "GFLOP/s ÷ same-run SGEMM", f"≥ {TARGETS['swa_bwd']}", [x["bwd"] for x in sk],
        lambda v: v >= TARGETS["swa_bwd"], "[A](#a-sliding-window-attention)")
    sv = fig_step_vs_kernel(recs)
    for mech, _, section, _, _ in STEP_MECHANISMS:
        xs = [x for x in sv if x["mechanism"] == mech]
        over = [(x, pas) for x in xs for pas, v in (("forward", x["fwd"]), ("backward", x["bwd"]))
                if v > TARGETS["step_over_kernel"]]
        add(f"{mech} step ÷ its local kernels (one rank, forward and backward)", "seconds ÷ seconds, median of repeats",
            f"≤ {TARGETS['step_over_kernel']}", [v for x in xs for v in (x["fwd"], x["bwd"])],
            lambda v: v <= TARGETS["step_over_kernel"], section,
            "; ".join(f"{pas}: the step adds most in {step_excess(x['rec'], pas)} of the step (profile in the "
                      "mechanism's guide)"
                      for x, pas in over), lower_is_worse=False)
    ck = [x for x in fig_chunk_kernels(recs) if x["family"] == "gdn"]
    add("chunkwise GDN local forward (K = V = 128, chunk 64)", "GFLOP/s ÷ SGEMM, triangular FLOP model",
        f"≥ {TARGETS['gdn_sgemm']}", [x["ratio"] for x in ck], lambda v: v >= TARGETS["gdn_sgemm"],
        "[B](#b-chunkwise-linear-attention)",
        "; ".join(f"as recorded (older model) {fmt(x['rec']['forward_ratio'])}" for x in ck
                  if x["factor"] != 1 and "forward_ratio" in x["rec"]))
    vr = fig_vs_recurrence(recs)
    best = max(vr, key=lambda x: x["speedup"]) if vr else None
    add("chunkwise vs the fastest recurrence (GDN, best chunk size)", "speed-up ÷ its FLOP-count ceiling",
        f"≥ {TARGETS['rec_ceiling']}", [best["of_ceiling"]] if best else [], lambda v: v >= TARGETS["rec_ceiling"],
        "[B](#b-chunkwise-linear-attention)",
        "; ".join(t for t in ((f"C = {best['chunk']}: {fmt(best['speedup'])}× against a ceiling of "
                               f"{fmt(best['ceiling'])}×" if best else ""),
                              recurrence_profile_note(best) if best else "") if t))
    tr = fig_torch(recs)
    peak = fma_peak_gflops(recs)
    for op in sorted({x["op"] for x in tr}):
        xs = [x for x in tr if x["op"] == op]
        section = "[A](#a-sliding-window-attention)" if op.startswith("SWA") else "[B](#b-chunkwise-linear-attention)"
        missed = [x for x in xs if x["raw"] < TARGETS["torch_raw"] and raw_target_need(x) is not None]
        beyond = [x for x in missed if raw_target_need(x) >= 1]
        within = [x for x in missed if raw_target_need(x) < 1]
        notes = []
        if beyond:
            notes.append(f"{len(beyond)} of the {len(missed)} missed case(s) would need the kernel above the same-run "
                         f"SGEMM rate (up to {fmt(max(raw_target_need(x) for x in beyond))} × SGEMM"
                         + (f", {fmt(max(raw_target_of_peak(x, peak) for x in beyond))} of the core's FMA peak"
                            if peak else "") + ")")
        if within:
            notes.append(f"{len(within)} of the {len(missed)} missed case(s) need at most "
                         f"{fmt(max(raw_target_need(x) for x in within))} × SGEMM (below it; where the time goes: "
                         "the kernel profile in the mechanism's section)")
        add(f"vs PyTorch CPU — {op}", "speed-up, raw", f"≥ {TARGETS['torch_raw']}×", [x["raw"] for x in xs],
            lambda v: v >= TARGETS["torch_raw"], section, "; ".join(notes))
        add(f"vs PyTorch CPU — {op}", "speed-up ÷ (own SGEMM ÷ torch SGEMM)", f"≥ {TARGETS['torch_norm']}×",
            [x["norm"] for x in xs], lambda v: v >= TARGETS["torch_norm"], section)
    isa = fig_isa(recs)
    add("default build ÷ `-march=native` build (SWA forward, GDN forward and backward, one rank)",
        "seconds ÷ seconds, median over rounds", f"≤ {TARGETS['isa_default']}", [x["ratio"] for x in isa],
        lambda v: v <= TARGETS["isa_default"], "[default build](#default-build-against--marchnative)",
        "; ".join(f"{x['call']}: {fmt(x['ratio'])}" for x in isa), lower_is_worse=False)
    vs_torch = [x["rec"] for x in isa if "default_speedup_over_torch" in x["rec"]]
    add("vs PyTorch CPU — SWA step forward, default build", "speed-up, raw (fastest of 5 calls, median over rounds)",
        f"≥ {TARGETS['torch_raw']}×", [num(r, "default_speedup_over_torch") for r in vs_torch],
        lambda v: v >= TARGETS["torch_raw"], "[default build](#default-build-against--marchnative)",
        "; ".join(f"`-march=native` build in the same run: {fmt(num(r, 'native_speedup_over_torch'))}×"
                  for r in vs_torch))
    cp = fig_cp(recs)
    for mech in ("A", "B", "C"):
        xs = [x for x in cp if x["P"] == 2 and (mech + ":") in x["mechanism"]]
        vals = [x["solo_eff"] for x in xs if x["solo_eff"] is not None and x["valid"]]
        notes = [f"{x['mechanism']} {x['case']}: {fmt(x['solo_eff'])}"
                 + (" (estimate: recorded with a concurrent T(1), × the same-run ceiling)" if x["estimated"] else "")
                 + (f", ceiling {fmt(x['ceiling'])}" if x["ceiling"] else ", ceiling not in these records")
                 + ("" if x["valid"] else " — **invalid** (ceiling above 1), not pooled")
                 + (f"; profile: {cp_profile_note(x)}" if cp_profile_note(x) else "")
                 for x in xs]
        add(f"CP efficiency at P = 2 × 1 thread — {dict(A='SWA', B='GDN', C='GDP')[mech]}",
            "T(1 rank alone) / (2·T(2))", f"≥ {TARGETS['cp']}", vals, lambda v: v >= TARGETS["cp"],
            "[CP efficiency](#cp-efficiency)", "; ".join(notes))
    pt = fig_per_token(recs)
    for mech in sorted({x["mechanism"] for x in pt}) or ["–"]:
        xs = [x for x in pt if x["mechanism"] == mech]
        worst = max(xs, key=lambda x: x["ratio"]) if xs else None
        add(f"per-token time vs sequence length — {mech}", "per-token time, longest ÷ shortest T",
            f"≤ {TARGETS['per_token']}", [x["ratio"] for x in xs], lambda v: v <= TARGETS["per_token"],
            "[A](#a-sliding-window-attention)" if mech.startswith("A") else "[B](#b-chunkwise-linear-attention)",
            (f"worst: {worst['case']}, T = {worst['from']} → {worst['to']}"
             + (f"; profile: {per_token_profile_note(worst)}" if per_token_profile_note(worst) else ""))
            if worst else "", lower_is_worse=False)
    longctx_summary(recs, add)
    ss = {}
    for x in sv:
        ss.setdefault(x["mechanism"], []).append(int(num(x["rec"], "steady_state_allocations")))
    add("steady-state allocations per forward+backward on a plan", "count (Kokkos Tools), after the timed calls",
        "0", [v for vs in ss.values() for v in vs], lambda v: v == 0, "step ÷ kernel tables in A, B, C",
        "; ".join(f"{m}: {', '.join(str(v) for v in vs)}" for m, vs in ss.items()), lower_is_worse=False)
    bv, off, skipped = fig_bytes(recs)
    add("bytes per rank (counters)", "÷ formula", "exactly 1.0", bv, lambda v: v == 1.0, "every mechanism",
        ("differing: " + "; ".join(off[:6])) if off else
        (f"{len(skipped)} heads records are checked against the plan's count (their closed formula does not "
         "apply to repeated key groups)" if skipped else ""))
    hv = []
    for r in pick(recs, "swa", kind="bytes_per_rank"):
        hv.append((num(r, "halo_bytes_received") / num(r, "allgather_bytes_received")) /
                  (num(r, "halo_formula") / num(r, "allgather_formula")))
    add("HaloKV bytes ÷ AllGatherKV bytes", "measured ratio ÷ formula ratio (rank 0)", "≈ (W−1+s)/L, i.e. 1",
        hv, lambda v: abs(v - 1) < 1e-12, "[A](#a-sliding-window-attention)")
    ev = [num(r, "instruction_ratio") for r in pick(recs, "expr") if "instruction_ratio" in r]
    add("expression-template kernel vs hand-written loop", "instructions (callgrind)", f"≤ {TARGETS['expr']}", ev,
        lambda v: v <= TARGETS["expr"], "[expressions](#expression-templates)", lower_is_worse=False)
    pk = fig_pack(recs)
    bad = [x for x in pk if not x["valid"]]
    add("head all-to-all pack/unpack", "GB/s ÷ same-run triad", f"≥ {TARGETS['pack']}",
        [x["ratio"] for x in pk if x["valid"]], lambda v: v >= TARGETS["pack"], "[C](#c-head-parallel-all-to-all)",
        (f"{len(bad)} case(s) invalid (a round above {fmt(PACK_CEILING)} × triad), not pooled; " if bad else "") +
        "P ≤ 2 only: " + verdict([x["ratio"] for x in pk if x["valid"] and not x["oversubscribed"]],
                                 lambda v: v >= TARGETS["pack"]).replace("*", "") + pack_copy_note(pk))
    mem = [r for r in pick(recs, "chunkwise", kind="summaries", family="gdn")]
    by_p = sorted((num(r, "ranks"), num(r, "gather_summary_memory_bytes"), num(r, "scan_summary_memory_bytes"))
                  for r in mem)
    at8 = [g / s for p, g, s in by_p if p == 8]
    shape_ok = len({s for _, _, s in by_p}) == 1 and all(b[1] > a[1] for a, b in zip(by_p, by_p[1:]))
    add("ScanCompose vs GatherFold at P = 8", "summary memory, GatherFold ÷ ScanCompose", "O(P) vs O(1)", at8,
        lambda v: shape_ok, "[B](#b-chunkwise-linear-attention)",
        f"ScanCompose constant at P = {', '.join(str(p) for p, _, _ in by_p)}" if shape_ok else "")
    return rows


# ----------------------------------------------------------------------------------------------
# Mechanism B vs C (bench/crossover)


def log_crossing(points):
    """points: sorted (x, d) with d = C − B. Returns the x where d changes sign (interpolated
    linearly in log x), or None."""
    for (x0, d0), (x1, d1) in zip(points, points[1:]):
        if d0 == 0:
            return x0
        if (d0 < 0) != (d1 < 0):
            f = d0 / (d0 - d1)
            return math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0)))
    return None


def fig_crossover(recs):
    """bench/crossover's records as figures: per (family, P) the rows of its table and its plot data,
    and the crossover in tokens per rank (bytes; time by the medians and by the fastest repeats).
    None without records."""
    cx = [r for r in recs if r.get("benchmark") == "crossover" and isnum(r.get("tokens_per_rank"))
          and isnum(r.get("ranks")) and r.get("mechanism") in ("B", "C") and isinstance(r.get("family"), str)]
    if not cx:
        return None
    fams = sorted({r.get("family") for r in cx})
    ranks = sorted({r["ranks"] for r in cx})
    cases, summary = [], []
    for fam in fams:
        for p in ranks:
            rs = [r for r in cx if r.get("family") == fam and r["ranks"] == p]
            if not rs:
                continue
            ts = sorted({r["tokens_per_rank"] for r in rs})

            def get(mech, pol, t):
                return next((r for r in rs if r["mechanism"] == mech and r["tokens_per_rank"] == t and
                             (pol is None or r.get("policy") == pol)), None)

            rows, dat = [], []
            for t in ts:
                gf, sc, c = get("B", "GatherFold", t), get("B", "ScanCompose", t), get("C", None, t)
                cells = [t]
                for r in (gf, sc, c):
                    cells.append(human_bytes(r.get("bytes_sent_max")) +
                                 ("" if r is None or r.get("bytes_equal_formula_every_rank") else " (≠ formula)")
                                 if r else "–")
                for r in (gf, sc, c):
                    cells.append(human_seconds(r.get("time_median_s")) if r else "–")
                tb = min([r["time_median_s"] for r in (gf, sc) if r and isnum(r.get("time_median_s"))], default=None)
                cells.append(fmt(c["time_median_s"] / tb) if c and tb and isnum(c.get("time_median_s")) else "–")
                cells.append(" / ".join(human_seconds(c[k]) for k in ("c_transposes_s", "c_column_copies_s", "c_recurrence_s"))
                             if c and all(isnum(c.get(k)) for k in ("c_transposes_s", "c_column_copies_s", "c_recurrence_s"))
                             else "–")
                rows.append(cells)
                dat.append([t] + [(r.get("bytes_sent_max") if r else "?") for r in (gf, sc, c)] +
                           [(r.get("time_median_s") if r else "?") for r in (gf, sc, c)])
            cases.append((fam, p, rows, dat))
            # Crossovers: C's bytes grow linearly in t (slope from the largest measured size), B's do not.
            big = get("C", None, ts[-1])
            b_gf, b_sc = get("B", "GatherFold", ts[-1]), get("B", "ScanCompose", ts[-1])
            slope = big["bytes_sent_max"] / ts[-1] if big and isnum(big.get("bytes_sent_max")) and ts[-1] else None
            x_gf = b_gf["bytes_sent_max"] / slope if slope and b_gf and isnum(b_gf.get("bytes_sent_max")) else None
            x_sc = b_sc["bytes_sent_max"] / slope if slope and b_sc and isnum(b_sc.get("bytes_sent_max")) else None
            tcross = []
            for field in ("time_median_s", "time_min_s"):
                diffs = []
                for t in ts:
                    c, gf, sc = get("C", None, t), get("B", "GatherFold", t), get("B", "ScanCompose", t)
                    bt = [r[field] for r in (gf, sc) if r and isnum(r.get(field))]
                    if c and isnum(c.get(field)) and bt:
                        diffs.append((t, c[field] - min(bt)))
                xt = log_crossing(diffs)
                if xt is not None:
                    later = [d for x, d in diffs if x > xt]
                    tcross.append(f"≈ {fmt(xt)}" + ("" if all((d > 0) == (later[0] > 0) for d in later) else
                                                     " (first of several sign changes)"))
                elif diffs:
                    tcross.append("none: C faster at every size" if all(d < 0 for _, d in diffs) else
                                  "none: B faster at every size")
                else:
                    tcross.append("–")
            summary.append([fam, p, fmt(x_gf), fmt(x_sc)] + tcross)
    return {"records": cx, "families": fams, "ranks": ranks, "cases": cases, "summary": summary}


def crossover_summary(x):
    """The crossover table (tokens per rank) with the sentence that says how it is read."""
    return ("**The crossover** (tokens per rank). Bytes: C's measured bytes per token (largest size) extrapolated "
            "linearly, against B's constant bytes; time: where C's time minus the faster B policy's time changes "
            "sign between two measured sizes (log-interpolated). Shared machine: the time crossover moves with "
            "the load; the byte crossover does not.\n\n" +
            table(["family", "P", "C bytes > B GatherFold beyond", "C bytes > B ScanCompose beyond",
                   "time crossover, medians (C slower than best B beyond)", "time crossover, fastest repeats"],
                  x["summary"]))


def crossover_block(recs, img=None):
    """docs/heads.md: how bench/crossover times B against C, its checks and formulas, the table of every
    family and P, and the plots (redrawn when `img` is given)."""
    x = fig_crossover(recs)
    if x is None:
        return "_No records (bench/results/crossover.json; `bench/crossover/run.sh BUILD_DIR`)._"
    cx, fams, ranks = x["records"], x["families"], x["ranks"]
    shapes = []
    for f in fams:
        r = next(c for c in cx if c.get("family") == f)
        shapes.append(f"{f}: H = {r.get('heads')}, K = {r.get('key_dim')}, V = {r.get('value_dim')}, "
                      f"householder steps {r.get('householder')}, chunk {r.get('chunk')}")
    md = ["`bench/crossover` runs one layer's forward + backward through the public APIs: **B** = "
          "a `chunkwise::CpPlan`'s `forward`/`backward` with `GatherFold` or `ScanCompose` on each rank's `t` tokens of "
          "every head; **C** = `TransposePlan::to_head_parallel` of the fused input projection, the "
          "single-device chunkwise recurrence over the whole sequence of the rank's heads, "
          "`to_sequence_parallel` of the output, and the reverse path in the backward "
          f"(`UnevenHeads`, contiguous tokens). From {run_facts(cx)}. Shapes ({'; '.join(shapes)}); P = "
          f"{', '.join(map(str, ranks))} ranks × 1 thread on the 2-core machine (P > 2 oversubscribed: "
          f"{', '.join(str(p) for p in ranks if p > 2) or 'none'}). "
          "Bytes: the slowest rank's bytes sent over all data collectives (Group counters), fwd + bwd; "
          "time: the slowest rank's fwd + bwd, median of the repeats. The last column splits one more run of C "
          "(a fence after each phase, slowest rank per phase) into its four transposes, the copies between the "
          "fused head-side matrix and the per-tensor views the backend takes, and the recurrence (forward + "
          "backward).\n"]
    checked = [r for r in cx if r.get("checked_against_single_rank") and isnum(r.get("max_rel_error_output"))]
    if checked:
        md.append(f"\nChecked once per family and P against the single-rank path on every rank: max relative error "
                  f"of the outputs {fmt(max(r['max_rel_error_output'] for r in checked))}, of the input gradients "
                  f"{fmt(max(r.get('max_rel_error_input_grad', 0) for r in checked))} over {len(checked)} records "
                  "(relative to the largest reference value); outputs against an fp64 token-by-token recurrence: the "
                  f"single-rank path {fmt(max((r.get('single_rank_output_rel_error_vs_fp64') or 0) for r in checked))}, "
                  f"B GatherFold {fmt(max((r.get('b_gatherfold_output_rel_error_vs_fp64') or 0) for r in checked))}. "
                  "Counters equal to their formulas on every rank in "
                  f"{sum(1 for r in cx if r.get('bytes_equal_formula_every_rank'))} of {len(cx)} records.\n")
    formulas = {}
    for r in cx:
        formulas.setdefault(f"{r['mechanism']} {r.get('policy')}", r.get("bytes_formula"))
    md.append("\nFormulas: " + "; ".join(f"**{k}**: `{v}`" for k, v in sorted(formulas.items()) if v) + "\n")
    for fam, p, rows, _ in x["cases"]:
        md.append(f"\n**{fam}, P = {p}**{' (oversubscribed)' if p > 2 else ''}\n\n")
        md.append(table(["tokens / rank", "B GatherFold bytes", "B ScanCompose bytes", "C all-to-all bytes",
                         "B GatherFold time", "B ScanCompose time", "C time", "C time ÷ best B",
                         "C: transposes / column copies / recurrence"], rows))
    if img:
        draw_crossover(x, img)
    for fam in fams:
        md.append(f"\n![crossover {fam}]({GUIDE_IMG}/crossover_{fam}.png)\n")
    return tidy(md)


def draw_crossover(x, img):
    """One plot per family: bytes and time against tokens per rank, a line per policy and P."""
    os.makedirs(img, exist_ok=True)
    files = {}
    for fam, p, _, dat in x["cases"]:
        files[(fam, p)] = os.path.join(img, f"cx_{fam}_P{p}.dat")
        write_data(files[(fam, p)], dat)
    for fam in x["families"]:
        plots_b, plots_t = [], []
        for i, p in enumerate(x["ranks"]):
            f = files.get((fam, p))
            if f is None:
                continue
            for j, lab in enumerate(("B GatherFold", "B ScanCompose", "C all-to-all")):
                style = f"w lp lc {i + 1} dt {j + 1} pt {5 + 2 * j}"
                plots_b.append(f"'{f}' u 1:{2 + j} {style} t '{lab} P={p}'")
                plots_t.append(f"'{f}' u 1:{5 + j} {style} t '{lab} P={p}'")
        png = os.path.join(img, f"crossover_{fam}.png")
        if plots_b:
            gnuplot(f"""set terminal pngcairo noenhanced size 980,400 font ',8'
set output '{png}'
set datafile missing '?'
set multiplot layout 1,2 title '{fam}: mechanism B (chunkwise summaries) vs C (head all-to-all), forward + backward'
set logscale xy
set xlabel 'tokens per rank'
set key top left font ',7'
set ylabel 'bytes sent, slowest rank'
plot {', '.join(plots_b)}
set ylabel 'seconds, slowest rank (median)'
plot {', '.join(plots_t)}
unset multiplot
""", png)
    for f in files.values():
        os.remove(f)


# ----------------------------------------------------------------------------------------------
# SWA growth (bench/results/swa_growth.json): time and bytes against T, W and P


GROWTH_X = ("length", "tokens", "T", "sequence_length", "queries")
GROWTH_GROUP = ("policy", "window", "W", "ranks", "P", "dim", "D")


SWEEP_AXIS = {"T": "tokens", "W": "window", "P": "ranks", "L": "length"}


def growth_by_sweep(rs, img):
    """Records that say which axis they sweep (`sweep`: T, W or P): per sweep and layout, a table
    of x and P against each policy's step time and bytes received (forward + backward, slowest
    rank), and one plot per sweep and layout (redrawn when `img` is given)."""
    md = []
    bytes_of = lambda r: sum(r[k] for k in ("forward_bytes_received_max", "backward_bytes_received_max")
                             if isnum(r.get(k))) if any(isnum(r.get(k)) for k in (
                                 "forward_bytes_received_max", "backward_bytes_received_max")) else None
    for sweep in sorted({str(r["sweep"]) for r in rs}):
        xkey = SWEEP_AXIS.get(sweep, sweep)
        srs = [r for r in rs if str(r.get("sweep")) == sweep and isnum(r.get(xkey))]
        for layout in sorted({str(r.get("layout", "")) for r in srs}):
            lrs = [r for r in srs if str(r.get("layout", "")) == layout]
            pols = sorted({str(r.get("policy")) for r in lrs})
            fixed = [f"{k} = {span(lrs, k)}" for k in ("tokens", "window", "dim", "q_heads", "kv_heads", "chunk")
                     if k != xkey and span(lrs, k) and "–" not in span(lrs, k)]
            md.append(f"\n**Sweep over {xkey}**, layout `{layout}` ({', '.join(fixed)}): step time (median, slowest "
                      "rank) and bytes received forward + backward (slowest rank, Group counters).\n\n")
            keys = sorted({(r[xkey], r.get("ranks")) for r in lrs}, key=lambda k: (k[1] or 0, k[0]))
            rows = []
            for x, p in keys:
                row = [x, p]
                for pol in pols:
                    r = next((r for r in lrs if r[xkey] == x and r.get("ranks") == p and str(r.get("policy")) == pol), None)
                    row += [human_seconds(r.get("step_median_s")) if r and isnum(r.get("step_median_s")) else "–",
                            human_bytes(bytes_of(r)) if r and bytes_of(r) is not None else "–"]
                rows.append(row)
            md.append(table([xkey, "P"] + [f"{pol} {w}" for pol in pols for w in ("time", "recv")], rows))
            safe = "".join(c if c.isalnum() else "_" for c in f"{sweep}_{layout}")
            if img:
                os.makedirs(img, exist_ok=True)
                plots_t, plots_b, files = [], [], []
                for pi, pol in enumerate(pols):
                    for p in sorted({r.get("ranks") for r in lrs if isnum(r.get("ranks"))}):
                        series = sorted((r for r in lrs if str(r.get("policy")) == pol and r.get("ranks") == p),
                                        key=lambda r: r[xkey])
                        if not series:
                            continue
                        f = os.path.join(img, f"g_{sweep}_{pi}_{p}.dat")
                        write_data(f, [[r[xkey], r.get("step_median_s") if isnum(r.get("step_median_s")) else "?",
                                        bytes_of(r) if bytes_of(r) else "?"] for r in series])
                        files.append(f)
                        style = f"w lp lc {p} dt {pi + 1} pt {5 + 2 * pi}"
                        plots_t.append(f"'{f}' u 1:2 {style} t '{pol} P={p}'")
                        if p > 1:
                            plots_b.append(f"'{f}' u 1:3 {style} t '{pol} P={p}'")
                png = os.path.join(img, f"perf_swa_growth_{safe}.png")
                if plots_t:
                    gnuplot(f"""set terminal pngcairo noenhanced size 980,400 font ',8'
set output '{png}'
set datafile missing '?'
set multiplot layout 1,2 title 'sliding-window attention, layout {layout}: sweep over {xkey}'
set logscale xy
set xlabel '{xkey}'
set key top left font ',6'
set ylabel 'step seconds (median, slowest rank)'
plot {', '.join(plots_t)}
set ylabel 'bytes received fwd+bwd (slowest rank)'
{('plot ' + ', '.join(plots_b)) if plots_b else ''}
unset multiplot
""", png)
                for f in files:
                    os.remove(f)
            md.append(f"\n![swa growth {sweep} {layout}]({GUIDE_IMG}/perf_swa_growth_{safe}.png)\n")
    return md


def growth_records(recs):
    return [r for r in recs if r.get("benchmark") == "swa_growth" or
            (r.get("benchmark") == "swa" and r.get("kind") in ("growth", "scaling"))]


def growth_block(recs, img=None):
    """docs/swa.md: the distributed step's time and bytes against T, W and P, every rank count and both
    layouts, with one plot per sweep (redrawn when `img` is given)."""
    rs = growth_records(recs)
    if not rs:
        return "_No records (bench/results/swa_growth.json)._"
    if all(r.get("sweep") is not None for r in rs):
        return tidy([f"From {run_facts(rs)}.\n"] + growth_by_sweep(rs, img))
    # Older records that do not say which axis they sweep: every time and bytes field they carry,
    # against their length field.
    md = []
    xkey = next((k for k in GROWTH_X if any(isnum(r.get(k)) for r in rs)), None)
    gkeys = [k for k in GROWTH_GROUP if any(k in r for r in rs) and len({str(r.get(k)) for r in rs}) > 1]
    ykeys = []
    for r in rs:
        for k, v in r.items():
            if isnum(v) and k not in ykeys and k != xkey and k not in gkeys and (
                    k.endswith("_median_s") or ("bytes" in k and "formula" not in k)):
                ykeys.append(k)
    if xkey is None or not ykeys:
        return (f"_{len(rs)} records, but no axis length field ({', '.join(GROWTH_X)}) or no time/bytes fields "
                "to tabulate._")
    md.append(f"From {run_facts(rs)}. Columns: the fields the records carry (times are medians of the repeats; "
              "bytes from the Group counters).\n\n")
    key = lambda r: tuple(str(r.get(k)) for k in gkeys) + (r.get(xkey) if isnum(r.get(xkey)) else 0,)
    rows = []
    for r in sorted(rs, key=key):
        rows.append([r.get(k, "–") for k in gkeys] + [r.get(xkey, "–")] +
                    [(human_seconds(r[k]) if k.endswith("_s") else human_bytes(r[k]) if "bytes" in k else fmt(r[k]))
                     if isnum(r.get(k)) else "–" for k in ykeys])
    md.append(table(gkeys + [xkey] + ykeys, rows))
    # One plot for times, one for bytes: a line per (group, field) against the axis length.
    for kind, sel, ylabel in (("time", [k for k in ykeys if k.endswith("_s")], "seconds (median)"),
                              ("bytes", [k for k in ykeys if "bytes" in k], "bytes per rank")):
        if not sel:
            continue
        if img:
            os.makedirs(img, exist_ok=True)
            groups = sorted({tuple(str(r.get(k)) for k in gkeys) for r in rs})
            plots, files = [], []
            for gi, g in enumerate(groups):
                series = sorted((r for r in rs if tuple(str(r.get(k)) for k in gkeys) == g and isnum(r.get(xkey))),
                                key=lambda r: r[xkey])
                if not series:
                    continue
                f = os.path.join(img, f"growth_{kind}_{gi}.dat")
                write_data(f, [[r[xkey]] + [r[k] if isnum(r.get(k)) else "?" for k in sel] for r in series])
                files.append(f)
                label = " ".join(f"{k}={v}" for k, v in zip(gkeys, g))
                for j, k in enumerate(sel):
                    plots.append(f"'{f}' u 1:{j + 2} w lp lc {gi + 1} dt {j + 1} t '{k} {label}'")
            png = os.path.join(img, f"perf_swa_growth_{kind}.png")
            if plots:
                gnuplot(f"""set terminal pngcairo noenhanced size 640,400 font ',8'
set output '{png}'
set datafile missing '?'
set logscale xy
set xlabel '{xkey}'
set ylabel '{ylabel}'
set key outside right font ',7'
set title 'sliding-window attention: {kind} vs {xkey} (bench/results/swa_growth.json)'
plot {', '.join(plots)}
""", png)
            for f in files:
                os.remove(f)
        md.append(f"\n![swa growth {kind}]({GUIDE_IMG}/perf_swa_growth_{kind}.png)\n")
    return tidy(md)


# ----------------------------------------------------------------------------------------------
# Sections of the report, and the blocks of detail it leaves to the guides

# The guides sit next to docs/img, so a block's plots are linked from there whatever --img says.
GUIDE_IMG = "img"


def anchor(heading):
    """The anchor GitHub gives a Markdown heading: lower case, every character but letters, digits,
    underscores, hyphens and spaces dropped, spaces turned into hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def detail(name, text=None):
    """A link from the report to the guide section that holds block `name` (GUIDE_BLOCKS)."""
    guide, _, heading, _ = next(b for b in GUIDE_BLOCKS if b[1] == name)
    return f"[{text or f'docs/{guide}, “{heading}”'}]({guide}#{anchor(heading)})"


def tidy(md):
    """A block's Markdown: the pieces joined, at most one blank line in a row, no blank edges."""
    return re.sub(r"\n{3,}", "\n\n", "\n".join(md) if isinstance(md, list) else md).strip()


def bar_plot(img, name, title, ylabel, labels_values, target, img_rel):
    """A bar per case with the target as a dashed line (gnuplot); returns the Markdown or ''."""
    if not labels_values:
        return ""
    dat = os.path.join(img, name + ".dat")
    write_data(dat, [(i, v, '"' + lab.replace('"', "'") + '"') for i, (lab, v) in enumerate(labels_values)])
    top = max(v for _, v in labels_values)
    png = os.path.join(img, name + ".png")
    ok = gnuplot(f"""set terminal pngcairo noenhanced size 720,360 font ',8'
set output '{png}'
set style fill solid 0.6
set boxwidth 0.7
set yrange [0:{max(top, target) * 1.15}]
set xtics rotate by -35 font ',7'
set ylabel '{ylabel}'
set title '{title}'
set key outside top center horizontal
plot '{dat}' u 1:2:xtic(3) w boxes t 'measured (median of repeats)', {target} w l dt 2 lw 2 t 'target {fmt(target)}'
""", png)
    os.remove(dat)
    return f"\n![{title}]({img_rel}/{name}.png)\n" if ok else ""


def section_machine(recs):
    md = ["\n## Machine and ceilings\n"]
    ceil = pick(recs, "ceilings")
    machine = next((r["machine"] for r in ceil if isinstance(r.get("machine"), dict)), None)
    if machine:
        md.append(f"CPU `{machine.get('cpu')}`, build `{machine.get('build_type')}`, Kokkos backend "
                  f"`{machine.get('backend')}`, {machine.get('threads')} thread(s) per rank, "
                  f"`-march=native`: {fmt(machine.get('native'))}"
                  + (f", host kernels' instruction set: `{machine['host_isa']}`" if "host_isa" in machine else "")
                  + f"; load average at the ceilings run: "
                  f"{fmt(machine.get('load_average'))} (2 cores). Every ratio below uses the ceiling measured in "
                  "its own benchmark run, around its own case.\n\n")
    rows = []
    for r in ceil:
        c = str(need(r, "case"))
        if c.startswith("sgemm"):
            rows.append([c, f"{fmt(num(r, 'gflops'))} GFLOP/s", need(r, "flops_formula")])
        elif c == "fma_peak":
            rows.append([c, f"{fmt(num(r, 'gflops'))} GFLOP/s (fp32 FMAs in registers, {need(r, 'lanes')} lanes, "
                         f"{need(r, 'chains')} chains: no kernel on one thread can exceed it)",
                         need(r, "flops_formula")])
        elif c == "triad":
            rows.append([c, f"{fmt(num(r, 'gbps'))} GB/s", need(r, "bytes_formula")])
        elif c.startswith("pingpong"):
            rows.append([c, f"one way {human_seconds(num(r, 'one_way_us') * 1e-6)}, {fmt(num(r, 'gbps'))} GB/s", ""])
        elif c.startswith("allgather"):
            rows.append([c, f"{fmt(num(r, 'gbps'))} GB/s", need(r, "bytes_formula")])
        elif c.startswith("contention"):
            rows.append([c, f"{fmt(num(r, 'machine_efficiency_ceiling'))} (SGEMM all ranks at once ÷ one alone)", ""])
    md.append(table(["ceiling", "measured (median of repeats)", "formula"], rows) if rows else
              "_No ceilings record (bench/results/ceilings.json)._\n")
    return md


def step_profile_block(recs, mech):
    """A guide's block: where the time of the step a user calls goes, label by label, against the
    local kernels alone (the report keeps the step ÷ kernel ratios)."""
    sv = [x for x in fig_step_vs_kernel(recs) if x["mechanism"] == mech]
    if not sv:
        return "_No step ÷ kernel records for this mechanism._"
    return tidy([STEP_PROFILE_METHOD + "\n", step_profile_table(sv)])


# Per-token growth over a length sweep: how the table is read (the report's B section and the SWA guide).
PER_TOKEN_TEXT = (f"Per-token time at the longest length ÷ at the shortest, per series (target ≤ {TARGETS['per_token']}; "
                  "the median of each end's timed calls). Where the records carry a profile of each end (the fastest "
                  "of 3 profiled calls after the timed ones, by Kokkos kernel label), the last column says how much "
                  "that call grew per token and which label's per-token time rose most.\n\n")


def per_token_table(rows):
    return table(["mechanism", "series", "from T", "to T", "per-token ratio", "where it grows (profile)"],
                 [[x["mechanism"], x["case"], x["from"], x["to"], fmt(x["ratio"]), per_token_profile_note(x) or "–"]
                  for x in rows])


def per_token_block(recs, mech):
    pt = [x for x in fig_per_token(recs) if x["mechanism"] == mech]
    if not pt:
        return "_No length sweep in these records._"
    return tidy([PER_TOKEN_TEXT, per_token_table(pt)])


def section_swa(recs, img, img_rel):
    md = ["\n## A: sliding-window attention\n",
          "The operator, its policies and every figure behind this section: [docs/swa.md](swa.md) §6.\n"]
    sk = fig_swa_kernel(recs)
    if sk:
        md.append(f"Local kernel, one thread, from {run_facts([x['rec'] for x in sk])}. FLOP model: forward "
                  f"`{need(sk[0]['rec'], 'forward_flop_formula')}`, backward `{need(sk[0]['rec'], 'backward_flop_formula')}` "
                  "(every query attends W keys); SGEMM measured around each case. Targets: forward ≥ 0.5, "
                  "backward ≥ 0.35 of SGEMM.\n\n")
        md.append(table(["case", "forward GFLOP/s", "÷ SGEMM", "backward GFLOP/s", "÷ SGEMM", "SGEMM GFLOP/s"],
                        [[x["case"], fmt(x["fwd_gflops"]), fmt(x["fwd"]), fmt(x["bwd_gflops"]), fmt(x["bwd"]),
                          fmt(x["sgemm"])] for x in sk]))
        md.append(bar_plot(img, "perf_swa_kernel", "SWA local kernel: forward GFLOP/s / same-run SGEMM", "ratio",
                           [(x["case"], x["fwd"]) for x in sk], TARGETS["swa_fwd"], img_rel))
    sv = [x for x in fig_step_vs_kernel(recs) if x["mechanism"] == "SWA"]
    if sv:
        md.append("\nThe step a user calls (`StepPlan::forward` / `backward`, steady state, one rank) against "
                  "`attention_forward` / `attention_backward` alone on the step's own rotated queries and axis with a "
                  "kept workspace; the two timed in alternation, same run, same shapes (median of repeats). What the step adds: the RoPE of the "
                  "queries, the record packing (keys rotated inside it) and unpacking, the next-cache cut. "
                  f"Target ≤ {TARGETS['step_over_kernel']}.\n\n")
        md.append(step_vs_kernel_table(sv))
        md.append(f"\nWhere the step's time goes, label by label against the kernels alone: {detail('swa-step-profile')}.\n")
    by = pick(recs, "swa", kind="bytes_per_rank")
    if by:
        md.append("\nBytes received per rank of one step (slowest rank, Group counters) against the axis length: "
                  "the all-gather grows with L, the halo stays at W − 1 records. The ratio `(W−1+s)/L` of "
                  "docs/choosing-a-mechanism.md §2 counts what a rank *holds* (its shard s plus the halo, over the "
                  "whole axis); the received-bytes ratio is `≈ (W−1)/(L−s)`, smaller still. The summary's HaloKV row "
                  "checks each counter against its own formula (rank 0).\n\n")
        md.append(table(["L", "W", "P", "all-gather recv/rank", "halo recv/rank", "halo ÷ all-gather, measured",
                         "(W−1+s)/L"],
                        [[need(r, "length"), need(r, "window"), need(r, "ranks"),
                          human_bytes(num(r, "max_allgather_bytes_over_ranks")),
                          human_bytes(num(r, "max_halo_bytes_over_ranks")),
                          fmt(num(r, "halo_bytes_received") / num(r, "allgather_bytes_received")),
                          fmt((r["window"] - 1 + (r["length"] - r["window"] + 1) / r["ranks"]) / r["length"])]
                         for r in sorted(by, key=lambda r: (r["window"], r["length"]))]))
    md += torch_section(recs, "SWA", "swa-torch-need")
    pt = [x for x in fig_per_token(recs) if x["mechanism"] == "A: SWA"]
    if pt:
        worst = max(pt, key=lambda x: x["ratio"])
        md.append(f"\n**Cost against T, W and P.** Per-token step time, longest ÷ shortest T: "
                  f"{span_of(x['ratio'] for x in pt)} over {len(pt)} series (policy × layout × P; target ≤ "
                  f"{TARGETS['per_token']}; highest: {worst['case']}, T = {worst['from']} → {worst['to']}). Every "
                  f"series, and the step's time and bytes against T, W and P at every rank count and both layouts: "
                  f"{detail('swa-growth-sweeps')}.\n")
    pr = portable_rows(recs)
    if pr:
        md.append("\n**Portable (GPU-shaped) kernels on the host** (no target: the source a GPU runs, timed on the "
                  "CPU next to the host SIMD kernels, one thread per team): portable ÷ SIMD "
                  f"{span_of(x['ratio'][0] for x in pr)} forward and "
                  f"{span_of(x['ratio'][1] for x in pr)} backward over {len(pr)} case(s); outputs bitwise "
                  f"equal across team sizes: {'yes' if all(x['bitwise'] for x in pr) else '**no**'}. Every case and "
                  f"team size: {detail('swa-portable')}.\n")
    md.append(f"\nProjected to P = 8 … 1024 (communication time, bytes and buffers of each policy): "
              f"{detail('swa-projection')}; where each policy stops scaling: "
              f"[below](#{anchor('Where each mechanism stops scaling')}).\n")
    return md


def portable_rows(recs):
    """The portable (GPU-shaped) SWA kernels next to the host SIMD kernels (same inputs, same run),
    and their team-size sweep. No target: the rows make a regression of the kernels GPUs run visible
    on the CPU. A team size above the run's threads is clamped by the kernels, so it is not a sweep
    point."""
    rows = []
    for r in pick(recs, "swa", kind="portable_kernels"):
        threads = num(r, "threads")
        teams = [(t, num(r, f"team{t}_forward_gflops"), num(r, f"team{t}_backward_gflops")) for t in (1, 2, 4)]
        rows.append({"rec": r, "case": f"D={need(r, 'dim')} W={need(r, 'window')} Hq={need(r, 'q_heads')} "
                                       f"Hkv={need(r, 'kv_heads')}",
                     "threads": threads,
                     "simd": (num(r, "simd_forward_gflops"), num(r, "simd_backward_gflops")),
                     "portable": (num(r, "portable_forward_gflops"), num(r, "portable_backward_gflops")),
                     "ratio": (num(r, "portable_over_simd_forward"), num(r, "portable_over_simd_backward")),
                     "teams": [(t, f, b) for t, f, b in teams if t <= threads],
                     "bitwise": need(r, "bitwise_equal_across_team_sizes"),
                     "error": num(r, "check_max_relative_error")})
    return rows


def portable_block(recs):
    """docs/swa.md: the portable team kernels against the host SIMD kernels, case by case and by team size."""
    rows = portable_rows(recs)
    if not rows:
        return "_No records (bench/results/swa_portable.json; `bench/swa/run_swa.sh`)._"
    return tidy([
        f"The team kernels CUDA and HIP compile (`swa/impl/team_kernels.hpp`), run on the host next to the "
        f"host SIMD kernels on the same inputs, one rank with {fmt(rows[0]['threads'])} OpenMP threads, from "
        f"{run_facts([x['rec'] for x in rows])}. Both at one thread per team (league-parallel); then the portable "
        "kernels at 1, 2 and 4 threads per team, whose outputs must be bitwise equal (the kernels promise it). "
        "No target: this shows whether the source a GPU runs regresses. FLOP model as the kernel table above.\n",
        table(["case", "SIMD fwd / bwd GFLOP/s", "portable fwd / bwd GFLOP/s", "portable ÷ SIMD fwd / bwd",
               "portable fwd / bwd GFLOP/s by threads per team", "bitwise equal across team sizes",
               "max rel. error vs fp64"],
              [[x["case"], f"{fmt(x['simd'][0])} / {fmt(x['simd'][1])}",
                f"{fmt(x['portable'][0])} / {fmt(x['portable'][1])}",
                f"{fmt(x['ratio'][0])} / {fmt(x['ratio'][1])}",
                "; ".join(f"{t}: {fmt(f)} / {fmt(b)}" for t, f, b in x["teams"]),
                "yes" if x["bitwise"] else "**no**", fmt(x["error"])] for x in rows])])


def section_chunkwise(recs, img, img_rel):
    md = ["\n## B: chunkwise linear attention\n",
          "The summary algebra, the policies, the kernels and every figure behind this section: "
          "[docs/chunkwise.md](chunkwise.md) §8.\n"]
    ck = fig_chunk_kernels(recs)
    if ck:
        md.append(f"Local forward, one thread, from {run_facts([x['rec'] for x in ck])}. FLOP models (triangular "
                  f"products at triangular size): gated delta `{GDN_FLOP_MODEL}`; scalar and diagonal decay "
                  f"`{SCALAR_FLOP_MODEL}`. Target: GDN ≥ 0.6 of SGEMM.\n\n")
        md.append(table(["family", "shape", "GFLOP/s (triangular model)", "÷ SGEMM", "SGEMM GFLOP/s",
                         "GFLOP/s as recorded", "record's model"],
                        [[x["family"], x["shape"], fmt(x["gflops"]), fmt(x["ratio"]), fmt(x["sgemm"]),
                          fmt(x["recorded_gflops"]), f"`{need(x['rec'], 'flop_model')}`"] for x in ck]))
    vr = fig_vs_recurrence(recs)
    if vr:
        md.append("\nGated delta single-device forward against the **fastest** token-by-token recurrence timed in the "
                  "run. Recurrences timed (median): " + "; ".join(
                      f"{w} {human_seconds(t)}" for t, w in vr[0]["recurrences"]) +
                  f". Ceiling: the fastest recurrence's time ÷ (the chunkwise FLOPs, triangular model, at the same-run "
                  f"SGEMM rate). Target: ≥ {TARGETS['rec_ceiling']} of the ceiling at the best chunk size.\n\n")
        md.append(table(["chunk", "chunkwise", "fastest recurrence", "speed-up", "FLOP-count ceiling",
                         "speed-up ÷ ceiling", "speed-up as recorded"],
                        [[x["chunk"], human_seconds(x["t_chunk"]), human_seconds(x["t_fast"]), fmt(x["speedup"]) + "×",
                          fmt(x["ceiling"]) + "×" + ("" if x["valid"] else " (**invalid**: above the ceiling)"),
                          fmt(x["of_ceiling"]), fmt(x["recorded"]) + "×"] for x in vr]))
        best = max(vr, key=lambda x: x["speedup"])
        prof = recurrence_profile(best)
        if prof:
            md.append(f"\nWhere the chunkwise forward's time goes at the best chunk size (C = {best['chunk']}): the "
                      "fastest of 3 profiled calls after the timed ones, by kernel label (Kokkos Tools begin/end "
                      "callbacks), with the FLOP model split by the kernel that does the work: `intra_chunk` the "
                      "strictly lower `KKᵀ`, the triangular solve, `Ũ`, `W̃` and the causal `QKᵀ` (`C²K + C³/3 + "
                      "(C²V + C²K) + C²K` per chunk, parallel over chunks); `forward_pass` `U = Ũ − W̃S`, the outputs "
                      "and the state update (`2CKV + (2CKV + C²V) + 2CKV`, sequential over a head's chunks). The "
                      "speed-up ÷ ceiling above is the call's rate ÷ SGEMM; this says which kernel holds it down.\n\n")
            md.append(table(["label", "seconds", "share of the call", "GFLOP/s (model)", "÷ SGEMM"],
                            [[lab, human_seconds(sec), f"{100 * share:.1f} %",
                              fmt(rate) if rate is not None else "–", fmt(of) if of is not None else "–"]
                             for lab, sec, share, rate, of in prof]))
    sv = [x for x in fig_step_vs_kernel(recs) if x["mechanism"] == "chunkwise GDN"]
    if sv:
        md.append("\nThe step a user calls (`CpPlan<GatherFold>::forward` / `backward`, steady state, one rank) against "
                  "the GDN backend's own `forward_prepare` + `forward_apply` (`backward_prepare` + `backward_apply`) on "
                  "the same inputs with the summary needs the driver passes at one rank, a kept saved bundle and a zero "
                  "boundary state, no composition; the two timed in alternation, same run (median of repeats). What "
                  "the step adds: the per-call checks and their agreement, the summary buffers, the one-rank "
                  f"composition. Target ≤ {TARGETS['step_over_kernel']}.\n\n")
        md.append(step_vs_kernel_table(sv))
        md.append(f"\nWhere the step's time goes, label by label against the kernels alone: "
                  f"{detail('chunkwise-step-profile')}.\n")
    md += torch_section(recs, "chunkwise", "chunkwise-torch-need")
    pt = [x for x in fig_per_token(recs) if x["mechanism"] == "B: chunkwise"]
    if pt:
        md.append("\n**Cost against T.** " + PER_TOKEN_TEXT)
        md.append(per_token_table(pt))
    mem = pick(recs, "chunkwise", kind="summaries")
    if mem:
        top = max(num(r, "ranks") for r in mem)
        at_top = [r for r in mem if num(r, "ranks") == top]
        equal = sum(1 for r in mem if num(r, "bytes_received") == num(r, "bytes_formula_value"))
        md.append(f"\n**Summaries** (GatherFold against ScanCompose on a latency-bound size, P = "
                  f"{fmt(min(num(r, 'ranks') for r in mem))}…{fmt(top)}, P > 2 oversubscribed; every family): bytes "
                  f"received equal to the formula in {equal} of {len(mem)} records; ScanCompose ÷ GatherFold time "
                  f"{span(mem, 'scan_over_gather')}; summary memory per rank at P = {fmt(top)}: GatherFold "
                  f"{human_bytes(min(num(r, 'gather_summary_memory_bytes') for r in at_top))}–"
                  f"{human_bytes(max(num(r, 'gather_summary_memory_bytes') for r in at_top))}, ScanCompose "
                  f"{human_bytes(min(num(r, 'scan_summary_memory_bytes') for r in at_top))}–"
                  f"{human_bytes(max(num(r, 'scan_summary_memory_bytes') for r in at_top))}. Every family and P: "
                  f"{detail('chunkwise-summaries')}.\n")
    md.append(f"\nCP efficiency at P = 2: [CP efficiency](#cp-efficiency); where the P = 2 call's time goes, label by "
              f"label, and why: {detail('chunkwise-cp-profile')}. Projected to P = 8 … 1024: "
              f"{detail('chunkwise-projection')}.\n")
    return md


def summaries_block(recs):
    """docs/chunkwise.md: bytes per rank against the formula, GatherFold and ScanCompose time and summary
    memory, every family and P."""
    mem = sorted(pick(recs, "chunkwise", kind="summaries"), key=lambda r: (r.get("family"), r.get("ranks")))
    if not mem:
        return "_No records (bench/results/chunkwise.json)._"
    return tidy([
        "Bytes per rank against the formula and GatherFold vs ScanCompose on a latency-bound size (P > 2 "
        f"oversubscribed), from {run_facts(mem)}.\n",
        table(["family", "P", "bytes recv", "formula", "GatherFold", "ScanCompose", "Scan ÷ Gather",
               "GatherFold memory", "ScanCompose memory"],
              [[need(r, "family"), need(r, "ranks"), num(r, "bytes_received"), num(r, "bytes_formula_value"),
                human_seconds(num(r, "gather_median_s")), human_seconds(num(r, "scan_median_s")),
                fmt(num(r, "scan_over_gather")), human_bytes(num(r, "gather_summary_memory_bytes")),
                human_bytes(num(r, "scan_summary_memory_bytes"))] for r in mem])])


def section_heads(recs, img, img_rel):
    md = ["\n## C: head-parallel all-to-all\n",
          "The transposes, the layer, when to choose C over B and every figure behind this section: "
          "[docs/heads.md](heads.md) §7–8.\n"]
    sv = [x for x in fig_step_vs_kernel(recs) if x["mechanism"] == "heads GDP"]
    if sv:
        md.append("The layer step a user calls (`GdpContextParallel::forward` / `backward`, steady state, one rank) "
                  "against the gated delta product backend's `forward_apply` / `backward_apply` alone on inputs of the "
                  "shape the layer hands it (the layer's gates and β, q, k, v of the same shapes), a kept saved "
                  "bundle, no transpose; the two timed in alternation, same run (median of repeats). What the step "
                  "adds: the conv and SiLU, the split and L2 normalisation, the gates, their backward, the transposes "
                  f"(local copies at P = 1). Target ≤ {TARGETS['step_over_kernel']}.\n\n")
        md.append(step_vs_kernel_table(sv))
        md.append(f"\nWhere the step's time goes, label by label against the kernels alone: "
                  f"{detail('heads-step-profile')}.\n")
    pk = fig_pack(recs)
    if pk:
        valid = [x for x in pk if x["valid"]]
        own = [x for x in valid if not x["oversubscribed"]]
        low = min(valid, key=lambda x: x["ratio"]) if valid else None
        misses = [x for x in valid if x["ratio"] < TARGETS["pack"]]
        md.append(f"\n**Pack/unpack of the all-to-all** (GB/s ÷ the same-run triad, target ≥ {TARGETS['pack']}; the "
                  f"median of each case's rounds; a round above {fmt(PACK_CEILING)} × triad makes its case invalid, "
                  f"left out), from {run_facts(pick(recs, 'heads'))}: at P ≤ 2, a core per rank, "
                  f"{span_of(x['ratio'] for x in own) or '–'} over {len(own)} cases; at every P "
                  f"{len(misses)} of {len(valid)} valid cases miss, the lowest {low['case']} at P = {low['P']} "
                  f"({fmt(low['ratio'])}), and {len(pk) - len(valid)} case(s) are invalid"
                  + pack_copy_note(pk) + f". Every case and round: {detail('heads-pack-rounds')}.\n"
                  if low else "\n_No valid pack/unpack case in these records._\n")
    else:
        md.append("_No pack/unpack records (bench/results/heads.json)._\n")
    x = fig_crossover(recs)
    if x:
        md.append(f"\n**Mechanism B against C, measured** (`bench/crossover`: one layer's forward + backward through "
                  f"the public APIs, families {', '.join(x['families'])}, P = {', '.join(map(str, x['ranks']))}; how "
                  f"it is run, its checks, every size and the plots: {detail('heads-crossover')}).\n\n")
        md.append(crossover_summary(x))
    md.append(f"\nProjected to P = 8 … 1024, the all-to-all against the summaries of B: {detail('heads-projection')}.\n")
    return md


def pack_block(recs):
    """docs/heads.md: every pack/unpack case's rounds against the triad, and against a same-run copy."""
    pk = fig_pack(recs)
    if not pk:
        return "_No pack/unpack records (bench/results/heads.json)._"
    return tidy([
        f"Pack/unpack of the head all-to-all, GB/s ÷ the same-run triad (target ≥ {TARGETS['pack']}), "
        f"median of the rounds of each case; a case with a round above {fmt(PACK_CEILING)} × triad is "
        f"**invalid** (above the physical ceiling) and left out of the verdict. From "
        f"{run_facts(pick(recs, 'heads'))}; P > 2 ranks share 2 cores. Every rank starts the triad, the "
        "kernel and a contiguous copy of the same bytes together, so each shares the machine with the same "
        "work on the other ranks; *÷ copy* divides the kernel by that copy, the fastest any gather of those "
        "bytes could be here (a pack writes P streams and an unpack reads P: on this machine a run-by-run "
        "`memcpy` of the pack's runs is no faster than the kernel, `ctxpar_bench_heads_pack_profile`).\n",
        table(["P", "case", "÷ triad (median of rounds)", "rounds", "÷ copy (median of rounds)", "status"],
              [[x["P"], x["case"], fmt(x["ratio"]), ", ".join(fmt(v) for v in x["rounds"]), fmt(x["copy_ratio"]),
                ("invalid (above ceiling)" if not x["valid"] else
                 "meets" if x["ratio"] >= TARGETS["pack"] else "**misses**")
                + (", oversubscribed" if x["oversubscribed"] else "")] for x in pk])])


# The CP-efficiency rows whose profile a guide holds (the mechanism's name in fig_cp → its block); a
# profiled row of another mechanism is shown in the report itself.
CP_PROFILE_BLOCKS = {"B: chunkwise GDN": "chunkwise-cp-profile"}


def cp_profile_block(recs, mechanism):
    """A guide's block: the profile of a mechanism's CP-efficiency call at P ranks against its single-rank
    call, label by label, with why the time outside kernels is what it is."""
    rows = [x for x in fig_cp(recs) if x["mechanism"] == mechanism and "single_rank_profile_wall_s" in x["rec"]]
    if not rows:
        return "_No profiled CP-efficiency record for this mechanism._"
    return tidy([CP_PROFILE_METHOD + "\n", cp_profile_table(rows)])


def section_cp(recs, img, img_rel):
    md = ["\n## CP efficiency\n"]
    cp = fig_cp(recs)
    if not cp:
        md.append("_No CP-efficiency records._\n")
        return md
    md.append("`T(1 rank alone) / (P·T(P))` by the definition above, the machine's contention ceiling beside it. "
              f"Target ≥ {TARGETS['cp']} at P = 2. A row with a concurrent baseline is an old record: its solo "
              "figure is estimated as efficiency × ceiling (the concurrent T(1) is slower than the solo one by the "
              "ceiling), and the next `scripts/bench` measures it directly. The hybrid's T(1) is its P = 1 run, alone "
              "on the machine.\n\n")
    md.append(table(["mechanism", "case", "P", "T(1) baseline", "efficiency as recorded", "efficiency, solo T(1)",
                     "contention ceiling", "verdict"],
                    [[x["mechanism"], x["case"], x["P"], x["baseline"], fmt(x["eff"]),
                      fmt(x["solo_eff"]) + (" (estimate)" if x["estimated"] else ""),
                      fmt(x["ceiling"]) if x["ceiling"] else "not in these records",
                      "invalid (ceiling above 1)" if not x["valid"] else
                      "meets" if x["solo_eff"] is not None and x["solo_eff"] >= TARGETS["cp"] else "**misses**"]
                     for x in cp]))
    prof = [x for x in cp if "single_rank_profile_wall_s" in x["rec"]]
    for mech in sorted({x["mechanism"] for x in prof if x["mechanism"] in CP_PROFILE_BLOCKS}):
        md.append(f"\n{mech}: {cp_profile_note(next(x for x in prof if x['mechanism'] == mech))}. Where the time of "
                  f"its P = 2 call goes, label by label, and why: {detail(CP_PROFILE_BLOCKS[mech])}.\n")
    inline = [x for x in prof if x["mechanism"] not in CP_PROFILE_BLOCKS]
    if inline:
        md.append("\n### Where the time goes\n\n" + CP_PROFILE_METHOD + "\n\n")
        md.append(cp_profile_table(inline))
    md.append(bar_plot(img, "perf_cp_efficiency", "CP efficiency at P = 2, solo T(1)", "T(1)/(2 T(2))",
                       [(f"{x['mechanism']} {x['case']}"[:40], x["solo_eff"]) for x in cp if x["solo_eff"]],
                       TARGETS["cp"], img_rel))
    return md


# Which records each PyTorch comparison comes from (the torch version is on their records).
TORCH_BENCHMARK = {"SWA": "swa_torch", "chunkwise": "chunkwise_torch"}


def torch_section(recs, prefix, need_block):
    """The PyTorch comparison of one mechanism (the ops whose name starts with `prefix`), raw and normalised:
    the figures the summary judges. What the raw target would take per case is in the guide's `need_block`."""
    tr = [x for x in fig_torch(recs) if x["op"].startswith(prefix)]
    if not tr:
        return ["\n**Against PyTorch CPU**: _no paired records (bench/<mechanism>/torch_baseline.py)._\n"]
    versions = sorted({str(r.get("torch")) for r in pick(recs, TORCH_BENCHMARK[prefix]) if r.get("torch")})
    md = [f"\n**Against PyTorch CPU.** Same op, same shapes, one thread, torch {', '.join(versions) or '–'}. Raw = "
          "torch time ÷ ctxpar time (medians); normalised = raw ÷ (ctxpar's SGEMM ÷ torch's SGEMM, each measured in "
          f"its own run of the comparison). Targets: raw ≥ {TARGETS['torch_raw']}×, normalised ≥ "
          f"{TARGETS['torch_norm']}×.\n\n"]
    lone = unpaired_torch(recs) if prefix == "SWA" else []
    if lone:
        md.append(f"Left out, no ctxpar case of the same shape in these records: {', '.join(lone)}.\n\n")
    md.append(table(["op", "case", "raw", "normalised", "ctxpar SGEMM", "torch SGEMM", "raw, ratio of minima"],
                    [[x["op"], x["case"], fmt(x["raw"]) + "×", fmt(x["norm"]) + "×", fmt(x["ctxpar_sgemm"]),
                      fmt(x["torch_sgemm"]), fmt(x["raw_of_minima"]) + "×" if isnum(x["raw_of_minima"]) else "–"]
                     for x in tr]))
    if any(raw_target_need(x) is not None for x in tr):
        md.append(f"\nWhat the raw target would take, case by case, as a fraction of ctxpar's SGEMM and of the "
                  f"core's FMA peak: {detail(need_block)}.\n")
    return md


def torch_need_block(recs, prefix):
    """A guide's block: per PyTorch case of one mechanism, the rate ctxpar would need for the raw target,
    by the same FLOP count on both sides, against ctxpar's SGEMM and the core's FMA peak."""
    rows = [x for x in fig_torch(recs) if x["op"].startswith(prefix) and raw_target_need(x) is not None]
    if not rows:
        return "_No PyTorch case with a FLOP count in these records._"
    count, outrun, skips = (
        ("the kernel formula, 4·D per visible query–key pair and query head forward, 10·D backward",
         ", softmax and exponentials included",
         " Torch's attention backward keeps the forward's weights instead of recomputing them (4 of the formula's "
         "5 products per pair), so the count credits it with work it skips.")
        if prefix == "SWA" else ("the forward's triangular model", "", ""))
    peak = fma_peak_gflops(recs)
    return tidy([
        f"What the raw target asks: {TARGETS['torch_raw']} × torch's rate, by the same FLOP count on both sides "
        f"({count}), as a fraction of ctxpar's same-run SGEMM and of the core's fp32 FMA peak (the ceilings run: "
        "FMAs in registers, no loads; no kernel on one thread can exceed 1 of it). At 1 × SGEMM or above the "
        f"target asks the kernel to outrun that SGEMM{outrun}; the SGEMM (Eigen's) is a reference, not the core's "
        "peak, and where the local kernels' table shows a ratio above 1 a kernel already does." + skips + "\n",
        table(["op", "case", "torch GFLOP/s", "÷ torch SGEMM", f"ctxpar GFLOP/s needed for {TARGETS['torch_raw']}×",
               "÷ ctxpar SGEMM", "÷ FMA peak", "raw target"],
              [[x["op"], x["case"], fmt(torch_gflops(x)), fmt(torch_gflops(x) / x["torch_sgemm"]),
                fmt(need_gflops(x)), fmt(raw_target_need(x)),
                fmt(raw_target_of_peak(x, peak)) if peak else "–",
                ("met" if x["raw"] >= TARGETS["torch_raw"] else "missed") +
                (", above SGEMM" if raw_target_need(x) >= 1 else ", below SGEMM")]
               for x in rows])])


def step_visible_pairs(r):
    """Query–key pairs inside the window of a step with no cache: query i sees min(i + 1, W) keys."""
    t, w = num(r, "queries"), num(r, "window")
    w = t if w == 0 else min(w, t)
    return w * (w + 1) // 2 + (t - w) * w


def torch_gflops(row):
    """Torch's rate by ctxpar's FLOP model of the same op: the SWA kernel formula, or the chunkwise
    forward model the torch baseline records as `forward_gflops` (None for a chunkwise forward +
    backward, which has no FLOP count). A row without `op` is a step forward."""
    r, op = row["rec"], row.get("op", "SWA step forward")
    if op.startswith("chunkwise ") and op.endswith(" forward"):
        return num(r, "forward_gflops")
    if op in ("SWA forward", "SWA backward"):
        return num(r, "forward_gflops" if op == "SWA forward" else "backward_gflops")
    if op in ("SWA step forward", "SWA step backward"):
        forward = op == "SWA step forward"
        flops = (4.0 if forward else 10.0) * num(r, "dim") * num(r, "q_heads") * step_visible_pairs(r)
        return flops / num(r, "forward_median_s" if forward else "backward_median_s") * 1e-9
    return None


def need_gflops(row):
    """GFLOP/s ctxpar needs to be TARGETS['torch_raw'] times as fast as torch's median."""
    rate = torch_gflops(row)
    return None if rate is None else TARGETS["torch_raw"] * rate


def raw_target_need(row):
    """need_gflops as a fraction of ctxpar's same-run SGEMM (None where there is no FLOP count)."""
    need = need_gflops(row)
    return None if need is None else need / row["ctxpar_sgemm"]


def fma_peak_gflops(recs):
    """The core's fp32 FMA peak from the ceilings run (None when the records have none)."""
    peak = [num(r, "gflops") for r in pick(recs, "ceilings") if r.get("case") == "fma_peak"]
    return max(peak) if peak else None


def raw_target_of_peak(row, peak):
    """need_gflops as a fraction of the core's FMA peak (None without a FLOP count or a peak)."""
    need = need_gflops(row)
    return None if need is None or not peak else need / peak




def section_hybrid(recs):
    hyb = sorted(pick(recs, "hybrid"), key=lambda r: num(r, "ranks"))
    md = ["\n## The hybrid stack (`ctxpar hybrid`)\n"]
    if not hyb:
        md.append("_No records (bench/results/hybrid_P*.json)._\n")
        return md
    md.append("Per layer, forward + backward of the context-parallel operator, first step, slowest rank; bytes of "
              "rank 0 against the formula; error against the P = 1 run. CP efficiency: see above.\n\n")
    rows = []
    for h in hyb:
        for lj in need(need(h, "steps")[0], "layers"):
            rows.append([need(h, "ranks"), need(h, "length"), need(lj, "layer"), need(lj, "policy"),
                         human_seconds(num(lj, "forward_seconds") + num(lj, "backward_seconds")),
                         human_bytes(num(lj, "bytes_received_rank0")), fmt(need(lj, "bytes_equal_formula_every_rank")),
                         fmt(num(lj, "max_error")), fmt(num(lj, "bound"))])
    md.append(table(["P", "L", "layer", "policy", "fwd+bwd", "recv/rank", "= formula", "max err vs P = 1", "bound"],
                    rows))
    return md


def section_expr(recs):
    md = ["\n## Expression templates\n"]
    ev = [r for r in pick(recs, "expr") if "instruction_ratio" in r]
    if not ev:
        md.append("_No callgrind records (bench/results/expr.json)._\n")
        return md
    md.append("Instructions of the fused expression kernel ÷ the hand-written loop (callgrind, repeatable on a "
              f"loaded machine); target ≤ {TARGETS['expr']}.\n\n")
    md.append(table(["case", "instruction ratio", "time ratio (medians)"],
                    [[need(r, "case"), fmt(num(r, "instruction_ratio")), fmt(r.get("time_ratio"))] for r in ev]))
    return md



PROJECTION_HEADING = "Projection to P = 8 … 1024 and L up to 1M tokens"
# Lengths and rank counts of the projection's tables (where a policy stops scaling is searched on a
# finer grid of P).
PROJECT_LS = (32768, 131072, 1048576)
PROJECT_PS = (8, 16, 64, 256, 1024)
# What each guide's projection block shows: its policies (keys of mechanisms()), the local compute they
# are set against, and which column of "which policy wins" (none, the SWA policies, or the GDN layer's
# summaries against the all-to-all).
PROJECT_FAMILIES = {
    "swa": (("swa_ag", "swa_ra", "swa_halo"), ("SWA",), "swa"),
    "chunkwise": (("gdn_gf", "gdn_sc"), ("GDN",), None),
    "heads": (("gdp_a2a", "gdn_a2a"), ("GDN",), "gdn"),
}
WINNER_CANDIDATES = {"swa": ("sliding-window attention", ["swa_ag", "swa_ra", "swa_halo"]),
                     "gdn": ("Gated DeltaNet layer (summaries vs all-to-all)", ["gdn_gf", "gdn_sc", "gdn_a2a"])}


def sgemm_rate(recs):
    return max([num(r, "gflops") for r in pick(recs, "ceilings") if str(r.get("case", "")).startswith("sgemm")],
               default=None)


def projection_model(recs):
    """What every projected figure uses: the fit of each collective kind and its factors on the cluster
    link, this machine's own α–β, the local compute rates and the accelerator's."""
    fits = fit_network(recs)
    sgemm = sgemm_rate(recs)
    # Compute rates: the measured kernels (a record without its rate field is an error, not a
    # fallback); the SGEMM only when no kernel record exists at all, and the report says so.
    rate_swa = median([x["fwd_gflops"] for x in fig_swa_kernel(recs)])
    rate_cw = median([x["gflops"] for x in fig_chunk_kernels(recs) if x["family"] == "gdn"])
    rates = {"swa": (rate_swa, "measured SWA local kernel (median forward GFLOP/s, bench/swa)") if rate_swa else
             (sgemm, "same-run SGEMM (no SWA kernel record)"),
             "cw": (rate_cw, "measured chunkwise kernel (GDN local forward GFLOP/s, triangular FLOP model, bench/chunkwise)") if rate_cw else
             (sgemm, "same-run SGEMM (no chunkwise kernel record)")}
    return {"fits": fits, "factors": collective_factors(fits), "rates": rates,
            "ab_here": {k: (f["alpha"], f["beta"]) for k, f in fits.items()} if len(fits) == 3 else None,
            "gpu": ACCELERATOR["flops"] * ACCELERATOR["efficiency"]}


def project_band(model, key):
    """The ± of a policy's projected time: the largest fit error of its collective kind (None unfitted)."""
    f = model["fits"].get(PROJECT_KIND[key])
    return f["error"] if f else None


def compute_rows(model, L, which):
    """Local compute per rank per layer at L, for each P: at this machine's measured rate and at the
    accelerator's, for SWA and/or the GDN chunkwise kernels."""
    rows = []
    for name in which:
        key, (rate, _) = ("swa_ag", model["rates"]["swa"]) if name == "SWA" else ("gdn_sc", model["rates"]["cw"])
        rows.append([f"compute, {name}, here ({fmt(rate)} GFLOP/s)"] +
                    [human_seconds(compute_flops(key, L, P) / (rate * 1e9)) if rate else "–" for P in PROJECT_PS])
        rows.append([f"compute, {'SWA' if name == 'SWA' else 'GDN chunkwise'}, accelerator"] +
                    [human_seconds(compute_flops(key, L, P) / model["gpu"]) for P in PROJECT_PS])
    return rows


def projection_block(recs, family):
    """A guide's block: the projection of one mechanism's policies, per L and P — communication time and
    bytes, buffers, compute beside them, this machine's α–β at one point, and which policy communicates
    least."""
    keys, compute, winners = PROJECT_FAMILIES[family]
    m = projection_model(recs)
    names = {k: f"{mech} / {pol}" for k, mech, pol in mechanisms()}
    cols = ["mechanism / policy"] + [f"P = {P}" for P in PROJECT_PS]
    md = ["Per rank and per layer, forward + backward, by the cluster model of "
          f"[docs/performance.md](performance.md#{anchor(PROJECTION_HEADING)}) (its reference shapes, links and "
          "accelerator; the ± is the fit error of the policy's collective kind). Each cell: communication time and, "
          "in brackets, bytes received per rank; `n/a`: the policy cannot run there. The compute rows: local compute "
          "at this machine's measured rate and at the assumed accelerator rate.\n"]
    for L in PROJECT_LS:
        rows, mem_rows = [], []
        for key in keys:
            cells, mem = [], []
            for P in PROJECT_PS:
                pr = project(key, L, P, cluster_ab(P, m["factors"]))
                if not pr["ok"]:
                    cells.append("n/a (P > heads)")
                    mem.append("n/a")
                    continue
                e = project_band(m, key)
                cells.append(f"{human_seconds(pr['time'])}" + (f" ±{e * 100:.0f}%" if e is not None else "") +
                             f" ({human_bytes(pr['recv'])})")
                mem.append(human_bytes(pr["mem"]))
            rows.append([names[key]] + cells)
            mem_rows.append([names[key]] + mem)
        md.append(f"\n**L = {L} tokens**\n\n")
        md.append(table(cols, rows + compute_rows(m, L, compute)))
        md.append(f"\nCommunication buffers per rank per layer at L = {L} (gathered axis, summaries, transpose "
                  "buffers):\n\n")
        md.append(table(cols, mem_rows))
    if m["ab_here"]:
        md.append("\nThe same at L = 131072, P = 8 with this machine's fitted α–β instead of the cluster's "
                  "(shared memory, if it had 8 free cores):\n\n")
        md.append(table(["mechanism / policy", "comm time"],
                        [[names[key], human_seconds(pr["time"]) if pr["ok"] else "n/a"]
                         for key in keys for pr in [project(key, 131072, 8, m["ab_here"])]]))
    if winners:
        title, cands = WINNER_CANDIDATES[winners]
        policy = {k: p for k, _, p in mechanisms()}
        wrows = []
        for L in (2048, 8192, 32768, 131072, 1048576):
            for P in (2, 4, 8, 16, 64, 1024):
                times = [(pr["time"], k) for k in cands for pr in [project(k, L, P, cluster_ab(P, m["factors"]))]
                         if pr["ok"] and pr["time"] is not None]
                wrows.append([L, P, policy[min(times)[1]] if times else "–"])
        md.append("\nWhich policy communicates least (cluster model):\n\n")
        md.append(table(["L", "P", title], wrows))
    return tidy(md)


def section_projection(recs, args, img_rel):
    m = projection_model(recs)
    fits, factors, rates, gpu = m["fits"], m["factors"], m["rates"], m["gpu"]
    sh = SHAPES
    md = [f"\n## {PROJECTION_HEADING}\n",
          "Per rank and per layer, forward + backward, from the formulas the byte counters are checked against "
          "(the hybrid stack and the mechanism benchmarks check them to the byte). Reference shapes (fp32): "
          f"SWA Hq = {sh['swa']['Hq']}, Hkv = {sh['swa']['Hkv']}, D = {sh['swa']['D']}, W = {sh['swa']['W']}; "
          f"GDN H = {sh['gdn']['H']}, K = V = {sh['gdn']['K']}; GDP H = {sh['gdp']['H']}, d = N = {sh['gdp']['d']}, "
          f"M = {sh['gdp']['M']}, G = {sh['gdp']['G']}. Network: the cluster links below (assumptions, with "
          "sources)" + ((" with each collective kind's fitted factors from the α–β section (its fitted α and β ÷ "
                         "the ping-pong's: " + ", ".join(f"{k} ×{fmt(fa)} per latency term, ×{fmt(fb)} per byte"
                                                         for k, (fa, fb) in factors.items() if k != "pingpong") +
                         "), and that kind's largest fit error as the band (±) of every time")
                        if len(fits) == 3 else " alone: no fitted collectives in these records, so no band") +
          ". Local compute time: flops from the FLOP models of docs/swa.md §6 and docs/chunkwise.md §8 at "
          f"{fmt(rates['swa'][0])} GFLOP/s ({rates['swa'][1]}) for SWA and "
          f"{fmt(rates['cw'][0])} GFLOP/s ({rates['cw'][1]}) for the chunkwise kernels — one CPU thread of this "
          "machine; a GPU computes 10–100× faster, which moves every crossover below to proportionally larger L/P.\n\n"]
    md.append(table(["cluster link", "α", "1/β", "source (assumption)"],
                    [[c["name"], human_seconds(c["alpha"]), f"{fmt(c['bw'] / 1e9)} GB/s", c["source"]]
                     for c in CLUSTER.values()]))
    md.append(f"\nCompute on the cluster side is an assumption too: {ACCELERATOR['name']} at "
              f"{fmt(ACCELERATOR['efficiency'])} of {fmt(ACCELERATOR['flops'] / 1e12)} TFLOP/s "
              f"({ACCELERATOR['source']}). The tables per policy at L = "
              f"{', '.join(str(L) for L in PROJECT_LS)} and P = {', '.join(str(P) for P in PROJECT_PS)} "
              "(communication time and bytes, buffers, compute, and which policy communicates least) are in the "
              f"guides: {detail('swa-projection', 'sliding-window attention')}, "
              f"{detail('chunkwise-projection', 'chunkwise summaries')}, "
              f"{detail('heads-projection', 'head all-to-all')}.\n")

    # Where each stops scaling
    md.append("\n### Where each mechanism stops scaling\n")
    md.append(f"\nCriteria, checked at P = 8, 16, 32, …, 1024: the policy cannot run (more ranks than heads); "
              f"its communication buffers exceed {human_bytes(MEMORY_LIMIT)} per rank per layer (a tenth of an 80 GB "
              "accelerator — the all-gather's O(L) memory); or its communication time exceeds its local compute "
              "time at the accelerator rate above (the summary gather's O(P) bytes and fold, the all-gather's O(L) "
              "bytes against O(L/P) work).\n\n")
    srows = []
    for key, mech, pol in mechanisms():
        for L in PROJECT_LS:
            reason = "scales to P = 1024 in this grid"
            for P in [8, 16, 32, 64, 128, 256, 512, 1024]:
                pr = project(key, L, P, cluster_ab(P, factors))
                if not pr["ok"]:
                    reason = f"P = {P}: more ranks than heads ({(SHAPES['gdp'] if key == 'gdp_a2a' else SHAPES['gdn'])['H']}): the all-to-all's head-count ceiling"
                    break
                tc = (compute_flops(key, L, P) + pr["extra_flops"]) / gpu
                if key in ("swa_ag", "swa_ra") and pr["mem"] > MEMORY_LIMIT:
                    reason = f"P = {P}: the gathered K/V buffer reaches {human_bytes(pr['mem'])} per rank per layer — the all-gather's O(L) memory"
                    break
                if tc and pr["time"] > tc:
                    what = {"gdn_gf": "the summary gather's O(P) bytes and fold",
                            "swa_ag": "the all-gather's O(L) bytes against O(L/P) compute",
                            "swa_ra": "the all-gather's O(L) bytes against O(L/P) compute"}.get(key, "communication")
                    reason = f"P = {P}: communication ({human_seconds(pr['time'])}) exceeds local compute ({human_seconds(tc)}) — {what}"
                    break
            srows.append([mech, pol, L, reason])
    md.append(table(["mechanism", "policy", "L", "first P in 8…1024 where it stops scaling (cluster network, accelerator compute)"], srows))
    # B/C crossover in tokens per rank
    sg = SHAPES["gdn"]
    rec = sg["H"] * (sg["K"] * sg["V"] + sg["K"] ** 2) * F32
    ch = (sg["H"] * (2 * sg["K"] + sg["V"] + 2) + sg["H"] * sg["V"]) * F32
    md.append(f"\nChunkwise-vs-all-to-all crossover in bytes (GDN, H = {sg['H']}, K = V = {sg['K']}): summaries move "
              f"`2·(P−1)·{human_bytes(rec)}` per rank, the all-to-all `2·(P−1)/P·(L/P)·{human_bytes(ch)}`; summaries "
              f"move fewer bytes once a rank holds more than `P·{fmt(rec / ch)}` tokens "
              f"(P = 8: {fmt(8 * rec / ch)}, P = 16: {fmt(16 * rec / ch)} tokens).\n")

    # Plot: comm vs compute at the largest L
    L = PROJECT_LS[-1]
    plot_rows = {k: [] for k, _, _ in mechanisms()}
    for key, _, _ in mechanisms():
        for P in PROJECT_PS:
            pr = project(key, L, P, cluster_ab(P, factors))
            if pr["ok"]:
                plot_rows[key].append((P, pr["time"], (compute_flops(key, L, P) + pr["extra_flops"]) / gpu))
    dat = os.path.join(args.img, "projection.dat")
    cols = [k for k, _, _ in mechanisms()]
    with open(dat, "w") as f:
        for P in PROJECT_PS:
            line = [str(P)]
            for k in cols:
                v = next((t for p, t, _ in plot_rows[k] if p == P), None)
                line.append(str(v) if v else "?")
            comp_swa = next((c for p, _, c in plot_rows["swa_ag"] if p == P), None)
            comp_gdn = next((c for p, _, c in plot_rows["gdn_sc"] if p == P), None)
            line += [str(comp_swa or "?"), str(comp_gdn or "?")]
            f.write(" ".join(line) + "\n")
    titles = [p for _, _, p in mechanisms()]
    band = lambda k: project_band(m, k)
    # Each curve with its band: the fit error of its collective kind (none without network records).
    plots = ", ".join(
        (f"'{dat}' u 1:{i + 2}:(${i + 2}*{max(0.0, 1 - band(k))}):(${i + 2}*{1 + band(k)}) w yerrorlines "
         f"t '{k}: {titles[i]} (±{band(k) * 100:.0f}%)'") if band(k) is not None else
        f"'{dat}' u 1:{i + 2} w lp t '{k}: {titles[i]}'" for i, k in enumerate(cols))
    ok = gnuplot(f"""set terminal pngcairo noenhanced size 640,420 font ',8'
set output '{args.img}/projection.png'
set datafile missing '?'
set logscale xy
set xrange [6:1400]
set xlabel 'ranks P'
set ylabel 'seconds per rank per layer (fwd+bwd)'
set key outside right font ',7'
set title 'L = {L} tokens: communication (cluster model) vs local compute'
plot {plots}, '{dat}' u 1:{len(cols) + 2} w l dt 2 lw 2 t 'compute SWA (accelerator)', '{dat}' u 1:{len(cols) + 3} w l dt 3 lw 2 t 'compute GDN (accelerator)'
""", os.path.join(args.img, "projection.png"))
    os.remove(dat)
    if ok:
        md.append(f"\n![projection]({img_rel}/projection.png)\n")
    return md


ALPHA_BETA_HEADING = "Latency–bandwidth (α–β) model, fitted per collective kind"


def section_alpha_beta(recs, fits):
    md = [f"\n## {ALPHA_BETA_HEADING}\n"]
    if not fits:
        md.append("_No network records (bench/results/network_P*.json): the fit awaits `scripts/bench`._\n")
        return md
    net = pick(recs, "network")
    ps = sorted({num(r, "ranks") for r in net})
    md.append(f"Measured by `bench/report/network_bench.cpp` at P = {', '.join(map(str, ps))} (medians; "
              f"shared-memory transport). Each kind is **fitted at P ≤ {CORES}**, where every rank has a core, and "
              f"**validated at every P**: above {CORES} ranks share the {CORES} cores, a waiting rank holds a core its "
              "peer needs, and the time grows faster than any α–β form — the last column says by how much. The "
              "projection uses the fit and its error at P ≤ "
              f"{CORES} as the band; the oversubscribed error is this machine's, not a cluster's. Least squares on "
              "relative error, α, β ≥ 0.\n\n")
    md.append(table(["kind", "model", "α", "1/β", "fitted points", f"largest error, P ≤ {CORES} (band)",
                     "largest error, every P"],
                    [[k, MODEL_TEXT[k], human_seconds(f["alpha"]), f"{fmt(1 / f['beta'] / 1e9)} GB/s" if f["beta"] else "∞",
                      f["fit_points"], f"{f['error'] * 100:.0f}%", f"{f['error_all'] * 100:.0f}%"]
                     for k, f in fits.items()]))
    md.append(f"\nEvery measured point against its kind's model, and the plot: {detail('hybrid-network')}.\n")
    return md


def network_block(recs, img=None):
    """docs/hybrid.md: every collective the network benchmark timed against its kind's fitted α–β model,
    and the plot (redrawn when `img` is given)."""
    fits = fit_network(recs)
    if not fits:
        return "_No network records (bench/results/network_P*.json)._"
    ps = sorted({num(r, "ranks") for r in pick(recs, "network")})
    rows, dat = [], {}
    for k, f in fits.items():
        for p, m, t, pr in f["points"]:
            rows.append([k, p, human_bytes(m), human_seconds(t), human_seconds(pr), fmt(t / pr)])
            dat.setdefault(k, []).append((p, t / pr, m))
    if img:
        os.makedirs(img, exist_ok=True)
        files = []
        for k, pts in dat.items():
            f = os.path.join(img, f"valid_{k}.dat")
            write_data(f, sorted(pts))
            files.append((k, f))
        gnuplot("set terminal pngcairo noenhanced size 560,360 font ',9'\n"
                f"set output '{img}/model_validation.png'\nset logscale y\nset xlabel 'ranks P'\n"
                "set ylabel 'measured / fitted model'\nset key top left\n"
                "set title 'alpha-beta model per collective kind vs measured'\n"
                "plot " + ", ".join(f"'{f}' u 1:2 w p pt {5 + 2 * i} t '{k}'" for i, (k, f) in enumerate(files)) +
                ", 1 w l dt 2 t 'exact'\n", os.path.join(img, "model_validation.png"))
        for _, f in files:
            os.remove(f)
    return tidy([f"Measured by `bench/report/network_bench.cpp` at P = {', '.join(map(str, ps))} (medians; "
                 "shared-memory transport); each kind's model is fitted at the rank counts where every rank has a "
                 f"core ([docs/performance.md](performance.md#{anchor(ALPHA_BETA_HEADING)}) gives the fits). Every "
                 "point against its kind's fitted model:\n",
                 table(["kind", "P", "m", "measured (median)", "fitted model", "measured ÷ model"], rows),
                 f"\n![model validation]({GUIDE_IMG}/model_validation.png)\n"])


def section_isa(recs):
    md = ["\n## Default build against -march=native\n"]
    isa = fig_isa(recs)
    if not isa:
        return md + ["_No record (bench/results/isa.json): run `scripts/bench-isa --json bench/results/isa.json`._\n"]
    first = isa[0]["rec"]
    md.append(f"The `ctxpar` tool built from the same source by `scripts/bench-isa` (Release): with no "
              f"architecture flag, where the host kernels pick their instruction set at run time "
              f"(`{need(first, 'default_host_isa')}` here), and with `-march=native` "
              f"(`{need(first, 'native_host_isa')}`). One rank, one thread, CPU `{need(first, 'cpu')}`; "
              f"each call's figure is the fastest of `--repeat 5`, the builds run in alternation for "
              f"{need(first, 'rounds')} rounds, and the table gives medians over rounds. Target: the default "
              f"build within {fmt(TARGETS['isa_default'])}× of the native one. A third build, `-march=native "
              "-mtune=generic`, separates what the instruction sets give from what the compiler's tuning for "
              "this CPU gives.\n\n")
    rows = []
    for x in isa:
        r = x["rec"]
        torch = (f"{human_seconds(num(r, 'torch_s'))} (torch {need(r, 'torch')}): "
                 f"{fmt(num(r, 'default_speedup_over_torch'))}× / {fmt(num(r, 'native_speedup_over_torch'))}×"
                 + (f"; default build's rounds {fmt(num(r, 'default_speedup_over_torch_lowest'))}–"
                    f"{fmt(num(r, 'default_speedup_over_torch_highest'))}×"
                    if "default_speedup_over_torch_lowest" in r else "")
                 if "torch_s" in r else "–")
        tuned = (f"{human_seconds(num(r, 'native_tune_generic_s'))} "
                 f"({fmt(num(r, 'default_over_native_tune_generic'))})" if "native_tune_generic_s" in r else "–")
        rows.append([x["call"], human_seconds(num(r, "default_s")), human_seconds(num(r, "native_s")), fmt(x["ratio"]),
                     tuned, torch])
    md.append(table(["call", "default build", "`-march=native`", "default ÷ native",
                     "`-march=native -mtune=generic` (default ÷ it)",
                     "PyTorch-CPU, same shape, same rounds: ctxpar speed-up default / native"], rows))
    md.append("\nShapes: `ctxpar swa` T = 4096, H = 8, D = 64, W = 1024 (PyTorch: the blockwise formulation of "
              "the SWA comparison, `bench/isa/torch_swa_step.py`); `ctxpar chunkwise --family gdn` T = 8192, "
              "H = 4, K = V = 128, chunk 64.\n")
    return md


def section_failed(md, name, e):
    """A gnuplot or layout problem in one section must not stop the report; a record that lacks a
    key the figures need must (RecordKeyError is a KeyError: re-raised)."""
    if isinstance(e, KeyError):
        raise e
    print(f"render.py: section '{name}' skipped: {type(e).__name__}: {e}", file=sys.stderr)
    md.append(f"\n_The {name} section could not be rendered ({type(e).__name__}: {e})._\n")



GROWTH_HEADING = "Growth with T, W and P (distributed step, both layouts)"

# The detail the report leaves to the guides: (guide under docs/, block name, heading of the guide
# section that holds the block, generator). A generator takes the records and, where the block has plots,
# the folder to redraw them in (guides.py --plots); given None it only writes the text, so checking the
# committed guides never depends on gnuplot. The report links to each block through its heading.
GUIDE_BLOCKS = (
    ("swa.md", "swa-torch-need", "What 2× PyTorch would take", lambda recs, img: torch_need_block(recs, "SWA")),
    ("swa.md", "swa-step-profile", "Where the step's time goes", lambda recs, img: step_profile_block(recs, "SWA")),
    ("swa.md", "swa-portable", "Portable kernels on the host", lambda recs, img: portable_block(recs)),
    ("swa.md", "swa-per-token", GROWTH_HEADING, lambda recs, img: per_token_block(recs, "A: SWA")),
    ("swa.md", "swa-growth-sweeps", GROWTH_HEADING, lambda recs, img: growth_block(recs, img)),
    ("swa.md", "swa-projection", "Projected to a cluster", lambda recs, img: projection_block(recs, "swa")),
    ("chunkwise.md", "chunkwise-step-profile", "Where the step's time goes",
     lambda recs, img: step_profile_block(recs, "chunkwise GDN")),
    ("chunkwise.md", "chunkwise-cp-profile", "Where the time of the P = 2 call goes",
     lambda recs, img: cp_profile_block(recs, "B: chunkwise GDN")),
    ("chunkwise.md", "chunkwise-summaries", "Summaries: GatherFold against ScanCompose",
     lambda recs, img: summaries_block(recs)),
    ("chunkwise.md", "chunkwise-torch-need", "What 2× PyTorch would take",
     lambda recs, img: torch_need_block(recs, "chunkwise")),
    ("chunkwise.md", "chunkwise-projection", "Projected to a cluster",
     lambda recs, img: projection_block(recs, "chunkwise")),
    ("heads.md", "heads-step-profile", "Where the step's time goes",
     lambda recs, img: step_profile_block(recs, "heads GDP")),
    ("heads.md", "heads-pack-rounds", "Pack / unpack vs the same-run triad (target ≥ 0.5)",
     lambda recs, img: pack_block(recs)),
    ("heads.md", "heads-crossover", "Mechanism B against C, end to end", lambda recs, img: crossover_block(recs, img)),
    ("heads.md", "heads-projection", "Projected to a cluster", lambda recs, img: projection_block(recs, "heads")),
    ("hybrid.md", "hybrid-network", "Collectives on this machine against the α–β model",
     lambda recs, img: network_block(recs, img)),
)


def section_intro(recs, args):
    machine = next((r["machine"] for r in pick(recs, "ceilings") if isinstance(r.get("machine"), dict)), {})
    return (f"Generated by `{args.command}` from the JSON records in `bench/results/` (renderer: "
            "`bench/report/render.py`); do not edit by hand — rerun the command.\n\n"
            f"**What was measured.** One shared machine with {CORES} cores (CPU `{machine.get('cpu', '?')}`; build, "
            "backend and ceilings under [Machine and ceilings](#machine-and-ceilings)), one thread per rank unless a "
            "section says otherwise. Every figure is a ratio measured side by side in one run, or a model fitted "
            f"to those measurements, by the [Definitions](#{anchor('Definitions (every figure below, every benchmark)')}). "
            "Absolute times drift from run to run on a shared machine, ratios much less; each section gives the load "
            "average of its run.\n\n"
            f"**How to reproduce.** `{args.command}` builds and runs every benchmark (tens of minutes here; "
            "`CTXPAR_BENCH_QUICK=1` runs the short versions), writes `bench/results/*.json`, and renders this page "
            f"and the guides' measured-figure blocks; `{args.command} --render-only` renders both again from the "
            "records already there and runs nothing. `scripts/bench-isa` makes the default-build record. Each section "
            "names the benchmark behind it.\n\n"
            "**How to read it.** The summary gives every target's verdict, the worst case deciding. Then one section "
            "per mechanism (A, B, C) with its headline figures, and the measures that span the mechanisms (CP "
            "efficiency, long context, the hybrid stack, the default build, expression templates, the network model "
            "and the projection). The detail behind a headline (profiles, sweeps, every case and round, the "
            "projection per policy) is in generated blocks of the guides (docs/swa.md, docs/chunkwise.md, "
            "docs/heads.md, docs/hybrid.md), rendered from the same records by the same definitions; each section "
            "links to its own.\n")


def render(recs, args):
    os.makedirs(args.img, exist_ok=True)
    img_rel = os.path.relpath(args.img, os.path.dirname(os.path.abspath(args.out)))
    md = ["# Performance report\n", section_intro(recs, args),
          "\n## Summary: every target of the bar\n",
          "Verdicts by the rule in [Definitions](#definitions-every-figure-below-every-benchmark): each case's "
          "median over its repeats, and every valid case in scope must meet the target.\n\n",
          table(["target", "measure", "bar", "figure (worst case)", "verdict", "section", "note"], summary_rows(recs)),
          "\n" + DEFINITIONS]
    fits = fit_network(recs)
    for name, fn in (("machine", lambda: section_machine(recs)),
                     ("SWA", lambda: section_swa(recs, args.img, img_rel)),
                     ("chunkwise", lambda: section_chunkwise(recs, args.img, img_rel)),
                     ("heads", lambda: section_heads(recs, args.img, img_rel)),
                     ("CP efficiency", lambda: section_cp(recs, args.img, img_rel)),
                     ("long context", lambda: section_longctx(recs, args.img, img_rel)),
                     ("hybrid", lambda: section_hybrid(recs)),
                     ("default build", lambda: section_isa(recs)),
                     ("expressions", lambda: section_expr(recs)),
                     ("alpha-beta", lambda: section_alpha_beta(recs, fits)),
                     ("projection", lambda: section_projection(recs, args, img_rel))):
        try:
            md += fn()
        except Exception as e:  # noqa: BLE001 — KeyError re-raised by section_failed
            section_failed(md, name, e)
    md.append(f"\n---\nRecords read: {len(recs)} from {len(set(r['_file'] for r in recs))} files "
              "(`bench/results/*.json`, every field of every record).\n")
    return "\n".join(md)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="bench/results")
    ap.add_argument("--out", default="docs/performance.md")
    ap.add_argument("--img", default="docs/img")
    ap.add_argument("--command", default="scripts/bench")
    args = ap.parse_args(argv)
    recs = load_records(args.results)
    text = render(recs, args)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"render.py: wrote {args.out} ({len(recs)} records)")


if __name__ == "__main__":
    main()
