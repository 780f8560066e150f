#!/usr/bin/env bash
# benchmarks/cpu_engine.sh - the CPU engine's targets, measured in one run:
#   load:    peak RSS / final footprint, and load GB/s against a cold read of the same file
#   decode:  weight bytes per token / time against the STREAM triads beside the decode blocks
#            (repeated), and each part (attention, routed + shared experts) the same way
#   prefill: each part's int8 ops / time against the int8 dot peak measured beside the prefill
#   kernels: kt-bench kernels (decode / triad, prefill / peak per kernel)
# and at the end the issue-16 table: every row as the ratio of each kt-bench model run.
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

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq 1 "$repeats"); do
    echo "== kt-bench model, run $i"
    "$build/tools/kt-bench" model -m "$model" -t "$threads" > "$out/model.$i" 2>&1 || true
    grep -E "engine created|STREAM triad|^(prefill|decode) +[0-9]|^decode (weight|/)|weight bytes per token|^parts|^  (decode|prefill), " \
        "$out/model.$i" || true
done

echo "== kt-bench kernels"
"$build/tools/kt-bench" kernels -t "$threads" 2>&1 | tee "$out/kernels"

# The table: one column per kt-bench model run; the packed Q4_K decode kernel at the best level.
ratio() { # FILE PATTERN: the ratio after '=' (or after the label) on the line matching PATTERN
    grep -E "$2" "$1" | head -1 | sed -E 's/.*= *([0-9.]+).*/\1/; s/^decode \/ adjacent triads *([0-9.]+).*/\1/'
}
echo
echo "== issue 16 table ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $threads threads)"
printf "%-48s %-8s" "part" "target"
for i in $(seq 1 "$repeats"); do printf " %8s" "run $i"; done
printf "\n"
row() { # LABEL TARGET PATTERN
    printf "%-48s %-8s" "$1" "$2"
    for i in $(seq 1 "$repeats"); do printf " %8s" "$(ratio "$out/model.$i" "$3")"; done
    printf "\n"
}
row "decode, whole step (x triads beside each block)" ">= 0.95" "^decode / adjacent triads"
row "decode, attention (x triad)" ">= 0.95" "^  decode, attention"
row "decode, routed + shared experts (x triad)" ">= 0.95" "^  decode, routed"
row "prefill 128 tokens, whole step (of int8 peak)" ">= 0.40" "^  prefill, whole step"
row "prefill, attention projections (of int8 peak)" ">= 0.5" "^  prefill, attention projections"
row "prefill, attention with its heads (of peak)" "-" "^  prefill, attention \(all"
row "prefill, routed + shared experts (of int8 peak)" ">= 0.6" "^  prefill, routed"
best=$(grep -E '^q4_K\.r[0-9]+\.' "$out/kernels" | grep -v '\.tiles ' | tail -1)
printf "%-48s %-8s %8s  (%s; %s x the run's first triad)\n" "kernels: packed Q4_K decode (x adjacent triads)" ">= 0.95" \
    "$(echo "$best" | awk '{print $NF}')" "$(echo "$best" | awk '{print $1}')" "$(echo "$best" | awk '{print $4}')"
q8=$(grep -E '^q8_0\.r[0-9]+\.' "$out/kernels" | grep -v '\.tiles ' | tail -1)
printf "%-48s %-8s %8s  (%s; %s x the run's first triad)\n" "kernels: packed Q8_0 decode (x adjacent triads)" ">= 0.95" \
    "$(echo "$q8" | awk '{print $NF}')" "$(echo "$q8" | awk '{print $1}')" "$(echo "$q8" | awk '{print $4}')"
gguf=$(grep -E '^q4_K +avx' "$out/kernels" | tail -1)
printf "%-48s %-8s %8s  (%s)\n" "kernels: Q4_K GGUF-row gemv decode (x triad)" "-" "$(echo "$gguf" | awk '{print $4}')" \
    "$(echo "$gguf" | awk '{print $2}')"
