#!/usr/bin/env bash
# benchmarks/cost_model.sh - issue 12's cost-model check: the per-layer time
# the cost model (placement/cost.c) predicts against what kt-bench model
# measures, decode and prefill, CPU-only and with half of each layer's routed
# experts, attention, the dense and shared FFNs and the head on the sim device,
# on kimi-k2-slice and deepseek-v3-slice.  Each configuration keeps RUNS runs
# taken while the host's triad is within 15% of the machine file's (at most
# 4 x RUNS tries; a shared host's load moves every figure); the measured
# column is their median per layer, the predicted one the cost model's.
#
# Usage: benchmarks/cost_model.sh [BUILD_DIR] [MACHINE_JSON] [RUNS] [THREADS]
#   MACHINE_JSON  from `kt-bench machine`; measured first when missing
# KT_COST_TRIAD_TOLERANCE (default 0.15): the triad band a run must fall in (1e9: any run).
# KT_COST_REMEASURE=1: measure the machine file again before every run (a shared host's
#   figures drift within minutes); the predicted column is then the median prediction.
# Models (4 layers, 16 experts, Q4_K experts; about 2.1 and 2.4 GiB) are
# written with kt-synth when missing, in $KT_BENCH_DIR (default
# /tmp/kt-bench), with every run's JSON.  Prints one table: model, placement,
# phase, layer, measured ms per token, predicted, error.
set -euo pipefail
build=${1:-build}
dir=${KT_BENCH_DIR:-/tmp/kt-bench}
machine=${2:-$dir/machine.json}
runs=${3:-3}
threads=${4:-$(nproc)}
prompt=64
gen=16
mkdir -p "$dir"
[ -f "$machine" ] || "$build/tools/kt-bench" machine -t "$threads" -o "$machine"
triad=$(jq '.nodes[0].triad_gbps' "$machine")
tol=${KT_COST_TRIAD_TOLERANCE:-0.15} # 1e9: keep every run

declare -A models=([kimi-k2-slice]="$dir/kimi-k2-slice-4x16.gguf" [deepseek-v3-slice]="$dir/deepseek-v3-slice-4x16.gguf")
for preset in "${!models[@]}"; do
    [ -f "${models[$preset]}" ] ||
        "$build/tools/kt-synth" --preset "$preset" --layers 4 --experts 16 --experts-type q4_k -q -o "${models[$preset]}"
done
cat >"$dir/cost-sim-half.yaml" <<EOF
version: 1
description: benchmarks/cost_model.sh, half of each layer's routed experts on the sim device
devices:
  sim:
    backend: sim
    memory_gib: 6
    transfer_gbps: 25
    latency_us: 10
attention: sim
experts:
  sim:
    per_layer: 8
cpu:
  nodes: auto
EOF

printf "%-18s %-9s %-8s %5s %12s %12s %8s %5s\n" model placement phase layer "measured ms" "predicted ms" error runs
for preset in kimi-k2-slice deepseek-v3-slice; do
    for placement in cpu-only sim-half; do
        opt=()
        [ "$placement" = cpu-only ] || opt=(--placement "$dir/cost-sim-half.yaml")
        # Keep the runs taken while the host's memory bandwidth (the run's own
        # triad) is within 15% of the machine file's: a shared host's load
        # moves both, and the prediction is for the host the file measured.
        files=()
        for r in $(seq $((4 * runs))); do
            f="$dir/cost-$preset-$placement-$r.json"
            if [ "${KT_COST_REMEASURE:-0}" = 1 ]; then # figures of this moment, for this run
                "$build/tools/kt-bench" machine -t "$threads" -o "$machine" >/dev/null 2>&1
                triad=$(jq '.nodes[0].triad_gbps' "$machine")
            fi
            "$build/tools/kt-bench" model -m "${models[$preset]}" -t "$threads" --prompt-tokens $prompt \
                --gen-tokens $gen --predict --machine "$machine" "${opt[@]}" --json "$f" >/dev/null 2>&1
            if jq -e --argjson t "$triad" --argjson tol "$tol" '(.triad.best_gbps - $t) | fabs < $tol * $t' "$f" >/dev/null; then
                files+=("$f")
            fi
            [ ${#files[@]} -lt "$runs" ] || break
        done
        if [ ${#files[@]} -eq 0 ]; then
            echo "$preset $placement: no run within 15% of the machine file's triad ($triad GB/s): host too busy" >&2
            continue
        fi
        # median over runs of each layer's measured total; the prediction; per token
        jq -rs --arg m "$preset" --arg p "$placement" '
            def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                               else (.[length / 2 - 1] + .[length / 2]) / 2 end;
            . as $runs | ["prefill", "decode"][] as $ph
            | ($runs[0][$ph].tokens) as $tok
            | range(0; $runs[0].n_layer) as $l
            | ([$runs[][$ph].layers[$l].total_ns] | median) as $meas
            | ([$runs[].predicted[$ph].layers[$l].total_ns] | median) as $pred
            | [$m, $p, $ph, $l, ($meas / $tok / 1e6), ($pred / $tok / 1e6), (($pred - $meas) / $meas * 100),
               ($runs | length)]
            | "\(.[0]) \(.[1]) \(.[2]) \(.[3]) \(.[4]) \(.[5]) \(.[6]) \(.[7])"' "${files[@]}" |
            while read -r m p ph l meas pred err n; do
                printf "%-18s %-9s %-8s %5s %12.3f %12.3f %+7.1f%% %5s\n" "$m" "$p" "$ph" "$l" "$meas" "$pred" "$err" "$n"
            done
    done
done
