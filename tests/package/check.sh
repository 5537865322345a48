#!/bin/sh
# Installs sluice into a temporary prefix, then builds package/consumer.c
# against it with find_package (shared and static) and with pkg-config,
# and runs each build on a real model.
# usage: check.sh SOURCE_DIR BUILD_DIR MODEL_FILE
set -eu
src=$1 build=$2 model=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null

# 1. CMake: find_package(sluice) + sluice::sluice / sluice::sluice_static
cmake -S "$src/tests/package" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_FLAGS="${SLUICE_CONSUMER_CFLAGS:-}" >/dev/null
cmake --build "$work/cmake" >/dev/null
LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}" "$work/cmake/consumer_shared" "$model"
"$work/cmake/consumer_static" "$model"

# 2. pkg-config --cflags --libs sluice
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$prefix/lib/x86_64-linux-gnu/pkgconfig"
cc ${SLUICE_CONSUMER_CFLAGS:-} $(pkg-config --cflags sluice) "$src/tests/package/consumer.c" \
   -o "$work/consumer_pc" $(pkg-config --libs sluice)
LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}" "$work/consumer_pc" "$model"
cc ${SLUICE_CONSUMER_CFLAGS:-} -DSLUICE_STATIC $(pkg-config --cflags sluice) "$src/tests/package/consumer.c" \
   -o "$work/consumer_pc_static" $(pkg-config --static --libs sluice | sed 's/-lsluice/-l:libsluice.a/')
"$work/consumer_pc_static" "$model"

# 3. only sluice_* symbols leave the shared library
bad=$(nm -D --defined-only "$prefix"/lib/libsluice.so | awk '{print $3}' | grep -v '^sluice_' | grep -v '^SLUICE_' || true)
if [ -n "$bad" ]; then
    echo "symbols exported without the sluice_ prefix:" $bad >&2
    exit 1
fi
readelf -d "$prefix"/lib/libsluice.so | grep -q 'SONAME.*libsluice.so.0' || { echo "no SONAME libsluice.so.0" >&2; exit 1; }
echo "packaging: find_package (shared, static), pkg-config (shared, static), exports, SONAME: ok"
