#!/usr/bin/python3
"""model.stream() from Python against the C `sluice bench` stream and a
seed-style Python loader, on one model, warm page cache, verified.

    build-release/sluice synth llama-3.2-1b /tmp/sluice-llama1b
    build-py/venv/bin/python bindings/python/benchmarks/bench_stream.py \\
        /tmp/sluice-llama1b --cli build-release/sluice --runs 5 --pool 4G

Every round runs, one after the other (each round starting one
configuration later, so that none always follows the same neighbour):
  C       `sluice bench MODEL --runs 1 --pool P --verify on --baselines none`
          (a fresh process: one untimed pass, then open + stream + close)
  python  a fresh interpreter: one untimed pass, then, timed,
          sluice.open(MODEL, pool=P, verify="require") + every
          `for name, a in model.stream(framework=F, raw=True)` + close
          (--framework np: read-only NumPy arrays; pt: torch tensors,
          zero copy under the write guard; raw=True: BF16 as its bits
          where NumPy has no bfloat16)
  seed    a fresh interpreter: one untimed pass, then, timed, for every
          file mmap it, parse the header (struct + json), and for every
          tensor hashlib.sha256 of its bytes compared with the manifest's
          digest, and np.frombuffer over the map
  other   with --other-python PY: python's run under another interpreter,
          whose sluice package is another build (a venv of an older commit:
          the write guard's cost was measured so, docs/performance.md)
Figures are medians (min-max) of the rounds: GB/s of tensor bytes, and the
peak RSS of the process (ru_maxrss).
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

PY_STREAM = r"""
import resource, sys, time
import sluice
path, pool, fw = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def stream(m):
    try:
        return m.stream(framework=fw, raw=True)
    except TypeError:  # a sluice from before raw=
        return m.stream(framework=fw)
def once():
    n = 0
    t0 = time.perf_counter()
    with sluice.open(path, pool=pool, verify="require") as m:
        for name, a in stream(m):
            n += a.nbytes if fw == "np" else a.numel() * a.element_size()
        del a
        st = m.stats()
    return time.perf_counter() - t0, n, st
once()                      # untimed: the process's first touch of its pool
wall, n, st = once()
assert st["tensors_verified"] == st["tensors_loaded"] and st["failures"] == 0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(wall, n, rss)
"""

PY_SEED = r"""
import hashlib, json, mmap, os, resource, struct, sys, time
import numpy as np
path, manifest_path = sys.argv[1], sys.argv[2]
DT = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}
with open(manifest_path) as f:
    manifest = json.load(f)
manifest = manifest.get("tensors", manifest)
def digest_of(v):
    return (v.get("digest") or v["sha256"]) if isinstance(v, dict) else v
