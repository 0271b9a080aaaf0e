#!/usr/bin/env python3
"""PyTorch-CPU baseline of the sliding-window attention step measured by ctxpar_bench_swa.

The same problem as the kernel cases of bench/swa/swa_bench.cpp (fp32, one thread, t = 1024
queries, Hq = 4, Hkv = 1, a full cache of W - 1 keys, D = 64/128, W = 512..4096), written as a user
would: contiguous [H, T, D] tensors, the window handled blockwise (each block of 256 queries against
the W - 1 + 256 keys it can see, a band mask, softmax, weighted sum), GQA by expanding the key
heads, the backward by autograd. Reports torch's own SGEMM rate in the same run, the GFLOP/s of
the forward and of the backward (timed alone, after an untimed forward) with the same FLOP
formulas, and, when
bench/results/swa.json is present, the speed-up of the ctxpar kernels (their median times from
that file, measured just before on the same machine) over this baseline, from medians and from
the best of the repeats.

It also times the step shape of the plan-then-execute issue, the whole stream in one step with no
cache (t = 4096 queries, Hq = 8, Hkv = 8 and 1, D = 64, W = 1024), against the ctxpar step a user
calls (`plan.forward` / `plan.backward`, the `step_vs_kernel` records of bench/results/swa.json).

Usage: /usr/bin/python3 bench/swa/torch_baseline.py [--out bench/results/swa_torch.json] [--repeats N]
       [--step-only]   (with --step-only and no --out: swa_torch_step.json in the temporary directory)
Needs Debian's python3-torch and libopenblas0-pthread (without OpenBLAS torch multiplies with the
reference BLAS at a few GFLOP/s, which would make the comparison meaningless).
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import torch


def timed(fn, repeats):
    """Median and minimum wall time of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def timed_inner(fn, repeats):
    """Like timed, for an fn() that times its own measured part and returns the seconds."""
    fn()
    times = [fn() for _ in range(repeats)]
    return statistics.median(times), min(times)


def sgemm_gflops(n=1024, repeats=5):
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2.0 * n ** 3 / timed(lambda: a @ b, repeats)[0] * 1e-9


def swa(q, k, v, window, block=256):
    """q [H, t, D]; k, v [Hkv, L, D]; query i is at position L - t + i, key j at j."""
    heads, t, dim = q.shape
    length = k.shape[1]
    c = length - t
    group = heads // k.shape[0]
    k = k.unsqueeze(1).expand(-1, group, -1, -1).reshape(heads, length, dim)
    v = v.unsqueeze(1).expand(-1, group, -1, -1).reshape(heads, length, dim)
    scale = 1.0 / dim ** 0.5
    outs = []
    for i0 in range(0, t, block):
        i1 = min(t, i0 + block)
        lo, hi = max(0, c + i0 - window + 1), c + i1
        s = (q[:, i0:i1] @ k[:, lo:hi].transpose(1, 2)) * scale
        qi = torch.arange(c + i0, c + i1).unsqueeze(1)
        kj = torch.arange(lo, hi).unsqueeze(0)
        s = s.masked_fill(~((kj <= qi) & (qi - kj < window)), float("-inf"))
        outs.append(torch.softmax(s, dim=-1) @ v[:, lo:hi])
    return torch.cat(outs, dim=1)


def time_forward_backward(q, k, v, dout, window, repeats):
    """(median, min) of the forward, then of the backward alone: the forward that records the graph
    runs untimed each repeat (a difference of two noisy timings would not survive a loaded
    machine)."""
    with torch.no_grad():
        fwd = timed(lambda: swa(q, k, v, window), repeats)
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))

    def bwd_only():
        loss = (swa(qg, kg, vg, window) * dout).sum()
        start = time.perf_counter()
        loss.backward()
        seconds = time.perf_counter() - start
        qg.grad = kg.grad = vg.grad = None
        return seconds

    return fwd, timed_inner(bwd_only, repeats)


