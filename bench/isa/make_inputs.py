#!/usr/bin/env python3
"""Random inputs of the `ctxpar` tool at the shapes of the default-versus-native comparison, written
as .npy files with the standard library only (no numpy: a fresh machine may not have it).

  make_inputs.py ROOT [swa] [gdn]   writes ROOT/swa/{q,k,v}.npy      T = 4096, H = 8, D = 64
                                    ROOT/gdn/{q,k,v,g,beta}.npy  T = 8192, H = 4, K = V = 128
                                    (both when neither is named)
Files already there with the right size are kept.
"""
import array
import math
import os
import random
import sys

SWA = dict(tokens=4096, heads=8, dim=64)
GDN = dict(tokens=8192, heads=4, dim=128)


def write_npy(path, shape, values):
    """fp32, C order, format version 1.0 (header padded to a multiple of 64 bytes)."""
    size = 1
    for extent in shape:
        size *= extent
    if os.path.exists(path) and os.path.getsize(path) > 4 * size:
        return
    dims = "".join("%d, " % s for s in shape) if len(shape) > 1 else "%d," % shape[0]
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % dims
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
        array.array("f", values()).tofile(f)


def unit_rows(values, width):
    """Rows of `width` scaled to unit length: the delta rule's keys are normalised."""
    out = []
    for i in range(0, len(values), width):
        row = values[i:i + width]
        norm = math.sqrt(sum(a * a for a in row))
        out += [a / norm for a in row]
    return out


def main(root, which):
    rng = random.Random(1)

    def gauss(n):
        return [rng.gauss(0, 1) for _ in range(n)]

    for name in which:
        os.makedirs(os.path.join(root, name), exist_ok=True)
    if "swa" in which:
        t, h, d = SWA["tokens"], SWA["heads"], SWA["dim"]
        for name in "qkv":
            write_npy(os.path.join(root, "swa", name + ".npy"), (t, h, d), lambda: gauss(t * h * d))
    if "gdn" not in which:
        return
    t, h, d = GDN["tokens"], GDN["heads"], GDN["dim"]
    write_npy(os.path.join(root, "gdn", "q.npy"), (t, h, d), lambda: gauss(t * h * d))
    write_npy(os.path.join(root, "gdn", "k.npy"), (t, h, d), lambda: unit_rows(gauss(t * h * d), d))
    write_npy(os.path.join(root, "gdn", "v.npy"), (t, h, d), lambda: gauss(t * h * d))
    write_npy(os.path.join(root, "gdn", "g.npy"), (t, h), lambda: [-abs(rng.gauss(0, 0.1)) for _ in range(t * h)])
    write_npy(os.path.join(root, "gdn", "beta.npy"), (t, h), lambda: [rng.random() for _ in range(t * h)])


if __name__ == "__main__":
    names = sys.argv[2:] or ["swa", "gdn"]
    if len(sys.argv) < 2 or any(n not in ("swa", "gdn") for n in names):
        sys.exit(__doc__)
    main(sys.argv[1], names)
