#!/usr/bin/env bash
# benchmarks/placement.sh - issue 12's measurements in one run: routing
# profiles, the machine file, the cost model against kt-bench model's
# measured per-layer times, and kt-place's plan against its hindsight plan
# and three baselines, on the sim device, plus a synthetic 2-node topology.
#
# Usage: benchmarks/placement.sh [BUILD_DIR] [WORK_DIR] [THREADS]
#
# Steps (each prints what it measured; every file lands in WORK_DIR):
#  1. a kimi-k2-slice model whose layers differ in routing concentration and
#     whose routing depends on the input (kt-synth --route-skew, --route-input);
#  2. kt-bench machine: this host's figures (and a 2-node synthetic topology's);
#  3. kt-bench profile on prompt set A (code) and on set B (prose);
#  4. kt-place on A's profile (the plan) and on B's (the hindsight plan), for
#     the sim device with a budget that holds a quarter of the routed experts;
#  5. both plans served on set B: the share of routed (token, expert) pairs on
#     the accelerator and the decode step time, measured; their predicted
#     decode step on B's profile (kt-bench model --predict);
#  5b. the same with both plans made as for a GPU (kt-place --device cuda on a
#     machine file whose cuda entry has the sim's link and a GPU's default kernel
#     rates), served on the sim: the share criterion where the budget fills;
#  6. the three baselines (experts by index, an equal count per layer by
#     frequency, a global top-N by frequency) against kt-place's plan:
#     predicted and measured decode tok/s;
#  7. the cost model's error per layer, decode and prefill, CPU-only and sim;
#  8. a 2-node synthetic topology: busiest / mean node per layer, predicted
#     and measured (the engine's per-node busy time);
#  9. the planner's wall time on a Kimi-K2-sized header (61 layers x 384
#     experts, 2 nodes, 1 GPU).
set -euo pipefail
build=${1:-build}
work=${2:-/tmp/kt-placement}
threads=${3:-$(nproc)}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
: >"$work/stderr.log"
trap 'echo "placement.sh: failed at line $LINENO; the last messages:" >&2; tail -n 3 "$work/stderr.log" >&2' ERR
bench=$build/tools/kt-bench
place=$build/tools/kt-place
synth=$build/tools/kt-synth
model=$work/k2-routing.gguf
set_a=$here/prompts/code.jsonl
set_b=$here/prompts/prose.jsonl
two_nodes="package:2 numa:1 core:1 pu:1"

say() { printf '\n== %s\n' "$*"; }

say "1. model: kimi-k2-slice, 4 layers x 32 experts, q4_K experts, routing skew 0.3..1.5 by layer, input-dependent"
[ -f "$model" ] || "$synth" --preset kimi-k2-slice --layers 4 --experts 32 --experts-type q4_k \
    --route-skew 0.3:1.5 --route-input 0.5 -q -o "$model"
ls -l "$model"

say "2. kt-bench machine ($threads threads; then the synthetic 2-node topology)"
"$bench" machine -t "$threads" -o "$work/machine.json" | tail -n 25
"$bench" machine -t "$threads" --topology "$two_nodes" -o "$work/machine-2node.json" | tail -n 8

say "3. profiles: set A ($(basename "$set_a")) and set B ($(basename "$set_b"))"
"$bench" profile -m "$model" -t "$threads" --prompts "$set_a" --max-tokens 16 -o "$work/profile-a.json" |
    grep -E "routed tokens|decode:"
"$bench" profile -m "$model" -t "$threads" --prompts "$set_b" --max-tokens 16 -o "$work/profile-b.json" |
    grep -E "routed tokens|decode:"

# A sim budget that holds attention, the KV cache and about a quarter of the routed experts.
gib=${KT_PLACEMENT_GPU_GIB:-1.5}
say "4. kt-place: the plan (profile A) and the hindsight plan (profile B), sim device, $gib GiB"
"$place" -m "$model" --profile "$work/profile-a.json" --machine "$work/machine.json" --device sim \
    --gpu-memory "$gib" --kv-tokens 4096 -o "$work/plan-a.yaml"
"$place" -m "$model" --profile "$work/profile-b.json" --machine "$work/machine.json" --device sim \
    --gpu-memory "$gib" --kv-tokens 4096 -o "$work/plan-b.yaml" | grep -E "planned in|decode"

say "5. both plans on set B: measured accelerator share and decode step; predicted decode step on B"
for plan in a b; do
    echo "-- plan-$plan.yaml on set B (measured)"
    "$bench" profile -m "$model" -t "$threads" --prompts "$set_b" --max-tokens 16 \
        --placement "$work/plan-$plan.yaml" -o "$work/profile-b-on-$plan.json" 2>>"$work/stderr.log" |
        grep -E "^decode:|accelerator"
    echo "-- plan-$plan.yaml on profile B (predicted)"
    "$place" -m "$model" --profile "$work/profile-b.json" --machine "$work/machine.json" \
        --evaluate "$work/plan-$plan.yaml" | grep -E "decode|accelerator"
