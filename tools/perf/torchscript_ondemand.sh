#!/bin/bash
# TorchScript blocks, on demand against resident in the same engine
# (docs/performance.md "Weights as values"): qwen2.5-0.5b written as F32
# values, prompt 12, 1 decode step, each way in a fresh process, page
# cache warm, ROUNDS rounds alternating the ways.
#   tools/perf/torchscript_ondemand.sh [BUILD] [WORK] [ROUNDS]
# BUILD: a Release build with torchscript_engine (default build-release);
# WORK: where the model and export go (default /tmp/sluice-ts-bench).
# Python: build-py/venv (tools/test_python.sh makes it).
set -eu
cd "$(dirname "$0")/../.."
build=${1:-build-release} work=${2:-/tmp/sluice-ts-bench} rounds=${3:-3}
py=build-py/venv/bin/python ex=examples/python/torchscript_blocks.py
w=$work/qv ts=$work/qv-ts tok=3,10,17,24,31,38,45,52,59,66,73,80
pool_demand=600M pool_all=2200M   # 0.30 of the weights (the embedding is 0.28); all of them
mkdir -p "$work"
[ -f "$w/model.safetensors" ] || "$build/sluice" synth qwen2.5-0.5b "$w" --values --dtype F32
[ -f "$ts/plan.json" ] || $py $ex export qwen2.5-0.5b "$ts" --dtype F32 --values
cat "$w/model.safetensors" >/dev/null
for round in $(seq "$rounds"); do
    echo "== round $round, $(uptime)"
    for pool in $pool_demand $pool_all; do
        echo -n "ScriptedModel pool $pool: "
        $py $ex bench-one scripted qwen2.5-0.5b "$ts" "$w" --pool $pool --steps 1 --dtype F32 --values
    done
    echo -n "eager load_state_dict: "
    $py $ex bench-one eager qwen2.5-0.5b "$ts" "$w" --steps 1 --dtype F32 --values
    for mode in "--pool $pool_demand" "--pool $pool_all --resident"; do
        echo -n "torchscript_engine $mode: "
        # shellcheck disable=SC2086
        "$build/torchscript_engine" "$ts" "$w" --tokens $tok --steps 1 $mode |
            grep -E '^(first_token_ms|total_ms|peak_rss_kb)' | tr '\n' ' '
        echo
    done
done
