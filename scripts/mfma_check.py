#!/usr/bin/env python3
"""Checks the AMD GPU assembly of the chunkwise kernels' tensor-core products (MFMA).

Usage: scripts/mfma_check.py TARGET ASSEMBLY

ASSEMBLY is the device assembly (`hipcc --cuda-device-only -S`) of
tests/gpu/instantiate_tensor_core.cpp for TARGET (gfx908 or gfx90a); scripts/gpu-compile-check hip
compiles it so. Each chunkwise team kernel (the gated delta per-chunk kernels and state passes,
the decay families' team kernels) chooses its products' operand type at run time, so each must
issue MFMA, and the file as a whole the instruction of each operand type on that target: IEEE
half 16x16x16; bfloat16 16x16x8 on gfx908 and 16x16x16 (`_1k`) from gfx90a; fp32 16x16x4 (the
`tf32` products, their operands rounded first). A kernel's scratch (private memory: spills and
arrays indexed at run time) must stay under 1 KiB: the accumulators of a whole emulated wavefront
held by one thread, the mistake this guards against, take 2 KiB.
"""
import re
import subprocess
import sys

CHUNK_KERNELS = ("ChunkUpdateTiles", "OutputTiles", "ScalarGradientTiles",
                 "DiagonalGradientTiles", "StatePass", "IntraChunk", "ChunkGradients")
REQUIRED = {
    "gfx908": ("v_mfma_f32_16x16x16f16", "v_mfma_f32_16x16x8bf16", "v_mfma_f32_16x16x4f32"),
    "gfx90a": ("v_mfma_f32_16x16x16f16", "v_mfma_f32_16x16x16bf16_1k", "v_mfma_f32_16x16x4f32"),
}
SCRATCH_LIMIT = 1024


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in REQUIRED:
        print(__doc__, file=sys.stderr)
        return 2
    target, path = sys.argv[1], sys.argv[2]
    text = open(path).read()
    ok = True
    for instruction in REQUIRED[target]:
        count = len(re.findall(rf"\b{instruction}\b", text))
        print(f"[mfma-check] {target}: {instruction} x{count}")
        ok = ok and count > 0
    # Functions start at a column-0 label of their mangled name; the assembler's per-function
    # summary comments (ScratchSize, NumVgprs) follow each body.
    parts = re.split(r"^(_Z\w+):[^\n]*$", text, flags=re.M)
    names, bodies = parts[1::2], parts[2::2]
    readable = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                              text=True).stdout.split("\n") if names else []
    for kernel in CHUNK_KERNELS:
        found = [(r, b) for r, b in zip(readable, bodies) if f"::{kernel}<" in r]
        if not found:
            print(f"[mfma-check] {target}: no {kernel} kernel in the assembly")
            ok = False
        for _, body in found:
            mfma = len(re.findall(r"\bv_mfma_", body))
            scratch = re.search(r"; ScratchSize: (\d+)", body)
            vgprs = re.search(r"; NumVgprs: (\d+)", body)
            agprs = re.search(r"; NumAgprs: (\d+)", body)
            scratch_bytes = int(scratch.group(1)) if scratch else -1
            tag = ""
            if mfma == 0:
                tag += " NO MFMA"
            if not 0 <= scratch_bytes < SCRATCH_LIMIT:
                tag += " SCRATCH OVER 1 KiB"
            ok = ok and not tag
            print(f"[mfma-check] {target}: {kernel}: {mfma} MFMA, {scratch_bytes} B scratch, "
                  f"{vgprs.group(1) if vgprs else '?'} VGPRs, "
                  f"{agprs.group(1) if agprs else '?'} AGPRs{tag}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
