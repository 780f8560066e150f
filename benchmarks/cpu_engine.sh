#!/usr/bin/env bash
# benchmarks/cpu_engine.sh - the CPU expert engine's targets, measured in one run:
#   load:    peak RSS / final footprint, and load GB/s against a cold read of the same file
#   decode:  weight bytes per token / time against the STREAM triad of the same run (repeated)
#   prefill: kt-bench model prefill, and kt-bench kernels' prefill rows against the int8 peak
# Usage: benchmarks/cpu_engine.sh [BUILD_DIR] [MODEL] [THREADS] [REPEATS]
# Writes the model with kt-synth if it is missing (kimi-k2-slice, 4 layers, 64 experts, Q4_K experts).
# Dropping the page cache needs root; without it the "cold" read is whatever the cache holds.
set -euo pipefail
build=${1:-build}
model=${2:-/tmp/kt-bench/kimi-k2-slice-4x64.gguf}
threads=${3:-2}
repeats=${4:-3}
mkdir -p "$(dirname "$model")"
if [ ! -f "$model" ]; then
    "$build/tools/kt-synth" --preset kimi-k2-slice --layers 4 --experts 64 --experts-type q4_k -q -o "$model"
fi
drop_caches() { sync; [ -w /proc/sys/vm/drop_caches ] && echo 3 > /proc/sys/vm/drop_caches || true; }

echo "== cold read of $model"
drop_caches
dd if="$model" of=/dev/null bs=16M 2>&1 | tail -1

echo "== load (kt-run, 1 token), cold"
drop_caches
/usr/bin/time -v "$build/tools/kt-run" -m "$model" -p "Hello" -n 1 -t "$threads" -q 2>&1 |
    grep -E "loading experts: .* in |load  |peak memory|Maximum resident" || true

for i in $(seq 1 "$repeats"); do
    echo "== kt-bench model, run $i"
    "$build/tools/kt-bench" model -m "$model" -t "$threads" 2>&1 |
        grep -E "engine created|STREAM triad|^prefill|^decode|weight bytes per token" || true
done

echo "== kt-bench kernels"
"$build/tools/kt-bench" kernels -t "$threads" 2>&1
