#!/usr/bin/env bash
# benchmarks/device_check.sh - issue 15's checklist on a GPU host, in one pass
# that fits a short lease: the CUDA tests plain and under compute-sanitizer,
# kt-run and kt-serve greedy on the GPU against CPU-only, the CPU kernels at the
# host's best level, then benchmarks/hybrid.sh's sweep with full per-layer
# reports.  Each step has a time cap and the whole pass a deadline, so a hang
# costs one step, not the rest; every log lands in OUT as it is written.
#
# Usage: benchmarks/device_check.sh [BIN] [OUT] [SECONDS] [N...]
#   BIN      a build folder (BIN/tools/kt-*, BIN/tests/test_*; default build)
#   OUT      where the logs go (default /tmp/kt-device-check): 8 files, what the device
#            tool brings back
#   SECONDS  the deadline of the whole pass (default 480)
#   N        routed experts per layer on the GPU for the sweep (default 0 8 32 128)
# Environment: KT_BENCH_MODEL (default /tmp/kt-bench/kimi-k2-slice-8x128.gguf,
# written with kt-synth when missing: 22.2 GiB).
set -u
bin=$(cd "${1:-build}" && pwd)
out=${2:-/tmp/kt-device-check}
budget=${3:-480}
shift $(($# < 3 ? $# : 3))
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(0 8 32 128)
src=$(cd "$(dirname "$0")/.." && pwd)
model=${KT_BENCH_MODEL:-/tmp/kt-bench/kimi-k2-slice-8x128.gguf}
work=/tmp/kt-device-work
threads=$(nproc)
mkdir -p "$out" "$work" "$(dirname "$model")"
export KT_TEST_TMP=$work/test-tmp KT_BIN_DIR=$bin/tools KT_SOURCE_DIR=$src
mkdir -p "$KT_TEST_TMP"
t_start=$SECONDS

left() { echo $((budget - (SECONDS - t_start))); }

# step CAP NAME CMD...: run CMD for at most CAP seconds (less near the
# deadline), print its exit status and time.
step() {
    local cap=$1 name=$2 l rc t0
    shift 2
    l=$(($(left) - 15))
    ((l < cap)) && cap=$l
    if ((cap < 5)); then
        echo "== $name: not run, the pass is out of time" >&2
        return 0
    fi
    echo "== $name (at most ${cap} s)" >&2
    t0=$SECONDS
    timeout -k 5 "$cap" "$@"
    rc=$?
    echo "== $name: exit $rc in $((SECONDS - t0)) s$( ((rc == 124 || rc == 137)) && echo ' (TIMED OUT)')" >&2
    return 0
}

# -- 0. the machine
{
    date -u
    nvidia-smi 2>&1 | head -20
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
    lscpu 2>&1
    grep -m1 '^flags' /proc/cpuinfo
    grep -E 'MemTotal|MemAvailable' /proc/meminfo
    df -h /tmp | tail -1
    ldd "$bin/tools/kt-serve" 2>&1 | grep -E 'not found|cuda|cublas'
} >"$out/env.txt" 2>&1
echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)"
grep -o -w -E 'avx512f|avx512_bf16|avx512_vnni|amx_tile|amx_int8|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '
echo

# The benchmark model is written in the background while the tests run.
if [ ! -f "$model" ]; then
    ("$bin/tools/kt-synth" --preset kimi-k2-slice --layers 8 --experts 128 --experts-type q4_k -q \
        -o "$model" >"$work/synth.log" 2>&1) &
    synth_pid=$!
else
    synth_pid=
fi
for p in tiny tiny-v3; do "$bin/tools/kt-synth" --preset $p -q -o "$work/$p.gguf" >/dev/null; done

cuda_tests=(test_cuda_dequant test_cuda_gemv test_cuda_mla test_cuda_ops test_cuda_route test_hybrid_sim)

# -- 1. the CUDA tests, plain
{
    for t in "${cuda_tests[@]}"; do step 90 "$t" "$bin/tests/$t"; done
} >"$out/tests.log" 2>&1
grep -E '^== |FAIL|skipped' "$out/tests.log" | grep -v '(at most' | head -40

# -- 2. kt-run and kt-serve: greedy on the GPU against CPU-only
gpu_plan() { # gpu_plan N FILE
    cat >"$2" <<EOF
version: 1
description: device_check.sh, $1 routed experts per layer on the GPU
devices:
  gpu:
    backend: cuda
    memory_gib: 70
attention: gpu
experts:
  gpu:
    per_layer: $1
cpu:
  nodes: auto
EOF
}
serve_text() { # serve_text MODEL PORT [--placement FILE]: one greedy completion's text
    local m=$1 port=$2 pid i r
    shift 2
    "$bin/tools/kt-serve" -m "$m" --port "$port" -t 8 "$@" >"$work/serve-$port.log" 2>&1 &
    pid=$!
    for i in $(seq 1 100); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.2
    done
    r=$(curl -s "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
        -d '{"prompt":"The quick brown fox jumps over","max_tokens":48,"temperature":0,"ignore_eos":true}')
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    printf '%s\n' "$r" | grep -o '"text":"[^"]*"' | head -1
}
{
    for p in tiny tiny-v3; do
        m=$work/$p.gguf
        "$bin/tools/kt-run" -m "$m" -p "The quick brown fox jumps over" -n 64 --temp 0 --ignore-eos -t 8 \
            >"$work/$p-cpu.txt" 2>"$work/$p-cpu.err"
        for n in 8 all; do
            gpu_plan $n "$work/$p-gpu-$n.yaml"
            step 60 "kt-run $p, $n experts per layer on the GPU" "$bin/tools/kt-run" -m "$m" \
                -p "The quick brown fox jumps over" -n 64 --temp 0 --ignore-eos -t 8 \
                --placement "$work/$p-gpu-$n.yaml" >"$work/$p-gpu-$n.txt" 2>"$work/$p-gpu-$n.err"
            tail -3 "$work/$p-gpu-$n.err"
            grep -h 'running CPU-only' "$work/$p-gpu-$n.err" && echo "kt-run $p, $n: GPU NOT USED"
            if [ -s "$work/$p-cpu.txt" ] && cmp -s "$work/$p-cpu.txt" "$work/$p-gpu-$n.txt"; then
                echo "kt-run $p, $n on the GPU: greedy text EQUAL to CPU-only's ($(wc -c <"$work/$p-cpu.txt") bytes)"
            else
                echo "kt-run $p, $n on the GPU: greedy text DIFFERS from CPU-only's"
                head -c 400 "$work/$p-cpu.txt"; echo; head -c 400 "$work/$p-gpu-$n.txt"; echo
            fi
        done
        a=$(serve_text "$m" 18181)
        b=$(serve_text "$m" 18182 --placement "$work/$p-gpu-8.yaml")
        if [ -n "$a" ] && [ "$a" = "$b" ]; then
            echo "kt-serve $p, 8 on the GPU: greedy completion EQUAL to CPU-only's"
        else
            echo "kt-serve $p, 8 on the GPU: completion DIFFERS or failed: cpu [$a] gpu [$b]"
            tail -5 "$work/serve-18182.log"
        fi
        grep -h 'running CPU-only' "$work/serve-18182.log" && echo "kt-serve $p: GPU NOT USED"
        # kt-bench check: the GPU placement against the CPU reference, per row and per layer
        step 90 "kt-bench check $p, 8 on the GPU" "$bin/tools/kt-bench" check -m "$m" -t 8 \
            --placement "$work/$p-gpu-8.yaml" --json "$work/check-$p.json"
    done
} >"$out/cli.log" 2>&1
grep -E 'EQUAL|DIFFERS|exit [^0]|NOT USED|PASS|FAIL' "$out/cli.log"

# -- 3. compute-sanitizer; the CPU kernel tests at the host's best level meanwhile
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
(
    for t in test_kernels_amx test_kernels_cpu test_kernels_packed test_kernels_gemm test_moe_pools test_moe_sliced \
        test_expert_store test_pack_pipeline; do
        step 150 "$t" "$bin/tests/$t"
    done
) >"$out/cpu.log" 2>&1 &
cpu_pid=$!
{
    if [ -z "$cs" ]; then
        echo "compute-sanitizer: not found"
    else
        for t in "${cuda_tests[@]}"; do
            step 75 "memcheck $t" "$cs" --tool memcheck --leak-check full --error-exitcode 9 "$bin/tests/$t"
        done
        # racecheck is slow (45 s was not enough on an H200) and reported
        # only cuBLASLt's own split-K kernels (nvjet_*): those are left out
        for t in test_cuda_mla test_cuda_gemv; do
            step 90 "racecheck $t" "$cs" --tool racecheck --kernel-name-exclude kns=nvjet --error-exitcode 9 \
                "$bin/tests/$t"
            step 45 "synccheck $t" "$cs" --tool synccheck --error-exitcode 9 "$bin/tests/$t"
        done
    fi
} >"$out/sanitizer.log" 2>&1
grep -E '^== .*exit|ERROR SUMMARY|not found' "$out/sanitizer.log"
wait $cpu_pid
grep -E '^== .*exit|FAIL' "$out/cpu.log" | head -30

# -- 4. the kernels at each level (AMX against AVX-512 on the same cores)
[ -n "$synth_pid" ] && wait "$synth_pid"
isa=avx512
grep -q -w amx_tile /proc/cpuinfo && isa=avx512,amx
step 60 "kt-bench kernels --isa $isa" "$bin/tools/kt-bench" kernels --isa $isa --seconds 0.2 -t "$threads" \
    >"$out/kernels.log" 2>&1
tail -1 "$out/kernels.log"

# -- 5. benchmarks/hybrid.sh's sweep, the whole reports
{
    cat "$work/synth.log" 2>/dev/null
    step 120 "CPU-only, $threads threads" "$bin/tools/kt-bench" model -m "$model" -t "$threads" \
        --json "$work/cpu-only.json"
    for n in "${counts[@]}"; do
        gpu_plan "$n" "$work/hybrid-$n.yaml"
        step 120 "$n experts per layer on the GPU" "$bin/tools/kt-bench" model -m "$model" -t "$threads" \
            --placement "$work/hybrid-$n.yaml" --json "$work/hybrid-$n.json"
    done
} >"$out/bench.log" 2>&1
grep -E '^== |^(prefill|decode) +[0-9]|CPU FFN threads busy|^device, |running CPU-only' "$out/bench.log"
tar -cf "$out/json.tar" -C "$work" $(cd "$work" && ls ./*.json 2>/dev/null) 2>/dev/null
echo "== pass done in $((SECONDS - t_start)) s"
