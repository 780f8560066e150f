#!/usr/bin/env bash
# benchmarks/pipeline.sh - issue 20: one model over 1, 2 and 3 MPI ranks on
# this machine (runtime/dist).  kt-run: prefill and decode tok/s and the
# pipeline line (rank 0's wait, each rank's busy time, the bubble) for each
# rank count; kt-bench model (a seeded prompt, greedy decode): prefill and
# decode tok/s and each phase's pipeline account (steps, every rank's busy
# time a step, the communication a step, the bubble) for each rank count;
# kt-place: the layer ranges it plans for the ranks (--ranks N, this
# machine's defaults) against the even split; kt-serve: 8 concurrent greedy requests, with micro-batches
# (default: one per rank) and without (--micro-batches 1), rank 0's pipeline
# account (steps, slices, busy per rank, bubble) from its log.
#
# Usage: benchmarks/pipeline.sh [BUILD_DIR] [MODEL] [THREADS_PER_RANK]
#   MODEL    default: kt-synth's tiny, written to /tmp/kt-pipeline/tiny.gguf
# On a machine with fewer cores than ranks x threads the ranks share cores
# (mpirun --oversubscribe): the numbers then show the pipeline's overhead,
# not a speed-up.
set -euo pipefail
build=${1:-build}
model=${2:-/tmp/kt-pipeline/tiny.gguf}
threads=${3:-1}
dir=$(dirname "$model")
mkdir -p "$dir"
[ -f "$model" ] || "$build/tools/kt-synth" --preset tiny -q -o "$model"
mpirun=(mpirun --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
[ "$(id -u)" -ne 0 ] || mpirun+=(--allow-run-as-root)
prompt=$(printf 'The river runs past the old mill and under the stone bridge. %.0s' $(seq 12))

echo "== kt-run: $model, $threads thread(s) per rank, $(nproc) cores"
for n in 1 2 3; do
    launch=()
    [ "$n" -eq 1 ] || launch=("${mpirun[@]}" -np "$n")
    echo "-- $n rank(s)"
    "${launch[@]}" "$build/tools/kt-run" -m "$model" -p "$prompt" -n 64 --temp 0 --ignore-eos -t "$threads" -q \
        2>&1 | grep -E "prompt tokens|prefill  |decode  |pipeline  " || true
done

echo "== kt-bench model: $model, $threads thread(s) per rank, 128-token prompt, 64 decoded"
for n in 1 2 3; do
    launch=()
    [ "$n" -eq 1 ] || launch=("${mpirun[@]}" -np "$n")
    echo "-- $n rank(s)"
    "${launch[@]}" "$build/tools/kt-bench" model -m "$model" -t "$threads" --prompt-tokens 128 --gen-tokens 64 \
        2>/dev/null | grep -E "^(prefill|decode) +[0-9.]+ tok/s|^pipeline, " || true
done

echo "== kt-place: layer ranges for 2 and 3 ranks (the stated defaults: every rank this machine's size)"
for n in 2 3; do
    "$build/tools/kt-place" -m "$model" --ranks "$n" -o "$dir/cluster-$n.yaml" 2>/dev/null |
        grep -E "^  (planned|even)  " || true
done

echo "== kt-serve: 8 concurrent requests of 48 tokens"
for n in 2 3; do
    for micro in 1 0; do
        log="$dir/serve-$n-$micro.log"
        extra=()
        [ "$micro" -eq 0 ] || extra=(--micro-batches "$micro")
        "${mpirun[@]}" -np "$n" "$build/tools/kt-serve" -m "$model" --port 0 -t "$threads" --max-seqs 8 \
            "${extra[@]}" 2>"$log" &
        job=$!
        port=""
        for _ in $(seq 600); do
            port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$' || true)
            [ -n "$port" ] && curl -sf -o /dev/null "http://127.0.0.1:$port/health" && break
            sleep 0.1
        done
        t0=$(date +%s.%N)
        for i in $(seq 8); do
            curl -s -o /dev/null "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
                -d "{\"messages\": [{\"role\": \"user\", \"content\": \"river $i\"}], \"max_tokens\": 48, \"temperature\": 0, \"ignore_eos\": true}" &
        done
        wait $(jobs -p | grep -v "^$job\$")
        t1=$(date +%s.%N)
        rank0=$(grep -o 'rank 0 on [^,]*, pid [0-9]*' "$log" | grep -o '[0-9]*$')
        kill -TERM "$rank0"
        wait "$job" || true
        printf -- "-- %d ranks, %s: 8 requests in %.2f s\n" "$n" \
            "$([ "$micro" -eq 0 ] && echo "micro-batches (one per rank)" || echo "no micro-batches")" \
            "$(echo "$t1 - $t0" | bc)"
        grep -E "kt-serve: pipeline of" "$log" | tail -1
    done
done
