#!/usr/bin/env python3
"""Fuzz suite of the `ctxpar` tool: malformed and nonsensical inputs to every subcommand.

Each case is a subcommand, its options and an input directory, with what must happen:
  "refuse"  a non-zero exit whose message names the culprit (a file or an option);
  "pass"    exit 0, the --out files present, and no backend warning the user did not cause;
  "fail"    exit 1 (the subcommand's own distributed-vs-single-rank check must fail);
  "finite"  as "pass", and every written .npy is finite (a log-decay of −∞ is a hard reset, which
            the token recurrence handles: no NaN may appear);
  "either"  exit 0 or 1 (non-finite inputs: propagated as the single-rank operator does); with
            exit 0 the summary must say the non-finite patterns are equal and count the NaN/Inf
            in the written output.
Every case fails on a signal, a hang (timeout), a C++ terminate/backtrace, and, for a refused
case, on an --out directory left behind (files the case itself put there excepted) or, for a
refused `hybrid --save-reference`, on a reference.txt written.

The "hostile/" cases go where the tool meets the file system and the extremes of its options:
FIFOs, devices and directories where a file is expected, outputs that cannot be committed (every
file written or none), `hybrid --reference` directories corrupted line by line and value by value
(a NaN or Inf in a saved reference must fail the check), empty option values, lenient .npy
headers, integer options near INT64_MAX, resource limits and ranks that hold no tokens. Each rank runs under an address-space limit (prlimit;
none in an ASan build, whose shadow memory needs terabytes of address space: ASan limits RSS).

Standard library only: .npy files are written with `struct`. Deterministic: the seed picks each
case's rank count and the random values.
"""
import argparse
import concurrent.futures
import json
import math
import os
import random
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time

# ---- .npy files -----------------------------------------------------------------------------

# bf16: bfloat16 as the tool reads it, its bit patterns in a '<u2' array (the upper halves of the
# fp32 values; truncated here, any pattern is a valid input).
DESCR = {"f4": "<f4", "f8": "<f8", "i4": "<i4", "i8": "<i8", "f2": "<f2", ">f4": ">f4",
         "bf16": "<u2"}
PACK = {"f4": "<f", "f8": "<d", "i4": "<i", "i8": "<q", "f2": "<e", ">f4": ">f"}


def npy(dtype, shape, values=None, *, descr=None, fortran=False, version=1, shape_text=None,
        header=None, extra=b"", cut=None):
    """The bytes of a .npy file; the keyword arguments break it in one way each."""
    count = 1
    for e in shape:
        count *= e
    if values is None:
        values = [0.0] * count
    if dtype == "bf16":
        data = b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16)
                        for v in values) + extra
    else:
        data = b"".join(struct.pack(PACK[dtype], v) for v in values) + extra
    if shape_text is None:
        shape_text = "(" + "".join(f"{e}, " for e in shape).rstrip(" ") + ")"
        if len(shape) > 1:
            shape_text = shape_text.replace(",)", ")")
    if header is None:
        header = (f"{{'descr': '{descr or DESCR[dtype]}', 'fortran_order': "
                  f"{'True' if fortran else 'False'}, 'shape': {shape_text}, }}")
    prefix = 10 if version == 1 else 12
    pad = (64 - (prefix + len(header) + 1) % 64) % 64
    h = (header + " " * pad + "\n").encode("latin-1")
    out = b"\x93NUMPY" + bytes([version, 0])
    out += struct.pack("<H", len(h)) if version == 1 else struct.pack("<I", len(h))
    out += h + data
    return out if cut is None else out[:cut]


class Rng:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def values(self, n, lo=-1.0, hi=1.0):
        return [self.r.uniform(lo, hi) for _ in range(n)]


# ---- valid input sets -------------------------------------------------------------------------

def swa_inputs(rng, T=9, H=2, HKV=1, D=4, dtype="f4"):
    return {"q.npy": npy(dtype, (T, H, D), rng.values(T * H * D)),
            "k.npy": npy(dtype, (T, HKV, D), rng.values(T * HKV * D)),
            "v.npy": npy(dtype, (T, HKV, D), rng.values(T * HKV * D))}


def chunkwise_inputs(rng, family="gdn", T=12, H=2, K=4, V=4, M=1, dtype="f4", cu=None):
    f = {"q.npy": npy(dtype, (T, H, K), rng.values(T * H * K))}
    kshape = (T, M, H, K) if family == "gdp" else (T, H, K)
    vshape = (T, M, H, V) if family == "gdp" else (T, H, V)
    n = 1
    for e in kshape:
        n *= e
    # Unit-norm-ish keys keep the delta rule stable.
    f["k.npy"] = npy(dtype, kshape, rng.values(n, -0.4, 0.4))
    n = 1
    for e in vshape:
        n *= e
    f["v.npy"] = npy(dtype, vshape, rng.values(n))
    gshape = (T, H, K) if family == "diagonal" else (T, H)
    n = 1
    for e in gshape:
        n *= e
    f["g.npy"] = npy(dtype, gshape, rng.values(n, -0.5, -0.01))
    if family in ("gdn", "gdp"):
        bshape = (T, M, H) if family == "gdp" else (T, H)
        n = 1
        for e in bshape:
            n *= e
        f["beta.npy"] = npy(dtype, bshape, rng.values(n, 0.1, 0.9))
    if cu is not None:
        f["cu_seqlens.npy"] = npy("i4", (len(cu),), cu)
    return f


HEADS = dict(H=2, d=2, G=1, N=2, M=1, w=2)


def heads_channels(H, d, G, N, M, w):
    return H * d + M * H * d + M * G * N + G * N + M * H + H, H * d * M + G * N * (M + 1)


def heads_inputs(rng, T=8, dtype="f4", cu=None):
    H, d, G, N, M, w = (HEADS[k] for k in "HdGNMw")
    c, cc = heads_channels(H, d, G, N, M, w)
    pd = "f8" if dtype == "f8" else "f4"  # parameters stay fp32 beside 16-bit activations
    f = {"x.npy": npy(dtype, (T, c), rng.values(T * c, -0.5, 0.5)),
         "conv_w.npy": npy(pd, (cc, w), rng.values(cc * w, -0.5, 0.5)),
         "conv_b.npy": npy(pd, (cc,), rng.values(cc, -0.1, 0.1)),
         "dt_bias.npy": npy(pd, (H,), rng.values(H)),
         "A_log.npy": npy(pd, (H,), rng.values(H, -0.5, 0.5))}
    if cu is not None:
        f["cu_seqlens.npy"] = npy("i4", (len(cu),), cu)
    return f


def heads_options():
    H, d, G, N, M, w = (HEADS[k] for k in "HdGNMw")
    # UnevenHeads: 2 heads over 3 ranks.
    return {"nheads": H, "headdim": d, "ngroups": G, "dstate": N, "householder": M,
            "conv-width": w, "uneven": None}


# ---- cases ------------------------------------------------------------------------------------

class Case:
    def __init__(self, name, command, options, files=None, expect="refuse", culprits=(),
                 ranks=None, outputs=(), out_files=None, reference=None, env=None):
        self.name, self.command, self.options = name, command, dict(options)
        self.env = env or {}  # set for this run only (e.g. CTXPAR_HOST_ISA)
        self.files = files  # None: the subcommand takes no --in
        self.expect, self.culprits, self.ranks, self.outputs = expect, culprits, ranks, outputs
        self.out_files = out_files or {}  # put into --out before the run (same kinds as files)
        # (saved, mutate): a copy of the saved reference `saved` (a key of REFERENCES) given as
        # --reference after mutate(directory) broke it; or ("save", prepare) for a
        # --save-reference directory prepare(directory) set up.
        self.reference = reference


def replace(files, name, content):
    f = dict(files)
    if content is None:
        f.pop(name, None)
    else:
        f[name] = content
    return f


