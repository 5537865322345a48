#!/usr/bin/python3
"""A stock gRPC client (Debian's python3-grpcio, every channel option at its
default: a 4 MiB receive limit) that fetches one tensor by GetTensor with a
given chunk_bytes and compares it with the tensor's bytes in a local
.safetensors file. No generated code: the request is encoded and the chunks
decoded by hand (the fields of proto/sluice/v1/tensor_service.proto).
usage: stock_client.py ADDR MODEL TENSOR CHUNK_BYTES LOCAL.safetensors [TOKEN_FILE]
exit 0: equal; 1: different; 2: the call failed (its status printed)."""
import json
import struct
import sys

import grpc


def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n])


def field_bytes(num, b):
    return varint((num << 3) | 2) + varint(len(b)) + b


def parse(msg):
    """The fields of one message: {number: value} (last one wins)."""
    out, i = {}, 0
    while i < len(msg):
        key, i = read_varint(msg, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            out[num], i = read_varint(msg, i)
        elif wt == 2:
            n, i = read_varint(msg, i)
            out[num] = msg[i:i + n]
            i += n
        else:
            raise ValueError("wire type %d" % wt)
    return out


def read_varint(b, i):
    n = shift = 0
    while True:
        x = b[i]
        i += 1
        n |= (x & 0x7F) << shift
        shift += 7
        if x < 0x80:
            return n, i


def local_bytes(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        a, b = hdr[name]["data_offsets"]
        f.seek(8 + n + a)
        return f.read(b - a)


def main():
    addr, model, tensor, chunk, local = sys.argv[1:6]
    md = None
    if len(sys.argv) > 6:
        with open(sys.argv[6]) as f:
            md = [("authorization", "Bearer " + f.read().strip())]
    req = field_bytes(1, model.encode()) + field_bytes(2, tensor.encode()) + \
        varint((4 << 3) | 0) + varint(int(chunk))
    with grpc.insecure_channel(addr) as ch:
        call = ch.unary_stream("/sluice.v1.TensorService/GetTensor",
                               request_serializer=None, response_deserializer=None)
        got, largest = b"", 0
        try:
            for raw in call(req, timeout=60, metadata=md):
                largest = max(largest, len(raw))
                got += parse(raw).get(4, b"")
        except grpc.RpcError as e:
            print("%s: %s" % (e.code().name, e.details()))
            return 2
    want = local_bytes(local, tensor)
    print("%d bytes in messages of at most %d bytes" % (len(got), largest))
    return 0 if got == want else 1


if __name__ == "__main__":
    sys.exit(main())
