#!/usr/bin/env bash
# benchmarks/native.sh - issue 17's measurements in one run: kimi-k2-slice (4 layers,
# 64 experts) as a Kimi-K2-Thinking-style checkpoint directory (INT4 routed experts,
# BF16 elsewhere) against the Q4_K GGUF of the same model, on the same threads:
#   load:    cold read of the files (page cache dropped where root may), then kt-run's
#            load time, expert load throughput, peak RSS / the resident footprint after it
#   decode:  kt-bench model's weight bytes per token over the STREAM triads beside the
#            decode blocks, whole step and routed + shared experts
#   prefill: the routed + shared experts' int8 ops over the int8 dot peak beside them
# Usage: benchmarks/native.sh [BUILD_DIR] [WORK_DIR] [THREADS]
# Writes both models with kt-synth if they are missing (about 6.5 and 5.4 GiB).
set -euo pipefail
build=${1:-build}
work=${2:-/tmp/kt-native}
threads=${3:-2}
mkdir -p "$work"
dir=$work/k2s-int4
gguf=$work/k2s-q4k.gguf
synth=$build/tools/kt-synth
[ -d "$dir" ] || "$synth" --preset kimi-k2-slice --layers 4 --experts 64 --format hf --hf-weights int4-experts -q -o "$dir"
[ -f "$gguf" ] || "$synth" --preset kimi-k2-slice --layers 4 --experts 64 --experts-type q4_k -q -o "$gguf"
drop_caches() { sync; [ -w /proc/sys/vm/drop_caches ] && echo 3 > /proc/sys/vm/drop_caches || true; }
files() { if [ -d "$1" ]; then ls "$1"/*.safetensors; else echo "$1"; fi; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for m in "$dir" "$gguf"; do
    name=$(basename "$m")
    echo "== $name: cold read"
    drop_caches
    bytes=$(cat $(files "$m") | wc -c)
    start=$(date +%s.%N)
    cat $(files "$m") > /dev/null
    end=$(date +%s.%N)
    awk -v b="$bytes" -v s="$start" -v e="$end" 'BEGIN { printf "%.2f GiB in %.2f s: %.0f MB/s\n", b / 2^30, e - s, b / (e - s) / 1e6 }'
    echo "== $name: load (kt-run, 1 token), cold"
    drop_caches
    "$build/tools/kt-run" -m "$m" -p "Hello" -n 1 -t "$threads" -q 2>&1 |
        grep -E "(converting weights|loading experts): .* in |load  |peak memory" || true
    echo "== $name: kt-bench model"
    "$build/tools/kt-bench" model -m "$m" -t "$threads" > "$out/$name" 2>&1 || true
    grep -E "STREAM triad|^decode / adjacent triads|^  decode, routed|^  prefill, routed|^  prefill, whole" "$out/$name" || true
done
ratio() { # FILE PATTERN
    grep -E "$2" "$1" | head -1 | sed -E 's/.*= *([0-9.]+).*/\1/; s/^decode \/ adjacent triads *([0-9.]+).*/\1/'
}
echo
echo "== issue 17 table ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $threads threads)"
printf "%-52s %-8s %12s %12s\n" "part" "target" "INT4 dir" "Q4_K GGUF"
row() { printf "%-52s %-8s %12s %12s\n" "$1" "$2" "$(ratio "$out/$(basename "$dir")" "$3")" "$(ratio "$out/$(basename "$gguf")" "$3")"; }
row "decode, whole step (x triads beside each block)" ">= 0.9" "^decode / adjacent triads"
row "decode, routed + shared experts (x triad)" ">= 0.9" "^  decode, routed"
row "prefill, routed + shared experts (of int8 peak)" "-" "^  prefill, routed"