def npy_breakers(dtype, shape, wrong_rank_shape):
    """Every way to break one .npy file: (label, content). Content is bytes, "DIR", "FIFO"."""
    n = 1
    for e in shape:
        n *= e
    good = npy(dtype, shape)
    other = "f8" if dtype == "f4" else "f4"
    return [
        ("bad-magic", b"NOTNPY" + good[6:]),
        ("empty", b""),
        ("short", good[:7]),
        ("truncated-header", good[:20]),
        ("truncated-data", good[:-3]),
        ("trailing-bytes", good + b"\0\0\0\0"),
        ("huge-shape-overflow", npy(dtype, (), shape_text="(4294967296, 4294967296, 4294967296)")),
        ("huge-shape", npy(dtype, (), shape_text="(1000000000, 1000000000)")),
        ("shape-too-many-digits", npy(dtype, (), shape_text="(1234567890123456789012,)")),
        ("negative-dim", npy(dtype, (), shape_text="(-1, 4)")),
        ("shape-not-a-tuple", npy(dtype, (), shape_text="[3, 4]")),
        ("shape-letters", npy(dtype, (), shape_text="(3, four)")),
        ("header-unterminated", npy(dtype, shape, header="{'descr': '<f4', 'shape': (2, 3")),
        ("header-no-descr", npy(dtype, shape, header="{'fortran_order': False, 'shape': (1,), }")),
        ("header-len-zero", b"\x93NUMPY\x01\x00\x00\x00" + good[10:]),
        ("header-len-huge", b"\x93NUMPY\x02\x00\xff\xff\xff\x7f" + good[10:]),
        ("version-3", npy(dtype, shape, version=1)[:6] + b"\x03\x00" + good[8:]),
        ("big-endian", npy(">f4", shape, [0.0] * n)),
        ("fortran-order", npy(dtype, shape, fortran=True)),
        ("dtype-int64", npy("i8", shape, [0] * n)),
        ("dtype-float16", npy("f2", shape, [0.0] * n)),
        ("dtype-other-float", npy(other, shape, [0.0] * n)),
        ("dtype-int32", npy("i4", shape, [0] * n)),
        ("wrong-rank", npy(dtype, wrong_rank_shape)),
        ("zero-d", npy(dtype, (), [0.0])),
        ("directory", "DIR"),
        ("fifo", "FIFO"),
        ("missing", None),
    ]


# The .npy reader is shared: every way of breaking a file runs against swa's q.npy; the other
# files get a sample that still covers each kind of culprit (reader, dtype, rank, file system).
SAMPLE = ("truncated-data", "huge-shape-overflow", "dtype-other-float", "dtype-int32", "wrong-rank",
          "directory", "empty", "missing")
PRIMARY_SAMPLE = SAMPLE + ("bad-magic", "huge-shape", "header-unterminated", "fifo",
                           "big-endian", "zero-d")


