#!/usr/bin/env python3
"""GPU performance model of ctxpar's heavy kernels (stdlib only).

Prints, per kernel and GPU, FLOPs and DRAM bytes per launch, scratch and registers per team, the
occupancy this implies, the roofline bound and the projected fraction of FP32 peak, from formulas
of the shapes and the published figures of each GPU (docs/gpu-model.md explains every term).

  scripts/gpu_model.py                      the tables of docs/gpu-model.md (markdown)
  scripts/gpu_model.py --update docs/gpu-model.md   regenerate the doc's tables in place
  scripts/gpu_model.py --selftest           figures consistent, no projection above a peak
  scripts/gpu_model.py --project GPU KERNEL key=value ...   one projection as JSON (gpu-check)

GPU is a100, h100 or h200 (or any nvidia-smi name containing one of them); KERNEL is one of
KERNELS below. Everything is a projection: nothing here has been measured on a GPU.
"""
import json
import math
import sys

# Published figures. FP32 = non-tensor CUDA-core peak (the kernels use FP32 FMAs); TF32 = dense
# tensor-core peak (the datasheets print it with sparsity, twice this), for reference only.
# Sources: "NVIDIA A100 Tensor Core GPU" datasheet and "NVIDIA A100 Tensor Core GPU Architecture"
# whitepaper (SM figures); "NVIDIA H100 Tensor Core GPU" datasheet and "NVIDIA H100 Tensor Core
# GPU Architecture" whitepaper; "NVIDIA H200 Tensor Core GPU" datasheet (same GH100 SM as H100).
GPUS = {
    "a100": dict(name="A100 SXM 80GB", sms=108, fp32_lanes=64, clock_ghz=1.41, fp32_tflops=19.5,
                 tf32_tflops=156.0, hbm_gbs=2039.0, l1_kib=192, smem_block_kib=163,
                 regs_sm=65536, threads_sm=2048, blocks_sm=32),
    "h100": dict(name="H100 SXM5 80GB", sms=132, fp32_lanes=128, clock_ghz=1.98,
                 fp32_tflops=67.0, tf32_tflops=494.5, hbm_gbs=3350.0, l1_kib=256,
                 smem_block_kib=227, regs_sm=65536, threads_sm=2048, blocks_sm=32),
    "h200": dict(name="H200 SXM 141GB", sms=132, fp32_lanes=128, clock_ghz=1.98,
                 fp32_tflops=67.0, tf32_tflops=494.5, hbm_gbs=4800.0, l1_kib=256,
                 smem_block_kib=227, regs_sm=65536, threads_sm=2048, blocks_sm=32),
}

# Assumptions of the model (not datasheet figures; docs/gpu-model.md §2 says why each).
LSU_WARP_PER_CLK = 1.0   # L1/shared loads: 32 banks x 4 B per clock per SM = one warp-wide load
WARPS_TO_SATURATE = 8    # resident warps an SM needs to keep its pipes busy (2 per sub-partition)
L2_LATENCY_CLK = 250     # an L2-hit global load, clocks (order of magnitude)
DRAM_LATENCY_NS = 600.0  # a DRAM miss, ns (order of magnitude)
LOADS_IN_FLIGHT = 4      # independent loads one thread keeps in flight in an unrolled inner loop
BARRIER_CLK = 40         # one team barrier
DEVICE_TEAM_THREADS = 256  # Kokkos::AUTO team size of a plain copy/elementwise team functor
GEMM_MR, GEMM_NR = 4, 8  # device tile of the team tile product (core/impl/tile_product.hpp)
SWA_QUERY_TILE = SWA_KEY_TILE = 32
SWA_VECTOR = 32          # vector lanes of the SWA team kernels (keys of a tile / head dimension)


def occupancy(gpu, team_threads, regs_per_thread, scratch_l0_bytes=0):
    """Teams (blocks) and warps resident per SM for one team shape."""
    g = GPUS[gpu]
    regs = int(math.ceil(regs_per_thread / 8.0) * 8)
    by_threads = g["threads_sm"] // team_threads
    by_regs = g["regs_sm"] // (regs * int(math.ceil(team_threads / 32.0)) * 32)
    by_smem = (g["l1_kib"] * 1024 - 1024) // scratch_l0_bytes if scratch_l0_bytes else 10 ** 9
    blocks = max(0, min(g["blocks_sm"], by_threads, by_regs, by_smem))
    warps = blocks * int(math.ceil(team_threads / 32.0))
    limiter = min((("threads", by_threads), ("registers", by_regs), ("scratch", by_smem),
                   ("blocks", g["blocks_sm"])), key=lambda x: x[1])[0]
    return dict(blocks_per_sm=blocks, warps_per_sm=warps,
                occupancy=warps * 32.0 / g["threads_sm"], limiter=limiter)


