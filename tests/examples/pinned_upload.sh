#!/bin/sh
# example_pinned_upload: examples/pinned_upload.c moves every tensor of a
# model with a chunked version 2 manifest through two 1 MiB staging
# buffers (sluice_read_into), verifying each piece; then, with one byte of
# the big tensor flipped, it must fail and say which chunk.
# usage: pinned_upload.sh PINNED_UPLOAD SLUICE
set -eu
dir=$(mktemp -d "${TMPDIR:-/tmp}/sluice-pinned.XXXXXX")
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 - "$dir/m.safetensors" <<'PY'
import json, struct, sys
n = 5 * 1024 * 1024 + 77
h = json.dumps({"big": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]},
                "small": {"dtype": "F32", "shape": [3], "data_offsets": [n, n + 12]}}).encode()
data = bytes((i * 7919 + 13) & 0xFF for i in range(n + 12))
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
"$2" manifest "$dir/m.safetensors" --chunk 1M -o "$dir/m.safetensors.manifest.json"
out=$("$1" "$dir/m.safetensors" 1)
echo "$out"
case "$out" in
*"2 tensors, 5242969 bytes uploaded in 7 pieces"*"6 chunks verified"*) ;;
*) echo "unexpected output"; exit 1 ;;
esac
# one byte of chunk 3 of big flipped (8-byte length + header + 3 MiB + 5)
/usr/bin/python3 - "$dir/m.safetensors" <<'PY'
import struct, sys
p = sys.argv[1]
d = bytearray(open(p, "rb").read())
at = 8 + struct.unpack("<Q", d[:8])[0] + 3 * 1024 * 1024 + 5
d[at] ^= 0xFF
open(p, "wb").write(d)
PY
if "$1" "$dir/m.safetensors" 1 2>"$dir/err"; then
    echo "a flipped byte went through"; exit 1
fi
cat "$dir/err"
grep -q "mismatch in chunk 3 of 6" "$dir/err"
echo "example_pinned_upload: ok"
