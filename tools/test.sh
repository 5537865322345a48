#!/bin/sh
# The whole test suite, from a fresh Debian 12 machine: installs what is
# missing, builds with AddressSanitizer + UBSan and runs every test through
# ctest, then builds with ThreadSanitizer and runs the concurrency tests.
# usage: tools/test.sh            (from the repository root or anywhere)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# libmicrohttpd-dev: the metrics endpoint; prometheus and curl: the
# metrics_promtool and metrics_prometheus ctests (about 12 s together);
# librust-blake3-dev: the BLAKE3 C sources the library builds; b3sum: the
# independent BLAKE3 the tests compare with; libcurl4-openssl-dev: remote
# models; nginx: test_remote and test_remote_faults; libgrpc++-dev,
# libprotobuf-dev, protobuf-compiler(-grpc): sluice serve; openssl: its TLS
# tests make a CA; python3: their test model writer; libsqlite3-dev: the
# persistent cache's index; scdoc, man-db, groff-base: the man pages and
# their test (man_pages); python3-cryptography: the OpenSSF model-signing
# fixtures (tests/model_signing_fx.py); squid: test_remote_proxy (a real caching
# proxy); libtorch-dev and python3-torch: the TorchScript engine example and
# its test (torchscript_engine), which exports its plans with python3-torch;
# python3-grpcio: serve_transport's stock gRPC client (tests/serve/stock_client.py);
# mount: the tests that mount a tmpfs or an overlay (test_cache, test_cache_load;
# not in a minimal Debian); nodejs and npm: s3rver, which test_remote_s3 (and
# test_remote.py after it) installs from npm; python3-onnx: the ONNX
# engine's test graphs (tests/onnx/make_blocks.py). One list for every stage
# (ASan ctests, TSan, fuzz, the README's blocks); tools/test_python.sh adds
# the Python stage's own.
# Debian's npm only where no node and npm are on PATH (NodeSource's nodejs
# carries its own npm, and conflicts with Debian's).
node=""
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || node="nodejs npm"
# shellcheck disable=SC2086
sh tools/deps.sh clang libclang-rt-14-dev libmicrohttpd-dev prometheus curl librust-blake3-dev b3sum \
    libcurl4-openssl-dev nginx libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc \
    openssl python3 libsqlite3-dev scdoc man-db groff-base python3-cryptography squid \
    libtorch-dev python3-torch python3-numpy python3-grpcio python3-onnx mount $node
jobs=$(nproc 2>/dev/null || echo 2)

# ONNX Runtime (not in Debian) from the npm registry, for examples/onnx_engine
# and its test: tools/ort.sh keeps it in ~/.cache/sluice (downloaded once,
# 150 MB; 29 MB kept). Without npm or the network it says why, and the ONNX
# parts are skipped (the onnx_engine test says so); everything else runs.
ort_root=$(sh tools/ort.sh) || ort_root=""

echo "== ASan + UBSan build, all tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=ON -DORT_ROOT="$ort_root" >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs"

echo "== ThreadSanitizer build, concurrency tests"
# (no sluice serve here: its tests run in the ASan build; grpc++ itself is
# not instrumented; nor the TorchScript and ONNX engines: neither libtorch
# nor ONNX Runtime is)
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_TSAN=ON -DSLUICE_WITH_GRPC=OFF \
      -DSLUICE_WITH_TORCH=OFF -DSLUICE_WITH_ORT=OFF >/dev/null
cmake --build build-tsan -j "$jobs"
TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -L threads -j "$jobs"

echo "== libFuzzer builds (clang), short bounded runs"
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DSLUICE_FUZZ=ON -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_TOOLS=OFF >/dev/null
cmake --build build-fuzz -j "$jobs"
sh tests/fuzz/run.sh build-fuzz "${SLUICE_FUZZ_SECONDS:-45}"

echo "== Python package (bindings/python, sluice.client included), pytest, ASan sluice and server"
sh tools/test_python.sh build-asan
echo "all tests passed"
