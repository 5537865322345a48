#!/usr/bin/python3
"""A verified get_slice of 1/8 of a tensor's rows, with chunk digests
against without (whole-tensor digest), in one run, warm page cache.

    build-py/venv/bin/python bindings/python/benchmarks/bench_slice.py /tmp/sluice-slice \\
        --rows 32768 --cols 1024 --chunk 16M --runs 7

Writes one F32 tensor of ROWS x COLS (128 MiB by default) and two version
2 manifests (SHA-256, by hashlib): one with chunk digests of CHUNK bytes,
one without. Each round opens the model once per manifest (alternating
which goes first) and times `safe_open(...).get_slice("t")[a:a + ROWS/8]`
for a window starting at a pseudo-random row, on a fresh open each time,
so nothing is cached in the pool. Prints the median (min-max) seconds,
the bytes the library read, and the ratio.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import stfile  # noqa: E402
import sluice  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--chunk", default="16M")
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    chunk = sluice.parse_size(a.chunk)
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "model.safetensors")
    t = np.random.default_rng(5).standard_normal((a.rows, a.cols)).astype(np.float32)
    stfile.write(path, {"t": t})
    del t
    manifests = {"chunked": os.path.join(a.dir, "chunked.json"),
                 "whole": os.path.join(a.dir, "whole.json")}
    stfile.write_manifest_v2(manifests["chunked"], [path], chunk_bytes=chunk)
    stfile.write_manifest_v2(manifests["whole"], [path])
    n = a.rows // 8
    rng = np.random.default_rng(9)
    times = {k: [] for k in manifests}
    read = {k: [] for k in manifests}
    order = list(manifests)
    for r in range(a.runs + 1):  # round 0 warms the page cache, untimed
        start = int(rng.integers(0, a.rows - n))
        for k in (order if r % 2 else order[::-1]):
            with sluice.safe_open(path, manifest=manifests[k]) as f:
                s = f.get_slice("t")
                t0 = time.perf_counter()
                out = s[start:start + n]
                dt = time.perf_counter() - t0
                st = f.model.stats()
            assert out.shape == (n, a.cols)
            if r:
                times[k].append(dt)
                read[k].append(st["bytes_read"])
    total = a.rows * a.cols * 4
    print(f"tensor {total / 2**20:.0f} MiB, slice {n} rows ({n * a.cols * 4 / 2**20:.0f} MiB), "
          f"chunk {chunk / 2**20:.0f} MiB, {a.runs} rounds")
    for k in manifests:
        v = times[k]
        print(f"{k:8s} {statistics.median(v) * 1e3:8.1f} ms [{min(v) * 1e3:.1f}-{max(v) * 1e3:.1f}]"
              f"  read {statistics.median(read[k]) / 2**20:.0f} MiB")
    print(f"whole / chunked time: {statistics.median(times['whole']) / statistics.median(times['chunked']):.2f}")


if __name__ == "__main__":
    main()