done

# On a host of 2 cores the sim's one thread shares the cores and the memory bus with the
# pools, so an expert there saves little and the planner puts few there.  Planned as for
# a GPU - a cuda accelerator in the machine file with the sim's link and a GPU's default
# kernel rates, the plan then served on the sim (backend: sim) - the budget fills with
# experts, and serving both plans on set B measures how well profile A's hot experts
# cover set B against B's own.
say "5b. the same, planned as for a GPU (the sim's link, a GPU's default kernel rates), served on the sim"
jq --argjson gib "$gib" '.accelerators += [(.accelerators[] | select(.backend == "sim")
        | .name = "cuda0" | .backend = "cuda" | .memory_gib = $gib
        | .decode |= map_values({gbps: 1000, overhead_us: 10}) | .prefill_gflops |= map_values(50000))]' \
    "$work/machine.json" >"$work/machine-gpu-like.json"
for plan in a b; do
    "$place" -m "$model" --profile "$work/profile-$plan.json" --machine "$work/machine-gpu-like.json" --device cuda \
        --gpu-memory "$gib" --kv-tokens 4096 -o "$work/plan-gpu-$plan.yaml" | grep -E "^  kt-place "
    sed -i -e 's/^    backend: cuda$/    backend: sim/' -e '/^    device: [0-9]*$/d' "$work/plan-gpu-$plan.yaml"
done
for plan in a b; do
    echo "-- plan-gpu-$plan.yaml on set B (measured on the sim)"
    "$bench" profile -m "$model" -t "$threads" --prompts "$set_b" --max-tokens 16 \
        --placement "$work/plan-gpu-$plan.yaml" -o "$work/profile-b-on-gpu-$plan.json" 2>>"$work/stderr.log" |
        grep -E "^decode:|accelerator"
done

say "6. kt-place's plan against the three baselines (sim): predicted and measured decode tok/s"
for b in index equal top; do
    "$place" -m "$model" --profile "$work/profile-a.json" --machine "$work/machine.json" --device sim \
        --gpu-memory "$gib" --kv-tokens 4096 --baseline "$b" -o "$work/baseline-$b.yaml" >/dev/null
done
for plan in plan-a baseline-index baseline-equal baseline-top; do
    echo "-- $plan"
    "$bench" model -m "$model" -t "$threads" --placement "$work/$plan.yaml" --prompt-tokens 64 --gen-tokens 32 \
        2>>"$work/stderr.log" | grep -E "^(prefill|decode) +[0-9]"
done

say "7. the cost model against kt-bench model, per layer (CPU-only, then plan-a on sim)"
"$bench" model -m "$model" -t "$threads" --predict --machine "$work/machine.json" --profile "$work/profile-a.json" \
    --json "$work/predict-cpu.json" 2>>"$work/stderr.log" | sed -n '/^prediction/,$p'
"$bench" model -m "$model" -t "$threads" --placement "$work/plan-a.yaml" --predict --machine "$work/machine.json" \
    --profile "$work/profile-a.json" --json "$work/predict-sim.json" 2>>"$work/stderr.log" | sed -n '/^prediction/,$p'

say "8. 2-node synthetic topology: busiest / mean node per layer, predicted (kt-place) and measured"
KT_TOPOLOGY_SYNTHETIC=$two_nodes "$place" -m "$model" --profile "$work/profile-a.json" --machine "$work/machine-2node.json" --device cpu \
    -o "$work/plan-2node.yaml" | grep -E "kt-place |worst|sliced"
KT_TOPOLOGY_SYNTHETIC=$two_nodes "$bench" model -m "$model" -t "$threads" --placement "$work/plan-2node.yaml" \
    --prompt-tokens 64 --gen-tokens 32 2>>"$work/stderr.log" | grep -E "node (0|1) pool|node balance"

say "9. planner wall time, Kimi-K2-sized header (61 x 384, 2 nodes, a 76 GiB sim accelerator: the machine file has no GPU here)"
# every byte of data a hole: about 0.1 MB on disk for 541 GiB of tensors
[ -f "$work/kimi-k2-header.gguf" ] || "$synth" --preset kimi-k2-slice --layers 61 --experts 384 --header-only \
    -q -o "$work/kimi-k2-header.gguf"
for run in 1 2 3; do
    KT_TOPOLOGY_SYNTHETIC=$two_nodes "$place" -m "$work/kimi-k2-header.gguf" --machine "$work/machine-2node.json" \
        --device sim --gpu-memory 76 --kv-tokens 65536 -o "$work/kimi-k2-plan.yaml" 2>>"$work/stderr.log" |
        grep -E "planned in"
done
