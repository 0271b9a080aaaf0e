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

Usage: /usr/bin/python3 bench/swa/torch_baseline.py [--out bench/results/swa_torch.json] [--repeats N]
Needs Debian's python3-torch and libopenblas0-pthread (without OpenBLAS torch multiplies with the
reference BLAS at a few GFLOP/s, which would make the comparison meaningless).
"""
import argparse
import json
import os
import statistics
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results/swa_torch.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ctxpar", default="bench/results/swa.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ours = {}
    if os.path.exists(args.ctxpar):
        for r in json.load(open(args.ctxpar)):
            if r.get("kind") == "local_kernel":
                ours[(r["dim"], r["window"])] = r
    ceiling = sgemm_gflops()
    print("torch %s SGEMM (n=1024, 1 thread): %.2f GFLOP/s" % (torch.__version__, ceiling))
    records = [{"benchmark": "swa_torch", "case": "torch sgemm ceiling", "gflops": ceiling,
                "torch": torch.__version__, "threads": 1}]
    t, hq, hkv = 1024, 4, 1
    for dim in (64, 128):
        for window in (512, 1024, 2048, 4096):
            length = window - 1 + t
            q = torch.rand(hq, t, dim) * 2 - 1
            k = torch.rand(hkv, length, dim) * 2 - 1
            v = torch.rand(hkv, length, dim) * 2 - 1
            dout = torch.rand(hq, t, dim) * 2 - 1
            with torch.no_grad():
                fwd, fwd_min = timed(lambda: swa(q, k, v, window), args.repeats)
            qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))

            # The backward alone: the forward that records the graph runs untimed each repeat (a
            # difference of two noisy timings would not survive a loaded machine).
            def bwd_only():
                loss = (swa(qg, kg, vg, window) * dout).sum()
                start = time.perf_counter()
                loss.backward()
                seconds = time.perf_counter() - start
                qg.grad = kg.grad = vg.grad = None
                return seconds

            bwd, bwd_min = timed_inner(bwd_only, args.repeats)
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
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