def device_time(gpu, league, team_threads, regs, fp_warp_instr, lsu_warp_instr, dram_bytes,
                serial_clk=0.0, scratch_l0=0, scratch_l1=0):
    """Roofline with issue limits: time of a launch of `league` identical teams.

    fp_warp_instr / lsu_warp_instr: FP32 and L1/shared load warp-instructions per team.
    serial_clk: clocks of a team's dependency chain (barriers, sequential loops) that no
    other warp of the same team can overlap. scratch_l1: level-1 (global memory) scratch per
    team; when the resident teams' scratch exceeds the SM's L1 the scratch loads miss to L2,
    which the model does not bound (L2 bandwidth is not in the datasheets): it is flagged.
    Returns the time and which term bounds it.
    """
    g = GPUS[gpu]
    occ = occupancy(gpu, team_threads, regs, scratch_l0)
    clk = g["clock_ghz"] * 1e9
    fp_rate = g["fp32_lanes"] / 32.0  # FP32 warp-instructions per clock per SM
    per_team_issue = max(fp_warp_instr / fp_rate, lsu_warp_instr / LSU_WARP_PER_CLK)
    busy_sms = min(g["sms"], league)
    waves = math.ceil(league / float(g["sms"] * max(occ["blocks_per_sm"], 1)))
    # Few resident warps cannot keep the pipes busy: the issue rate scales down below saturation.
    teams_per_sm = min(occ["blocks_per_sm"], math.ceil(league / float(busy_sms)))
    active_warps = teams_per_sm * math.ceil(team_threads / 32.0)
    issue_eff = min(1.0, active_warps / float(WARPS_TO_SATURATE))
    t_issue = league * per_team_issue / (busy_sms * issue_eff) / clk
    # A serial chain runs once per wave of resident teams (teams of one wave overlap).
    t_serial = waves * serial_clk / clk
    t_dram = dram_bytes / (g["hbm_gbs"] * 1e9)
    terms = {"FP32 issue" if fp_warp_instr / fp_rate >= lsu_warp_instr else "L1/shared loads":
             t_issue, "latency chain": t_serial, "HBM bandwidth": t_dram}
    bound = max(terms, key=terms.get)
    if bound != "latency chain" and busy_sms < g["sms"] and terms[bound] == t_issue:
        bound += " (%d of %d SMs)" % (busy_sms, g["sms"])
    l1_pressure = teams_per_sm * scratch_l1 / (g["l1_kib"] * 1024.0)
    if l1_pressure > 1 and terms[max(terms, key=terms.get)] == t_issue:
        bound += "; scratch %.1fx L1: misses go to L2, slower than shown" % l1_pressure
    return dict(time_s=max(terms.values()), bound=bound, busy_sms=busy_sms, waves=waves,
                issue_efficiency=issue_eff, l1_pressure=l1_pressure, **occ)


# ----------------------------------------------------------------------------- kernels
def gemm_cost(m, n, k, band_half=False):
    """FLOPs and per-lane FP / load operations of team_gemm (register tile MR x NR)."""
    mnk = m * n * k * (0.5 if band_half else 1.0)
    return 2 * mnk, mnk, mnk * (GEMM_MR + GEMM_NR) / float(GEMM_MR * GEMM_NR)


KOKKOS_CUDA_LEVEL0_MAX = 40 * 1024  # Kokkos 3.4 Cuda scratch_size_max(0); level 1 is global memory


def scratch_levels(scratch):
    """The level-0 and level-1 scratch of a team asking for `scratch` bytes: level 0 (shared
    memory) where it fits, as `ctxpar::impl::scratch_level` chooses, else level 1."""
    fits = scratch <= KOKKOS_CUDA_LEVEL0_MAX
    return dict(scratch_l0=scratch if fits else 0, scratch_l1=0 if fits else scratch)


