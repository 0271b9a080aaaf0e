"""Cross-checks ctxpar's .npy reader and writer against NumPy: every supported dtype, shape and
format version NumPy writes (bfloat16 as its uint16 bit patterns) must round-trip bit-exactly through `npy_copy`, and every unsupported
file must be refused with a ctxpar error naming what is wrong."""
import os
import subprocess
import sys
import tempfile

import numpy as np

copy_tool = sys.argv[1]
rng = np.random.default_rng(7)
failures = []


def run(path_in, path_out):
    return subprocess.run([copy_tool, path_in, path_out], capture_output=True, text=True)


with tempfile.TemporaryDirectory() as tmp:
    cases = 0
    # uint16 is how bfloat16 travels (its bit patterns): read as bfloat16, written back as '<u2'.
    for dtype in (np.float32, np.float64, np.int32, np.float16, np.uint16):
        for shape in [(), (1,), (7,), (2, 3, 4), (0, 3), (3, 1, 2, 2)]:
            for version in ((1, 0), (2, 0)):
                if dtype == np.uint16:
                    wide = np.asarray(rng.standard_normal(shape) * 1000, dtype=np.float32)
                    bits = wide.reshape(shape).view(np.uint32)
                    a = (bits >> 16).astype(np.uint16)
                else:
                    a = (rng.standard_normal(shape) * 1000).astype(dtype)
                src = os.path.join(tmp, "in.npy")
                dst = os.path.join(tmp, "out.npy")
                with open(src, "wb") as f:
                    np.lib.format.write_array(f, a, version=version)
                r = run(src, dst)
                cases += 1
                if r.returncode != 0:
                    failures.append(f"{dtype.__name__}{shape} v{version}: refused: {r.stderr.strip()}")
                    continue
                b = np.load(dst)
                if b.dtype != a.dtype or b.shape != a.shape or a.tobytes() != b.tobytes():
                    failures.append(f"{dtype.__name__}{shape} v{version}: round trip differs")
                with open(dst, "rb") as f:
                    if np.lib.format.read_magic(f) != (1, 0):
                        failures.append(f"{dtype.__name__}{shape}: written version is not 1.0")

    refused = {
        "int64": (np.arange(6, dtype=np.int64), "unsupported dtype"),
        "uint32": (np.ones(3, dtype=np.uint32), "unsupported dtype"),
        "big-endian half": (np.ones(3, dtype=">f2"), "unsupported dtype"),
        "big-endian": (np.ones(3, dtype=">f4"), "unsupported dtype"),
        "fortran": (np.asfortranarray(np.ones((2, 3), dtype=np.float32)), "C-order"),
        "bool": (np.ones(3, dtype=bool), "unsupported dtype"),
    }
    for name, (a, needle) in refused.items():
        src = os.path.join(tmp, name + ".npy")
        np.save(src, a)
        r = run(src, os.path.join(tmp, "never.npy"))
        cases += 1
        if r.returncode != 3 or needle not in r.stderr:
            failures.append(f"{name}: expected a ctxpar error containing '{needle}', got "
                            f"exit {r.returncode}: {r.stderr.strip()}")
    src = os.path.join(tmp, "cut.npy")
    np.save(src, np.ones((4, 4), dtype=np.float64))
    with open(src, "r+b") as f:
        f.truncate(os.path.getsize(src) - 1)
    r = run(src, os.path.join(tmp, "never.npy"))
    cases += 1
    if r.returncode != 3 or "truncated data" not in r.stderr:
        failures.append(f"truncated: got exit {r.returncode}: {r.stderr.strip()}")

for f in failures:
    print("FAIL:", f)
print(f"{cases - len(failures)} of {cases} NumPy cross-checks passed")
sys.exit(1 if failures else 0)
