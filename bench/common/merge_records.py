#!/usr/bin/env python3
"""Merge the per-rank-count JSON files a sweep wrote (DIR/P*.json, each a list of records) into one
results file, so every bench/<area>/run*.sh writes bench/results/<name>.json the same way.

    merge_records.py DIR OUT [--keep-if-empty]

With --keep-if-empty an empty sweep (every run failed) leaves an existing OUT untouched instead of
replacing it by an empty list.
"""
import glob
import json
import sys


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    folder, out = argv[1], argv[2]
    keep_if_empty = "--keep-if-empty" in argv[3:]
    records = []
    for path in sorted(glob.glob(folder + "/P*.json")):
        with open(path) as f:
            records += json.load(f)
    if not records and keep_if_empty:
        print(f"no records in {folder}: {out} left as it was")
        return 0
    with open(out, "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {len(records)} records to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
