#!/usr/bin/env bash
# benchmarks/long_context.sh - issue 19's long-context figures: kimi-k2-slice (the
# real per-layer shapes of Kimi-K2: 64 heads, kv rank 512, rope 64) with a BF16
# latent KV cache, one sequence:
#   KV cache bytes per token (all layers), from kt-bench model's report;
#   prefill tok/s of a DEPTH-token prompt (chunked: kt-bench model prefills in
#   steps of the engine's max_batch_tokens, 256), a fresh engine's (--cold);
#   decode tok/s at that depth (greedy, GEN tokens after the prompt), and of a
#   decode token's time the attention's: all of it, and its heads over the
#   context (attention less its projections, which do not grow with depth),
#   from kt-bench model's per-layer split ("attention per token" of the
#   decode block), in ms per token.
# Usage: benchmarks/long_context.sh [BUILD_DIR] [WORK_DIR] [THREADS] [DEPTH...]
#   DEPTH  context depths (default: 8192 32768 131072; 131072 runs a prompt of
#          131072 - GEN tokens so prompt + decode fit the model's 131072)
# Environment: GEN (decode tokens, default 16), LAYERS (default 4), EXPERTS
# (default 64), KV_TYPE (default bf16).
# Writes the model with kt-synth if it is missing (4 layers, 64 Q4_K experts:
# about 5.4 GiB, the one benchmarks/native.sh writes). Each depth's JSON lands
# in WORK_DIR (long-context-DEPTH.json). Attention grows with depth^2 in
# prefill: on 2 cores 32K takes tens of minutes and 128K hours; give the
# depths that fit the machine.
set -euo pipefail
build=${1:-build}
work=${2:-/tmp/kt-native}
threads=${3:-$(nproc)}
shift $(($# < 3 ? $# : 3))
depths=("$@")
[ ${#depths[@]} -gt 0 ] || depths=(8192 32768 131072)
gen=${GEN:-16}
layers=${LAYERS:-4}
experts=${EXPERTS:-64}
kv_type=${KV_TYPE:-bf16}
mkdir -p "$work"
model=$work/k2s-q4k.gguf
[ "$layers" = 4 ] && [ "$experts" = 64 ] || model=$work/k2s-q4k-${layers}x${experts}.gguf
[ -f "$model" ] || "$build/tools/kt-synth" --preset kimi-k2-slice --layers "$layers" --experts "$experts" \
    --experts-type q4_k -q -o "$model"

num() { # FILE PREFIX: the number after PREFIX on the first line that starts with it
    awk -v p="$2" 'index($0, p) == 1 { $0 = substr($0, length(p) + 1); print $1; exit }' "$1"
}
decode_attention() { # FILE FIELD: the decode block's attention per token (4: all of it, 10: its heads), ms
    awk -v f="$2" '/^decode per layer/ { d = 1 } d && index($0, "  attention per token") == 1 { print $f; exit }' "$1"
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rows=()
for depth in "${depths[@]}"; do
    prompt=$depth
    [ "$depth" -lt 131072 ] || prompt=$((131072 - gen))
    echo "== depth $depth: $prompt prompt tokens, $gen decoded, KV $kv_type, $threads threads"
    start=$(date +%s)
    "$build/tools/kt-bench" model -m "$model" -t "$threads" --kv-type "$kv_type" --prompt-tokens "$prompt" \
        --gen-tokens "$gen" --cold --json "$work/long-context-$depth.json" >"$out/$depth" 2>&1 ||
        { cat "$out/$depth"; exit 1; }
    grep -E "^(prefill|decode) +[0-9]|^KV cache bytes per token" "$out/$depth"
    echo "   decode attention $(decode_attention "$out/$depth" 4) ms per token, of it heads over the context" \
        "$(decode_attention "$out/$depth" 10) ms"
    echo "   ($(($(date +%s) - start)) s)"
    rows+=("$(printf "%-8s %12s %14s %14s %16s %16s" "$depth" "$(num "$out/$depth" "KV cache bytes per token")" \
        "$(num "$out/$depth" "prefill")" "$(num "$out/$depth" "decode")" "$(decode_attention "$out/$depth" 4)" \
        "$(decode_attention "$out/$depth" 10)")")
done
echo
echo "== $(basename "$model"), KV $kv_type, $threads threads ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'))"
printf "%-8s %12s %14s %14s %16s %16s\n" "depth" "KV B/token" "prefill tok/s" "decode tok/s" "dec attn ms/tok" \
    "dec heads ms/tok"
printf "%s\n" "${rows[@]}"
