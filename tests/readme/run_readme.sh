#!/bin/bash
# The README's runnable blocks (tests/readme/extract.py says which), run in
# order in one temporary directory so that later blocks use what earlier
# ones made (model/ from `sluice synth tiny model`). The built `sluice`,
# `sluice-serve` and `serve_client` are first on PATH; tools/ is linked
# into the directory, so `sh tools/serve_http.sh` works as in the
# repository. A C block is compiled against include/ and the built
# libsluice.so and run; a Python block runs with build-py/venv's python
# (tools/test_python.sh makes it) when that imports sluice (and torch, for
# a block that imports it), else it is skipped with the reason.
# A server block's first line is a server that stays in the foreground: it
# is started in the background, with the port it names (its last number of
# 4-5 digits) replaced everywhere in the block by a free one, and the rest
# runs once that port accepts a connection (at most 30 s); the server is
# stopped after, also on failure. A server that exits 77 skips its block.
# usage: run_readme.sh BUILD_DIR SOURCE_DIR "CC [FLAGS]" [README]
set -u
B=$(cd "$1" && pwd)
SRC=$(cd "$2" && pwd)
CC_CMD=$3
README=${4:-$SRC/README.md}
T=$(mktemp -d "${TMPDIR:-/tmp}/sluice-readme.XXXXXX")
SPID=""
# A server block runs in its own process group (setsid), and the whole
# group is stopped: the block's line starts the server as a child of the
# shell that runs it, which a signal to that shell alone would leave
# running (an nginx and a sluice-serve outlived every run that way).
stop_server() {
    [ -n "$SPID" ] || return 0
    kill -TERM -- "-$SPID" 2>/dev/null
    for _ in $(seq 50); do
        kill -0 -- "-$SPID" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$SPID" 2>/dev/null
    wait "$SPID" 2>/dev/null
    SPID=""
}
cleanup() {
    stop_server
    rm -rf "$T"
}
trap cleanup EXIT
mkdir "$T/blocks" "$T/run"
/usr/bin/python3 "$SRC/tests/readme/extract.py" "$README" "$T/blocks" >"$T/list" || exit 1
cd "$T/run" || exit 1
ln -s "$SRC/tools" tools
export PATH="$B:$PATH"
PY=$SRC/build-py/venv/bin/python
FAILS=0
RAN=0

free_port() {
    /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run_body KIND FILE: runs one block's code; returns its status (77: skipped).
run_body() {
    case $1 in
    sh) bash -eu "$2" ;;
    c)
        $CC_CMD -std=c11 -Wall -Werror -I"$SRC/include" "$2" -o "$T/prog" \
            -L"$B" -lsluice -Wl,-rpath,"$B" && "$T/prog" ;;
    python)
        if [ ! -x "$PY" ] || ! "$PY" -c 'import sluice' 2>/dev/null; then
            echo "skip: no build-py/venv with the sluice package (tools/test_python.sh makes it)"
            return 77
        fi
        if grep -q '^import torch\|^import .*torch' "$2" && ! "$PY" -c 'import torch' 2>/dev/null; then
            echo "skip: torch is not installed (python3-torch)"
            return 77
        fi
        "$PY" "$2" ;;
    esac
}

while read -r n kind mode line; do
    f=$T/blocks/$n.$kind
    echo "== block $n ($kind, $mode), README line $line"
    sed 's/^/   | /' "$f"
    if [ "$mode" = server ]; then
        port=$(head -n 1 "$f" | grep -oE '[0-9]{4,5}' | tail -n 1)
        if [ -z "$port" ]; then
            echo "FAIL block $n (README line $line): its server line names no port"
            FAILS=$((FAILS + 1)); continue
        fi
        new=$(free_port)
        sed -i "s/\b$port\b/$new/g" "$f"
        head -n 1 "$f" >"$T/server.sh"
        tail -n +2 "$f" >"$T/body.sh"
        setsid bash "$T/server.sh" >"$T/server.log" 2>&1 &
        SPID=$!
        up=""
        for _ in $(seq 300); do
            if (exec 3<>"/dev/tcp/127.0.0.1/$new") 2>/dev/null; then up=1; break; fi
            kill -0 "$SPID" 2>/dev/null || break
            sleep 0.1
        done
        if [ -z "$up" ]; then
            wait "$SPID"; rc=$?
            SPID=""
            if [ $rc -eq 77 ]; then echo "skip: the server cannot run here:"; cat "$T/server.log"; continue; fi
            echo "FAIL block $n: the server did not listen on $new within 30 s (exit $rc):"
            cat "$T/server.log"
            FAILS=$((FAILS + 1)); continue
        fi
        run_body sh "$T/body.sh"; rc=$?
        stop_server
    else
        run_body "$kind" "$f"; rc=$?
    fi
    if [ $rc -eq 77 ]; then continue; fi
    if [ $rc -ne 0 ]; then
        echo "FAIL block $n (README line $line): exit $rc"
        [ "$mode" = server ] && cat "$T/server.log"
        FAILS=$((FAILS + 1))
    else
        RAN=$((RAN + 1)); echo "ok block $n"
    fi
done <"$T/list"
echo "$RAN blocks ran, $FAILS failed"
# no block run at all (none extracted, or every one skipped) proves nothing
[ $RAN -gt 0 ] || { echo "no README block ran"; exit 1; }
[ $FAILS -eq 0 ]
