"""A small .safetensors writer and an independent reader for the tests.

Written from the format's description (8-byte little-endian header length,
JSON header, data), with struct + json + NumPy only: the reference
package is not installable here, so the tests state the expected values
themselves.
"""
import hashlib
import json
import os
import struct

import numpy as np

NP_NAMES = {
    np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
    np.dtype(np.int16): "I16", np.dtype(np.uint16): "U16", np.dtype(np.float16): "F16",
    np.dtype(np.int32): "I32", np.dtype(np.uint32): "U32", np.dtype(np.float32): "F32",
    np.dtype(np.int64): "I64", np.dtype(np.uint64): "U64", np.dtype(np.float64): "F64",
    np.dtype(np.complex64): "C64",
}
# What sluice gives for each dtype without ml_dtypes (raw views for BF16/F8).
EXPECTED_NP = {v: k for k, v in NP_NAMES.items()}
EXPECTED_NP.update({"BF16": np.dtype(np.uint16), "F8_E5M2": np.dtype(np.uint8),
                    "F8_E4M3": np.dtype(np.uint8), "F8_E8M0": np.dtype(np.uint8),
                    "F8_E4M3FNUZ": np.dtype(np.uint8), "F8_E5M2FNUZ": np.dtype(np.uint8)})


def write(path, tensors, metadata=None, align=8):
    """tensors: {name: ndarray} or {name: (dtype_name, shape, raw bytes)}.
    Writes in the given order. Returns {name: sha256 hex}."""
    entries, blobs, offset = {}, [], 0
    if metadata is not None:
        entries["__metadata__"] = metadata
    digests = {}
    for name, t in tensors.items():
        if isinstance(t, tuple):
            dtype, shape, raw = t
        else:
            dtype, shape, raw = NP_NAMES[t.dtype], list(t.shape), np.ascontiguousarray(t).tobytes()
        entries[name] = {"dtype": dtype, "shape": list(shape),
                         "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
        digests[name] = hashlib.sha256(raw).hexdigest()
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * ((-len(header)) % align)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for b in blobs:
            f.write(b)
    return digests


def write_manifest(path, digests):
    with open(path, "w") as f:
        json.dump(digests, f)


def parse(path):
    """(the file's bytes, N, {name: (dtype_name, shape tuple, raw bytes,
    absolute offset)}, the metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], tuple(e["shape"]), data[8 + n + b:8 + n + end], 8 + n + b)
    return data, n, out, meta


def read(path):
    """{name: (dtype_name, shape tuple, raw bytes)} and the metadata."""
    _, _, tensors, meta = parse(path)
    return {k: v[:3] for k, v in tensors.items()}, meta


def read_model(path):
    """Like read, over a file, a directory or an index.json."""
    if os.path.isdir(path):
        idx = [p for p in os.listdir(path) if p.endswith(".safetensors.index.json")]
        if idx:
            return read_model(os.path.join(path, sorted(idx)[0]))
        files = sorted(os.path.join(path, p) for p in os.listdir(path)
                       if p.endswith(".safetensors"))
    elif path.endswith(".index.json"):
        with open(path) as f:
            wm = json.load(f)["weight_map"]
        d = os.path.dirname(path)
        files = [os.path.join(d, s) for s in sorted(set(wm.values()))]
    else:
        files = [path]
    out = {}
    for f in files:
        out.update(read(f)[0])
    return out


def expected_array(dtype, shape, raw):
    """The NumPy array sluice should give (raw views for BF16/F8)."""
    npd = EXPECTED_NP.get(dtype)
    if npd is None:  # packed
        return np.frombuffer(raw, dtype=np.uint8)
    return np.frombuffer(raw, dtype=npd).reshape(shape)


def write_sharded(d, shards, metadata=None):
    """shards: list of {name: array}. Writes model-0000i-of-0000n.safetensors,
    model.safetensors.index.json and sluice.manifest.json in d."""
    os.makedirs(d, exist_ok=True)
    weight_map, digests = {}, {}
    n = len(shards)
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        digests.update(write(os.path.join(d, fname), tensors, metadata))
        for k in tensors:
            weight_map[k] = fname
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    write_manifest(os.path.join(d, "sluice.manifest.json"), digests)
    return digests


def b3sum(data):
    """BLAKE3 of data by the b3sum program (Debian package b3sum): an
    implementation independent of the one compiled into sluice."""
    import subprocess
    out = subprocess.run(["b3sum", "--no-names"], input=data, capture_output=True,
                         check=True).stdout
    return out.split()[0].decode()


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def write_manifest_v2(path, files, algorithm="sha256", chunk_bytes=None):
    """A version 2 manifest for the .safetensors files (paths), written
    from the format's description in sluice.h: per tensor its digest,
    dtype, shape, nbytes (and with chunk_bytes, the digests of its
    chunk_bytes-sized chunks, for tensors of more than one chunk); per file
    its digest, size and the digest of its first 8 + N bytes."""
    digest = {"sha256": sha256, "blake3": b3sum}[algorithm]
    tensors, out_files = {}, {}
    for p in files:
        data, n, parsed, _ = parse(p)
        for name, (dtype, shape, raw, _) in parsed.items():
            entry = {"digest": digest(raw), "dtype": dtype, "shape": list(shape),
                     "nbytes": len(raw)}
            if chunk_bytes and len(raw) > chunk_bytes:
                entry["chunk_bytes"] = chunk_bytes
                entry["chunks"] = [digest(raw[k:k + chunk_bytes])
                                   for k in range(0, len(raw), chunk_bytes)]
            tensors[name] = entry
        out_files[os.path.basename(p)] = {"digest": digest(data), "size": len(data),
                                          "header": digest(data[:8 + n])}
    with open(path, "w") as f:
        json.dump({"format": "sluice-manifest", "version": 2, "algorithm": algorithm,
                   "tensors": tensors, "files": out_files}, f)


def tensor_offset(path, name):
    """Absolute offset of a tensor's first byte in its file."""
    return parse(path)[2][name][3]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
