#!/usr/bin/env python3
"""Renders docs/performance.md from the JSON records in bench/results/ (python3 standard library
only; PNG plots through gnuplot when it is installed). Every number in the report comes from a
record or from a formula applied to records; the only constants are the design targets
(../shared/design/50-performance.md), the reference layer shapes of the projection, and the
cluster latency/bandwidth assumptions, all printed with the report.

usage: render.py --results bench/results --out docs/performance.md --img docs/img
"""
import argparse
import glob
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

# ----------------------------------------------------------------------------------------------
# Loading


def load_records(results):
    recs = []
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            print(f"render.py: skipping {path}: {e}", file=sys.stderr)
            continue
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


def with_key(recs, key, benchmark=None):
    return [r for r in recs if key in r and isinstance(r[key], (int, float)) and not isinstance(r[key], bool)
            and (benchmark is None or r.get("benchmark") == benchmark)]


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


# ----------------------------------------------------------------------------------------------
# α–β model


def fit_alpha_beta(points):
    """Least squares t = α + n·β over (n bytes, t seconds), weighted by 1/t² (relative error), so
    the latency of small messages counts as much as the bandwidth of large ones."""
    w = [1.0 / (t * t) for _, t in points]
    sw = sum(w)
    sx = sum(wi * n for wi, (n, _) in zip(w, points))
    sy = sum(wi * t for wi, (_, t) in zip(w, points))
    sxx = sum(wi * n * n for wi, (n, _) in zip(w, points))
    sxy = sum(wi * n * t for wi, (n, t) in zip(w, points))
    den = sw * sxx - sx * sx
    beta = (sw * sxy - sx * sy) / den
    alpha = (sy - beta * sx) / sw
    return max(alpha, 0.0), beta


def log2ceil(p):
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def t_allgather(a, b, p, m):
    """Per-rank contribution m bytes: ⌈log2 P⌉ latency terms, (P−1)·m bytes through each rank."""
    return log2ceil(p) * a + (p - 1) * m * b


def t_alltoall(a, b, p, m):
    """Block m bytes per destination: P−1 pairwise exchanges."""
    return (p - 1) * (a + m * b)


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


def cluster_ab(p):
    c = CLUSTER["intra"] if p <= 8 else CLUSTER["inter"]
    return c["alpha"], 1.0 / c["bw"]


# ----------------------------------------------------------------------------------------------
ACCELERATOR = {"name": "an A100-class GPU", "flops": 156e12, "efficiency": 0.4,
               "source": "NVIDIA A100 datasheet: 156 TFLOP/s dense TF32 tensor-core peak; 40% is the share "
                         "FlashAttention-2-class kernels reach (50-performance.md cites 0.5–0.7 for the best)"}
MEMORY_LIMIT = 8 * 2**30

# Reference layer shapes for the projection (fp32 activations, as the library's float path)

SHAPES = {
    "swa": {"Hq": 32, "Hkv": 8, "D": 128, "W": 4096},
    "gdn": {"H": 16, "K": 128, "V": 128, "chunk": 64},
    "gdp": {"H": 16, "d": 128, "N": 128, "M": 2, "G": 1, "chunk": 64},
}
F32 = 4


def gdn_chunk_flops(c, k, v):
    # 21-chunkwise-kernels.md §5 model, as in gated_delta_rule.hpp gated_delta_chunk_flops
    return (c * c * k + c ** 3 / 3 + 2 * c * c * v + 2 * c * c * k + 2 * c * c * k + 2 * c * k * v
            + 2 * c * k * v + 2 * c * c * v + 2 * c * k * v + 2 * c * k * k + 2 * k ** 3)


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


def project(key, L, P, ab):
    """Per rank per layer, forward + backward: bytes received, communication time, transient
    communication memory, extra (fold) flops, whether the mechanism can run at all."""
    a, b = ab
    s = SHAPES
    t = L / P
    if key.startswith("swa"):
        sh = s["swa"]
        rec = 2 * sh["Hkv"] * sh["D"] * F32 + 16
        g = 2 * sh["Hkv"] * sh["D"] * F32
        if key in ("swa_ag", "swa_ra"):
            recv = (L - t) * rec + t * g * (P - 1)
            time_ = t_allgather(a, b, P, t * rec) + t_allgather(a, b, P, t * g)
            mem = L * (rec + g)
        else:
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
    per_in = t * (c_in / P) * F32
    per_out = t * (c_out / P) * F32
    recv = 2 * (P - 1) * (per_in + per_out)
    time_ = 2 * (t_alltoall(a, b, P, per_in) + t_alltoall(a, b, P, per_out))
    return {"recv": recv, "time": time_, "mem": L * (c_in + c_out) / P * F32, "extra_flops": 0, "ok": True}


def compute_flops(key, L, P):
    """Local flops per rank per layer, forward + backward (backward = 2.5× forward for attention,
    2× for the chunkwise kernels; the design's FLOP models)."""
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
# Targets of 50-performance.md


def median(xs):
    return statistics.median(xs) if xs else None


