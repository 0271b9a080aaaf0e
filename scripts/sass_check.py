#!/usr/bin/env python3
"""Checks the SASS of the tensor-core kernels: every instantiation of the attention kernels must
issue HMMA of the shape its scalar asks for, the gated delta chunk kernels and state passes all
three shapes (they choose one at run time), and the FMA attention kernels none; the attention
kernels on 16-bit operands, which read their staged tiles by ldmatrix, must issue LDSM, and stage
them by asynchronous copies (LDGSTS); those that stage two tiles ahead must wait with one group
still in flight (DEPBAR.LE SB0, 0x1).

Usage: scripts/sass_check.py CUOBJDUMP CUBIN [--expect-sm 90]

CUBIN is the sm_XX cubin that `nvcc --keep` leaves (scripts/gpu-compile-check compiles
tests/gpu/instantiate_tensor_core.cpp that way). CUOBJDUMP is a `cuobjdump` of any CUDA release
that knows the architecture: the CUDA 13 install on these machines ships none, so
`scripts/setup --cuda` takes the one in Debian's CUDA 11.8 package.

Why the header is rewritten: CUDA 12.8 and later write cubins with ELF ABI version 8, whose
e_flags carry the SM number in bits 8-15; earlier tools read ABI version 7, with the SM in bits
0-7 and the virtual SM in bits 16-23, and refuse the new header ("Support for 'sm_4' has been
removed"). The instructions of an sm_90 cubin are encoded by the hardware, not by the toolkit
release, so a copy with the old header is disassembled exactly; the check refuses a cubin whose SM
is not the one expected, so a wrong reading cannot pass unnoticed.
"""
import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile

# ELF64 header fields (the ELF specification): EI_ABIVERSION is e_ident[8], e_flags at byte 48.
EI_ABIVERSION = 8
E_FLAGS = 48
# The flags an ABI-7 cubin of a 64-bit, unified-texture-mode build carries besides its SM numbers.
OLD_ABI_64BIT_UNIFIED = 0x500

# Kernels that must run on tensor cores in every instantiation, and the HMMA shape per scalar:
# m16n8k16 with fp32 accumulation for bfloat16 and half, m16n8k8 TF32 for fp32 inputs.
ATTENTION_KERNELS = ("TensorCoreForwardKernel", "TensorCoreQueryGradientKernel",
                     "TensorCoreKeyGradientKernel")
# The gated delta per-chunk kernels and state passes, and the decay families' team kernels, keep
# fp32 data and choose their products' operand type at run time (`ChunkProducts`), so each
# instantiation must hold all three shapes.
CHUNK_KERNELS = ("gated_delta::IntraChunk", "gated_delta::ChunkGradients",
                 "gated_delta::StatePass", "impl::ChunkUpdateTiles", "impl::OutputTiles",
                 "impl::ScalarGradientTiles", "impl::DiagonalGradientTiles")
TENSOR_CORE_KERNELS = ATTENTION_KERNELS + CHUNK_KERNELS
# The portable FMA kernels of the same TU: if HMMA showed up there, the check would not be telling
# the tensor-core paths apart from the rest, so they must have none.
FMA_KERNELS = ("TeamForwardKernel", "TeamQueryGradientKernel", "TeamKeyGradientKernel")
# The attention kernels on 16-bit operands read their staged tiles' B fragments (and, in the
# backward at head dimensions up to 128, a staged row operand's A fragments) by `ldmatrix`: each
# must issue LDSM.
READS_BY_LDMATRIX = re.compile(r"TensorCore\w+Kernel<(?:ctxpar::)?(?:bfloat16|float16),")
# The attention kernels on 16-bit operands stage their tiles by cp.async (LDGSTS). Those whose two
# stages fit the level-0 scratch (`TensorCoreTiles::stages_fitting`) wait for the current tile
# with the next one's group in flight (cp.async.wait_group 1): the forward at padded head
# dimensions 64 and 128, the dQ and dK/dV kernels at 64.
DOUBLE_BUFFERED = {"TensorCoreForwardKernel": (64, 128), "TensorCoreQueryGradientKernel": (64,),
                   "TensorCoreKeyGradientKernel": (64,)}
WAIT_WITH_ONE_IN_FLIGHT = re.compile(r"\bDEPBAR\.LE SB0, 0x1\b")
HMMA_FOR_SCALAR = {"bfloat16": "HMMA.16816.F32.BF16", "float16": "HMMA.16816.F32",
                   "float": "HMMA.1688.F32.TF32"}