def make_cases(seed):
    rng = Rng(seed)
    cases = []

    # swa ------------------------------------------------------------------------------------
    swa = swa_inputs(rng)
    swa_out = ("out.npy", "summary.json")
    cases.append(Case("swa/valid", "swa", {}, swa, "pass", ranks=(1, 2, 3), outputs=swa_out))
    cases.append(Case("swa/valid-backward-f8-halo", "swa",
                      {"backward": None, "policy": "halo", "window": 3, "chunk": 4},
                      swa_inputs(rng, dtype="f8"), "pass", ranks=(2, 3),
                      outputs=swa_out + ("dq.npy", "dk.npy", "dv.npy")))
    # 16-bit tensors end to end: read, computed, checked bitwise against one rank, written.
    cases.append(Case("swa/valid-backward-bf16", "swa", {"backward": None, "window": 4, "chunk": 4},
                      swa_inputs(rng, dtype="bf16"), "pass", ranks=(1, 3),
                      outputs=swa_out + ("dq.npy", "dk.npy", "dv.npy")))
    cases.append(Case("swa/valid-backward-f2-halo", "swa",
                      {"backward": None, "policy": "halo", "window": 3, "chunk": 4},
                      swa_inputs(rng, dtype="f2"), "pass", ranks=(2,),
                      outputs=swa_out + ("dq.npy", "dk.npy", "dv.npy")))
    # The tensor-core kernels (emulated on the host): bitwise against one rank on the same
    # kernels; refused by name for fp64 tensors.
    cases.append(Case("swa/valid-backward-bf16-tensor-core", "swa",
                      {"backward": None, "window": 4, "chunk": 4, "kernels": "tensor-core"},
                      swa_inputs(rng, dtype="bf16"), "pass", ranks=(1, 3),
                      outputs=swa_out + ("dq.npy", "dk.npy", "dv.npy")))
    cases.append(Case("swa/kernels=tensor-core-f8", "swa", {"kernels": "tensor-core"},
                      swa_inputs(rng, dtype="f8"), culprits=("options.kernels",), ranks=(2,)))
    cases.append(Case("swa/k.npy/f4-beside-bf16", "swa", {},
                      replace(swa_inputs(rng, dtype="bf16"), "k.npy", npy("f4", (9, 1, 4))),
                      culprits=("k.npy",)))
    # --repeat: the checked result is the last of the repeated runs, so the check still holds.
    cases.append(Case("swa/valid-repeat", "swa",
                      {"backward": None, "policy": "halo", "window": 3, "chunk": 4, "repeat": 2},
                      swa, "pass", ranks=(1, 3), outputs=swa_out + ("dq.npy",)))
    # --overlap: each forward posts the next step's all-gather; the results and the check are
    # those of the gathered stream (repeated runs: the posted path in steady state).
    cases.append(Case("swa/valid-overlap-backward-bf16", "swa",
                      {"backward": None, "window": 4, "chunk": 3, "overlap": None},
                      swa_inputs(rng, dtype="bf16"), "pass", ranks=(1, 2, 3),
                      outputs=swa_out + ("dq.npy", "dk.npy", "dv.npy")))
    cases.append(Case("swa/valid-overlap-rope-after-repeat", "swa",
                      {"backward": None, "policy": "rope-after", "window": 3, "chunk": 4,
                       "overlap": None, "repeat": 2}, swa, "pass", ranks=(3,),
                      outputs=swa_out + ("dq.npy",)))
    for label, extra in (("halo", {"policy": "halo"}), ("whole-axis", {"layout": "whole-axis"})):
        cases.append(Case(f"swa/--overlap-with-{label}", "swa", dict(extra, overlap=None), swa,
                          culprits=("--overlap",), ranks=(2,)))
    for bad in ("-1", "x", "2000000"):
        cases.append(Case(f"swa/repeat={bad}", "swa", {"repeat": bad}, swa,
                          culprits=("--repeat",), ranks=(2,)))
    for label, content in npy_breakers("f4", (9, 2, 4), (9, 8)):
        cases.append(Case(f"swa/q.npy/{label}", "swa", {}, replace(swa, "q.npy", content),
                          culprits=("q.npy",)))
    for label, content in npy_breakers("f4", (9, 1, 4), (9, 4)):
        if label not in SAMPLE:
            continue
        cases.append(Case(f"swa/k.npy/{label}", "swa", {}, replace(swa, "k.npy", content),
                          culprits=("k.npy",)))
    for label, dims in (("zero-tokens", (0, 2, 4)), ("zero-heads", (9, 0, 4)),
                        ("zero-dim", (9, 2, 0))):
        cases.append(Case(f"swa/q.npy/{label}", "swa", {},
                          replace(swa, "q.npy", npy("f4", dims)), culprits=("q.npy",)))
    cases.append(Case("swa/v.npy/mismatched-tokens", "swa", {},
                      replace(swa, "v.npy", npy("f4", (8, 1, 4))), culprits=("v.npy",)))
    cases.append(Case("swa/k.npy/heads-not-dividing", "swa", {},
                      replace(swa, "k.npy", npy("f4", (9, 3, 4))), culprits=("k.npy",)))
    cases.append(Case("swa/pos.npy/wrong-length", "swa", {},
                      replace(swa, "pos.npy", npy("i4", (4,), [0, 1, 2, 3])),
                      culprits=("pos.npy",)))
    cases.append(Case("swa/pos.npy/float", "swa", {},
                      replace(swa, "pos.npy", npy("f4", (9,))), culprits=("pos.npy",)))
    cases.append(Case("swa/seq.npy/wrong-length", "swa", {},
                      replace(swa, "seq.npy", npy("i4", (3,), [0, 0, 1])), culprits=("seq.npy",)))
    cases.append(Case("swa/dout.npy/wrong-shape", "swa", {"backward": None},
                      replace(swa, "dout.npy", npy("f4", (9, 2, 3))), culprits=("dout.npy",)))
    for opt, value in (("chunk", -1), ("chunk", "abc"), ("chunk", 2**70), ("window", -1),
                       ("rope-base", 0), ("rope-base", -2), ("rope-base", "nan"),
                       ("rope-base", "inf"), ("rope-base", "1e999"), ("policy", "bogus"),
                       ("layout", "bogus"), ("kernels", "bogus")):
        cases.append(Case(f"swa/--{opt}={value}", "swa", {opt: value}, swa,
                          culprits=(f"--{opt}",)))
    nan_q = npy("f4", (9, 2, 4), [float("nan") if i == 13 else v for i, v in
                                  enumerate(rng.values(72))])
    cases.append(Case("swa/q.npy/nan", "swa", {"backward": None}, replace(swa, "q.npy", nan_q),
                      "either", ranks=(2,), outputs=swa_out))
    inf_k = npy("f4", (9, 1, 4), [float("-inf") if i == 5 else v for i, v in
                                  enumerate(rng.values(36))])
    cases.append(Case("swa/k.npy/inf", "swa", {}, replace(swa, "k.npy", inf_k), "either",
                      ranks=(3,), outputs=swa_out))

    # chunkwise ------------------------------------------------------------------------------
    cw = chunkwise_inputs(rng, "gdn", cu=[0, 5, 12])
    base = {"family": "gdn", "chunk": 4}
    cw_out = ("o.npy", "ht.npy", "chunkwise.json")
    cases.append(Case("chunkwise/valid-gdn", "chunkwise", dict(base, backward=None), cw, "pass",
                      ranks=(1, 2, 3), outputs=cw_out + ("dq.npy", "dg.npy", "dbeta.npy")))
    for fam in ("scalar", "diagonal", "gdp"):
        cases.append(Case(f"chunkwise/valid-{fam}", "chunkwise",
                          {"family": fam, "chunk": 4, "householder": 2 if fam == "gdp" else 1},
                          chunkwise_inputs(rng, fam, M=2 if fam == "gdp" else 1, dtype="f8"),
                          "pass", ranks=(2,), outputs=cw_out))
    cases.append(Case("chunkwise/perturbed-rank-fails-the-check", "chunkwise",
                      dict(base, **{"perturb-rank": "LAST"}), cw, "fail", ranks=(1, 2, 3)))
    # --repeat: gradients written whole on every call (not accumulated), and a corrupted rank is
    # still caught after the repetitions.
    cases.append(Case("chunkwise/valid-gdn-repeat", "chunkwise",
                      dict(base, backward=None, repeat=2), cw, "pass", ranks=(2, 3),
                      outputs=cw_out + ("dq.npy",)))
    cases.append(Case("chunkwise/perturbed-rank-with-repeat-fails", "chunkwise",
                      dict(base, backward=None, repeat=1, **{"perturb-rank": "LAST"}), cw, "fail",
                      ranks=(2,)))
    cases.append(Case("chunkwise/repeat=-1", "chunkwise", dict(base, repeat=-1), cw,
                      culprits=("--repeat",), ranks=(2,)))
    for name, shape, wrong in (("q.npy", (12, 2, 4), (12, 8)), ("v.npy", (12, 2, 4), (12, 8)),
                               ("g.npy", (12, 2), (12, 2, 1)), ("beta.npy", (12, 2), (24,))):
        for label, content in npy_breakers("f4", shape, wrong):
            if label not in (PRIMARY_SAMPLE if name == "q.npy" else SAMPLE[:5] + ("missing",)):
                continue
            cases.append(Case(f"chunkwise/{name}/{label}", "chunkwise", base,
                              replace(cw, name, content), culprits=(name,)))
    for label, dims in (("zero-tokens", (0, 2, 4)), ("zero-heads", (12, 0, 4)),
                        ("zero-dim", (12, 2, 0))):
        cases.append(Case(f"chunkwise/q.npy/{label}", "chunkwise", base,
                          replace(cw, "q.npy", npy("f4", dims)), culprits=("q.npy",)))
    cases.append(Case("chunkwise/v.npy/zero-dim", "chunkwise", base,
                      replace(cw, "v.npy", npy("f4", (12, 2, 0))), culprits=("v.npy",)))
    cases.append(Case("chunkwise/k.npy/mismatched-tokens", "chunkwise", base,
                      replace(cw, "k.npy", npy("f4", (11, 2, 4))), culprits=("k.npy",)))
    cases.append(Case("chunkwise/h0.npy/wrong-shape", "chunkwise", base,
                      replace(cw, "h0.npy", npy("f4", (1, 2, 4, 4))), culprits=("h0.npy",)))
    cases.append(Case("chunkwise/dht.npy/int32", "chunkwise", dict(base, backward=None),
                      replace(cw, "dht.npy", npy("i4", (2, 2, 4, 4), [0] * 64)),
                      culprits=("dht.npy",)))
    for label, cu in (("short-of-T", [0, 5, 10]), ("past-T", [0, 5, 17]),
                      ("huge", [0, 5, 2**31 - 1]), ("decreasing", [0, 8, 5, 12]),
                      ("negative", [-3, 5, 12]), ("not-from-zero", [2, 5, 12]),
                      ("one-entry", [0]), ("empty", [])):
        cases.append(Case(f"chunkwise/cu_seqlens.npy/{label}", "chunkwise", base,
                          replace(cw, "cu_seqlens.npy", npy("i4", (len(cu),), cu)),
                          culprits=("cu_seqlens",)))
    cases.append(Case("chunkwise/cu_seqlens.npy/int64", "chunkwise", base,
                      replace(cw, "cu_seqlens.npy", npy("i8", (3,), [0, 5, 12])),
                      culprits=("cu_seqlens",)))
    cases.append(Case("chunkwise/cu_seqlens.npy/2d", "chunkwise", base,
                      replace(cw, "cu_seqlens.npy", npy("i4", (3, 1), [0, 5, 12])),
                      culprits=("cu_seqlens",)))
    for opt, value in (("chunk", 0), ("chunk", -4), ("chunk", 10**6), ("chunk", 2**40),
                       ("scale", "nan"), ("scale", "inf"), ("scale", "-inf"), ("scale", "1e999"),
                       ("householder", 0), ("householder", 9), ("family", "bogus"),
                       ("compose", "bogus"), ("layout", "bogus"), ("products", "bogus"),
                       ("products", ""), ("perturb-rank", "NP"), ("perturb-rank", -2)):
        cases.append(Case(f"chunkwise/--{opt}={value}", "chunkwise", dict(base, **{opt: value}),
                          cw, culprits=(f"--{opt}",)))
    g_neg_inf = chunkwise_inputs(rng, "gdn", cu=[0, 5, 12])
    g_vals = rng.values(24, -0.5, -0.01)
    g_vals[14] = float("-inf")
    g_neg_inf["g.npy"] = npy("f4", (12, 2), g_vals)
    cases.append(Case("chunkwise/g.npy/log-decay-minus-inf", "chunkwise",
                      dict(base, backward=None), g_neg_inf, "finite", ranks=(1, 2, 3),
                      outputs=cw_out + ("dq.npy", "dk.npy", "dv.npy", "dg.npy", "dbeta.npy")))
    v_nan = dict(cw)
    vv = rng.values(96)
    vv[40] = float("nan")
    v_nan["v.npy"] = npy("f4", (12, 2, 4), vv)
    cases.append(Case("chunkwise/v.npy/nan", "chunkwise", base, v_nan, "either", ranks=(2, 3),
                      outputs=cw_out))
    # 16-bit tensors (states fp32): valid runs end to end, a corrupted rank caught within the
    # 16-bit tolerance, and the 16-bit ways to get a file wrong refused by file.
    cw16 = chunkwise_inputs(rng, "gdn", dtype="bf16", cu=[0, 5, 12])
    cases.append(Case("chunkwise/valid-gdn-bf16", "chunkwise", dict(base, backward=None), cw16,
                      "pass", ranks=(1, 3),
                      outputs=cw_out + ("dq.npy", "dg.npy", "dbeta.npy", "dh0.npy")))
    cases.append(Case("chunkwise/valid-diagonal-f2-scan", "chunkwise",
                      {"family": "diagonal", "chunk": 4, "compose": "scan", "backward": None},
                      dict(chunkwise_inputs(rng, "diagonal", dtype="f2"),
                           **{"h0.npy": npy("f4", (1, 2, 4, 4), rng.values(32))}),
                      "pass", ranks=(2,), outputs=cw_out + ("dq.npy", "dg.npy")))
    # Tensor-core chunk products by name: every family runs them (emulated here); fp64 data
    # refuses them by the option's name.
    cases.append(Case("chunkwise/valid-gdn-bf16-products-bfloat16", "chunkwise",
                      dict(base, products="bfloat16", backward=None), cw16, "pass", ranks=(2,),
                      outputs=cw_out + ("dq.npy", "dg.npy")))
    cases.append(Case("chunkwise/valid-diagonal-products-tf32", "chunkwise",
                      {"family": "diagonal", "chunk": 4, "products": "tf32", "backward": None},
                      chunkwise_inputs(rng, "diagonal"), "pass", ranks=(3,),
                      outputs=cw_out + ("dq.npy", "dg.npy")))
    cases.append(Case("chunkwise/products-on-fp64", "chunkwise", dict(base, products="bfloat16"),
                      chunkwise_inputs(rng, "gdn", dtype="f8"), culprits=("options.products",)))
    cases.append(Case("chunkwise/products-on-fp64-decay", "chunkwise",
                      {"family": "scalar", "chunk": 4, "products": "float16"},
                      chunkwise_inputs(rng, "scalar", dtype="f8"), culprits=("options.products",)))
    cases.append(Case("chunkwise/perturbed-rank-bf16-fails", "chunkwise",
                      dict(base, **{"perturb-rank": "LAST"}), cw16, "fail", ranks=(2, 3)))
    cases.append(Case("chunkwise/k.npy/f2-beside-bf16", "chunkwise", base,
                      replace(cw16, "k.npy", npy("f2", (12, 2, 4), rng.values(96, -0.4, 0.4))),
                      culprits=("k.npy",)))
    cases.append(Case("chunkwise/h0.npy/bf16-state", "chunkwise", base,
                      replace(cw16, "h0.npy", npy("bf16", (2, 2, 4, 4), rng.values(64))),
                      culprits=("h0.npy",)))
    g16 = rng.values(24, -0.5, -0.01)
    g16[7] = 0.25
    cases.append(Case("chunkwise/g.npy/bf16-positive-log-decay", "chunkwise", base,
                      replace(cw16, "g.npy", npy("bf16", (12, 2), g16)), culprits=("g.npy",)))

    # heads ----------------------------------------------------------------------------------
    hd = heads_inputs(rng, cu=[0, 3, 8])
    ho = heads_options()
    hd_out = ("y.npy", "z.npy", "heads.json")
    cases.append(Case("heads/valid", "heads", dict(ho, backward=None), hd, "pass",
                      ranks=(1, 2, 3), outputs=hd_out + ("dx.npy", "dconv_w.npy")))
    cases.append(Case("heads/valid-f8-zigzag", "heads", dict(ho, layout="zigzag"),
                      heads_inputs(rng, T=12, dtype="f8"), "pass", ranks=(2,), outputs=hd_out))
    cases.append(Case("heads/perturbed-rank-fails-the-check", "heads",
                      dict(ho, **{"perturb-rank": "LAST"}), hd, "fail", ranks=(2, 3)))
    cases.append(Case("heads/valid-repeat", "heads", dict(ho, backward=None, repeat=2), hd, "pass",
                      ranks=(3,), outputs=hd_out + ("dx.npy",)))
    cases.append(Case("heads/perturbed-rank-with-repeat-fails", "heads",
                      dict(ho, backward=None, repeat=1, **{"perturb-rank": "LAST"}), hd, "fail",
                      ranks=(2,)))
    cases.append(Case("heads/repeat=x", "heads", dict(ho, repeat="x"), hd,
                      culprits=("--repeat",), ranks=(2,)))
    for opt in ("nheads", "headdim", "ngroups", "dstate", "householder", "conv-width"):
        cases.append(Case(f"heads/--{opt}=0", "heads", dict(ho, **{opt: 0}), hd,
                          culprits=(f"--{opt}",)))
        cases.append(Case(f"heads/--{opt}=huge", "heads", dict(ho, **{opt: 10**8}), hd,
                          culprits=(f"--{opt}",)))
    cases.append(Case("heads/--nheads-missing", "heads",
                      {k: v for k, v in ho.items() if k != "nheads"}, hd, culprits=("--nheads",)))
    cases.append(Case("heads/even-heads-not-divisible-by-the-ranks", "heads",
                      {k: v for k, v in ho.items() if k != "uneven"}, hd,
                      culprits=("nheads",), ranks=(3,)))
    cases.append(Case("heads/--ngroups-not-dividing", "heads", dict(ho, ngroups=3), hd,
                      culprits=("--ngroups",)))
    cases.append(Case("heads/--dstate-mismatching-x", "heads", dict(ho, dstate=3), hd,
                      culprits=("x.npy",)))
    for opt, value in (("chunk", 0), ("chunk", 10**7), ("layout", "bogus"),
                       ("perturb-rank", "NP")):
        cases.append(Case(f"heads/--{opt}={value}", "heads", dict(ho, **{opt: value}), hd,
                          culprits=(f"--{opt}",)))
    c, cc = heads_channels(*(HEADS[k] for k in "HdGNMw"))
    for name, shape, wrong in (("x.npy", (8, c), (8, c, 1)), ("conv_w.npy", (cc, 2), (cc,)),
                               ("A_log.npy", (2,), (2, 1))):
        for label, content in npy_breakers("f4", shape, wrong):
            if label not in (PRIMARY_SAMPLE if name == "x.npy" else SAMPLE[:5] + ("missing",)):
                continue
            cases.append(Case(f"heads/{name}/{label}", "heads", ho, replace(hd, name, content),
                              culprits=(name,)))
    cases.append(Case("heads/x.npy/zero-tokens", "heads", ho,
                      replace(hd, "x.npy", npy("f4", (0, c))), culprits=("x.npy",)))
    cases.append(Case("heads/D.npy/wrong-length", "heads", ho,
                      replace(hd, "D.npy", npy("f4", (3,))), culprits=("D.npy",)))
    cases.append(Case("heads/dy.npy/wrong-shape", "heads", dict(ho, backward=None),
                      replace(hd, "dy.npy", npy("f4", (8, 3))), culprits=("dy.npy",)))
    for label, cu in (("short-of-T", [0, 3, 6]), ("past-T", [0, 3, 11]),
                      ("huge", [0, 3, 2**31 - 1]), ("decreasing", [0, 6, 3, 8]),
                      ("negative", [-1, 3, 8]), ("one-entry", [0])):
        cases.append(Case(f"heads/cu_seqlens.npy/{label}", "heads", ho,
                          replace(hd, "cu_seqlens.npy", npy("i4", (len(cu),), cu)),
                          culprits=("cu_seqlens",)))
    cases.append(Case("heads/cu_seqlens.npy/float", "heads", ho,
                      replace(hd, "cu_seqlens.npy", npy("f4", (3,), [0, 3, 8])),
                      culprits=("cu_seqlens",)))
    cases.append(Case("heads/cu_seqlens.npy/2d", "heads", ho,
                      replace(hd, "cu_seqlens.npy", npy("i4", (3, 1), [0, 3, 8])),
                      culprits=("cu_seqlens",)))
    xs = rng.values(8 * c, -0.5, 0.5)
    xs[c + 1] = float("nan")
    cases.append(Case("heads/x.npy/nan", "heads", dict(ho, backward=None),
                      replace(hd, "x.npy", npy("f4", (8, c), xs)), "either", ranks=(2,),
                      outputs=hd_out))
    # 16-bit activations (parameters fp32): valid runs, a corrupted rank caught within the 16-bit
    # bound, and the 16-bit ways to get a file wrong refused by file.
    hd16 = heads_inputs(rng, dtype="bf16", cu=[0, 3, 8])
    cases.append(Case("heads/valid-bf16", "heads", dict(ho, backward=None), hd16, "pass",
                      ranks=(1, 3), outputs=hd_out + ("dx.npy", "dconv_w.npy")))
    cases.append(Case("heads/valid-f2-zigzag-skip", "heads",
                      dict(ho, layout="zigzag", backward=None),
                      dict(heads_inputs(rng, T=12, dtype="f2"),
                           **{"D.npy": npy("f4", (2,), rng.values(2))}),
                      "pass", ranks=(2,), outputs=hd_out + ("dD.npy",)))
    cases.append(Case("heads/perturbed-rank-bf16-fails", "heads",
                      dict(ho, **{"perturb-rank": "LAST"}), hd16, "fail", ranks=(2, 3)))
    cases.append(Case("heads/conv_w.npy/bf16-parameter", "heads", ho,
                      replace(hd16, "conv_w.npy", npy("bf16", (cc, 2), rng.values(cc * 2))),
                      culprits=("conv_w.npy",)))
    cases.append(Case("heads/dy.npy/f4-beside-bf16", "heads", dict(ho, backward=None),
                      replace(hd16, "dy.npy", npy("f4", (8, 4), rng.values(32))),
                      culprits=("dy.npy",)))

    # hybrid (no input files) ----------------------------------------------------------------
    tiny = dict(TINY)
    cases.append(Case("hybrid/valid", "hybrid", tiny, None, "pass", ranks=(1, 3)))
    cases.append(Case("hybrid/perturbed-rank-fails-the-check", "hybrid",
                      dict(tiny, **{"perturb-rank": "LAST"}), None, "fail", ranks=(2,)))
    cases.append(Case("hybrid/bfloat16-valid", "hybrid", dict(tiny, dtype="bfloat16"), None,
                      "pass", ranks=(2,)))
    cases.append(Case("hybrid/float16-perturbed-rank-fails-the-check", "hybrid",
                      dict(tiny, dtype="float16", **{"perturb-rank": "LAST"}), None, "fail",
                      ranks=(3,)))
    # The GDN layer's chunk products on tensor cores (emulated here): they pass at their
    # roundoff, a corrupted rank still fails the check at it, and fp64 data refuses them.
    cases.append(Case("hybrid/float16-bfloat16-products-valid", "hybrid",
                      dict(tiny, dtype="float16", products="bfloat16"), None, "pass",
                      ranks=(3,)))
    cases.append(Case("hybrid/bfloat16-products-perturbed-rank-fails-the-check", "hybrid",
                      dict(tiny, dtype="bfloat16", products="bfloat16",
                           **{"perturb-rank": "LAST"}), None, "fail", ranks=(2,)))
    cases.append(Case("hybrid/products-on-fp64", "hybrid", dict(tiny, products="tf32"), None,
                      culprits=("--products",)))
    for opt, value in (("length", 0), ("length", 10**12), ("model-dim", 0), ("heads", 0),
                       ("kv-heads", 0), ("kv-heads", 3), ("head-dim", 3), ("head-dim", 0),
                       ("window", -1), ("chunk", 0), ("steps", 0), ("lr", "nan"), ("lr", -1),
                       ("householder", 0), ("groups", 0), ("groups", 3), ("perturb-rank", "NP"),
                       ("perturb-rank", -7), ("swa-policy", "bogus"), ("documents", 2),
                       ("dtype", "float32"), ("dtype", ""), ("products", "bogus"),
                       ("products", "")):
        cases.append(Case(f"hybrid/--{opt}={value}", "hybrid", dict(tiny, **{opt: value}), None,
                          culprits=(f"--{opt}",)))

    # demo and the tool itself ---------------------------------------------------------------
    for opt, value in (("length", -1), ("width", 0), ("part", "bogus"), ("length", "1e3")):
        cases.append(Case(f"demo/--{opt}={value}", "demo", {opt: value}, None,
                          culprits=(f"--{opt}",)))
    for token in ("--kokkos-threads=abc", "--kokkos-threads=0", "--kokkos-threads",
                  "--kokkos-numa=-1", "--kokkos-num-devices=1,x", "--kokkos-bogus=1",
                  "--kokkos-disable-warnings=yes"):
        cases.append(Case(f"tool/{token}", "swa", {token: "RAW"}, swa,
                          culprits=(token.split("=")[0],)))
    # The host instruction set asked for through the environment: a value that names none is
    # refused on every rank before any file is read; the baseline runs on every CPU and build.
    for command, opts, files, outs in (("swa", {}, swa, swa_out), ("chunkwise", base, cw, cw_out),
                                       ("heads", ho, hd, hd_out)):
        for bad in ("avx3", "AVX2 ", "-1"):
            cases.append(Case(f"{command}/CTXPAR_HOST_ISA={bad!r}", command, opts, files,
                              culprits=("CTXPAR_HOST_ISA",), ranks=(1, 3),
                              env={"CTXPAR_HOST_ISA": bad}))
        cases.append(Case(f"{command}/CTXPAR_HOST_ISA=baseline", command, opts, files, "pass",
                          ranks=(2,), outputs=outs, env={"CTXPAR_HOST_ISA": "baseline"}))
    cases.append(Case("tool/unknown-option", "swa", {"bogus": 1}, swa, culprits=("--bogus",)))
    cases.append(Case("tool/flag-with-value", "swa", {"backward=1": "RAW"}, swa,
                      culprits=("--backward",)))
    cases.append(Case("tool/--out-is-a-file", "swa", {"out": "FILE"}, swa, culprits=("--out",)))
    cases.append(Case("tool/--out-under-a-file", "chunkwise", dict(base, out="UNDER_FILE"), cw,
                      culprits=("--out",)))
    cases.append(Case("tool/--in-missing", "heads", dict(ho, **{"in": "MISSING"}), hd,
                      culprits=("x.npy",)))
    return cases + hostile_cases(rng, swa, cw, base, hd, ho)