def swa_team_rows(gpu, regs, scratch_l0):
    """Team size Kokkos picks (team_size_recommended, capped at the 32 rows of a query tile): the
    block size with the best occupancy, the larger one on a tie (cuda_get_opt_block_size)."""
    best, rows = -1.0, 1
    for r in (32, 16, 8, 4, 2, 1):
        occ = occupancy(gpu, r * SWA_VECTOR, regs, scratch_l0)["occupancy"]
        if occ > best + 1e-9:
            best, rows = occ, r
    return rows


def swa_pass(gpu, which, T, W, Hq, Hkv, D, heads_per_team=None):
    """SWA team kernels (swa/impl/team_kernels.hpp): forward, dq, dkdv."""
    group = Hq // Hkv
    acc = 4
    if heads_per_team is None:  # heads_per_team(): largest divisor, rows <= 128, fits level 0
        heads_per_team = 1
        if which != "dkdv":
            for hpt in range(group, 1, -1):
                if (group % hpt == 0 and hpt * SWA_QUERY_TILE <= 128
                        and swa_scratch(which, D, hpt) <= KOKKOS_CUDA_LEVEL0_MAX):
                    heads_per_team = hpt
                    break
    rows = heads_per_team * SWA_QUERY_TILE
    tiles_q = math.ceil(T / float(SWA_QUERY_TILE))
    key_tiles = math.ceil((W + SWA_QUERY_TILE - 1) / float(SWA_KEY_TILE)) + 1
    # D-length products per (row, key): forward s, o; dQ s, dP, dQ; dK/dV s, dP, dV, dK
    products = {"forward": 2, "dq": 3, "dkdv": 4}[which]
    useful = {"forward": 4, "dq": 6, "dkdv": 8}[which] * D
    if which == "dkdv":  # team per (key tile, kv head): every head of the group, every query tile
        league = math.ceil((T + W) / float(SWA_KEY_TILE)) * Hkv
        row_tiles = key_tiles * group * SWA_QUERY_TILE
        staged = (group * key_tiles * SWA_QUERY_TILE + SWA_KEY_TILE) * D * 2 * acc
    else:
        league = tiles_q * Hkv * (group // heads_per_team)
        row_tiles = rows * key_tiles
        staged = key_tiles * SWA_KEY_TILE * D * 2 * acc
    # Per (row, 32-key tile): each product is 32·D FMAs, each reading two scratch values (one
    # broadcast, one per lane); the forward adds the per-lane weight sum (32 adds and loads a lane).
    lane_fma = row_tiles * products * SWA_KEY_TILE * D
    lane_lsu = 2 * lane_fma
    if which == "forward":
        lane_fma += row_tiles * SWA_KEY_TILE * SWA_VECTOR
        lane_lsu += row_tiles * SWA_KEY_TILE * SWA_VECTOR
    flops = useful * float(T) * W * Hq  # visible pairs only (the benchmark's count)
    compulsory = acc * D * (2 * T * Hq + 2 * (T + W) * Hkv) * (1 if which == "forward" else 2)
    no_reuse = league * staged + acc * D * 2 * T * Hq
    regs = 40  # per lane: accumulators s/dp/o, running max, alpha, sum, ~10 pointers
    scratch = swa_scratch(which, D, heads_per_team)
    level0 = scratch if scratch <= KOKKOS_CUDA_LEVEL0_MAX else 0
    team_threads = swa_team_rows(gpu, regs, level0) * SWA_VECTOR
    t = device_time(gpu, league, team_threads, regs, lane_fma / 32.0, lane_lsu / 32.0,
                    compulsory, serial_clk=key_tiles * 3 * BARRIER_CLK, scratch_l0=level0,
                    scratch_l1=0 if level0 else scratch)
    return dict(kernel="swa_" + which, flops=flops, bytes=compulsory, bytes_no_l2_reuse=no_reuse,
                league=league, team_threads=team_threads, regs=regs, scratch=scratch,
                scratch_level=0 if level0 else 1, heads_per_team=heads_per_team, **t)


def swa_scratch(which, D, hpt):
    """scratch_bytes() of the three kernels (fp32 accumulators, 16-byte pieces, tokens)."""
    rows = hpt * SWA_QUERY_TILE
    kt, qt = SWA_KEY_TILE, SWA_QUERY_TILE
    tokens = 16 * qt + 16 * kt + 32
    if which == "forward":  # q, o rows; Kᵀ, V tile; P; m, l
        return 4 * (2 * rows * D + 2 * kt * D + rows * kt + 2 * rows) + tokens
    if which == "dq":  # q, dO, dQ rows; Kᵀ, K, Vᵀ tile; dS; lse, delta
        return 4 * (3 * rows * D + 3 * kt * D + rows * kt + 2 * rows) + tokens
    # Kᵀ, Vᵀ, dK, dV tile; q, dO rows; P, dS; lse, delta
    return 4 * (4 * kt * D + 2 * qt * D + 2 * qt * kt + 2 * qt) + tokens


def gdn_intra(gpu, T, H, K, V, C, n_h=1):
    """gated_delta::IntraChunk: one team per (chunk, head); C counts sub-steps (chunk x n_h)."""
    c = C * n_h
    nc = math.ceil(T * n_h / float(c))
    league = nc * H
    f = [gemm_cost(c, c, K, True), gemm_cost(c, c, K, True), gemm_cost(c, K, c, True),
         gemm_cost(c, V, c, True)]
    flops = sum(x[0] for x in f) + c ** 3 / 3.0
    lane_fma = sum(x[1] for x in f) + c ** 3 / 6.0
    lane_lsu = sum(x[2] for x in f) + 2 * c ** 3 / 6.0 + 6 * c * K + 2 * c * V
    per_team_bytes = 4 * (c * (2 * K + V) + 2 * c * c + 3 * c * K + c * V + 3 * c)
    # forward substitution: c dependent rows, each a barrier and a loop of up to c loads
    serial = c * BARRIER_CLK + c * c / 2.0 * 8
    team_threads = 256
    t = device_time(gpu, league, team_threads, 64, lane_fma / 32.0, lane_lsu / 32.0,
                    league * per_team_bytes, serial_clk=serial,
                    **scratch_levels(4 * (3 * c * K + c * c + c * V)))
    return dict(kernel="gd_intra_chunk", flops=flops * league, bytes=league * per_team_bytes,
                league=league, team_threads=team_threads, regs=64,
                scratch=4 * (3 * c * K + c * c + c * V), **t)


def gdn_pass(gpu, T, H, K, V, C, n_h=1, seqs=1, nb=32, reverse=False):
    """gated_delta::ForwardPass / ReversePass: team per (sequence, head, nb state columns),
    sequential over the chunks of the sequence."""
    c = C * n_h
    nc = math.ceil(T * n_h / float(c))
    blocks = math.ceil(V / float(nb))
    league = seqs * H * blocks
    g = [gemm_cost(c, nb, K), gemm_cost(c, nb, K), gemm_cost(c, nb, c, True),
         gemm_cost(K, nb, c)]
    step_flops = sum(x[0] for x in g)
    step_fma = sum(x[1] for x in g)
    step_lsu = sum(x[2] for x in g)
    # Each step streams W̃, Q̂Γ, K̃ (c x K) and P (c x c) from global memory (A operands) and
    # reads Ũ / writes U, S0, O: a dependent chain of k-loops with L2-latency loads.
    chain = (2 * K + c + c) * L2_LATENCY_CLK / float(LOADS_IN_FLIGHT) + 6 * BARRIER_CLK
    step_bytes = 4 * (3 * c * K + c * c + 2 * c * V + K * V + c * V)
    team_threads = 128
    flops = step_flops * nc * league
    t = device_time(gpu, league, team_threads, 64, step_fma * nc / 32.0, step_lsu * nc / 32.0,
                    step_bytes * nc * H * seqs, serial_clk=chain * nc,
                    **scratch_levels(4 * (K * nb + 2 * c * nb)))
    return dict(kernel="gd_reverse_pass" if reverse else "gd_forward_pass", flops=flops,
                bytes=step_bytes * nc * H * seqs, league=league, team_threads=team_threads,
                regs=64, scratch=4 * (K * nb + 2 * c * nb), chunks=nc, **t)


def gdn_gradients(gpu, T, H, K, V, C, n_h=1):
    """gated_delta::ChunkGradients: one team per (chunk, head), eleven tile products."""
    c = C * n_h
    nc = math.ceil(T * n_h / float(c))
    league = nc * H
    f = [gemm_cost(c, K, V), gemm_cost(c, c, V, True), gemm_cost(c, c, K, True),
         gemm_cost(c, V, c, True), gemm_cost(c, K, V), gemm_cost(c, c, V, True),
         gemm_cost(c, K, V)] + [gemm_cost(c, K, c, True)] * 4
    flops = sum(x[0] for x in f)
    lane_fma = sum(x[1] for x in f) + 8 * c * K
    lane_lsu = sum(x[2] for x in f) + 16 * c * K
    per_team_bytes = 4 * (2 * c * (2 * K + V) + c * c + 3 * c * V + 2 * K * V + 4 * c)
    team_threads = 256
    t = device_time(gpu, league, team_threads, 64, lane_fma / 32.0, lane_lsu / 32.0,
                    league * per_team_bytes, serial_clk=c * 8 * 4 + 6 * BARRIER_CLK,
                    **scratch_levels(4 * (8 * c * K + 3 * c * V + 2 * V * K + 3 * c * c + 4 * c)))
    return dict(kernel="gd_chunk_gradients", flops=flops * league, bytes=league * per_team_bytes,
                league=league, team_threads=team_threads, regs=64,
                scratch=4 * (8 * c * K + 3 * c * V + 2 * V * K + 3 * c * c + 4 * c), **t)


def gdn_forward(gpu, T, H, K, V, C, n_h=1, seqs=1):
    """Whole local forward (intra + forward pass); FLOPs as the benchmark counts them."""
    a, b = gdn_intra(gpu, T, H, K, V, C, n_h), gdn_pass(gpu, T, H, K, V, C, n_h, seqs)
    t = a["time_s"] + b["time_s"]
    c = C * n_h
    model = (c * c * K + c ** 3 / 3.0 + 2 * c * c * V + 4 * c * c * K + 6 * c * K * V
             + 2 * c * c * V) * (T * n_h / float(c)) * H  # docs/chunkwise.md §5 model, no M terms
    bound = a["bound"] if a["time_s"] > b["time_s"] else "state pass: " + b["bound"]
    return dict(kernel="gd_forward" if n_h == 1 else "gdp_forward", flops=a["flops"] + b["flops"],
                bench_flops=model,
                bytes=a["bytes"] + b["bytes"], time_s=t, bound=bound, league=a["league"],
                team_threads=a["team_threads"], regs=64, scratch=a["scratch"],
                occupancy=a["occupancy"], limiter=a["limiter"], busy_sms=a["busy_sms"],
                l1_pressure=a["l1_pressure"], pass_league=b["league"], pass_time_s=b["time_s"],
                intra_time_s=a["time_s"])


def decay_forward(gpu, T, H, K, V, C, diagonal=False, seqs=1):
    """decay_kernels.hpp: chunk_update (team per chunk, head), chain_forward (one item per
    sequence x head x key row x 16 state columns, sequential over chunks), output (team per
    chunk, head)."""
    nc = math.ceil(T / float(C))
    up = gemm_cost(K, V, C)
    out = [gemm_cost(C, C, K, True), gemm_cost(C, V, C, True), gemm_cost(C, V, K)]
    bench = (C * C * K + C * C * V + 4 * C * K * V) * nc * H  # the benchmark's count
    flops = nc * H * (up[0] + sum(x[0] for x in out))
    exp_lane = (C * K if diagonal else C) * 2  # exp of the gate differences
    lane_fma = nc * H * (up[1] + sum(x[1] for x in out) + exp_lane * 8)
    lane_lsu = nc * H * (up[2] + sum(x[2] for x in out))
    bytes_ = 4 * nc * H * (C * (2 * K + 2 * V) + 3 * K * V + C * V)
    league = nc * H
    t1 = device_time(gpu, league, 256, 64, lane_fma / 32.0 / league, lane_lsu / 32.0 / league,
                     bytes_, **scratch_levels(4 * (4 * C * K + C * C + K * 16)))
    # chain: items of 16 columns, each reads ds and writes the state per chunk (bandwidth)
    items = seqs * H * K * math.ceil(V / 16.0)
    chain_bytes = 4 * nc * H * K * V * 2  # read ΔS, write the chunk-start state
    t2 = device_time(gpu, math.ceil(items / 256.0), 256, 40, 0, 0, chain_bytes,
                     serial_clk=nc * L2_LATENCY_CLK / float(LOADS_IN_FLIGHT))
    t = t1["time_s"] + t2["time_s"]
    bound = t1["bound"] if t1["time_s"] >= t2["time_s"] else "chain: " + t2["bound"]
    return dict(kernel="diagonal_forward" if diagonal else "scalar_forward", flops=flops,
                bench_flops=bench,
                bytes=bytes_ + chain_bytes, time_s=t, bound=bound, league=league,
                team_threads=256, regs=64, scratch=4 * (4 * C * K + C * C + K * 16),
                occupancy=t1["occupancy"], limiter=t1["limiter"], busy_sms=t1["busy_sms"],
                l1_pressure=t1["l1_pressure"])


def pack(gpu, rows, channels, runs, kind="pack_sequence"):
    """heads::impl::PackSequence (one thread per channel run, lanes = vector length 1 under
    Kokkos::AUTO, so each thread copies its run serially) or UnpackHead (TeamVectorRange over
    the row: coalesced)."""
    g = GPUS[gpu]
    nbytes = 2.0 * 4 * rows * channels
    t_bw = nbytes / (g["hbm_gbs"] * 1e9)
    if kind == "pack_sequence":
        teams_sm = min(g["blocks_sm"], g["threads_sm"] // DEVICE_TEAM_THREADS)
        threads = g["sms"] * teams_sm * min(runs, DEVICE_TEAM_THREADS)
        # a thread walks its run sector by sector: one 32-byte sector per DRAM latency
        rate = threads * 32.0 / (DRAM_LATENCY_NS * 1e-9) * 2  # read + write streams
        t = max(t_bw, nbytes / rate)
        bound = "latency (one thread per run)" if t > t_bw else "HBM bandwidth"
    else:
        t, bound = t_bw, "HBM bandwidth"
    occ = occupancy(gpu, DEVICE_TEAM_THREADS, 24)
    return dict(kernel=kind, flops=0.0, bytes=nbytes, time_s=t, bound=bound, league=rows,
                team_threads=DEVICE_TEAM_THREADS, regs=24, scratch=0, runs=runs, **occ)


KERNELS = {
    "swa_forward": lambda g, a: swa_pass(g, "forward", a["T"], a["W"], a["Hq"], a["Hkv"], a["D"]),
    "swa_dq": lambda g, a: swa_pass(g, "dq", a["T"], a["W"], a["Hq"], a["Hkv"], a["D"]),
    "swa_dkdv": lambda g, a: swa_pass(g, "dkdv", a["T"], a["W"], a["Hq"], a["Hkv"], a["D"]),
    "swa_backward": lambda g, a: swa_backward(g, a),
    "gd_intra_chunk": lambda g, a: gdn_intra(g, a["T"], a["H"], a["K"], a["V"], a["C"],
                                             a.get("n_h", 1)),
    "gd_forward_pass": lambda g, a: gdn_pass(g, a["T"], a["H"], a["K"], a["V"], a["C"],
                                             a.get("n_h", 1)),
    "gd_reverse_pass": lambda g, a: gdn_pass(g, a["T"], a["H"], a["K"], a["V"], a["C"],
                                             a.get("n_h", 1), reverse=True),
    "gd_chunk_gradients": lambda g, a: gdn_gradients(g, a["T"], a["H"], a["K"], a["V"], a["C"],
                                                     a.get("n_h", 1)),
    "gd_forward": lambda g, a: gdn_forward(g, a["T"], a["H"], a["K"], a["V"], a["C"],
                                           a.get("n_h", 1)),
    "scalar_forward": lambda g, a: decay_forward(g, a["T"], a["H"], a["K"], a["V"], a["C"]),
    "diagonal_forward": lambda g, a: decay_forward(g, a["T"], a["H"], a["K"], a["V"], a["C"],
                                                   True),
    "pack_sequence": lambda g, a: pack(g, a["rows"], a["channels"], a["runs"]),
    "unpack_head": lambda g, a: pack(g, a["rows"], a["channels"], 1, "unpack_head"),
}


def swa_backward(gpu, a):
    q = swa_pass(gpu, "dq", a["T"], a["W"], a["Hq"], a["Hkv"], a["D"])
    k = swa_pass(gpu, "dkdv", a["T"], a["W"], a["Hq"], a["Hkv"], a["D"])
    bench = 10.0 * a["D"] * a["Hq"] * a["T"] * a["W"]  # the benchmark's count (no recompute)
    return dict(kernel="swa_backward", flops=q["flops"] + k["flops"], bench_flops=bench,
                bytes=q["bytes"] + k["bytes"],
                time_s=q["time_s"] + k["time_s"], bound="dQ: %s; dK/dV: %s" % (q["bound"],
                                                                              k["bound"]),
                league=q["league"], team_threads=q["team_threads"], regs=q["regs"],
                scratch=max(q["scratch"], k["scratch"]), occupancy=q["occupancy"],
                limiter=q["limiter"], busy_sms=q["busy_sms"])


def project(gpu, kernel, args):
    r = KERNELS[kernel](gpu, args)
    g = GPUS[gpu]
    r["gpu"] = g["name"]
    r["gflops"] = r["flops"] / r["time_s"] * 1e-9 if r["flops"] else 0.0
    r.setdefault("bench_flops", r["flops"])
    # the rate in the benchmark's own FLOP count (what gpu-check compares with a measurement)
    r["bench_gflops"] = r["bench_flops"] / r["time_s"] * 1e-9 if r["flops"] else 0.0
    r["gbps"] = r["bytes"] / r["time_s"] * 1e-9
    r["fraction_fp32_peak"] = r["gflops"] / (g["fp32_tflops"] * 1e3)
    r["fraction_hbm_peak"] = r["gbps"] / g["hbm_gbs"]
    r["intensity"] = r["flops"] / r["bytes"] if r["bytes"] else 0.0
    r["ridge"] = g["fp32_tflops"] * 1e3 / g["hbm_gbs"]
    return r


def gpu_key(name):
    n = name.lower()
    for k in ("h200", "h100", "a100"):
        if k in n:
            return k
    return None


# ----------------------------------------------------------------------------- tables
SHAPES = [
    ("swa_forward", dict(T=131072, W=4096, Hq=32, Hkv=8, D=128),
     "T=128Ki W=4096 Hq=32 Hkv=8 D=128"),
    ("swa_dq", dict(T=131072, W=4096, Hq=32, Hkv=8, D=128), "same"),
    ("swa_dkdv", dict(T=131072, W=4096, Hq=32, Hkv=8, D=128), "same"),
    ("gd_intra_chunk", dict(T=131072, H=32, K=128, V=128, C=64), "T=128Ki H=32 K=V=128 C=64"),
    ("gd_forward_pass", dict(T=131072, H=32, K=128, V=128, C=64), "same, 1 sequence"),
    ("gd_forward", dict(T=131072, H=32, K=128, V=128, C=64), "same (intra + pass)"),
    ("gd_reverse_pass", dict(T=131072, H=32, K=128, V=128, C=64), "same, 1 sequence"),
    ("gd_chunk_gradients", dict(T=131072, H=32, K=128, V=128, C=64), "same"),
    ("gd_intra_chunk", dict(T=131072, H=32, K=128, V=128, C=64, n_h=2), "GDP n_h=2, same"),
    ("gd_forward", dict(T=131072, H=32, K=128, V=128, C=64, n_h=2), "GDP n_h=2 (intra + pass)"),
    ("gd_forward", dict(T=2048, H=1, K=128, V=128, C=64), "T=2048 H=1 (bench/chunkwise shape)"),
    ("swa_forward", dict(T=1024, W=4096, Hq=4, Hkv=1, D=128),
     "t=1024 W=4096 Hq=4 Hkv=1 D=128 (bench/swa shape)"),
    ("scalar_forward", dict(T=131072, H=32, K=128, V=128, C=64), "T=128Ki H=32 K=V=128 C=64"),
    ("diagonal_forward", dict(T=131072, H=32, K=128, V=128, C=64), "same"),
    ("pack_sequence", dict(rows=16384, channels=12288, runs=24),
     "rows=16Ki C=12288, 24 runs (P=8)"),
    ("pack_sequence", dict(rows=131072, channels=12288, runs=3),
     "rows=128Ki C=12288, 3 runs (P=1)"),
    ("unpack_head", dict(rows=131072, channels=1536), "rows=128Ki C_j=1536 (P=8)"),
]


def fmt(x):
    if x == 0:
        return "0"
    for unit, s in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= unit:
            return "%.3g%s" % (x / unit, s)
    return "%.3g" % x


def markdown():
    out = ["<!-- generated by scripts/gpu_model.py; do not edit by hand -->", ""]
    out.append("### GPUs (published figures)\n")
    out.append("| GPU | SMs | FP32 lanes/SM | boost GHz | FP32 TFLOP/s "
               "| TF32 tensor TFLOP/s (dense) | HBM GB/s | ridge FLOP/B (FP32) | L1+shared KiB/SM |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for k, g in GPUS.items():
        out.append("| %s | %d | %d | %.2f | %.1f | %.1f | %.0f | %.1f | %d |" % (
            g["name"], g["sms"], g["fp32_lanes"], g["clock_ghz"], g["fp32_tflops"],
            g["tf32_tflops"], g["hbm_gbs"], g["fp32_tflops"] * 1e3 / g["hbm_gbs"], g["l1_kib"]))
    out.append("\n### Per launch: FLOPs, bytes, team resources, occupancy\n")
    out.append("| kernel | shape | FLOPs | DRAM bytes | FLOP/B | league (teams) | threads/team "
               "| regs/thread (est.) | scratch/team | occupancy A100 / H100 (limiter) "
               "| resident scratch / L1, H100 |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for kernel, args, label in SHAPES:
        a, h = project("a100", kernel, args), project("h100", kernel, args)
        out.append("| %s | %s | %s | %s | %.1f | %s | %d | %d | %.0f KiB | %.0f%% / %.0f%% (%s) "
                   "| %s |" % (
            kernel, label, fmt(a["flops"]), fmt(a["bytes"]), a["intensity"], fmt(a["league"]),
            a["team_threads"], a["regs"], a["scratch"] / 1024.0, 100 * a["occupancy"],
            100 * h["occupancy"], h["limiter"],
            "%.1fx" % h["l1_pressure"] if h.get("l1_pressure") else "-"))
    out.append("\n### Projection: time, bound and fraction of peak\n")
    out.append("| kernel | shape | GPU | projected time | GFLOP/s | of FP32 peak | GB/s | of HBM "
               "peak | bound |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for kernel, args, label in SHAPES:
        for gk in ("a100", "h100", "h200"):
            r = project(gk, kernel, args)
            out.append("| %s | %s | %s | %.3g ms | %s | %.1f%% | %.0f | %.1f%% | %s |" % (
                kernel, label, GPUS[gk]["name"], r["time_s"] * 1e3,
                "%.0f" % r["gflops"] if r["flops"] else "-",
                100 * r["fraction_fp32_peak"], r["gbps"], 100 * r["fraction_hbm_peak"],
                r["bound"]))
    return "\n".join(out) + "\n"


def selftest():
    """Consistency of the figures and the projections: the FP32 peak is SMs x lanes x 2 x clock,
    and no projection runs above the FP32 or HBM peak (in executed FLOPs and compulsory bytes)."""
    errors = []
    for k, g in GPUS.items():
        peak = g["sms"] * g["fp32_lanes"] * 2 * g["clock_ghz"] / 1e3
        if abs(peak - g["fp32_tflops"]) > 0.02 * g["fp32_tflops"]:
            errors.append("%s: SMs x lanes x 2 x clock = %.1f TFLOP/s, datasheet %.1f"
                          % (k, peak, g["fp32_tflops"]))
    shapes = [a for _, a, _ in SHAPES] + [dict(T=63, W=1, Hq=1, Hkv=1, D=8, H=1, K=8, V=8, C=64,
                                                rows=1, channels=1, runs=1)]
    for gk in GPUS:
        for kernel in KERNELS:
            for a in shapes:
                try:
                    r = project(gk, kernel, a)
                except KeyError:
                    continue  # a shape of another kernel
                if r["fraction_fp32_peak"] > 1.0 + 1e-9 or r["fraction_hbm_peak"] > 1.0 + 1e-9:
                    errors.append("%s %s %s: above peak" % (gk, kernel, a))
    for e in errors:
        print("selftest: " + e)
    print("selftest: %s" % ("FAILED" if errors else "ok"))
    return 1 if errors else 0


def main(argv):
    if argv == ["--selftest"]:
        return selftest()
    if len(argv) >= 3 and argv[0] == "--project":
        gk = gpu_key(argv[1]) or argv[1]
        if gk not in GPUS:
            print(json.dumps({"error": "no model for GPU '%s'" % argv[1]}))
            return 1
        args = {}
        for kv in argv[3:]:
            k, v = kv.split("=", 1)
            args[k] = float(v) if "." in v else int(v)
        print(json.dumps(project(gk, argv[2], args), sort_keys=True))
        return 0
    if len(argv) == 2 and argv[0] == "--update":
        begin, end = "<!-- BEGIN gpu_model.py tables -->", "<!-- END gpu_model.py tables -->"
        with open(argv[1]) as f:
            text = f.read()
        a, b = text.index(begin) + len(begin), text.index(end)
        with open(argv[1], "w") as f:
            f.write(text[:a] + "\n" + markdown() + text[b:])
        return 0
    if argv and argv[0] not in ("--markdown",):
        print(__doc__)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
