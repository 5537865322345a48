#!/bin/sh
# Runs every fuzz target for a bounded time on a corpus seeded from the
# real files, the committed corpus and tests/data/bad. Any crash fails.
# usage: tests/fuzz/run.sh BUILD_DIR SECONDS
set -eu
build=$1 seconds=$2
here=$(cd "$(dirname "$0")" && pwd)
real=$here/../../../shared/data/real
for target in fuzz_header fuzz_index fuzz_manifest fuzz_model fuzz_signature fuzz_msign fuzz_msign_statement; do
    name=${target#fuzz_}
    # a signature file is five short lines: a third of the time is plenty
    t=$seconds
    [ "$target" = fuzz_signature ] && t=$(( (seconds + 2) / 3 ))
    work=$build/fuzz-corpus/$name
    mkdir -p "$work" "$build/fuzz-crashes"
    seeds="$here/corpus/$name $here/../data/bad"
    [ -d "$real" ] && seeds="$seeds $real"
    echo "-- $target for ${t}s"
    # -rss_limit_mb and -max_len keep it within this 2-core machine.
    "$build/tests/fuzz/$target" "$work" $seeds -dict="$here/$name.dict" \
        -max_total_time="$t" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
        -artifact_prefix="$build/fuzz-crashes/$target-" -print_final_stats=1 2>&1 |
        grep -E '^(#[0-9]+.*DONE|stat::|==|SUMMARY|INFO: Running|artifact)' || true
    if ls "$build/fuzz-crashes/$target-"* >/dev/null 2>&1; then
        echo "$target found crashing inputs in $build/fuzz-crashes" >&2
        exit 1
    fi
done