# ---- hostile: files, outputs, references, extremes ------------------------------------------

TINY = {"length": 24, "window": 6, "chunk": 8, "model-dim": 8, "heads": 2, "kv-heads": 1,
        "head-dim": 4, "steps": 1, "quiet": None}
# References saved once per suite run (P = 1, --save-reference) and copied for each case.
REFERENCES = {"tiny": dict(TINY, steps=2), "packed": dict(TINY, packed=None, documents=2)}
INT64_MAX = 2**63 - 1


def edit_text(transform):
    """A mutation of a reference directory: reference.txt's lines through `transform`."""
    def mutate(d):
        path = os.path.join(d, "reference.txt")
        with open(path) as f:
            lines = f.read().splitlines()
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in transform(lines)))
    return mutate


def replace_line(kind, new):
    """Replaces the first line starting with `kind` by `new`."""
    def transform(lines):
        i = next(i for i, line in enumerate(lines) if line.startswith(kind))
        return lines[:i] + [new] + lines[i + 1:]
    return edit_text(transform)


def edit_matrix(name, how):
    """A mutation of one .f64 file of a reference: "nan"/"inf" poke one value, "cut" drops its
    last byte, "grow" appends a row's worth of zero bytes, or a special file replaces it."""
    def mutate(d):
        path = os.path.join(d, name)
        if how in ("FIFO", "DIR"):
            os.remove(path)
            put(path, how)
            return
        with open(path, "rb") as f:
            data = bytearray(f.read())
        if how in ("nan", "inf", "-inf"):
            data[8:16] = struct.pack("<d", float(how))
        elif how == "cut":
            data = data[:-1]
        elif how == "grow":
            data += bytes(64)
        with open(path, "wb") as f:
            f.write(data)
    return mutate


