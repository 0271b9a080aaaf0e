#!/usr/bin/env python3
"""PyTorch-CPU baseline of the chunkwise local forward/backward measured by ctxpar_bench_chunkwise.

The same problem as the P = 1 local kernel cases of bench/chunkwise/chunkwise_bench.cpp (fp32, one
thread, one head, T = 2048, K = V = 128, chunk 64), written as a user would in torch: contiguous
[H, T, D] tensors, the intra-chunk work batched over all chunks at once, the chunk states carried
in a Python loop over chunks, the gated delta rule in the WY/UT form ((I + A)^-1 by a unit
triangular solve), the backward by autograd. Each forward is checked once against a token-by-token
torch recurrence before it is timed. Reports torch's own SGEMM rate in the same run, the forward
GFLOP/s with the FLOP models the C++ benchmark uses, and, when bench/results/chunkwise.json holds
the ctxpar records, the speed-up of ctxpar over this baseline (forward: the single-device local
forward; forward+backward: the driver on one rank, which also forms the CP summaries).

Usage: /usr/bin/python3 bench/chunkwise/torch_baseline.py [--out bench/results/chunkwise_torch.json]
       [--ctxpar bench/results/chunkwise.json] [--repeats N]
Needs Debian's python3-torch and libopenblas0-pthread (the reference BLAS would make the comparison
meaningless).
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def sgemm_gflops(n=1024, repeats=5):
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2.0 * n ** 3 / timed(lambda: a @ b, repeats)[0] * 1e-9


def chunk_parts(q, k, g, chunk):
    """Per-chunk views [H, n, C, D], cumulative log-gates and the decay matrix exp(γ_i − γ_j)."""
    heads, length, _ = q.shape
    n = length // chunk
    gam = g.reshape(heads, n, chunk).cumsum(-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    diff = (gam.unsqueeze(-1) - gam.unsqueeze(-2)).masked_fill(~causal, float("-inf"))
    return n, gam, diff.exp()


def gdn_chunkwise(q, k, v, g, beta, chunk=64):
    """Gated delta rule, chunkwise WY/UT form. q, k [H, T, K]; v [H, T, V]; g, beta [H, T]."""
    heads, length, kd = q.shape
    vd = v.shape[-1]
    n, gam, decay = chunk_parts(q, k, g, chunk)
    qc = (q * kd ** -0.5).reshape(heads, n, chunk, kd)
    kc = k.reshape(heads, n, chunk, kd)
    vc = v.reshape(heads, n, chunk, vd)
    bc = beta.reshape(heads, n, chunk, 1)
    big = gam.exp().unsqueeze(-1)  # Γ_i
    eye = torch.eye(chunk)
    a = (bc * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)
    x = torch.linalg.solve_triangular(eye + a, eye.expand_as(a), upper=False, unitriangular=True)
    w = x @ (bc * big * kc)
    u_tilde = x @ (bc * vc)
    p = (qc @ kc.transpose(-1, -2)) * decay
    k_end = kc * (gam[..., -1:] - gam).exp().unsqueeze(-1)
    q_big = qc * big
    last = gam[..., -1].exp()
    state = q.new_zeros(heads, kd, vd)
    outs = []
    for c in range(n):
        u = u_tilde[:, c] - w[:, c] @ state
        outs.append(q_big[:, c] @ state + p[:, c] @ u)
        state = last[:, c, None, None] * state + k_end[:, c].transpose(-1, -2) @ u
    return torch.cat(outs, dim=1)


def scalar_chunkwise(q, k, v, g, chunk=64):
    """Scalar decay (A_t = exp(g_t)·I), chunkwise."""
    heads, length, kd = q.shape
    vd = v.shape[-1]
    n, gam, decay = chunk_parts(q, k, g, chunk)
    qc = (q * kd ** -0.5).reshape(heads, n, chunk, kd)
    kc = k.reshape(heads, n, chunk, kd)
    vc = v.reshape(heads, n, chunk, vd)
    intra = ((qc @ kc.transpose(-1, -2)) * decay) @ vc
    q_big = qc * gam.exp().unsqueeze(-1)
    k_end = kc * (gam[..., -1:] - gam).exp().unsqueeze(-1)
    updates = k_end.transpose(-1, -2) @ vc
    last = gam[..., -1].exp()
    state = q.new_zeros(heads, kd, vd)
    outs = []
    for c in range(n):
        outs.append(q_big[:, c] @ state + intra[:, c])
        state = last[:, c, None, None] * state + updates[:, c]
    return torch.cat(outs, dim=1)


def recurrence(q, k, v, g, beta=None):
    """Token-by-token reference (fp64), the check of each chunkwise forward."""
    q, k, v, g = q.double(), k.double(), v.double(), g.double()
    heads, length, kd = q.shape
    state = q.new_zeros(heads, kd, v.shape[-1])
    outs = []
    for t in range(length):
        kt, vt = k[:, t].unsqueeze(-1), v[:, t].unsqueeze(1)
        state = g[:, t].exp()[:, None, None] * state
        if beta is None:
            state = state + kt @ vt
        else:
            b = beta[:, t].double()[:, None, None]
            state = state + kt @ (b * (vt - kt.transpose(-1, -2) @ state))
        outs.append((q[:, t].unsqueeze(1) * kd ** -0.5) @ state)
    return torch.cat(outs, dim=1)


def inputs(heads, length, kd, vd, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.rand(*s, generator=gen) * 2 - 1  # noqa: E731
    q, v = rnd(heads, length, kd), rnd(heads, length, vd)
    k = torch.nn.functional.normalize(rnd(heads, length, kd), dim=-1)
    g = -0.06 + 0.04 * rnd(heads, length)
    beta = 0.5 + 0.45 * rnd(heads, length)
    return q, k, v, g, beta


def gdn_flops(c, k, v, with_m):
    """Per chunk, triangular products at triangular size (the convention of docs/performance.md and
    of the C++ benchmark): A C²K, solve C³/3, Ũ/W̃ C²V + C²K, QKᵀ⊙L C²K, U 2CKV, outputs 2CKV + C²V,
    state 2CKV; the dense M terms only with with_m."""
    f = (c * c * k + c ** 3 / 3 + (c * c * v + c * c * k) + c * c * k + 2 * c * k * v
         + (2 * c * k * v + c * c * v) + 2 * c * k * v)
    return f + (2 * c * k * k + 2 * k ** 3 if with_m else 0)


def scalar_flops(c, k, v):
    return c * c * k + c * c * v + 4 * c * k * v


def main():
    parser = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--out", default=os.path.join(root, "bench/results/chunkwise_torch.json"))
    parser.add_argument("--ctxpar", default=os.path.join(root, "bench/results/chunkwise.json"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    heads, length, kd, vd, chunk = 1, 2048, 128, 128, 64
    ours = {}
    if os.path.exists(args.ctxpar):
        for r in json.load(open(args.ctxpar)):
            ours[r.get("case")] = r
    sgemm = sgemm_gflops()
    records = []
    q, k, v, g, beta = inputs(heads, length, kd, vd)
    cases = [
        ("gdn", lambda *a: gdn_chunkwise(*a, chunk=chunk), (q, k, v, g, beta),
         gdn_flops(chunk, kd, vd, False) * length / chunk * heads,
         "gdn_vs_recurrence_C64", "gdn_local_forward"),
        ("scalar", lambda *a: scalar_chunkwise(*a, chunk=chunk), (q, k, v, g),
         scalar_flops(chunk, kd, vd) * length / chunk * heads,
         "scalar_local_forward", "scalar_local_forward"),
    ]
    for family, fn, args_in, flops, fwd_case, both_case in cases:
        with torch.no_grad():
            got = fn(*args_in).double()
            ref = recurrence(*args_in)
        rel = float((got - ref).norm() / ref.norm())
        assert rel < 1e-4, f"{family}: torch chunkwise differs from the recurrence (rel L2 {rel})"
        with torch.no_grad():
            t_fwd = timed(lambda: fn(*args_in), args.repeats)
        leaves = [x.clone().requires_grad_(True) for x in args_in]
        dout = torch.rand(heads, length, vd) * 2 - 1

        def both():
            for x in leaves:
                x.grad = None
            (fn(*leaves) * dout).sum().backward()

        t_both = timed(both, args.repeats)
        rec = {
            "benchmark": "chunkwise_torch", "case": family + "_torch", "family": family,
            "machine": platform.node(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "tokens": length, "heads": heads,
            "key_dim": kd, "value_dim": vd, "chunk": chunk,
            "torch_sgemm_gflops": sgemm,
            "forward_median_s": t_fwd[0], "forward_min_s": t_fwd[1], "forward_max_s": t_fwd[2],
            "forward_backward_median_s": t_both[0], "forward_backward_min_s": t_both[1],
            "forward_backward_max_s": t_both[2],
            "forward_gflops": flops / t_fwd[0] * 1e-9, "rel_l2_vs_recurrence": rel,
        }
        if fwd_case in ours:
            ctx = ours[fwd_case]
            rec["ctxpar_forward_median_s"] = ctx["chunkwise_median_s"]
            rec["speedup_forward"] = t_fwd[0] / ctx["chunkwise_median_s"]
        if both_case in ours and "forward_backward_median_s" in ours[both_case]:
            ctx = ours[both_case]
            rec["ctxpar_forward_backward_median_s"] = ctx["forward_backward_median_s"]
            rec["speedup_forward_backward"] = t_both[0] / ctx["forward_backward_median_s"]
        if both_case in ours:
            rec["ctxpar_sgemm_gflops"] = ours[both_case].get("sgemm_gflops")
        records.append(rec)
        print(f"{family}: torch forward {t_fwd[0] * 1e3:.2f} ms ({rec['forward_gflops']:.1f} "
              f"GFLOP/s), fwd+bwd {t_both[0] * 1e3:.2f} ms, torch SGEMM {sgemm:.1f} GFLOP/s, "
              f"speed-up fwd x{rec.get('speedup_forward', float('nan')):.2f}, "
              f"fwd+bwd x{rec.get('speedup_forward_backward', float('nan')):.2f}")
    records.append({"benchmark": "chunkwise_torch", "case": "torch sgemm ceiling", "n": 1024,
                    "gflops": sgemm, "torch": torch.__version__,
                    "threads": torch.get_num_threads()})
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {len(records)} records to {args.out}")


if __name__ == "__main__":
    main()
