#!/usr/bin/env python3
"""Runs `ctxpar hybrid --json FILE` (the command after `--`) and checks its time phases.

The communication phase is what the layers' groups counted inside their collectives'
MPI calls (Traffic::seconds), so across ranks it must be more than zero for every layer
of a distributed run (each layer's operator moves data), and no phase may exceed the
layer's total. These are consistency checks of the accounting, not performance figures.
Standard library only.
"""
import argparse
import json
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="the --json FILE the command writes")
    ap.add_argument("--ranks", type=int, required=True, help="the command's rank count")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command line")
    a = ap.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    run = subprocess.run(command + ["--json", a.json], capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout + run.stderr)
        sys.exit(f"ctxpar hybrid exited with {run.returncode}")
    with open(a.json) as f:
        record = json.load(f)
    wrong = []
    for step in record["steps"]:
        for layer in step["layers"]:
            where = f"step {step['step']}, layer {layer['layer']}"
            for run_name, phases in layer["phases_seconds"].items():
                total = phases["total"]
                for key in ("communication", "relayout", "staging", "host_glue",
                            "outside_mpi_slowest_rank", "outside_mpi_fastest_rank"):
                    if not 0 <= phases[key] <= total:
                        wrong.append(f"{where}, {run_name}: {key} {phases[key]} outside "
                                     f"[0, total {total}]")
            dist = layer["phases_seconds"]["distributed"]
            if a.ranks >= 2 and not dist["communication"] > 0:
                wrong.append(f"{where}: no time inside communication at P = {a.ranks}")
            if a.ranks >= 2 and not dist["mpi_calls_rank0"] > 0:
                wrong.append(f"{where}: no collective call at P = {a.ranks}")
    for w in wrong:
        print(w)
    if wrong:
        sys.exit(f"{len(wrong)} phase check(s) failed")
    print(f"phases consistent in {len(record['steps'])} step(s) at P = {a.ranks}")


if __name__ == "__main__":
    main()
