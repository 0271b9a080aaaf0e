#!/usr/bin/env python3
"""PyTorch-CPU time of the sliding-window attention forward at the shape of `ctxpar swa` in the
default-versus-native comparison (T = 4096, H = 8 query and key heads, D = 64, W = 1024, one
thread): the blockwise formulation of bench/swa/torch_baseline.py. Prints the torch version and the
fastest of REPEATS calls in seconds, after one warm-up call, the statistic the tool's steady_state
reports.

  torch_swa_step.py [REPEATS]
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "swa"))
from torch_baseline import swa  # noqa: E402  (the formulation every SWA comparison uses)


def main(repeats):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokens, heads, dim, window = 4096, 8, 64, 1024
    q, k, v = (torch.rand(heads, tokens, dim) * 2 - 1 for _ in range(3))
    with torch.no_grad():
        swa(q, k, v, window)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            swa(q, k, v, window)
            times.append(time.perf_counter() - start)
    print(torch.__version__, repr(min(times)))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
