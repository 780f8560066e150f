#!/usr/bin/env bash
# benchmarks/cost_model.sh - issue 12's cost-model check: the per-layer time
# the cost model (placement/cost.c) predicts against what kt-bench model
# measures, decode and prefill, CPU-only and with half of each layer's routed
# experts, attention, the dense and shared FFNs and the head on the sim device,
# on kimi-k2-slice and deepseek-v3-slice.  Each configuration runs RUNS times;
# the measured column is the median per layer and part (this host is shared
# and noisy), the predicted one is the cost model's (the same every run).
#
# Usage: benchmarks/cost_model.sh [BUILD_DIR] [MACHINE_JSON] [RUNS] [THREADS]
#   MACHINE_JSON  from `kt-bench machine`; measured first when missing
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

printf "%-18s %-9s %-8s %5s %12s %12s %8s\n" model placement phase layer "measured ms" "predicted ms" error
for preset in kimi-k2-slice deepseek-v3-slice; do
    for placement in cpu-only sim-half; do
        opt=()
        [ "$placement" = cpu-only ] || opt=(--placement "$dir/cost-sim-half.yaml")
        files=()
        for r in $(seq "$runs"); do
            f="$dir/cost-$preset-$placement-$r.json"
            "$build/tools/kt-bench" model -m "${models[$preset]}" -t "$threads" --prompt-tokens $prompt \
                --gen-tokens $gen --predict --machine "$machine" "${opt[@]}" --json "$f" >/dev/null 2>&1
            files+=("$f")
        done
        # median over runs of each layer's measured total; the prediction; per token
        jq -rs --arg m "$preset" --arg p "$placement" '
            def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                               else (.[length / 2 - 1] + .[length / 2]) / 2 end;
            . as $runs | ["prefill", "decode"][] as $ph
            | ($runs[0][$ph].tokens) as $tok
            | range(0; $runs[0].n_layer) as $l
            | ([$runs[][$ph].layers[$l].total_ns] | median) as $meas
            | ($runs[0].predicted[$ph].layers[$l].total_ns) as $pred
            | [$m, $p, $ph, $l, ($meas / $tok / 1e6), ($pred / $tok / 1e6), (($pred - $meas) / $meas * 100)]
            | "\(.[0]) \(.[1]) \(.[2]) \(.[3]) \(.[4]) \(.[5]) \(.[6])"' "${files[@]}" |
            while read -r m p ph l meas pred err; do
                printf "%-18s %-9s %-8s %5s %12.3f %12.3f %+7.1f%%\n" "$m" "$p" "$ph" "$l" "$meas" "$pred" "$err"
            done
    done
done
