#!/usr/bin/env bash
# benchmarks/hybrid.sh - issue 5's targets: attention (with the router, KV cache
# and output head), the shared experts and N routed experts per layer on the
# accelerator, the other experts on the host's cores; decode and prefill
# against CPU-only on the same host, the CPU FFN threads' busy share of each
# decode step, and the device's busy and copy time - for each N in one run.
#
# Usage: benchmarks/hybrid.sh [BUILD_DIR] [MODEL] [THREADS] [BACKEND] [N...]
#   BACKEND  cuda (default) or sim (runs anywhere; its times are host times,
#            useful to check the plumbing, not GPU speed)
#   N        routed experts per layer on the device (default: 0 8 32)
# Writes the model with kt-synth if it is missing: kimi-k2-slice, 8 layers,
# 128 experts, Q4_K experts (about 26 GiB: a GPU host's size, not a laptop's).
# Each run's JSON lands next to the model (hybrid-N.json, cpu-only.json).
set -euo pipefail
build=${1:-build}
model=${2:-/tmp/kt-bench/kimi-k2-slice-8x128.gguf}
threads=${3:-$(nproc)}
backend=${4:-cuda}
shift $(($# < 4 ? $# : 4))
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(0 8 32)
dir=$(dirname "$model")
mkdir -p "$dir"
if [ ! -f "$model" ]; then
    "$build/tools/kt-synth" --preset kimi-k2-slice --layers 8 --experts 128 --experts-type q4_k -q -o "$model"
fi

summary() { # the lines of kt-bench model's report that the targets read
    grep -E "^(prefill|decode) +[0-9]|CPU FFN threads busy|^device, |STREAM triad|decode / adjacent" || true
}

echo "== CPU-only ($threads threads)"
"$build/tools/kt-bench" model -m "$model" -t "$threads" --json "$dir/cpu-only.json" 2>&1 | summary

for n in "${counts[@]}"; do
    plan="$dir/hybrid-$n.yaml"
    cat >"$plan" <<EOF
version: 1
description: benchmarks/hybrid.sh, $n routed experts per layer on the $backend device
devices:
  gpu:
    backend: $backend
    memory_gib: 70
attention: gpu
experts:
  gpu:
    per_layer: $n
cpu:
  nodes: auto
EOF
    echo "== attention, router, shared experts, output head and $n experts per layer on $backend"
    "$build/tools/kt-bench" model -m "$model" -t "$threads" --placement "$plan" --json "$dir/hybrid-$n.json" 2>&1 |
        summary
done
