#!/usr/bin/python3
"""Baseline (f) of `sluice bench`: the verifier a user would write instead
of `sluice verify`. It maps every shard with mmap, hashes zero-copy
memoryview slices of each tensor with hashlib.sha256 (OpenSSL; hashlib
releases the GIL on large buffers) on a pool of one thread per CPU,
largest tensor first, and compares each digest with the manifest.

usage: py_verify.py MODEL_PATH MANIFEST [THREADS]
MODEL_PATH is a .safetensors file, a directory or an index.json. Prints
"verified N tensors, F failed, B bytes" and exits 1 on a mismatch.
"""
import concurrent.futures
import hashlib
import json
import mmap
import os
import struct
import sys


def shard_paths(path):
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if not os.path.exists(index):
            return [os.path.join(path, "model.safetensors")]
        path = index
    if path.endswith(".json"):
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        base = os.path.dirname(path)
        return [os.path.join(base, s) for s in sorted(set(weight_map.values()))]
    return [path]


def main():
    model, manifest = sys.argv[1], sys.argv[2]
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else os.cpu_count()
    with open(manifest) as f:
        doc = json.load(f)
    entries = doc.get("tensors", doc)
    if doc.get("algorithm", "sha256") != "sha256":
        sys.exit("py_verify: only SHA-256 manifests (this one is %s)" % doc["algorithm"])
    # flat: {name: digest}; version 1: {"sha256": ...}; version 2: {"digest": ...}
    want = {k: (v.get("digest", v.get("sha256")) if isinstance(v, dict) else v)
            for k, v in entries.items()}

    maps, work = [], []
    for p in shard_paths(model):
        with open(p, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        maps.append(m)
        (hlen,) = struct.unpack("<Q", m[:8])
        header = json.loads(bytes(m[8:8 + hlen]))
        header.pop("__metadata__", None)
        view = memoryview(m)
        for name, t in header.items():
            b, e = t["data_offsets"]
            work.append((e - b, name, view[8 + hlen + b:8 + hlen + e]))
    work.sort(key=lambda w: w[0], reverse=True)

    def check(item):
        size, name, buf = item
        ok = hashlib.sha256(buf).hexdigest() == want.get(name)
        buf.release()
        return name, size, ok

    failed, total = [], 0
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for name, size, ok in pool.map(check, work):
            total += size
            if not ok:
                failed.append(name)
    for name in failed:
        print("FAILED", name)
    print("verified %d tensors, %d failed, %d bytes" % (len(work) - len(failed), len(failed), total))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