def remove(name):
    return lambda d: os.remove(os.path.join(d, name))


def special(name, kind):
    def mutate(d):
        os.remove(os.path.join(d, name))
        put(os.path.join(d, name), kind)
    return mutate


def hostile_cases(rng, swa, cw, base, hd, ho):
    cases = []
    H = "hostile/"
    swa_out = ("out.npy", "summary.json")
    hd_out = ("y.npy", "z.npy", "heads.json")

    # special files where a file is read or written: refused by name, never opened blocking
    for kind in ("FIFO", "DIR"):
        cases.append(Case(f"{H}swa/out.npy-is-a-{kind}", "swa", {}, swa, culprits=("out.npy",),
                          out_files={"out.npy": kind}, ranks=(2,)))
        cases.append(Case(f"{H}hybrid/--json-is-a-{kind}", "hybrid",
                          dict(TINY, json="WORK/out/j"), None, culprits=("--json",),
                          out_files={"j": kind}))
    # a stale temporary of an earlier tool (or someone's FIFO) under the old fixed name
    cases.append(Case(f"{H}heads/stale-FIFO-temporary-in-out", "heads", ho, hd, "pass",
                      out_files={"y.npy.partial": "FIFO", "heads.json.partial": "FIFO"},
                      outputs=hd_out, ranks=(2,)))
    for target, kind in (("/dev/full", "a device"), ("/dev/null", "a device")):
        cases.append(Case(f"{H}demo/--json={target}", "demo", {"json": target, "part": "swa"},
                          None, culprits=("--json",), ranks=(1,)))
    cases.append(Case(f"{H}hybrid/--json-in-a-missing-directory", "hybrid",
                      dict(TINY, json="WORK/nowhere/x.json"), None, culprits=("--json",),
                      ranks=(2,)))
    cases.append(Case(f"{H}hybrid/--json-valid", "hybrid", dict(TINY, json="WORK/out/ok.json"),
                      None, "pass", ranks=(2,), out_files={".keep": b""}, outputs=("ok.json",)))
    # outputs that cannot be committed: every other file removed again
    cases.append(Case(f"{H}swa/summary.json-is-a-directory", "swa", {}, swa,
                      culprits=("summary.json",), out_files={"summary.json": "DIR"}))
    # the same over an earlier run's output: the rollback puts the earlier out.npy back
    cases.append(Case(f"{H}swa/earlier-out.npy-kept-when-the-commit-fails", "swa", {}, swa,
                      culprits=("summary.json",),
                      out_files={"out.npy": b"an earlier run's output", "summary.json": "DIR"},
                      ranks=(2,)))
    cases.append(Case(f"{H}chunkwise/dg.npy-is-a-FIFO", "chunkwise", dict(base, backward=None),
                      cw, culprits=("dg.npy",), out_files={"dg.npy": "FIFO"}, ranks=(3,)))
    # a sparse file far larger than its header says: refused from its size, not read
    good = npy("f4", (9, 2, 4), rng.values(72))
    cases.append(Case(f"{H}swa/q.npy/sparse-64GiB", "swa", {},
                      replace(swa, "q.npy", ("SPARSE", good, 64 << 30)), culprits=("q.npy",),
                      ranks=(1,)))
    # lenient headers NumPy itself would refuse or read differently
    for label, text in (
            ("duplicate-shape", "{'descr': '<f4', 'fortran_order': False, 'shape': (9, 2, 4), "
                                "'shape': (72,), }"),
            ("duplicate-descr", "{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, "
                                "'shape': (9, 2, 4), }"),
            ("empty-item", "{'descr': '<f4', 'fortran_order': False, 'shape': (9, , 2, 4), }"),
            ("only-comma", "{'descr': '<f4', 'fortran_order': False, 'shape': (,), }"),
            ("one-item-no-comma", "{'descr': '<f4', 'fortran_order': False, 'shape': (72), }"),
            ("unknown-key", "{'descr': '<f4', 'fortran_order': False, 'shape': (9, 2, 4), "
                            "'align': True, }"),
            ("after-the-dict", "{'descr': '<f4', 'fortran_order': False, 'shape': (9, 2, 4), } x"),
            ("no-colon", "{'descr' '<f4', 'fortran_order': False, 'shape': (9, 2, 4), }")):
        cases.append(Case(f"{H}swa/q.npy/{label}", "swa", {},
                          replace(swa, "q.npy", npy("f4", (9, 2, 4), rng.values(72),
                                                    header=text)), culprits=("q.npy",)))
    # empty option values: a value left out, never the default
    for cmd, opts, files, opt in (("hybrid", TINY, None, "json"),
                                  ("hybrid", TINY, None, "reference"),
                                  ("hybrid", TINY, None, "save-reference"),
                                  ("swa", {}, swa, "out"), ("swa", {}, swa, "layout"),
                                  ("chunkwise", base, cw, "in"), ("demo", {}, None, "json")):
        # `--in ""` and `--out ""` (the suite supplies --in/--out itself), `--key=` otherwise
        spelled = {opt: ""} if opt in ("in", "out") else {f"--{opt}=": "RAW"}
        cases.append(Case(f"{H}{cmd}/--{opt}=", cmd, dict(opts, **spelled), files,
                          culprits=(f"--{opt}",)))
    # integer options near INT64_MAX: clamped where "at least the whole sequence" is meant
    for opt, value in (("chunk", INT64_MAX), ("chunk", INT64_MAX - 5), ("window", INT64_MAX),
                       ("window", 2**62 + 1)):
        cases.append(Case(f"{H}swa/--{opt}={value}", "swa",
                          {opt: value, "backward": None}, swa, "pass",
                          outputs=swa_out, ranks=(1, 3)))
    for opt, value in (("window", INT64_MAX), ("chunk", INT64_MAX), ("window", 24)):
        cases.append(Case(f"{H}hybrid/--{opt}={value}", "hybrid", dict(TINY, **{opt: value}),
                          None, "pass", ranks=(2,)))
    # resource limits named by option: an MPI count, the memory
    for label, opts in (("int-count", {"length": 4194304, "model-dim": 4096}),
                        ("memory", {"length": 65536, "heads": 256, "head-dim": 2,
                                    "kv-heads": 256, "kernel-chunk": 4096}),
                        ("wide-heads", {"length": 2000000, "heads": 64, "head-dim": 1024,
                                        "kv-heads": 64})):
        cases.append(Case(f"{H}hybrid/{label}", "hybrid", dict(TINY, window=0, **opts), None,
                          culprits=("--length",), ranks=(1,)))
    # the default model at a million tokens: more than the suite's address-space limit allows
    cases.append(Case(f"{H}hybrid/million-tokens-under-prlimit", "hybrid",
                      {"length": 1000000, "quiet": None}, None, culprits=("--length",),
                      ranks=(2,)))
    cases.append(Case(f"{H}hybrid/--steps=INT_MAX", "hybrid", dict(TINY, steps=2**31 - 1), None,
                      culprits=("--steps",), ranks=(1,)))
    for label, opts in (("int-count", {"length": 16777216, "width": 1024}),
                        ("memory", {"length": 4000000, "width": 256})):
        cases.append(Case(f"{H}demo/{label}", "demo", opts, None, culprits=("--length",),
                          ranks=(2,)))
    # domains: positive or NaN log-decays, subnormal learning rate
    for label, bad in (("positive", 0.25), ("plus-inf", float("inf")), ("nan", float("nan")),
                       ("tiny-positive", 1e-30)):
        g = rng.values(24, -0.5, -0.01)
        g[17] = bad
        cases.append(Case(f"{H}chunkwise/g.npy/{label}", "chunkwise", base,
                          replace(cw, "g.npy", npy("f4", (12, 2), g)), culprits=("g.npy",)))
    cases.append(Case(f"{H}hybrid/--lr=1e-320", "hybrid", dict(TINY, lr="1e-320"), None, "pass",
                      ranks=(1,)))
    cases.append(Case(f"{H}hybrid/--lr=1e400", "hybrid", dict(TINY, lr="1e400"), None,
                      culprits=("--lr",), ranks=(1,)))
    # --perturb-rank on a rank that holds no tokens
    cases.append(Case(f"{H}chunkwise/--perturb-rank-on-an-empty-rank", "chunkwise",
                      dict(base, **{"perturb-rank": "LAST"}),
                      chunkwise_inputs(rng, "gdn", T=2, cu=[0, 2]), culprits=("--perturb-rank",),
                      ranks=(3,)))
    cases.append(Case(f"{H}heads/--perturb-rank-on-an-empty-rank", "heads",
                      dict(ho, **{"perturb-rank": "LAST"}), heads_inputs(rng, T=2),
                      culprits=("--perturb-rank",), ranks=(3,)))
    cases.append(Case(f"{H}hybrid/--perturb-rank-on-an-empty-rank", "hybrid",
                      dict(TINY, length=2, chunk=1, **{"perturb-rank": "LAST"}), None,
                      culprits=("--perturb-rank",), ranks=(3,)))

    # hybrid --reference: a saved reference broken line by line and value by value
    ref = dict(TINY, steps=2)
    ref_cases = [
        ("valid", "tiny", None, "pass", ()),
        ("time-negative-layer", "tiny", replace_line("time 1 0", "time 1 -2 0.5"), "refuse",
         ("line",)),
        ("time-layer-past-the-model", "tiny", replace_line("time 2 1", "time 2 9 0.1"),
         "refuse", ("line",)),
        ("loss-step-not-a-number", "tiny", replace_line("loss 1", "loss one 0.5"), "refuse",
         ("line",)),
        ("loss-step-negative", "tiny", replace_line("loss 2", "loss -2 0.5"), "refuse",
         ("line",)),
        ("loss-value-junk", "tiny", replace_line("loss 1", "loss 1 0.5x"), "refuse", ("line",)),
        ("grad-rows-negative", "tiny", replace_line("grad", "grad w -3 8"), "refuse", ("line",)),
        ("grad-rows-huge", "tiny", replace_line("grad", "grad w 99999999999999999999 8"),
         "refuse", ("line",)),
        ("grad-shape-not-the-model", "tiny",
         edit_text(lambda ls: [(" ".join(l.split()[:2] + ["1", "1"]) if l.startswith("grad")
                                else l) for l in ls]), "refuse", ("grad",)),
        ("option-without-value", "tiny", replace_line("option window", "option window"),
         "refuse", ("line",)),
        ("duplicate-loss", "tiny", edit_text(lambda ls: ls + ["loss 1 0.25"]), "refuse",
         ("line",)),
        ("unknown-line", "tiny", edit_text(lambda ls: ls + ["junk 1 2"]), "refuse", ("line",)),
        ("empty-line", "tiny", edit_text(lambda ls: ls[:3] + [""] + ls[3:]), "refuse",
         ("line",)),
        ("no-magic", "tiny", edit_text(lambda ls: ls[1:]), "refuse", ("reference",)),
        ("reference.txt-missing", "tiny", remove("reference.txt"), "refuse", ("reference.txt",)),
        ("reference.txt-is-a-FIFO", "tiny", special("reference.txt", "FIFO"), "refuse",
         ("reference.txt",)),
        ("step-file-is-a-FIFO", "tiny", edit_matrix("step1.x2.f64", "FIFO"), "refuse",
         ("step1.x2.f64",)),
        ("step-file-is-a-directory", "tiny", edit_matrix("step2.dx1.f64", "DIR"), "refuse",
         ("step2.dx1.f64",)),
        ("step-file-cut", "tiny", edit_matrix("step1.x3.f64", "cut"), "refuse",
         ("step1.x3.f64",)),
        ("step-file-grown", "tiny", edit_matrix("step2.x1.f64", "grow"), "refuse",
         ("step2.x1.f64",)),
        ("step-file-missing", "tiny", remove("step2.dx0.f64"), "refuse", ("step2.dx0.f64",)),
        ("nan-in-an-output", "tiny", edit_matrix("step1.x2.f64", "nan"), "fail", ()),
        ("inf-in-an-input-gradient", "tiny", edit_matrix("step2.dx2.f64", "inf"), "fail", ()),
        ("nan-loss", "tiny", replace_line("loss 2", "loss 2 nan"), "fail", ()),
        ("inf-loss", "tiny", replace_line("loss 1", "loss 1 -inf"), "fail", ()),
    ]
    for label, saved, mutate, expect, culprits in ref_cases:
        cases.append(Case(f"{H}hybrid/reference/{label}", "hybrid",
                          dict(ref, reference="WORK/ref"), None, expect, culprits=culprits,
                          ranks=(2,) if expect == "refuse" else (3,),
                          reference=(saved, mutate or (lambda d: None))))
    # a NaN or Inf in a gradient file must fail too
    cases.append(Case(f"{H}hybrid/reference/nan-in-a-weight-gradient", "hybrid",
                      dict(ref, reference="WORK/ref"), None, "fail", ranks=(2,),
                      reference=("tiny", lambda d: edit_matrix(
                          sorted(n for n in os.listdir(d) if n.startswith("step1.grad."))[0],
                          "nan")(d))))
    # options a reference must share: refused before the run, naming the option
    for label, opts in (("another-window", {"window": 5}), ("another-lr", {"lr": 0.25}),
                        ("more-steps", {"steps": 3}), ("another-length", {"length": 30})):
        cases.append(Case(f"{H}hybrid/reference/{label}", "hybrid",
                          dict(ref, reference="WORK/ref", **opts), None,
                          culprits=("--" + next(iter(opts)),), ranks=(2,),
                          reference=("tiny", lambda d: None)))
    # packed documents: zigzag at P = 3 rounds the boundaries to multiples of 6 (not 1)
    cases.append(Case(f"{H}hybrid/reference/packed-zigzag-boundaries", "hybrid",
                      dict(REFERENCES["packed"], layout="zigzag", reference="WORK/ref"), None,
                      culprits=("--documents",), ranks=(3,), reference=("packed", lambda d: None)))
    cases.append(Case(f"{H}hybrid/reference/packed-contiguous", "hybrid",
                      dict(REFERENCES["packed"], reference="WORK/ref"), None, "pass", ranks=(2,),
                      reference=("packed", lambda d: None)))
    # --save-reference where it cannot be written: refused, and no reference left
    for label, prepare in (("reference.txt-is-a-FIFO", lambda d: (os.makedirs(d),
                                                                  os.mkfifo(d + "/reference.txt"))),
                           ("a-step-file-is-a-FIFO", lambda d: (os.makedirs(d),
                                                                os.mkfifo(d + "/step1.dx1.f64"))),
                           ("a-step-file-is-a-directory",
                            lambda d: os.makedirs(d + "/step1.x1.f64")),
                           ("under-a-file", lambda d: open(d, "w").close())):
        cases.append(Case(f"{H}hybrid/save-reference/{label}", "hybrid",
                          dict(TINY, **{"save-reference": "WORK/saved" +
                                        ("/sub" if label == "under-a-file" else "")}),
                          None, culprits=("--save-reference",), ranks=(1,),
                          reference=("save", prepare)))
    return cases