def step_cases(steps, ceiling, repeats):
    """The issue's step shape, whole stream in one step, no cache: t = 4096, Hq = 8, Hkv = 8 and 1,
    D = 64, W = 1024, against the ctxpar step (plan.forward / plan.backward) of the same shape."""
    records = []
    t, window, hq, dim = 4096, 1024, 8, 64
    for hkv in (8, 1):
        q = torch.rand(hq, t, dim) * 2 - 1
        k = torch.rand(hkv, t, dim) * 2 - 1
        v = torch.rand(hkv, t, dim) * 2 - 1
        dout = torch.rand(hq, t, dim) * 2 - 1
        (fwd, fwd_min), (bwd, bwd_min) = time_forward_backward(q, k, v, dout, window, repeats)
        rec = {"benchmark": "swa_torch", "case": "torch step Hkv=%d" % hkv, "kind": "step",
               "queries": t, "window": window, "q_heads": hq, "kv_heads": hkv, "dim": dim,
               "forward_median_s": fwd, "backward_median_s": bwd, "forward_min_s": fwd_min,
               "backward_min_s": bwd_min, "sgemm_gflops": ceiling}
        line = "torch step t=%d W=%d Hq=%d Hkv=%d D=%d: forward %.4f s, backward %.4f s" % (
            t, window, hq, hkv, dim, fwd, bwd)
        mine = steps.get((t, window, hq, hkv, dim))
        if mine:
            for op in ("forward", "backward"):
                rec["ctxpar_step_%s_speedup" % op] = rec[op + "_median_s"] / mine["step_%s_median_s" % op]
                rec["ctxpar_step_%s_speedup_min" % op] = rec[op + "_min_s"] / mine["step_%s_min_s" % op]
            line += "; ctxpar step speed-up forward %.2fx, backward %.2fx (best of repeats: %.2fx, %.2fx)" % (
                rec["ctxpar_step_forward_speedup"], rec["ctxpar_step_backward_speedup"],
                rec["ctxpar_step_forward_speedup_min"], rec["ctxpar_step_backward_speedup_min"])
        print(line, flush=True)
        records.append(rec)
    return records


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None,
                        help="default bench/results/swa_torch.json; with --step-only a file in the "
                             "temporary directory, so that a partial run never replaces the record")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ctxpar", default="bench/results/swa.json")
    parser.add_argument("--step-only", action="store_true",
                        help="only the step shape (pairs with ctxpar_bench_swa --step-only)")
    args = parser.parse_args()
    if args.out is None:
        args.out = (os.path.join(tempfile.gettempdir(), "swa_torch_step.json") if args.step_only
                    else "bench/results/swa_torch.json")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ours, steps = {}, {}
    if os.path.exists(args.ctxpar):
        for r in json.load(open(args.ctxpar)):
            if r.get("kind") == "local_kernel":
                ours[(r["dim"], r["window"])] = r
            elif r.get("kind") == "step_vs_kernel":
                steps[(r["queries"], r["window"], r["q_heads"], r["kv_heads"], r["dim"])] = r
    ceiling = sgemm_gflops()
    print("torch %s SGEMM (n=1024, 1 thread): %.2f GFLOP/s" % (torch.__version__, ceiling))
    records = [{"benchmark": "swa_torch", "case": "torch sgemm ceiling", "gflops": ceiling,
                "torch": torch.__version__, "threads": 1}]
    t, hq, hkv = 1024, 4, 1
    for dim in (() if args.step_only else (64, 128)):
        for window in (512, 1024, 2048, 4096):
            length = window - 1 + t
            q = torch.rand(hq, t, dim) * 2 - 1
            k = torch.rand(hkv, length, dim) * 2 - 1
            v = torch.rand(hkv, length, dim) * 2 - 1
            dout = torch.rand(hq, t, dim) * 2 - 1
            (fwd, fwd_min), (bwd, bwd_min) = time_forward_backward(q, k, v, dout, window, args.repeats)
            pairs = t * window
            gf, gb = 4.0 * dim * hq * pairs / fwd * 1e-9, 10.0 * dim * hq * pairs / bwd * 1e-9
            rec = {"benchmark": "swa_torch", "case": "torch D=%d W=%d" % (dim, window), "dim": dim,
                   "window": window, "queries": t, "q_heads": hq, "kv_heads": hkv,
                   "forward_median_s": fwd, "backward_median_s": bwd, "forward_min_s": fwd_min,
                   "backward_min_s": bwd_min, "forward_gflops": gf,
                   "backward_gflops": gb, "sgemm_gflops": ceiling, "forward_ratio": gf / ceiling,
                   "backward_ratio": gb / ceiling}
            line = "torch D=%3d W=%5d: forward %6.2f GFLOP/s (%.3f of its SGEMM), backward %6.2f GFLOP/s (%.3f)" % (
                dim, window, gf, gf / ceiling, gb, gb / ceiling)
            mine = ours.get((dim, window))
            if mine:
                rec["ctxpar_forward_speedup"] = fwd / mine["forward_median_s"]
                rec["ctxpar_backward_speedup"] = bwd / mine["backward_median_s"]
                # Best-of-repeats on both sides: less sensitive to load spikes than medians.
                rec["ctxpar_forward_speedup_min"] = fwd_min / mine["forward_min_s"]
                rec["ctxpar_backward_speedup_min"] = bwd_min / mine["backward_min_s"]
                line += "; ctxpar speed-up forward %.2fx, backward %.2fx (best of repeats: %.2fx, %.2fx)" % (
                    rec["ctxpar_forward_speedup"], rec["ctxpar_backward_speedup"],
                    rec["ctxpar_forward_speedup_min"], rec["ctxpar_backward_speedup_min"])
            print(line, flush=True)
            records.append(rec)
    records += step_cases(steps, ceiling, args.repeats)
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)
    print("wrote %d records to %s" % (len(records), args.out))


if __name__ == "__main__":
    main()
