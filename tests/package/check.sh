#!/bin/sh
# Installs sluice into a temporary prefix, runs the installed command from
# there, then builds package/consumer.c against it with find_package
# (shared and static) and with pkg-config, and runs each build on a model:
# MODEL_FILE (a real one) when it exists, else a tiny one written here, so
# that a clone without ../shared beside it still checks the package.
# usage: check.sh SOURCE_DIR BUILD_DIR MODEL_FILE
set -eu
src=$1 build=$2 model=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
if [ ! -f "$model" ]; then
    echo "packaging: $model is absent; using a generated one-tensor model"
    header='{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    model=$work/tiny.safetensors
    # the 8-byte little-endian header length (under 256), the header, 2 bytes
    printf "\\$(printf %03o ${#header})\\0\\0\\0\\0\\0\\0\\0%s\\1\\2" "$header" > "$model"
fi

# 0. the installed command runs from the prefix alone (RPATH $ORIGIN/../lib*)
if [ -x "$prefix/bin/sluice" ]; then
    version=$(env -u LD_LIBRARY_PATH "$prefix/bin/sluice" --version) ||
        { echo "installed bin/sluice --version failed (library not found?)" >&2; exit 1; }
    case $version in
        "sluice "[0-9]*) ;;
        *) echo "installed bin/sluice --version printed: $version" >&2; exit 1 ;;
    esac
fi

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
echo "packaging: installed bin/sluice --version, find_package (shared, static), pkg-config (shared, static), exports, SONAME: ok"
