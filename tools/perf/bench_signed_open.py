#!/usr/bin/python3
"""The cost of verifying a signature at open (docs/performance.md,
"OpenSSF model signing"): sluice.open of one model N times in one process
for each way of trusting it, the median and minimum wall time of an open
(and close), and the bytes the process read per open (/proc/self/io
rchar: read() and pread() calls), which show that no weight is read.

usage: bench_signed_open.py MODEL N MODE=KWARGS...
  MODE is a label; KWARGS a Python dict literal of sluice.open's keywords,
  e.g.  plain='{}'  ec='{"trusted_keys": ["ec.pub"]}'
Run with the binding installed (tools/test_python.sh's build-py/venv).
"""
import ast
import statistics
import sys
import time

import sluice


def rchar():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def main():
    model, n = sys.argv[1], int(sys.argv[2])
    modes = [a.split("=", 1) for a in sys.argv[3:]]
    print(f"{'mode':<12} {'median ms':>10} {'min ms':>8} {'bytes read/open':>16}")
    for label, kw in modes:
        kwargs = ast.literal_eval(kw)
        with sluice.open(model, **kwargs):  # warm: OpenSSL's first use, page cache
            pass
        times, read = [], 0
        for _ in range(n):
            r0, t0 = rchar(), time.perf_counter()
            with sluice.open(model, **kwargs):
                pass
            times.append(time.perf_counter() - t0)
            read += rchar() - r0
        print(f"{label:<12} {statistics.median(times) * 1e3:>10.3f} {min(times) * 1e3:>8.3f} "
              f"{read // n:>16}")


if __name__ == "__main__":
    main()
