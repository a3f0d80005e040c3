#!/usr/bin/python3
"""`ferry run` with its workers' shared allocations on and off, alternated in one run.

    test/bench/run_bench.py --ferry build/tools/ferry [--quick] [--json F]

Rows: the built-in tasks as a user starts them, each run R times per setting, alternating:
  square, 1 MiB results     --task square --features 4096 (64 x 4096 float32 in and out)
  square, 4 MiB results     --task square --features 16384
  mlp                       the default job (results of 2.5 KiB: under the line from which a
                            tensor is born shared, so copied either way)
Each figure is the median of the runs' tasks/s; the ratio is on / off. A row fails (exit 1) when
a run fails or, with shared allocations on, a result larger than the line was copied.
"""
import argparse
import json
import statistics
import subprocess
import sys

ROWS = [
    ("square, 1 MiB results", ["--task", "square", "--features", "4096"], True),
    ("square, 4 MiB results", ["--task", "square", "--features", "16384"], True),
    ("mlp (2.5 KiB results)", ["--task", "mlp"], False),
]


def run(ferry, args, setting, batches):
    cmd = [ferry, "run", *args, "--batches", str(batches), "--shared-allocations", setting,
           "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}\n{p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--quick", action="store_true", help="one short run each: a smoke test")
    ap.add_argument("--json")
    a = ap.parse_args()
    repeats, batches = (1, 200) if a.quick else (5, 3000)
    out = {"rows": []}
    failed = False
    print(f"{'ferry run':<26}{'off tasks/s':>14}{'on tasks/s':>14}{'on/off':>9}  results zero-copy")
    for name, args, large in ROWS:
        got = {"off": [], "on": []}
        share = 0.0
        for _ in range(repeats):
            for setting in ("off", "on"):
                d = run(a.ferry, args, setting, batches)
                got[setting].append(d["tasks_per_second"])
                if setting == "on":
                    r = d["results"]
                    total = r["bytes_zero_copy"] + r["bytes_copied"]
                    share = r["bytes_zero_copy"] / total if total else 0.0
        off, on = statistics.median(got["off"]), statistics.median(got["on"])
        if large and share < 1.0:
            failed = True
        print(f"{name:<26}{off:>14.0f}{on:>14.0f}{on / off:>8.2f}x  {share * 100:.0f}%")
        out["rows"].append({"row": name, "off": got["off"], "on": got["on"],
                            "ratio": on / off, "zero_copy_share_on": share})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if failed:
        print("FAIL: with shared allocations on, results over the line were copied")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
