#!/usr/bin/env python3
"""Per-kernel time of bench_cuda's timed steps, from an ncu CSV.

  ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \\
      --page raw --log-file decode.csv bench_cuda ... --profile
  python3 tools/gpu/kernel_profile.py --steps 3 decode.csv

bench_cuda --profile brackets only the timed steps (cudaProfilerStart/Stop),
so every kernel in the file belongs to one of --steps equal steps. Prints,
per kernel name, its launches and time per step and its share, largest
first, and the step's kernel-time sum (the step's wall time minus this is
launch gaps and host work).
"""
import argparse
import collections
import csv
import re
import sys

# ncu writes "ns" (older releases "nsecond"); anything else is refused.
UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "s": 1e6, "second": 1e6}


def short(name):
    name = re.sub(r"\(.*$", "", name)           # drop the argument list
    name = re.sub(r"^void ", "", name)
    return name[:90]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own log lines start with ==
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        print(f"{a.csv}: no kernels (did ncu run? see the log)")
        return 1
    head, units = rows[0], rows[1]
    col = head.index("gpu__time_duration.sum")
    if units[col] not in UNITS:
        print(f"{a.csv}: unknown time unit {units[col]!r}")
        return 1
    scale = UNITS[units[col]]
    name_col = head.index("Kernel Name")
    per = collections.defaultdict(lambda: [0, 0.0])
    for r in rows[2:]:
        try:
            t = float(r[col].replace(",", "")) * scale
        except ValueError:
            continue
        k = per[short(r[name_col])]
        k[0] += 1
        k[1] += t
    total = sum(v[1] for v in per.values()) / a.steps
    print(f"kernel time per step: {total:.1f} us over "
          f"{sum(v[0] for v in per.values()) / a.steps:.0f} launches")
    for name, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"  {t / a.steps:9.1f} us {100 * t / a.steps / total:5.1f}% "
              f"{n / a.steps:6.1f}x  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
