#!/usr/bin/python3
"""Writes a .safetensors file of U8 tensors filled with pseudo-random bytes
(stdlib only), for the serve tests: mkmodel.py OUT NAME:BYTES [NAME:BYTES ...]"""
import json
import random
import struct
import sys


def main():
    out, specs = sys.argv[1], sys.argv[2:]
    header, offset = {}, 0
    for spec in specs:
        name, size = spec.rsplit(":", 1)
        size = int(size)
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    rnd = random.Random(1234)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for spec in specs:
            size = int(spec.rsplit(":", 1)[1])
            while size:
                n = min(size, 1 << 22)
                f.write(rnd.randbytes(n))
                size -= n


if __name__ == "__main__":
    main()