def isnum(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# String fields a benchmark may write to explain its own figure; the report shows them verbatim.
REASON_KEYS = ("reason", "reason_missed", "why_missed", "why", "analysis", "note")


def record_reasons(rs):
    out = []
    for r in rs:
        for k in REASON_KEYS:
            v = r.get(k)
            if isinstance(v, str) and v.strip() and v.strip() not in out:
                out.append(v.strip())
    return "; ".join(out)


def run_facts(rs):
    """Where the figures come from: files and the load average the records carry."""
    files = sorted({r.get("_file", "?") for r in rs})
    loads = [r["machine"]["load_average"] for r in rs if isinstance(r.get("machine"), dict)
             and isnum(r["machine"].get("load_average")) and r["machine"]["load_average"] >= 0]
    s = f"{len(rs)} record(s) in {', '.join(files)}"
    if loads:
        s += (f"; load average {fmt(min(loads))}" if min(loads) == max(loads) else
              f"; load average {fmt(min(loads))}–{fmt(max(loads))}") + " at the start of the run(s) (2 cores)"
    return s


def span(rs, key):
    vs = [r[key] for r in rs if isnum(r.get(key))]
    if not vs:
        return None
    return fmt(vs[0]) if min(vs) == max(vs) else f"{fmt(min(vs))}–{fmt(max(vs))}"


def target_rows(recs, sgemm):
    """One row per target. The reason column is made only of what the records say: a benchmark's
    own explanation (any of REASON_KEYS) when it wrote one, then the figures around the ratio
    (same-run ceilings, rates, times) and where they come from."""
    rows = []

    def add(what, measure, target, values, met_fn, where, rs, detail=""):
        if not values:
            rows.append([what, measure, target, "not measured", "–", where + " (no record in bench/results/)"])
            return
        lo, hi, med = min(values), max(values), median(values)
        met = met_fn(values)
        shown = fmt(med) if len(values) == 1 else f"{fmt(med)} (median of {len(values)}; {fmt(lo)}–{fmt(hi)})"
        verdict = "**met**" if met else "**missed**"
        parts = [p for p in (record_reasons(rs), detail, run_facts(rs) if rs else "") if p]
        rows.append([what, measure, target, shown, verdict, "; ".join(parts)])

    swa_k = pick(recs, "swa", kind="local_kernel")
    swa_detail = (f"kernel forward {span(swa_k, 'forward_gflops')} GFLOP/s, backward {span(swa_k, 'backward_gflops')} "
                  f"GFLOP/s against the SGEMM measured around each case, {span(swa_k, 'sgemm_gflops')} GFLOP/s "
                  f"(FLOP formulas {span_str(swa_k, 'forward_flop_formula')} / {span_str(swa_k, 'backward_flop_formula')})")
    add("SWA local forward (fp32, D = 64/128, W = 512–4096)", "GFLOP/s ÷ same-run SGEMM", "≥ 0.5",
        [r["forward_ratio"] for r in swa_k if isnum(r.get("forward_ratio"))], lambda v: median(v) >= 0.5, "bench/swa",
        swa_k, swa_detail)
    add("SWA backward", "GFLOP/s ÷ SGEMM", "≥ 0.35",
        [r["backward_ratio"] for r in swa_k if isnum(r.get("backward_ratio"))], lambda v: median(v) >= 0.35,
        "bench/swa", swa_k, swa_detail)
    cw = [r for r in recs if r.get("benchmark") == "chunkwise"]
    cw_k = [r for r in cw if isnum(r.get("forward_ratio", r.get("ratio_to_sgemm")))]
    gdn_k = next((r for r in cw if r.get("kind") == "local_kernel" and "chunkwise_median_s" in r), None)
    cw_detail = "" if gdn_k is None else (
        f"T = {gdn_k.get('tokens')}, H = {gdn_k.get('heads')}, K = V = {gdn_k.get('key_dim')}, chunk "
        f"{gdn_k.get('chunk')}: chunkwise {human_seconds(gdn_k['chunkwise_median_s'])} vs token recurrence "
        f"{human_seconds(gdn_k.get('recurrence_median_s'))} (medians, same run), {fmt(gdn_k.get('gflops'))} GFLOP/s "
        f"by the FLOP model ({gdn_k.get('flop_model')}) against the same-run SGEMM {fmt(gdn_k.get('sgemm_gflops'))} GFLOP/s")
    add("chunkwise GDN local forward (K = V = 128, chunk 64)", "GFLOP/s ÷ SGEMM", "≥ 0.4",
        [r.get("forward_ratio", r.get("ratio_to_sgemm")) for r in cw_k],
        lambda v: median(v) >= 0.4, "bench/chunkwise", cw_k, cw_detail)
    cw_s = [r for r in cw if any(isnum(r.get(k)) for k in ("speedup_vs_recurrence", "speedup"))]
    add("chunkwise vs token-by-token recurrence (GDN through the CP driver, one rank)", "speed-up",
        "≥ 5× at K = V = 128",
        [r[k] for r in cw_s for k in ("speedup_vs_recurrence", "speedup") if isnum(r.get(k))],
        lambda v: median(v) >= 5, "bench/chunkwise", cw_s, cw_detail)
    # The single-device forward per chunk size, next to its FLOP-count ceiling (every chunkwise flop
    # at the same-run SGEMM rate against the recurrence at its measured rate).
    cw_l = [r for r in cw if isnum(r.get("local_speedup_vs_recurrence"))]
    if cw_l:
        add("chunkwise vs token-by-token recurrence (GDN single-device forward, best chunk size)", "speed-up",
            "≥ 5× at K = V = 128", [max(r["local_speedup_vs_recurrence"] for r in cw_l)],
            lambda v: median(v) >= 5, "bench/chunkwise", cw_l,
            "per chunk size: " + ", ".join(
                f"C = {r.get('chunk')}: {fmt(r['local_speedup_vs_recurrence'])}× (ceiling "
                f"{fmt(r.get('speedup_ceiling'))}×)" for r in sorted(cw_l, key=lambda r: r.get("chunk", 0))))
    # PyTorch baselines: one row per mechanism and speed-up field (<mechanism>_torch.json records,
    # or a speed-up field in a mechanism's own records).
    torch_groups = {}
    for r in recs:
        b = str(r.get("benchmark", ""))
        for k, v in r.items():
            if isnum(v) and ("speedup" in k and (b.endswith("_torch") or "torch" in k)):
                torch_groups.setdefault((b[:-6] if b.endswith("_torch") else b, k), []).append(r)
    if not torch_groups:
        add("vs PyTorch CPU, same op, same threads", "speed-up", "≥ 2×", [], None,
            "bench/<mechanism>/torch_baseline.py → bench/results/<mechanism>_torch.json", [])
    for (mech, key), rs in sorted(torch_groups.items()):
        allr = [r for r in recs if r.get("benchmark") in (mech + "_torch",)] or rs
        ceiling = [r for r in allr if "sgemm" in str(r.get("case", "")).lower() and isnum(r.get("gflops"))]
        versions = sorted({str(r.get("torch")) for r in allr if r.get("torch")})
        threads = sorted({str(r.get("threads")) for r in allr if r.get("threads") is not None})
        rates = [f"{k} {span(rs, k)}" for k in sorted({k for r in rs for k in r if k.endswith("gflops")
                                                         and "sgemm" not in k}) if span(rs, k)]
        if not ceiling:
            ceiling = [{"gflops": r["torch_sgemm_gflops"]} for r in allr if isnum(r.get("torch_sgemm_gflops"))]
        detail = ", ".join(([f"torch {', '.join(versions)}"] if versions else []) +
                           ([f"{', '.join(threads)} thread(s)"] if threads else []) +
                           ([f"torch SGEMM {span(ceiling, 'gflops')} GFLOP/s in the same run"] if ceiling else []))
        parts = ([detail] if detail else []) + ([f"torch rates (GFLOP/s): {', '.join(rates)}"] if rates else [])
        parts.append("per case: " + ", ".join(f"{r.get('case')}: {fmt(r[key])}" for r in rs))
        detail = "; ".join(parts)
        add(f"vs PyTorch CPU — {mech} ({key})", "speed-up of ctxpar over torch", "≥ 2×",
            [r[key] for r in rs], lambda v: median(v) >= 2, f"bench/{mech}", rs, detail)
    eff_rs = [r for r in recs if r.get("benchmark") in ("swa", "chunkwise", "heads", "hybrid")
              and any(isnum(r.get(k)) for k in ("cp_efficiency", "efficiency"))]
    eff = [r[k] for r in eff_rs for k in ("cp_efficiency", "efficiency") if isnum(r.get(k))]
    eff_detail = "per record: " + ", ".join(
        f"{r.get('benchmark')} {r.get('case')} {fmt(r.get('cp_efficiency', r.get('efficiency')))}"
        + (f" (load {fmt(r['machine']['load_average'])})" if isinstance(r.get("machine"), dict)
           and isnum(r["machine"].get("load_average")) else "") for r in eff_rs)
    ceil_rs = [r for r in eff_rs if isnum(r.get("machine_efficiency_ceiling"))]
    if ceil_rs:
        # The machine's own limit from the same run: SGEMM on every rank at once vs rank 0 alone.
        eff_detail += ("; this machine's ceiling for a compute-bound operator with no communication "
                       "(SGEMM on both ranks at once ÷ alone, measured around each case): " + ", ".join(
                           f"{r.get('benchmark')} {r.get('case')} {fmt(r['machine_efficiency_ceiling'])}"
                           + (f" (efficiency ÷ ceiling {fmt(r['efficiency_vs_machine_ceiling'])})"
                              if isnum(r.get("efficiency_vs_machine_ceiling")) else
                              f" (its T(1): {r['t1_method']})" if r.get("t1_method") else "")
                           for r in ceil_rs))
    add("CP efficiency at 2 ranks × 1 thread", "T(1) / (2·T(2))", "≥ 0.9", eff, lambda v: median(v) >= 0.9,
        "bench/<mechanism>", eff_rs, eff_detail)
    ratio_recs, ratio_src, off, not_applicable = [], [], [], []
    for r in recs:
        for meas, form in (("allgather_bytes_received", "allgather_formula"), ("halo_bytes_received", "halo_formula"),
                           ("bytes_received", "bytes_formula_value"), ("bytes_sent_counted", "bytes_sent_formula"),
                           ("bytes_sent_max", "bytes_sent_formula_max"),
                           ("bytes_received_max", "bytes_received_formula_max")):
            if meas == "bytes_sent_counted" and isnum(r.get("bytes_ratio_formula")) and r["bytes_ratio_formula"] < 0:
                # the record marks its closed formula as not applicable (repeated key groups, uneven heads)
                not_applicable.append(f"{r.get('case')} P={r.get('machine', {}).get('ranks', '?')}")
                continue
            if isnum(r.get(meas)) and isnum(r.get(form)) and r[form]:
                ratio_recs.append(r[meas] / r[form])
                if r not in ratio_src:
                    ratio_src.append(r)
                if r[meas] != r[form]:
                    off.append(f"{r.get('benchmark')} {r.get('case')}: {meas} {r[meas]} vs {form} {r[form]}")
    hyb = pick(recs, "hybrid")
    for h in hyb:
        for st in h.get("steps", []) if isinstance(h.get("steps"), list) else []:
            for lj in st.get("layers", []):
                if isnum(lj.get("formula_received_rank0")) and lj["formula_received_rank0"] > 0:
                    ratio_recs.append(lj["bytes_received_rank0"] / lj["formula_received_rank0"])
                    if h not in ratio_src:
                        ratio_src.append(h)
                    if lj["bytes_received_rank0"] != lj["formula_received_rank0"]:
                        off.append(f"hybrid P={h.get('ranks')} {lj.get('layer')}")
    by_bench = {}
    for r in ratio_src:
        by_bench[r.get("benchmark")] = by_bench.get(r.get("benchmark"), 0) + 1
    add("bytes per rank (counters)", "÷ formula", "exactly 1.0", ratio_recs,
        lambda v: all(abs(x - 1.0) == 0 for x in v), "bench/swa, bench/chunkwise, bench/heads, bench/crossover, ctxpar hybrid",
        ratio_src, ("differing: " + "; ".join(off[:8])) if off else
        ("counter = formula in every record: " + ", ".join(f"{b} {n}" for b, n in sorted(by_bench.items()))) +
        (f"; {len(not_applicable)} heads record(s) say their closed formula does not apply (bytes_ratio_formula "
         f"< 0: {', '.join(sorted(set(not_applicable)))}) and are left out" if not_applicable else ""))
    halo = [r for r in recs if r.get("benchmark") == "swa" and isnum(r.get("halo_bytes_received"))
            and isnum(r.get("allgather_bytes_received")) and r["allgather_bytes_received"] > 0]
    rows_h, design = [], []
    for r in halo:
        L, W, P = r.get("length"), r.get("window"), r.get("ranks", 2)
        if r.get("halo_formula") and r.get("allgather_formula") and isnum(L) and isnum(W):
            # rank 0's measured received-bytes ratio over the same ratio from the two formulas
            rows_h.append((r["halo_bytes_received"] / r["allgather_bytes_received"]) /
                          (r["halo_formula"] / r["allgather_formula"]))
            design.append(f"L={L}, W={W}: {fmt(r['halo_bytes_received'] / r['allgather_bytes_received'])} "
                          f"vs (W−1+s)/L = {fmt((W - 1 + (L - W + 1) / P) / L)}")
    add("HaloKV bytes ÷ AllGatherKV bytes", "measured ratio ÷ formula ratio (rank 0)", "≈ (W−1+s)/L", rows_h,
        lambda v: all(abs(x - 1) < 1e-12 for x in v), "bench/swa", halo,
        "measured received-bytes ratio vs the design's held-keys ratio: " + "; ".join(design))
    expr_rs = [r for r in recs if r.get("benchmark") == "expr" and isnum(r.get("instruction_ratio"))]
    add("expression-template kernel vs hand-written loop", "instructions (callgrind)", "≤ 1.03",
        [r["instruction_ratio"] for r in expr_rs], lambda v: max(v) <= 1.03, "bench/expr", expr_rs,
        "per case: " + ", ".join(f"{r.get('case')}: {fmt(r['instruction_ratio'])}" for r in expr_rs))
    heads_rs = [r for r in recs if r.get("benchmark") == "heads"
                and any(isnum(r.get(k)) for k in ("pack_ratio_to_triad", "ratio_to_triad", "triad_ratio"))]
    heads = [r[k] for r in heads_rs for k in ("pack_ratio_to_triad", "ratio_to_triad", "triad_ratio") if isnum(r.get(k))]
    add("head all-to-all pack/unpack", "GB/s ÷ same-run triad", "≥ 0.5", heads, lambda v: median(v) >= 0.5,
        "bench/heads", heads_rs,
        f"pack/unpack {span(heads_rs, 'gbps')} GB/s against the same-run triad {span(heads_rs, 'triad_gbps')} GB/s")
    mem = [r for r in recs if r.get("benchmark") == "chunkwise" and r.get("kind") == "summaries"
           and isnum(r.get("gather_summary_memory_bytes")) and isnum(r.get("scan_summary_memory_bytes"))
           and r.get("family") == "gdn" and isnum(r.get("ranks"))]
    at8 = [r["gather_summary_memory_bytes"] / r["scan_summary_memory_bytes"] for r in mem if r.get("ranks") == 8]
    scan_const = len({r["scan_summary_memory_bytes"] for r in mem}) == 1
    by_p = sorted((r["ranks"], r["gather_summary_memory_bytes"]) for r in mem)
    gather_grows = all(b[1] > a[1] for a, b in zip(by_p, by_p[1:]))
    add("ScanCompose vs GatherFold at P = 8", "summary memory, GatherFold ÷ ScanCompose", "O(P) vs O(1)", at8,
        lambda v: scan_const and gather_grows, "bench/chunkwise", mem,
        f"ScanCompose holds {span(mem, 'scan_summary_memory_bytes')} bytes at P = "
        f"{', '.join(str(p) for p, _ in by_p)}; GatherFold grows from {human_bytes(by_p[0][1]) if by_p else '–'} "
        f"to {human_bytes(by_p[-1][1]) if by_p else '–'}")
    return rows


def span_str(rs, key):
    vs = sorted({str(r[key]) for r in rs if isinstance(r.get(key), str)})
    return "/".join(f"`{v}`" for v in vs) if vs else "–"



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


def crossover_section(recs, img, img_rel):
    md = ["\n## Mechanism B vs C: the chunkwise-summary vs head-all-to-all crossover, measured\n"]
    cx = [r for r in recs if r.get("benchmark") == "crossover" and isnum(r.get("tokens_per_rank"))
          and isnum(r.get("ranks")) and r.get("mechanism") in ("B", "C") and isinstance(r.get("family"), str)]
    if not cx:
        md.append("_No records (bench/results/crossover.json; `bench/crossover/run.sh BUILD_DIR`)._\n")
        return md
    fams = sorted({r.get("family") for r in cx})
    shapes = []
    for f in fams:
        r = next(x for x in cx if x.get("family") == f)
        shapes.append(f"{f}: H = {r.get('heads')}, K = {r.get('key_dim')}, V = {r.get('value_dim')}, "
                      f"householder steps {r.get('householder')}, chunk {r.get('chunk')}")
    ranks = sorted({r["ranks"] for r in cx})
    md.append("`bench/crossover` runs one layer's forward + backward through the public APIs: **B** = "
              "`chunkwise_cp_forward/backward` with `GatherFold` or `ScanCompose` on each rank's `t` tokens of "
              "every head; **C** = `TransposePlan::to_head_parallel` of the fused input projection, the "
              "single-device chunkwise recurrence over the whole sequence of the rank's heads, "
              "`to_sequence_parallel` of the output, and the reverse path in the backward "
              f"(`UnevenHeads`, contiguous tokens). Shapes ({'; '.join(shapes)}); P = {', '.join(map(str, ranks))} "
              f"ranks × 1 thread on the 2-core machine (P > 2 oversubscribed: {', '.join(str(p) for p in ranks if p > 2) or 'none'}). "
              "Bytes: the slowest rank's bytes sent over all data collectives (Group counters), fwd + bwd; "
              "time: the slowest rank's fwd + bwd, median of the repeats. The last column splits one more run of C "
              "(a fence after each phase, slowest rank per phase) into its four transposes, the copies between the "
              "fused head-side matrix and the per-tensor views the backend takes, and the recurrence (forward + "
              "backward).\n")
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
    summary = []
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
            md.append(f"\n**{fam}, P = {p}**{' (oversubscribed)' if p > 2 else ''}\n\n")
            md.append(table(["tokens / rank", "B GatherFold bytes", "B ScanCompose bytes", "C all-to-all bytes",
                             "B GatherFold time", "B ScanCompose time", "C time", "C time ÷ best B",
                             "C: transposes / column copies / recurrence"], rows))
            write_data(os.path.join(img, f"cx_{fam}_P{p}.dat"), dat)
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
    md.append("\n**The crossover** (tokens per rank). Bytes: C's measured bytes per token (largest size) extrapolated "
              "linearly, against B's constant bytes; time: where C's time minus the faster B policy's time changes "
              "sign between two measured sizes (log-interpolated). Shared machine: the time crossover moves with "
              "the load; the byte crossover does not.\n\n")
    md.append(table(["family", "P", "C bytes > B GatherFold beyond", "C bytes > B ScanCompose beyond",
                     "time crossover, medians (C slower than best B beyond)", "time crossover, fastest repeats"],
                    summary))
    for fam in fams:
        plots_b, plots_t = [], []
        for i, p in enumerate(ranks):
            f = os.path.join(img, f"cx_{fam}_P{p}.dat")
            if not os.path.exists(f):
                continue
            for j, lab in enumerate(("B GatherFold", "B ScanCompose", "C all-to-all")):
                style = f"w lp lc {i + 1} dt {j + 1} pt {5 + 2 * j}"
                plots_b.append(f"'{f}' u 1:{2 + j} {style} t '{lab} P={p}'")
                plots_t.append(f"'{f}' u 1:{5 + j} {style} t '{lab} P={p}'")
        png = os.path.join(img, f"crossover_{fam}.png")
        ok = gnuplot(f"""set terminal pngcairo noenhanced size 980,400 font ',8'
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
""", png) if plots_b else False
        if ok:
            md.append(f"\n![crossover {fam}]({img_rel}/crossover_{fam}.png)\n")
    for fam in fams:
        for p in ranks:
            f = os.path.join(img, f"cx_{fam}_P{p}.dat")
            if os.path.exists(f):
                os.remove(f)
    return md


# ----------------------------------------------------------------------------------------------
# SWA growth (bench/results/swa_growth.json): time and bytes against T, W and P


GROWTH_X = ("length", "tokens", "T", "sequence_length", "queries")
GROWTH_GROUP = ("policy", "window", "W", "ranks", "P", "dim", "D")


SWEEP_AXIS = {"T": "tokens", "W": "window", "P": "ranks", "L": "length"}


def growth_by_sweep(rs, img, img_rel):
    """Records that say which axis they sweep (`sweep`: T, W or P): per sweep and layout, a table
    of x and P against each policy's step time and bytes received (forward + backward, slowest
    rank), and one plot per sweep and layout."""
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
            safe = "".join(c if c.isalnum() else "_" for c in f"{sweep}_{layout}")
            png = os.path.join(img, f"perf_swa_growth_{safe}.png")
            ok = gnuplot(f"""set terminal pngcairo noenhanced size 980,400 font ',8'
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
""", png) if plots_t else False
            for f in files:
                os.remove(f)
            if ok:
                md.append(f"\n![swa growth {sweep} {layout}]({img_rel}/perf_swa_growth_{safe}.png)\n")
    return md


def growth_section(recs, img, img_rel):
    rs = [r for r in recs if r.get("benchmark") == "swa_growth" or
          (r.get("benchmark") == "swa" and r.get("kind") in ("growth", "scaling"))]
    md = ["\n## Sliding-window attention: how time and bytes grow with T, W and P\n"]
    if not rs:
        md.append("_No records (bench/results/swa_growth.json)._\n")
        return md
    if all(r.get("sweep") is not None for r in rs):
        md.append(f"From {run_facts(rs)}.\n")
        return md + growth_by_sweep(rs, img, img_rel)
    xkey = next((k for k in GROWTH_X if any(isnum(r.get(k)) for r in rs)), None)
    gkeys = [k for k in GROWTH_GROUP if any(k in r for r in rs) and len({str(r.get(k)) for r in rs}) > 1]
    ykeys = []
    for r in rs:
        for k, v in r.items():
            if isnum(v) and k not in ykeys and k != xkey and k not in gkeys and (
                    k.endswith("_median_s") or ("bytes" in k and "formula" not in k)):
                ykeys.append(k)
    if xkey is None or not ykeys:
        md.append(f"_{len(rs)} records, but no axis length field ({', '.join(GROWTH_X)}) or no time/bytes fields: "
                  "shown in the record dump below._\n")
        return md
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
        ok = gnuplot(f"""set terminal pngcairo noenhanced size 640,400 font ',8'
set output '{png}'
set datafile missing '?'
set logscale xy
set xlabel '{xkey}'
set ylabel '{ylabel}'
set key outside right font ',7'
set title 'sliding-window attention: {kind} vs {xkey} (bench/results/swa_growth.json)'
plot {', '.join(plots)}
""", png) if plots else False
        for f in files:
            os.remove(f)
        if ok:
            md.append(f"\n![swa growth {kind}]({img_rel}/perf_swa_growth_{kind}.png)\n")
    return md


# ----------------------------------------------------------------------------------------------


def validation_trend(vdat):
    """What the measured/predicted ratios do with P, read from the records (median per P)."""
    by_p = {}
    for p, ratio, _, _ in vdat:
        if ratio:
            by_p.setdefault(p, []).append(ratio)
    if len(by_p) < 2:
        return ""
    meds = [(p, median(v)) for p, v in sorted(by_p.items())]
    shown = ", ".join(f"P = {p}: {fmt(m)}" for p, m in meds)
    rising = all(b[1] >= a[1] for a, b in zip(meds, meds[1:]))
    return (f"Median measured/predicted per P: {shown}" +
            (" — it grows with P, as it must when P ranks share 2 cores (a rank that waits holds a core its peer "
             "needs), so the fit is valid at P = 2 only." if rising and meds[-1][1] > 1.5 * meds[0][1] else
             "."))


def section_failed(md, name, e):
    print(f"render.py: section '{name}' skipped: {type(e).__name__}: {e}", file=sys.stderr)
    md.append(f"\n_The {name} section could not be rendered from the records in this run "
              f"({type(e).__name__}: {e}); the other sections are unaffected._\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="bench/results")
    ap.add_argument("--out", default="docs/performance.md")
    ap.add_argument("--img", default="docs/img")
    ap.add_argument("--command", default="scripts/bench")
    args = ap.parse_args()
    recs = load_records(args.results)
    os.makedirs(args.img, exist_ok=True)
    img_rel = os.path.relpath(args.img, os.path.dirname(os.path.abspath(args.out)))
    md = []
    md.append("# Performance\n")
    md.append(f"Generated by `{args.command}` from the JSON records in `bench/results/` "
              f"(renderer: `bench/report/render.py`); do not edit by hand — rerun the command. Every figure "
              "is a ratio measured side by side in one run, or a model fitted to those measurements. "
              "The machine is shared and noisy: absolute times drift run to run, ratios much less.\n")

    try:
        # Machine and ceilings
        ceil = pick(recs, "ceilings")
        machine = next((r.get("machine") for r in ceil if r.get("machine")), None) or \
            next((r.get("machine") for r in recs if r.get("machine")), {})
        md.append("## Machine and ceilings\n")
        if machine:
            md.append(f"CPU `{machine.get('cpu')}`, build `{machine.get('build_type')}`, Kokkos backend "
                      f"`{machine.get('backend')}`, {machine.get('threads')} thread(s) per rank, "
                      f"{machine.get('ranks')} rank(s), `-march=native`: {fmt(machine.get('native'))}; load average "
                      f"during the ceilings run: {fmt(machine.get('load_average'))}.\n")
        rows = []
        sgemm = None
        for r in ceil:
            c = r.get("case", "")
            if c.startswith("sgemm"):
                rows.append([c, f"{fmt(r.get('gflops'))} GFLOP/s (best {fmt(r.get('best_gflops'))})", r.get("flops_formula", "")])
                sgemm = max(sgemm or 0, r.get("gflops", 0))
            elif c == "triad":
                rows.append([c, f"{fmt(r.get('gbps'))} GB/s (best {fmt(r.get('best_gbps'))})", r.get("bytes_formula", "")])
            elif c.startswith("pingpong"):
                rows.append([c, f"one way {human_seconds(r.get('one_way_us', 0) * 1e-6)}, {fmt(r.get('gbps'))} GB/s", ""])
            elif c.startswith("allgather"):
                rows.append([c, f"{fmt(r.get('gbps'))} GB/s, median {human_seconds(r.get('time_median_s'))}",
                             r.get("bytes_formula", "")])
        md.append(table(["ceiling", "measured (median of repeats)", "formula"], rows) if rows else
                  "_No ceilings record (bench/results/ceilings.json)._\n")

    except Exception as e:  # a missing or old-format record must not stop the report
        section_failed(md, 'machine and ceilings', e)
    try:
        # Targets
        md.append("\n## The bar: each target of 50-performance.md next to its measured ratio\n")
        md.append(table(["what", "measure", "target", "measured", "verdict", "reason / note"], target_rows(recs, sgemm)))
        md.append("\n\"Not measured\" means no benchmark in this run wrote that figure; the mechanism benchmark "
                  "that should write it is named in the last column.\n")

    except Exception as e:  # a missing or old-format record must not stop the report
        section_failed(md, 'targets', e)
    try:
        # How cost grows (from the mechanism benchmarks' records)
        by = [r for r in pick(recs, "swa", kind="bytes_per_rank") if r.get("length")]
        if by:
            md.append("\n## How cost grows\n")
            md.append("Bytes received per rank (slowest rank) of one sliding-window step against the axis length, "
                      "for both policies (`bench/swa`): the all-gather grows with `L`, the halo stays at `W − 1` "
                      "records.\n\n")
            rows = []
            for r in sorted(by, key=lambda r: (r["window"], r["length"])):
                rows.append([r["length"], r["window"], r.get("ranks"),
                             human_bytes(r.get("max_allgather_bytes_over_ranks", r.get("allgather_bytes_received"))),
                             human_bytes(r.get("max_halo_bytes_over_ranks", r.get("halo_bytes_received")))])
            md.append(table(["L", "W", "P", "all-gather recv/rank", "halo recv/rank"], rows))
            for w in sorted({r["window"] for r in by}):
                write_data(os.path.join(args.img, f"grow_{w}.dat"),
                           [(r["length"], r.get("max_allgather_bytes_over_ranks", r["allgather_bytes_received"]),
                             r.get("max_halo_bytes_over_ranks", r["halo_bytes_received"]))
                            for r in sorted(by, key=lambda r: r["length"]) if r["window"] == w])
            plots = []
            for w in sorted({r["window"] for r in by}):
                f = f"{args.img}/grow_{w}.dat"
                plots.append(f"'{f}' u 1:2 w lp pt 7 t 'all-gather W={w}', '{f}' u 1:3 w lp pt 5 t 'halo W={w}'")
            ok = gnuplot(f"""set terminal pngcairo noenhanced size 560,360 font ',9'
    set output '{args.img}/swa_bytes_growth.png'
    set logscale xy
    set xlabel 'axis length L (tokens)'
    set ylabel 'bytes received per rank'
    set key top left
    set title 'sliding-window step: bytes per rank vs L (measured counters)'
    plot {", ".join(plots)}
    """, os.path.join(args.img, "swa_bytes_growth.png"))
            for w in sorted({r["window"] for r in by}):
                os.remove(os.path.join(args.img, f"grow_{w}.dat"))
            if ok:
                md.append(f"\n![bytes growth]({img_rel}/swa_bytes_growth.png)\n")
        kern = pick(recs, "swa", kind="local_kernel")
        if kern:
            md.append("\nSliding-window local kernel rate against the window (same-run SGEMM ratio), `bench/swa`:\n\n")
            md.append(table(["D", "W", "forward GFLOP/s", "÷ SGEMM", "backward GFLOP/s", "÷ SGEMM"],
                            [[r.get("dim"), r.get("window"), fmt(r.get("forward_gflops")), fmt(r.get("forward_ratio")),
                              fmt(r.get("backward_gflops")), fmt(r.get("backward_ratio"))]
                             for r in sorted(kern, key=lambda r: (r.get("dim"), r.get("window")))]))

    except Exception as e:  # a missing or old-format record must not stop the report
        section_failed(md, 'how cost grows', e)
    try:
        md += growth_section(recs, args.img, img_rel)
    except Exception as e:  # a missing or old-format record must not stop the report
        section_failed(md, 'SWA growth', e)
    try:
        md += crossover_section(recs, args.img, img_rel)
    except Exception as e:  # a missing or old-format record must not stop the report
        section_failed(md, 'B vs C crossover', e)

    try:
        # Hybrid stack
        hyb = sorted(pick(recs, "hybrid"), key=lambda r: r.get("ranks", 0))
        if hyb:
            md.append("\n## The hybrid stack (`ctxpar hybrid`)\n")
            md.append("Per layer, forward + backward of the context-parallel operator (the host-side glue "
                      "excluded), first step, slowest rank; bytes of rank 0 against the formula.\n")
            rows = []
            for h in hyb:
                st = (h.get("steps") or [{}])[0]
                for lj in st.get("layers", []):
                    tt = lj.get("forward_seconds", 0) + lj.get("backward_seconds", 0)
                    rows.append([h.get("ranks"), h.get("length"), lj.get("layer"), lj.get("policy"),
                                 human_seconds(tt), fmt(lj.get("tokens_per_second")),
                                 human_bytes(lj.get("bytes_received_rank0")),
                                 fmt(lj.get("bytes_equal_formula_every_rank")), fmt(lj.get("max_error"))])
            md.append(table(["P", "L", "layer", "policy", "fwd+bwd", "tokens/s", "recv/rank", "= formula",
                             "max err vs P=1"], rows))
            # Same-run figures first: each distributed run also times the single-rank reference of
            # the same step inside the same processes, so both sides see the same machine load.
            same = []
            for h in hyb:
                if h.get("ranks", 1) < 2:
                    continue
                for lj in (h.get("steps") or [{}])[0].get("layers", []):
                    ph = lj.get("phases_seconds") or {}
                    dist, single = ph.get("distributed") or {}, ph.get("single_rank") or {}
                    if not isnum(lj.get("cp_efficiency")) or not dist or not single:
                        continue
                    same.append([h.get("ranks"), lj.get("layer"), human_seconds(single.get("total", 0)),
                                 human_seconds(dist.get("total", 0)), fmt(lj["cp_efficiency"]),
                                 human_seconds(dist.get("local_compute", 0)),
                                 human_seconds(dist.get("communication", 0)),
                                 human_seconds(dist.get("relayout", 0)),
                                 human_seconds(dist.get("staging", 0) + dist.get("host_glue", 0)),
                                 fmt(dist.get("mpi_calls_rank0"))])
            if same:
                md.append("\nCP efficiency of each layer, `T(1) / (P·T(P))`, measured **in the same run** (the "
                          "single-rank reference of the same step is timed inside the distributed run's processes), "
                          f"with the distributed time split by phase (load average at the end: "
                          f"{', '.join('P = %s %s' % (h.get('ranks'), fmt(h.get('load_average'))) for h in hyb)}; "
                          "2 cores):\n\n")
                md.append(table(["P", "layer", "T(1)", "T(P)", "efficiency", "local compute", "MPI",
                                 "re-layout", "staging + glue", "MPI calls"], same))
                md.append("\nThe MPI column is time inside MPI calls (PMPI wrappers of `ctxpar hybrid`): with two ranks "
                          "on a shared 2-core machine it is mostly waiting for a descheduled peer "
                          "(see docs/hybrid.md).\n")
            p1 = next((h for h in hyb if h.get("ranks") == 1), None)
            p2 = next((h for h in hyb if h.get("ranks") == 2), None)
            if p1 and p2:
                rows = []
                for l1, l2 in zip(p1["steps"][0]["layers"], p2["steps"][0]["layers"]):
                    t1 = l1["forward_seconds"] + l1["backward_seconds"]
                    t2 = l2["forward_seconds"] + l2["backward_seconds"]
                    rows.append([l1["layer"], human_seconds(t1), human_seconds(t2), fmt(t1 / (2 * t2))])
                md.append(f"\nFor comparison, the cross-run ratio from two consecutive runs of the command (load "
                          f"average at the end of each: P = 1 {fmt(p1.get('load_average'))}, P = 2 "
                          f"{fmt(p2.get('load_average'))}) — it charges any change of machine load between the two "
                          "runs to context parallelism:\n\n")
                md.append(table(["layer", "T(1)", "T(2)", "cross-run ratio"], rows))

    except Exception as e:  # a missing or old-format record must not stop the report
        section_failed(md, 'hybrid stack', e)
    try:
        # α–β
        net = pick(recs, "network")
        md.append("\n## Latency–bandwidth (α–β) model\n")
        ab_here = None
        if net:
            pp = sorted([(r["bytes"], r["time_median_s"]) for r in net if r.get("kind") == "pingpong" and r.get("ranks") == 2])
            if len(pp) >= 2:
                ab_here = fit_alpha_beta(pp)
                a, b = ab_here
                md.append(f"Fitted by least squares (relative error) to the ping-pong medians at P = 2 (`bench/report/network_bench.cpp`, "
                          f"{len(pp)} sizes from {human_bytes(pp[0][0])} to {human_bytes(pp[-1][0])}): "
                          f"**α = {human_seconds(a)}**, **1/β = {fmt(1 / b / 1e9)} GB/s** (shared-memory transport).\n")
                write_data(os.path.join(args.img, "pingpong.dat"), [(n, t, a + n * b) for n, t in pp])
                ok = gnuplot(f"""set terminal pngcairo noenhanced size 560,360 font ',9'
    set output '{args.img}/alpha_beta.png'
    set logscale xy
    set xlabel 'message bytes'
    set ylabel 'one-way time [s]'
    set key top left
    set title 'ping-pong at P = 2: measured vs alpha + n beta'
    plot '{args.img}/pingpong.dat' u 1:2 w p pt 7 t 'measured (median)', '' u 1:3 w l lw 2 t 'model'
    """, os.path.join(args.img, "alpha_beta.png"))
                os.remove(os.path.join(args.img, "pingpong.dat"))
                if ok:
                    md.append(f"\n![ping-pong fit]({img_rel}/alpha_beta.png)\n")
                # Validation on the collectives
                rows = []
                vdat = []
                for r in sorted(net, key=lambda r: (r.get("kind"), r.get("bytes"), r.get("ranks"))):
                    k, p, m = r.get("kind"), r.get("ranks"), r.get("bytes")
                    if k not in ("allgather", "alltoall"):
                        continue
                    pred = t_allgather(a, b, p, m) if k == "allgather" else t_alltoall(a, b, p, m)
                    meas = r["time_median_s"]
                    rows.append([k, p, human_bytes(m), human_seconds(meas), human_seconds(pred), fmt(meas / pred if pred else None)])
                    vdat.append((p, meas / pred if pred else 0, k, m))
                md.append("\nValidation before projecting: the model's prediction for the collectives against what "
                          "was measured here. All-gather: `⌈log2 P⌉·α + (P−1)·m·β` (m bytes per rank); all-to-all: "
                          "`(P−1)·(α + m·β)` (m bytes per destination). The model is fitted at P = 2; above P = 2 "
                          "the ranks share the machine's 2 cores. " + validation_trend(vdat) +
                          " The projection below uses the stated cluster figures, not this machine's fit.\n\n")
                md.append(table(["collective", "P", "m", "measured", "predicted", "measured / predicted"], rows))
                p2 = [x[1] for x in vdat if x[0] == 2]
                if p2:
                    md.append(f"\nAt P = 2 (no oversubscription) measured/predicted spans {fmt(min(p2))}–{fmt(max(p2))} "
                              f"over {len(p2)} cases (median {fmt(median(p2))}).\n")
                for kind in ("allgather", "alltoall"):
                    write_data(os.path.join(args.img, f"valid_{kind}.dat"),
                               sorted((x[0], x[1], x[3]) for x in vdat if x[2] == kind))
                ok = gnuplot(f"""set terminal pngcairo noenhanced size 560,360 font ',9'
    set output '{args.img}/model_validation.png'
    set logscale y
    set xlabel 'ranks P (2 cores: P > 2 oversubscribed)'
    set ylabel 'measured / predicted'
    set key top left
    set title 'alpha-beta model vs measured collectives'
    plot '{args.img}/valid_allgather.dat' u 1:2 w p pt 7 t 'all-gather', '{args.img}/valid_alltoall.dat' u 1:2 w p pt 5 t 'all-to-all', 1 w l dt 2 t 'exact'
    """, os.path.join(args.img, "model_validation.png"))
                for kind in ("allgather", "alltoall"):
                    os.remove(os.path.join(args.img, f"valid_{kind}.dat"))
                if ok:
                    md.append(f"\n![model validation]({img_rel}/model_validation.png)\n")
        else:
            md.append("_No network records (bench/results/network_P*.json)._\n")

    except Exception as e:  # a missing or old-format record must not stop the report
        section_failed(md, 'alpha-beta model', e)
    try:
        # Compute rates
        swa_k = pick(recs, "swa", kind="local_kernel")
        rate_swa = median([r["forward_gflops"] for r in swa_k if "forward_gflops" in r])
        cw = [r for r in recs if r.get("benchmark") == "chunkwise" and isinstance(r.get("forward_gflops"), (int, float))]
        rate_cw = median([r["forward_gflops"] for r in cw])
        rates = {"swa": (rate_swa, "measured SWA local kernel (median forward GFLOP/s, bench/swa)") if rate_swa else
                 (sgemm, "same-run SGEMM (no SWA kernel record)"),
                 "cw": (rate_cw, "measured chunkwise kernel (median forward GFLOP/s, bench/chunkwise)") if rate_cw else
                 (sgemm, "same-run SGEMM (no chunkwise kernel record)")}

        md.append("\n## Projection to P = 8 … 1024 and L up to 1M tokens\n")
        sh = SHAPES
        md.append("Per rank and per layer, forward + backward, from the formulas the byte counters are checked against "
                  "(the hybrid stack and the mechanism benchmarks check them to the byte). Reference shapes (fp32): "
                  f"SWA Hq = {sh['swa']['Hq']}, Hkv = {sh['swa']['Hkv']}, D = {sh['swa']['D']}, W = {sh['swa']['W']}; "
                  f"GDN H = {sh['gdn']['H']}, K = V = {sh['gdn']['K']}; GDP H = {sh['gdp']['H']}, d = N = {sh['gdp']['d']}, "
                  f"M = {sh['gdp']['M']}, G = {sh['gdp']['G']}. Network: the cluster figures below (assumptions, with "
                  "sources); this machine's fitted α–β appears for P = 8 only as a reference. Local compute time: "
                  f"flops from the design's FLOP models at {fmt(rates['swa'][0])} GFLOP/s ({rates['swa'][1]}) for SWA and "
                  f"{fmt(rates['cw'][0])} GFLOP/s ({rates['cw'][1]}) for the chunkwise kernels — one CPU thread of this "
                  "machine; a GPU computes 10–100× faster, which moves every crossover below to proportionally larger L/P.\n\n")
        md.append(table(["cluster link", "α", "1/β", "source (assumption)"],
                        [[c["name"], human_seconds(c["alpha"]), f"{fmt(c['bw'] / 1e9)} GB/s", c["source"]]
                         for c in CLUSTER.values()]))
        Ls = [32768, 131072, 1048576]
        Ps = [8, 16, 64, 256, 1024]
        gpu = ACCELERATOR["flops"] * ACCELERATOR["efficiency"]
        md.append(f"\nCompute on the cluster side is an assumption too: {ACCELERATOR['name']} at "
                  f"{fmt(ACCELERATOR['efficiency'])} of {fmt(ACCELERATOR['flops'] / 1e12)} TFLOP/s "
                  f"({ACCELERATOR['source']}). Each cell: communication time per rank per layer (forward + backward) "
                  "and, in brackets, bytes received per rank; the last rows give the local compute time at the measured "
                  "rate of this machine and at the assumed accelerator rate. `n/a`: the policy cannot run there.\n")
        plot_rows = {k: [] for k, _, _ in mechanisms()}
        for L in Ls:
            rows = []
            for key, mech, pol in mechanisms():
                cells = []
                for P in Ps:
                    pr = project(key, L, P, cluster_ab(P))
                    if not pr["ok"]:
                        cells.append("n/a (P > heads)")
                        continue
                    fl = compute_flops(key, L, P) + pr["extra_flops"]
                    if L == Ls[-1]:
                        plot_rows[key].append((P, pr["time"], fl / gpu))
                    cells.append(f"{human_seconds(pr['time'])} ({human_bytes(pr['recv'])})")
                rows.append([f"{mech} / {pol}"] + cells)
            for label, rate in ((f"compute, SWA, here ({fmt(rates['swa'][0])} GFLOP/s)", rates["swa"][0] * 1e9),
                                (f"compute, GDN, here ({fmt(rates['cw'][0])} GFLOP/s)", rates["cw"][0] * 1e9),
                                ("compute, SWA, accelerator", gpu), ("compute, GDN chunkwise, accelerator", gpu)):
                key = "swa_ag" if "SWA" in label else "gdn_sc"
                rows.append([label] + [human_seconds(compute_flops(key, L, P) / rate) if rate else "–" for P in Ps])
            md.append(f"\n**L = {L} tokens**\n\n")
            md.append(table(["mechanism / policy"] + [f"P = {P}" for P in Ps], rows))
            mem_rows = []
            for key, mech, pol in mechanisms():
                cells = []
                for P in Ps:
                    pr = project(key, L, P, cluster_ab(P))
                    cells.append(human_bytes(pr["mem"]) if pr["ok"] else "n/a")
                mem_rows.append([f"{mech} / {pol}"] + cells)
            md.append(f"\nCommunication buffers per rank per layer at L = {L} (gathered axis, summaries, transpose "
                      "buffers):\n\n")
            md.append(table(["mechanism / policy"] + [f"P = {P}" for P in Ps], mem_rows))
        if ab_here:
            rows = []
            for key, mech, pol in mechanisms():
                pr = project(key, 131072, 8, ab_here)
                rows.append([f"{mech} / {pol}", human_seconds(pr["time"]) if pr["ok"] else "n/a"])
            md.append("\nThe same at L = 131072, P = 8 with this machine's fitted α–β instead of the cluster's "
                      "(shared memory, if it had 8 free cores):\n\n")
            md.append(table(["mechanism / policy", "comm time"], rows))

        # Where each stops scaling
        md.append("\n### Where each mechanism stops scaling\n")
        md.append(f"\nCriteria, checked at P = 8, 16, 32, …, 1024: the policy cannot run (more ranks than heads); "
                  f"its communication buffers exceed {human_bytes(MEMORY_LIMIT)} per rank per layer (a tenth of an 80 GB "
                  "accelerator — the all-gather's O(L) memory); or its communication time exceeds its local compute "
                  "time at the accelerator rate above (the summary gather's O(P) bytes and fold, the all-gather's O(L) "
                  "bytes against O(L/P) work).\n\n")
        srows = []
        for key, mech, pol in mechanisms():
            for L in Ls:
                reason = "scales to P = 1024 in this grid"
                for P in [8, 16, 32, 64, 128, 256, 512, 1024]:
                    pr = project(key, L, P, cluster_ab(P))
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

        # Which policy wins where
        md.append("\n### Which policy wins where (least communication time, cluster model)\n")
        wrows = []
        for L in [2048, 8192, 32768, 131072, 1048576]:
            for P in [2, 4, 8, 16, 64, 1024]:
                best = {}
                for fam, keys in (("A", ["swa_ag", "swa_ra", "swa_halo"]), ("GDN: B vs C", ["gdn_gf", "gdn_sc", "gdn_a2a"])):
                    cands = [(project(k, L, P, cluster_ab(P))["time"], k) for k in keys if project(k, L, P, cluster_ab(P))["ok"]]
                    cands = [c for c in cands if c[0] is not None]
                    best[fam] = dict((k, p) for k, _, p in mechanisms())[min(cands)[1]] if cands else "–"
                wrows.append([L, P, best["A"], best["GDN: B vs C"]])
        md.append(table(["L", "P", "sliding-window attention", "Gated DeltaNet layer (summaries vs all-to-all)"], wrows))
        # B/C crossover in tokens per rank
        sg = SHAPES["gdn"]
        rec = sg["H"] * (sg["K"] * sg["V"] + sg["K"] ** 2) * F32
        ch = (sg["H"] * (2 * sg["K"] + sg["V"] + 2) + sg["H"] * sg["V"]) * F32
        md.append(f"\nChunkwise-vs-all-to-all crossover in bytes (GDN, H = {sg['H']}, K = V = {sg['K']}): summaries move "
                  f"`2·(P−1)·{human_bytes(rec)}` per rank, the all-to-all `2·(P−1)/P·(L/P)·{human_bytes(ch)}`; summaries "
                  f"move fewer bytes once a rank holds more than `P·{fmt(rec / ch)}` tokens "
                  f"(P = 8: {fmt(8 * rec / ch)}, P = 16: {fmt(16 * rec / ch)} tokens).\n")

        # Plot: comm vs compute at the largest L
        dat = os.path.join(args.img, "projection.dat")
        cols = [k for k, _, _ in mechanisms()]
        with open(dat, "w") as f:
            for P in Ps:
                line = [str(P)]
                for k in cols:
                    v = next((t for p, t, _ in plot_rows[k] if p == P), None)
                    line.append(str(v) if v else "?")
                comp_swa = next((c for p, _, c in plot_rows["swa_ag"] if p == P), None)
                comp_gdn = next((c for p, _, c in plot_rows["gdn_sc"] if p == P), None)
                line += [str(comp_swa or "?"), str(comp_gdn or "?")]
                f.write(" ".join(line) + "\n")
        titles = [p for _, _, p in mechanisms()]
        plots = ", ".join(f"'{dat}' u 1:{i + 2} w lp t '{k}: {titles[i]}'" for i, k in enumerate(cols))
        ok = gnuplot(f"""set terminal pngcairo noenhanced size 640,420 font ',8'
    set output '{args.img}/projection.png'
    set datafile missing '?'
    set logscale xy
    set xrange [6:1400]
    set xlabel 'ranks P'
    set ylabel 'seconds per rank per layer (fwd+bwd)'
    set key outside right font ',7'
    set title 'L = {Ls[-1]} tokens: communication (cluster model) vs local compute'
    plot {plots}, '{dat}' u 1:{len(cols) + 2} w l dt 2 lw 2 t 'compute SWA (accelerator)', '{dat}' u 1:{len(cols) + 3} w l dt 3 lw 2 t 'compute GDN (accelerator)'
    """, os.path.join(args.img, "projection.png"))
        os.remove(dat)
        if ok:
            md.append(f"\n![projection]({img_rel}/projection.png)\n")
    except Exception as e:  # a missing or old-format record must not stop the report
        section_failed(md, 'projection', e)
    try:
        # Per-benchmark detail (every record, compact)
        md.append("\n## Appendix: every benchmark record\n")
        for bench_name in sorted({r.get("benchmark") for r in recs if r.get("benchmark") not in (None, "network", "hybrid")}):
            br = pick(recs, bench_name)
            keys = []
            for r in br:
                for k, v in r.items():
                    if k in ("benchmark", "machine", "_file") or isinstance(v, (dict, list)):
                        continue
                    if k.endswith(("_min_s", "_max_s", "_repeats")):
                        continue
                    if k not in keys:
                        keys.append(k)
            keys = keys[:12]
            md.append(f"\n### `{bench_name}` ({len(br)} records, `{br[0]['_file']}`; first 12 fields)\n")
            md.append(table(keys, [[fmt(r.get(k)) if not isinstance(r.get(k), str) else r.get(k) for k in keys] for r in br]))

    except Exception as e:  # a missing or old-format record must not stop the report
        section_failed(md, 'every benchmark record', e)
    md.append(f"\n---\nRecords read: {len(recs)} from {len(set(r['_file'] for r in recs))} files; rendered "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n")
    with open(args.out, "w") as f:
        f.write("\n".join(md))
    print(f"render.py: wrote {args.out} ({len(recs)} records)")


if __name__ == "__main__":
    main()
