#!/bin/bash
# TorchScript blocks, on demand against resident in the same engine
# (docs/performance.md "Weights as values"): qwen2.5-0.5b written as F32
# values (1,976,131,072 bytes), prompt 12, 1 decode step, each way in a
# fresh process, page cache warm, ROUNDS rounds alternating the ways.
# On demand: the vocabulary in pieces (export --vocab-parts 8, plan
# version 2: the tied head in 8 vocab parts, each checked by its part
# digest, the embedding read by the prompt's rows) in a pool of 471 MiB,
# under a quarter of the weights. Resident: the whole-weight blocks (plan
# version 1) with a 2200 MiB pool, every weight kept bound.
#   tools/perf/torchscript_ondemand.sh [BUILD] [WORK] [ROUNDS]
# BUILD: a Release build with torchscript_engine and sluice (default
# build-release); WORK: where the model and exports go (default
# /tmp/sluice-ts-bench). Python: build-py/venv (tools/test_python.sh
# makes it).
set -eu
cd "$(dirname "$0")/../.."
build=${1:-build-release} work=${2:-/tmp/sluice-ts-bench} rounds=${3:-3}
py=build-py/venv/bin/python ex=examples/python/torchscript_blocks.py
w=$work/qv ts=$work/qv-ts tsp=$work/qv-pieces tok=3,10,17,24,31,38,45,52,59,66,73,80
parts=8 pool_demand=471M pool_all=2200M   # under 1/4 of the weights; all of them
mkdir -p "$work"
[ -f "$w/model.safetensors" ] || "$build/sluice" synth qwen2.5-0.5b "$w" --values --dtype F32
# The manifest synth wrote (16 MiB chunk digests), with the part digests
# of the built-in rules for 8 (the tied embedding along the vocabulary).
mf=$w/model.safetensors.manifest.json
grep -q '"parts"' "$mf" 2>/dev/null ||
    "$build/sluice" manifest "$w/model.safetensors" -o "$mf" -q --parts builtin --worlds $parts
[ -f "$ts/plan.json" ] || $py $ex export qwen2.5-0.5b "$ts" --dtype F32 --values
[ -f "$tsp/plan.json" ] || $py $ex export qwen2.5-0.5b "$tsp" --dtype F32 --values --vocab-parts $parts
cat "$w/model.safetensors" >/dev/null
echo "before: $(uptime)"
for round in $(seq "$rounds"); do
    echo "== round $round, $(uptime)"
    echo -n "ScriptedModel pieces, pool $pool_demand: "
    $py $ex bench-one scripted qwen2.5-0.5b "$tsp" "$w" --pool $pool_demand --steps 1 --dtype F32 --values
    echo -n "ScriptedModel whole, pool $pool_all (resident): "
    $py $ex bench-one scripted qwen2.5-0.5b "$ts" "$w" --pool $pool_all --steps 1 --dtype F32 --values
    for way in "$tsp --pool $pool_demand" "$ts --pool $pool_all --resident"; do
        echo -n "torchscript_engine ${way#"$work"/}: "
        # shellcheck disable=SC2086
        "$build/torchscript_engine" ${way%% *} "$w" --tokens $tok --steps 1 ${way#* } |
            grep -E '^(first_token_ms|step|total_ms|peak_rss_kb|pool_high_water)' | tr '\n' ' '
        echo
    done
done
echo "after: $(uptime)"
