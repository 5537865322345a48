#!/usr/bin/python3
"""model.stream() of a remote model from Python against the C `sluice
bench` remote stream, over loopback nginx, verified; and the warm-cache
remote stream against the local verified stream. Same run, same model.

    build-rel/sluice synth llama-3.2-1b /tmp/sluice-llama1b
    build-py/venv/bin/python bindings/python/benchmarks/bench_remote.py \\
        /tmp/sluice-llama1b --cli build-rel/sluice --runs 3 --pool 4G

nginx serves the model's folder through tools/serve_http.sh on a free
port of 127.0.0.1. Every round runs, one after the other (each round
starting one configuration later):
  C remote      `sluice bench URL/ --runs 1 --pool P --verify on --baselines none`
                (a fresh process: one untimed pass, then open + stream + close)
  python remote a fresh interpreter: one untimed pass, then, timed,
                sluice.open(URL/, pool=P, verify="require") + every
                `for name, a in model.stream()` + close (no cache)
  python warm   the same with cache_dir=C, a cache the untimed pass (and
                every earlier round) filled: tensors come from its blobs
  python local  the same on the local folder (no cache)
Figures are medians (min-max) of the rounds, GB/s of tensor bytes.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, HERE)
# sluice bench's stream row (a URL works as a path), sizes, figures: bench_stream's
from bench_stream import fmt, parse_size, run_c  # noqa: E402

PY_STREAM = r"""
import sys, time
import sluice
path, pool, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
def once():
    n = 0
    t0 = time.perf_counter()
    with sluice.open(path, pool=pool, verify="require", cache_dir=cache) as m:
        for name, a in m.stream():
            n += a.nbytes
        del a
        st = m.stats()
    return time.perf_counter() - t0, n, st
once()
wall, n, st = once()
assert st["tensors_verified"] + st["disk_hits"] >= st["tensors_loaded"] and st["failures"] == 0, st
if cache:
    assert st["remote_bytes"] == 0, st   # warm: nothing from the network
print(wall, n, st["disk_hits"])
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_py(path, pool, cache=""):
    out = subprocess.run([sys.executable, "-c", PY_STREAM, path, str(pool), cache], check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[1]) / float(out[0]) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="/tmp/sluice-llama1b")
    ap.add_argument("--cli", default="build-rel/sluice", help="the sluice command")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pool", default="4G")
    a = ap.parse_args()
    model = os.path.abspath(a.model)
    if not os.path.isfile(os.path.join(model, "sluice.manifest.json")):
        raise SystemExit(f"{model}: no sluice.manifest.json (make it with `sluice synth`)")
    pool = parse_size(a.pool)
    port = free_port()
    nginx = subprocess.Popen(["sh", os.path.join(REPO, "tools", "serve_http.sh"), model,
                              str(port)], stdout=subprocess.DEVNULL, start_new_session=True)
    cache = tempfile.mkdtemp(prefix="sluice-bench-cache-", dir=os.path.join(REPO, "build-py"))
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or nginx.poll() is not None:
                    raise SystemExit("nginx did not start (tools/serve_http.sh)")
                time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/"
        configs = {
            "C sluice bench remote stream": lambda: run_c(a.cli, url, a.pool)[0],
            "python remote model.stream()": lambda: run_py(url, pool),
            "python remote, warm cache": lambda: run_py(url, pool, cache),
            "python local verified stream": lambda: run_py(model, pool),
        }
        names = list(configs)
        res = {k: [] for k in names}
        for r in range(a.runs):
            for k in names[r % len(names):] + names[:r % len(names)]:
                gbps = configs[k]()
                res[k].append(gbps)
                print(f"round {r + 1}: {k}: {gbps:.2f} GB/s", file=sys.stderr, flush=True)
    finally:
        os.killpg(nginx.pid, 15)
        nginx.wait(timeout=10)
        subprocess.run(["rm", "-rf", cache])
    print(f"\n{model} over loopback nginx, verified, pool {a.pool}, "
          f"median of {a.runs} rounds [min-max]")
    print("| configuration | GB/s |\n| --- | --- |")
    for k in names:
        print(f"| {k} | {fmt(res[k])} |")
    med = {k: statistics.median(res[k]) for k in names}
    print(f"\npython remote / C remote: {med[names[1]] / med[names[0]]:.3f} (target >= 0.95)")
    print(f"python warm cache / python local: {med[names[2]] / med[names[3]]:.3f} "
          f"(target >= 0.9)")


if __name__ == "__main__":
    main()