files = sorted(os.path.join(path, p) for p in os.listdir(path) if p.endswith(".safetensors"))
def once():
    n = 0
    t0 = time.perf_counter()
    for fn in files:
        with open(fn, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (hl,) = struct.unpack("<Q", mm[:8])
        header = json.loads(mm[8:8 + hl])
        header.pop("__metadata__", None)
        view = memoryview(mm)
        for name, e in header.items():
            b, end = e["data_offsets"]
            lo, hi = 8 + hl + b, 8 + hl + end
            if hashlib.sha256(view[lo:hi]).hexdigest() != digest_of(manifest[name]).lower():
                raise SystemExit(f"checksum mismatch: {name}")
            a = np.frombuffer(mm, dtype=DT[e["dtype"]], count=(hi - lo) // np.dtype(DT[e["dtype"]]).itemsize, offset=lo)
            n += a.nbytes
            del a
        del view
        mm.close()
    return time.perf_counter() - t0, n
once()
wall, n = once()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(wall, n, rss)
"""


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def run_c(cli, model, pool):
    with tempfile.NamedTemporaryFile(suffix=".csv") as f:
        subprocess.run([cli, "bench", model, "--runs", "1", "--pool", pool, "--verify", "on",
                        "--baselines", "none", "--csv", f.name], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = list(csv.DictReader(open(f.name)))
    row = [r for r in rows if r["mode"] == "stream"][0]
    if row["ok"] != "1":
        raise SystemExit(f"sluice bench failed: {row['error']}")
    return float(row["bytes_needed"]) / float(row["wall_s"]) / 1e9, float(row["peak_rss_mb"])


def run_py(script, *args, python=sys.executable):
    # from /tmp: a sluice/ folder in the working directory would shadow the
    # interpreter's installed package
    out = subprocess.run([python, "-c", script, *args], check=True, capture_output=True,
                         text=True, cwd=tempfile.gettempdir()).stdout.split()
    wall, n, rss = float(out[0]), int(out[1]), float(out[2])
    return n / wall / 1e9, rss


def fmt(xs):
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="/tmp/sluice-llama1b")
    ap.add_argument("--cli", default="build-release/sluice", help="the sluice command")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pool", default="4G")
    ap.add_argument("--framework", choices=("np", "pt"), default="np",
                    help="what the Python stream gives: NumPy arrays or torch tensors")
    ap.add_argument("--other-python", metavar="PY",
                    help="also run the Python stream under PY (another build of the package)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    a.model = os.path.abspath(a.model)  # the Python runs start in /tmp
    # the manifest sluice finds: the directory's, or a single file's sidecar
    sidecars = [os.path.join(a.model, n) for n in ("sluice.manifest.json",
                                                    "model.safetensors.manifest.json")]
    manifest = next((p for p in sidecars if os.path.isfile(p)), None)
    if not manifest:
        raise SystemExit(f"{a.model}: no sluice.manifest.json (make it with `sluice synth`)")
    pool = parse_size(a.pool)
    configs = {
        "C sluice bench stream": lambda: run_c(a.cli, a.model, a.pool),
        f"python model.stream({a.framework})": lambda: run_py(PY_STREAM, a.model, str(pool),
                                                             a.framework),
        "seed-style python loader": lambda: run_py(PY_SEED, a.model, manifest),
    }
    if a.other_python:
        configs[f"python model.stream({a.framework}) under {a.other_python}"] = \
            lambda: run_py(PY_STREAM, a.model, str(pool), a.framework, python=a.other_python)
    names = list(configs)
    res = {k: ([], []) for k in names}
    for r in range(a.runs):
        for k in names[r % len(names):] + names[:r % len(names)]:
            gbps, rss = configs[k]()
            res[k][0].append(gbps)
            res[k][1].append(rss)
            print(f"round {r + 1}: {k}: {gbps:.2f} GB/s, peak RSS {rss:.0f} MiB",
                  file=sys.stderr, flush=True)
    print(f"\n{a.model}, warm, verified, pool {a.pool}, median of {a.runs} rounds [min-max]")
    print(f"| configuration | GB/s | peak RSS MiB |\n| --- | --- | --- |")
    for k in names:
        print(f"| {k} | {fmt(res[k][0])} | {fmt(res[k][1])} |")
    med = {k: statistics.median(res[k][0]) for k in names}
    py_rss = max(res[names[1]][1])
    ratio_c = med[names[1]] / med[names[0]]
    ratio_seed = med[names[1]] / med[names[2]]
    print(f"\npython / C: {ratio_c:.3f} (target >= 0.95)")
    print(f"python / seed: {ratio_seed:.2f} (target >= 8)")
    if a.other_python:
        print(f"python / python under {a.other_python}: {med[names[1]] / med[names[3]]:.3f}")
    print(f"python peak RSS {py_rss:.0f} MiB, pool + 64 MiB = {(pool >> 20) + 64} MiB "
          f"({'within' if py_rss <= (pool >> 20) + 64 else 'OVER'})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": {k: {"gbps": res[k][0], "rss_mb": res[k][1]} for k in names},
                       "ratio_c": ratio_c, "ratio_seed": ratio_seed}, f, indent=1)


if __name__ == "__main__":
    main()
