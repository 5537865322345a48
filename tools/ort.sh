#!/bin/sh
# Fetches ONNX Runtime (headers and the Linux x64 library, one version) for
# examples/onnx_engine and its test. Debian 12 does not package ONNX
# Runtime; the npm registry has it inside a Unity package,
# com.github.asus4.onnxruntime 0.4.9 (MIT; Microsoft's LICENSE and
# ThirdPartyNotices inside): ORT 1.29.0's C headers and
# libonnxruntime.so (soname libonnxruntime.so.1), in one 150 MB tarball,
# the smallest download that holds both (onnxruntime-node 1.29.0 is 112 MB
# with no headers).
#
# The tarball is checked against the SHA-256 pinned below (npm itself
# checks the registry's sha512 while fetching), and only the headers, the
# library and the licences are kept, in
#   ${SLUICE_ORT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/ort-1.29.0}
#     include/onnxruntime_*.h  lib/libonnxruntime.so.1 (+ .so link)
#     LICENSE ThirdPartyNotices.txt VERSION
# (about 30 MB), which CMake finds by itself (examples/onnx.cmake; or
# -DORT_ROOT=DIR). A folder already there is used as it is: nothing is
# downloaded twice.
#
# usage: tools/ort.sh      prints the folder on stdout, exit 0;
#                          without npm, without the network or on any
#                          failure: the reason on stderr, exit 1 (the
#                          ORT parts are then skipped; nothing else needs it)
set -eu
ver=1.29.0
pkg=com.github.asus4.onnxruntime@0.4.9
tgz=com.github.asus4.onnxruntime-0.4.9.tgz
sha256=e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d
hdrs='package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64_x86_64-simulator/onnxruntime.framework/Headers'
lib=package/Plugins/Linux/x64/libonnxruntime.so
dest=${SLUICE_ORT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/ort-$ver}

fail() {
    echo "tools/ort.sh: $*; the ONNX Runtime parts (examples/onnx_engine, its test) are skipped" >&2
    exit 1
}

ready() {
    [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$ver" ] &&
        [ -f "$dest/include/onnxruntime_c_api.h" ] && [ -f "$dest/lib/libonnxruntime.so.1" ]
}
if ready; then
    echo "$dest"
    exit 0
fi
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || fail "no ONNX Runtime for $(uname -s)-$(uname -m) here (Linux x86_64 only)"
command -v npm >/dev/null 2>&1 || fail "no npm (Debian: apt-get install npm)"
command -v sha256sum >/dev/null 2>&1 || fail "no sha256sum"

parent=$(dirname "$dest")
mkdir -p "$parent" || fail "cannot create $parent"
tmp=$(mktemp -d "$parent/.ort-tmp.XXXXXX") || fail "cannot create a folder in $parent"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM

start=$(date +%s)
# A private npm cache, removed with the rest: the kept folder is the cache.
# Short timeouts and one retry, so that a machine without the network is
# told so in seconds.
if ! (cd "$tmp" && npm pack "$pkg" --pack-destination "$tmp" --cache "$tmp/npm-cache" \
        --fetch-timeout 60000 --fetch-retries 1 --no-audit --no-fund --loglevel error \
        >"$tmp/npm.log" 2>&1); then
    fail "npm pack $pkg failed (no network or no registry?): $(grep -v 'complete log' "$tmp/npm.log" | head -n 3 | tr '\n' ' ')"
fi
[ -f "$tmp/$tgz" ] || fail "npm pack $pkg wrote no $tgz"
got=$(sha256sum "$tmp/$tgz" | cut -d' ' -f1)
[ "$got" = "$sha256" ] || fail "$tgz has SHA-256 $got, expected $sha256"
fetched=$(date +%s)
tar -xzf "$tmp/$tgz" -C "$tmp" "$hdrs" "$lib" package/LICENSE package/ThirdPartyNotices.txt \
    || fail "$tgz: cannot extract the headers and the library"
mkdir -p "$tmp/out/include" "$tmp/out/lib"
cp "$tmp/$hdrs"/onnxruntime_*.h "$tmp/$hdrs"/cpu_provider_factory.h "$tmp/out/include/"
cp "$tmp/$lib" "$tmp/out/lib/libonnxruntime.so.1"
ln -s libonnxruntime.so.1 "$tmp/out/lib/libonnxruntime.so"
cp "$tmp/package/LICENSE" "$tmp/package/ThirdPartyNotices.txt" "$tmp/out/"
grep -q '^#define ORT_API_VERSION 29$' "$tmp/out/include/onnxruntime_c_api.h" \
    || fail "the headers are not ORT 1.29's (ORT_API_VERSION 29)"
echo "$ver" >"$tmp/out/VERSION"
# Into place in one rename (-T: never into a folder a concurrent run made
# meanwhile); a complete folder already there wins, an incomplete one goes.
if ! ready; then
    rm -rf "$dest"
    mv -T "$tmp/out" "$dest" 2>/dev/null || ready || fail "cannot move the files to $dest"
fi
end=$(date +%s)
echo "tools/ort.sh: ONNX Runtime $ver in $dest (fetched in $((fetched - start)) s, extracted in $((end - fetched)) s, $(du -sm "$dest" | cut -f1) MB kept)" >&2
echo "$dest"
