#!/bin/sh
# The walk of sluice_open's path through src/, for docs and issue notes:
#   tools/perf/open_walk.sh [SRC_DIR] [MODEL]
# builds SRC_DIR's libsluice.so (default: this checkout) with
# -finstrument-functions in a temporary build directory, opens MODEL (default:
# one file of one tensor with its manifest, written here, so that the walk
# shows the open's path rather than its per-tensor loops) once on the calling
# thread, and prints the
# files that thread passed through in order within DEPTH calls of sluice_open
# (OPEN_WALK_DEPTH, default 3: deeper, every per-tensor helper call counts),
# then: stays (runs of calls inside one file), files, and returns (stays in a
# file the walk had already left); and over the whole depth, the files entered
# and the distinct calls from one file of src/ into another.
# OPEN_WALK_COUNT=REGEX also prints how often the open entered each function
# of src/ whose name matches REGEX (e.g. the ones that parse a location).
# Only the opening thread counts (the engine's workers and the libcurl thread
# are not the open's path). Two checkouts compare with the same MODEL.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "${1:-$here/../..}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_C_FLAGS="-finstrument-functions" -DSLUICE_BUILD_TESTS=OFF \
      -DSLUICE_WITH_GRPC=OFF -DSLUICE_WITH_TORCH=OFF >/dev/null
cmake --build "$work/build" -j "$(nproc)" --target sluice sluice_cli >/dev/null 2>&1 ||
    cmake --build "$work/build" -j "$(nproc)" --target sluice >/dev/null
lib=$(find "$work/build" -name 'libsluice.so*' -type f | head -n 1)
model=${2:-}
if [ -z "$model" ]; then
    cli=$(find "$work/build" -maxdepth 1 -name sluice -type f | head -n 1)
    mkdir "$work/model"
    /usr/bin/python3 - "$work/model/model.safetensors" <<'PY'
import json, struct, sys
header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
header += b" " * (-len(header) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + bytes(range(16)))
PY
    "$cli" manifest "$work/model" -q -o "$work/model/sluice.manifest.json"
    model=$work/model
fi
cc -O0 -g -rdynamic -I "$src/include" "$here/open_walk.c" -o "$work/open_walk" \
   -L "$(dirname "$lib")" -lsluice -Wl,-rpath,"$(dirname "$lib")" -ldl -lpthread
"$work/open_walk" "$model" "$work/trace"
# offsets -> files of src/ (0: outside the library, e.g. back in main)
awk '{ print $2 }' "$work/trace" | sort -u | grep -v '^0$' >"$work/offsets" || true
addr2line -e "$lib" <"$work/offsets" | sed "s|^$src/||; s|:[0-9?]*.*||" >"$work/files"
paste -d ' ' "$work/offsets" "$work/files" >"$work/map"
awk -v map="$work/map" -v depth="${OPEN_WALK_DEPTH:-3}" '
    BEGIN { while ((getline line < map) > 0) { split(line, kv, " "); file[kv[1]] = kv[2] } }
    { f = ($2 in file) ? file[$2] : ""
      if (f != "") all[f] = 1
      if (f != "" && $1 > prev_depth && prev != "" && prev != f) edge[prev " -> " f] = 1
      prev = f; prev_depth = $1
      if (f == "" || $1 > depth || f == last) next
      stays++; if (f in seen) returns++; seen[f] = 1; last = f; print "  " f }
    END { n = 0; for (f in seen) n++; a = 0; for (f in all) a++; e = 0; for (x in edge) e++
          printf "within depth %d: stays %d, files %d, returns to a file already left %d\n", depth, stays, n, returns
          printf "whole walk: files %d, distinct calls between files %d\n", a, e }
' "$work/trace"
if [ -n "${OPEN_WALK_COUNT:-}" ]; then
    addr2line -f -e "$lib" <"$work/offsets" | awk 'NR % 2 == 1' >"$work/funcs"
    paste -d ' ' "$work/offsets" "$work/funcs" >"$work/fmap"
    awk -v map="$work/fmap" -v re="$OPEN_WALK_COUNT" '
        BEGIN { while ((getline line < map) > 0) { split(line, kv, " "); fn[kv[1]] = kv[2] } }
        prev_depth != "" && $1 > prev_depth && ($2 in fn) && fn[$2] ~ re { n[fn[$2]]++ }
        { prev_depth = $1 }
        END { t = 0; for (f in n) { printf "entered %s: %d\n", f, n[f]; t += n[f] }
              printf "entered functions matching %s: %d\n", re, t }
    ' "$work/trace"
fi