# ---- running -----------------------------------------------------------------------------------

CRASH_MARKS = ("exited on signal", "Segmentation fault", "core dumped", "terminate called",
               "Backtrace", "Aborted (", "AddressSanitizer", "runtime error:")
UNCAUSED_WARNINGS = ("OMP_PROC_BIND environment variable not set",)


def materialise(case, work):
    """Writes the case's input directory; returns (in_dir, out_dir)."""
    in_dir, out_dir = os.path.join(work, "in"), os.path.join(work, "out")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(in_dir)
    for folder, files in ((in_dir, case.files), (out_dir, case.out_files)):
        for name, content in (files or {}).items():
            os.makedirs(folder, exist_ok=True)
            put(os.path.join(folder, name), content)
    return in_dir, out_dir


def put(path, content):
    """Creates `path` as a directory, a FIFO, a sparse file or a file of `content` bytes."""
    if content == "DIR":
        os.makedirs(path)
    elif content == "FIFO":
        os.mkfifo(path)
    elif isinstance(content, tuple) and content[0] == "SPARSE":
        with open(path, "wb") as f:
            f.write(content[1])
            f.truncate(content[2])
    elif content is not None:
        with open(path, "wb") as f:
            f.write(content)


def command_line(case, np_, in_dir, out_dir, work):
    args = [case.command]
    opts = dict(case.options)
    if case.files is not None:
        opts.setdefault("in", in_dir)
        opts.setdefault("out", out_dir)
    for key, value in opts.items():
        if value == "RAW":
            args.append(key if key.startswith("--") else "--" + key)
            continue
        if key == "in" and value == "MISSING":
            value = os.path.join(work, "no-such-dir")
        if key == "out" and value == "FILE":
            value = os.path.join(work, "a-file")
            open(value, "w").close()
        if key == "out" and value == "UNDER_FILE":
            open(os.path.join(work, "a-file"), "w").close()
            value = os.path.join(work, "a-file", "out")
        if key in ("json", "save-reference", "reference") and isinstance(value, str) and \
                value.startswith("WORK/"):
            value = os.path.join(work, value[5:])
        if value == "LAST":
            value = np_ - 1
        if value == "NP":
            value = np_
        args.append("--" + key)
        if value is not None:
            args.append(str(value))
    return args