def old_header_copy(cubin, expect_sm, out):
    data = bytearray(open(cubin, "rb").read())
    if data[:4] != b"\x7fELF":
        sys.exit(f"sass_check: {cubin} is not an ELF file")
    abi = data[EI_ABIVERSION]
    flags = struct.unpack_from("<I", data, E_FLAGS)[0]
    sm = (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF
    if sm != expect_sm:
        sys.exit(f"sass_check: {cubin} is for sm_{sm} (ABI version {abi}, e_flags {flags:#x}), "
                 f"expected sm_{expect_sm}")
    if abi >= 8:
        data[EI_ABIVERSION] = 7
        struct.pack_into("<I", data, E_FLAGS, sm | OLD_ABI_64BIT_UNIFIED | sm << 16)
    out.write(data)
    out.flush()


def demangle(names):
    try:
        result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                                text=True, check=True)
        return result.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return names


def scalar_of(name):
    # The kernel's first template argument is its storage scalar.
    m = re.search(r"(?:Kernel|IntraChunk|ChunkGradients|StatePass|Tiles)<(ctxpar::)?"
                  r"(bfloat16|float16|float|double)\b", name)
    return m.group(2) if m else None


def padded_dim(name):
    # The kernels' padded head dimension is the template argument after the team member (the
    # dK/dV kernel's pass may follow it).
    m = re.search(r"TeamMember, (\d+)[,>]", name)
    return int(m.group(1)) if m else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cuobjdump")
    parser.add_argument("cubin")
    parser.add_argument("--expect-sm", type=int, default=90)
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as copy:
        old_header_copy(args.cubin, args.expect_sm, copy)
        # cuobjdump runs the nvdisasm next to it.
        env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(args.cuobjdump)) + os.pathsep
                   + os.environ.get("PATH", ""))
        dump = subprocess.run([args.cuobjdump, "--dump-sass", copy.name], capture_output=True,
                              text=True, env=env)
    if dump.returncode != 0 or "Function :" not in dump.stdout:
        sys.exit(f"sass_check: {args.cuobjdump} --dump-sass failed: "
                 f"{(dump.stderr or dump.stdout).strip()[:400]}")
    parts = re.split(r"\n\s*Function : (\S+)\n", dump.stdout)
    mangled = parts[1::2]
    bodies = parts[2::2]
    functions = list(zip(demangle(mangled), bodies))
    ok = True
    for kernel in TENSOR_CORE_KERNELS + FMA_KERNELS:
        wanted = kernel in TENSOR_CORE_KERNELS
        found = [(n, b) for n, b in functions if re.search(r"\b" + kernel + "<", n)]
        bad = []
        for name, body in found:
            hmma = re.findall(r"\bHMMA\.[0-9A-Z.]+", body)
            if wanted:
                scalar = scalar_of(name)
                shapes = (set(HMMA_FOR_SCALAR.values()) if kernel in CHUNK_KERNELS else
                          {HMMA_FOR_SCALAR[scalar]} if scalar in HMMA_FOR_SCALAR else None)
                if not shapes or not shapes <= set(hmma):
                    bad.append(f"{scalar}: {sorted(set(hmma)) or 'no HMMA'}")
                if READS_BY_LDMATRIX.search(name):
                    if not re.search(r"\bLDSM\.", body):
                        bad.append(f"{scalar}: no LDSM for its staged tiles")
                    if not re.search(r"\bLDGSTS\.", body):
                        bad.append(f"{scalar}: no LDGSTS staging its tiles")
                    dp = padded_dim(name)
                    if dp is None:
                        bad.append(f"{scalar}: no padded head dimension in its name")
                    elif (dp in DOUBLE_BUFFERED.get(kernel, ()) and
                          not WAIT_WITH_ONE_IN_FLIGHT.search(body)):
                        bad.append(f"{scalar} D={dp}: no wait with a tile in flight")
            elif hmma:
                bad.append(f"{scalar_of(name)}: {len(hmma)} HMMA in an FMA kernel")
        counts = {}
        for name, body in found:
            counts[scalar_of(name)] = counts.get(scalar_of(name), 0) + len(
                re.findall(r"\bHMMA\.", body))
        what = "HMMA per scalar " + ", ".join(f"{s} {c}" for s, c in sorted(counts.items(), key=str))
        print(f"[sass-check] {kernel}: {len(found)} instantiations; {what}"
              + (f"; WRONG: {'; '.join(bad)}" if bad else ""))
        if not found or bad:
            ok = False
    ldsm = len(re.findall(r"\bLDSM\.", dump.stdout))
    ldgsts = len(re.findall(r"\bLDGSTS\.", dump.stdout))
    print(f"[sass-check] whole TU: {len(functions)} functions, "
          f"{len(re.findall(r'HMMA[.]', dump.stdout))} HMMA, {ldsm} LDSM, {ldgsts} LDGSTS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
