#!/usr/bin/env python3
"""An hf:// model with no published manifest, opened and one tensor read
(model.norm.weight), against the tests' stand-in for the Hub
(tests/hf_hub_server.py) on loopback: unverified (verify="off"), the first
verified open (derives: reads the whole file once, docs/manifests.md), the
second (the derived manifest), three rounds in turn. Prints wall and CPU
time (this process: the library's threads) and the storage's requests and
bytes (the sum of the ranges it served).

usage: tools/perf/hf_derive.py SLUICE [WORKDIR]
  SLUICE   a sluice command, to write the qwen2.5-0.5b synth preset
  WORKDIR  default /tmp/hfbench (about 1 GB)
Run with the Python that has the sluice package (tools/test_python.sh's venv).
"""
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "..", "..", "tests", "hf_hub_server.py")
COMMIT = "1" * 40


def main():
    sluice_cmd = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else "/tmp/hfbench"
    root, xdg = os.path.join(work, "root"), os.path.join(work, "xdg")
    snap = os.path.join(root, "org", "qwen", COMMIT)
    if not os.path.isfile(os.path.join(snap, "model.safetensors")):
        os.makedirs(os.path.join(root, "org", "qwen", "refs"), exist_ok=True)
        os.makedirs(snap, exist_ok=True)
        with open(os.path.join(root, "org", "qwen", "refs", "main"), "w") as f:
            f.write(COMMIT)
        out = os.path.join(work, "synth")
        subprocess.run([sluice_cmd, "synth", "qwen2.5-0.5b", out, "--no-manifest"], check=True)
        os.rename(os.path.join(out, "model.safetensors"), os.path.join(snap, "model.safetensors"))
    os.environ["XDG_CACHE_HOME"] = xdg
    os.environ.pop("SLUICE_CACHE_DIR", None)
    import sluice
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([sys.executable, SERVER, str(port), root])
    base = "http://127.0.0.1:%d" % port
    os.environ["HF_ENDPOINT"] = base

    def ctl(q):
        return urllib.request.urlopen(base + q, timeout=60).read().decode()

    deadline = time.monotonic() + 20
    while True:
        try:
            ctl("/ctl/storage")
            break
        except OSError:
            if srv.poll() is not None or time.monotonic() > deadline:
                sys.exit("the stand-in Hub did not start")
            time.sleep(0.05)

    def storage():
        n = b = 0
        for line in ctl("/ctl/log").splitlines():
            if line.startswith("storage "):
                n += 1
                m = re.search(r"range=bytes=(\d+)-(\d+)", line)
                b += int(m.group(2)) - int(m.group(1)) + 1 if m else 1 << 40
        return n, b

    def one(mode):
        ctl("/ctl/clear")
        if mode == "first":
            shutil.rmtree(os.path.join(xdg, "sluice", "derived"), ignore_errors=True)
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        with sluice.open("hf://org/qwen", verify="off" if mode == "off" else "default") as m:
            m.get_tensor("model.norm.weight", raw=True)
            state = m.verify_state
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        n, b = storage()
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        print("%-6s %-16s wall %6.2f s  cpu %5.2f s  storage %3d requests %11d bytes"
              % (mode, state, t1 - t0, cpu, n, b), flush=True)

    try:
        one("first")  # warms the stand-in's digest of the file
        for _ in range(3):
            for mode in ("off", "first", "second"):
                one(mode)
    finally:
        srv.kill()
        srv.wait()


if __name__ == "__main__":
    main()