def count_nonfinite_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    hlen = struct.unpack("<H", data[8:10])[0]
    header = data[10:10 + hlen].decode("latin-1")
    fmt = "<d" if "<f8" in header else "<f"
    size = struct.calcsize(fmt)
    body = data[10 + hlen:]
    return sum(1 for (v,) in struct.iter_unpack(fmt, body[:len(body) // size * size])
               if not math.isfinite(v))


def judge(case, np_, rc, text, out_dir, elapsed, timed_out):
    """The reasons this run is wrong (empty when it is right)."""
    wrong = []
    if timed_out:
        return [f"hang: no exit within {elapsed:.0f} s"]
    if rc < 0 or rc >= 128:
        wrong.append(f"killed by a signal (status {rc})")
    for mark in CRASH_MARKS:
        if mark in text:
            wrong.append(f"crash: output contains {mark!r}")
    if case.expect == "refuse":
        if rc == 0:
            wrong.append("exit 0 with invalid input")
        elif not any(c in text for c in case.culprits):
            wrong.append(f"the message names none of {list(case.culprits)}")
        left = set(os.listdir(out_dir)) - set(case.out_files) if os.path.exists(out_dir) else ()
        if left:
            wrong.append(f"a refused run left files in --out: {sorted(left)}")
        # no data loss: a file that was in --out before a refused run still holds its bytes
        for name, content in case.out_files.items():
            if isinstance(content, bytes):
                path = os.path.join(out_dir, name)
                if not os.path.isfile(path):
                    wrong.append(f"a refused run removed the earlier {name} from --out")
                else:
                    with open(path, "rb") as f:
                        if f.read() != content:
                            wrong.append(f"a refused run changed the earlier {name} in --out")
        saved = os.path.join(os.path.dirname(out_dir), "saved")
        if case.reference and case.reference[0] == "save" and os.path.isdir(saved):
            written = [n for n in os.listdir(saved) if os.path.isfile(os.path.join(saved, n))
                       and (n.endswith(".f64") or n == "reference.txt")]
            if written:
                wrong.append(f"a refused --save-reference left {sorted(written)[:3]}")
    elif case.expect in ("pass", "finite"):
        if rc != 0:
            wrong.append(f"valid input refused (exit {rc})")
        for w in UNCAUSED_WARNINGS:
            if w in text:
                wrong.append(f"a warning the user did not cause: {w!r}")
        for name in case.outputs:
            if not os.path.isfile(os.path.join(out_dir, name)):
                wrong.append(f"--out lacks {name}")
            elif case.expect == "finite" and name.endswith(".npy"):
                bad = count_nonfinite_npy(os.path.join(out_dir, name))
                if bad:
                    wrong.append(f"{name} holds {bad} NaN/Inf")
            elif name.endswith(".json") and "CTXPAR_HOST_ISA" in case.env:
                with open(os.path.join(out_dir, name)) as f:
                    ran = json.load(f).get("host_isa")
                if ran != case.env["CTXPAR_HOST_ISA"]:
                    wrong.append(f"{name} says host_isa {ran!r}, not the forced "
                                 f"{case.env['CTXPAR_HOST_ISA']!r}")
    elif case.expect == "fail":
        if rc == 0:
            wrong.append("exit 0 although the distributed result was corrupted")
        elif rc != 1:
            wrong.append(f"exit {rc}, not the failed check's 1")
    elif case.expect == "either":
        if rc not in (0, 1, 2):
            wrong.append(f"exit {rc}")
        if rc == 0:
            summary = [n for n in case.outputs if n.endswith(".json")]
            try:
                with open(os.path.join(out_dir, summary[0])) as f:
                    s = json.dumps(json.load(f))
                if '"passed": true' not in s or "pattern_equal\": false" in s:
                    wrong.append("exit 0 but the summary does not say the check passed")
                written = sum(count_nonfinite_npy(os.path.join(out_dir, n))
                              for n in case.outputs if n.endswith(".npy"))
                if written and "nonfinite\": 0" in s and "nonfinite\": " + str(written) not in s:
                    wrong.append(f"{written} NaN/Inf written but the summary counts none")
            except (OSError, ValueError, IndexError) as e:
                wrong.append(f"exit 0 without a readable summary ({e})")
    return wrong


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", required=True)
    ap.add_argument("--mpiexec", required=True, help="the launcher and its flags, before -np")
    ap.add_argument("--np-flag", default="-np")
    ap.add_argument("--work", required=True)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--memory-mb", type=int, default=3072,
                    help="address-space limit per rank (0: none, for sanitizer builds, whose "
                    "shadow memory needs terabytes of address space; they limit RSS instead)")
    ap.add_argument("--only", default="",
                    help="comma-separated name prefixes: run only those cases (e.g. swa/,tool/)")
    ap.add_argument("--jobs", type=int, default=3, help="runs side by side")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    ranks = [int(r) for r in a.ranks.split(",")]
    prefixes = [p for p in a.only.split(",") if p]
    cases = [c for c in make_cases(a.seed)
             if not prefixes or any(c.name.startswith(p) for p in prefixes)]
    if a.list:
        for c in cases:
            print(c.name)
        return 0
    pick = random.Random(a.seed + 1)
    launcher = shlex.split(a.mpiexec)
    prlimit = shutil.which("prlimit")
    env = dict(os.environ)
    # The tool must keep Kokkos quiet by itself: no OMP_PROC_BIND from the test environment.
    env.pop("OMP_PROC_BIND", None)
    env.pop("OMP_PLACES", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    runs = []
    for index, case in enumerate(cases):
        nps = [r for r in case.ranks if r in ranks] if case.ranks else []
        for np_ in nps or [pick.choice(ranks)]:
            runs.append((index, case, np_))

    references = os.path.join(a.work, "references")
    needed = {c.reference[0] for c in cases if c.reference and c.reference[0] != "save"}
    for name in sorted(needed):
        # The saved references the --reference cases copy and break: P = 1, as documented.
        target = os.path.join(references, name)
        shutil.rmtree(target, ignore_errors=True)
        cmd = launcher + [a.np_flag, "1", a.tool] + command_line(
            Case(name, "hybrid", dict(REFERENCES[name], **{"save-reference": target})), 1, "",
            "", a.work)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              timeout=a.timeout)
        if proc.returncode != 0 or not os.path.isfile(os.path.join(target, "reference.txt")):
            print(f"cannot save the reference {name!r} (exit {proc.returncode}):\n"
                  f"{proc.stdout.decode('utf-8', 'replace')[-2000:]}")
            return 1

    def run(job):
        index, case, np_ = job
        work = os.path.join(a.work, f"case{index:03d}_np{np_}")
        in_dir, out_dir = materialise(case, work)
        if case.reference and case.reference[0] == "save":
            case.reference[1](os.path.join(work, "saved"))
        elif case.reference:
            shutil.copytree(os.path.join(references, case.reference[0]),
                            os.path.join(work, "ref"))
            case.reference[1](os.path.join(work, "ref"))
        tool = [a.tool] + command_line(case, np_, in_dir, out_dir, work)
        if prlimit and a.memory_mb > 0:
            tool = [prlimit, f"--as={a.memory_mb << 20}", "--"] + tool
        cmd = launcher + [a.np_flag, str(np_)] + tool
        t0 = time.time()
        timed_out = False
        # Runs side by side each get their own Open MPI session directory: a shared one is
        # created by the first launch and removed by the last, and two launches can race on it.
        session = {"OMPI_MCA_orte_tmpdir_base": os.path.join(work, "mpi-session")}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=dict(env, **session, **case.env), start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            timed_out = True
        elapsed = time.time() - t0
        text = out.decode("utf-8", "replace")
        wrong = judge(case, np_, proc.returncode, text, out_dir, elapsed, timed_out)
        if not wrong:
            shutil.rmtree(work, ignore_errors=True)
        return case, np_, proc.returncode, elapsed, wrong, text, " ".join(map(shlex.quote, cmd))

    started = time.time()
    failures = []
    # mpirun's start-up is mostly waiting, so a few runs side by side use the cores better.
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for case, np_, rc, elapsed, wrong, text, cmd in pool.map(run, runs):
            print(f"[{'ok' if not wrong else 'WRONG'}] {case.name} np={np_} exit={rc} "
                  f"{elapsed:.1f}s", flush=True)
            if wrong:
                failures.append((case.name, np_, wrong, cmd))
                for w in wrong:
                    print(f"    {w}")
                for line in text.strip().splitlines()[-6:]:
                    print(f"    | {line[:300]}")
    print(f"\n{len(runs)} runs of {len(cases)} cases in {time.time() - started:.0f} s: "
          f"{len(failures)} wrong")
    for name, np_, wrong, cmd in failures:
        print(f"  {name} (np {np_}): {'; '.join(wrong)}\n    {cmd}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
