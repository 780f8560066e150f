#!/usr/bin/env bash
# benchmarks/rebalance.sh - issue 13's measurements in one run: the online
# rebalancer against a static plan and the hindsight plan when the traffic
# changes, the step time while experts move, the decode-time expert cache
# against both (the sim device, this host's NUMA layout), and the NUMA
# balance the rebalancer reaches on a synthetic 2-node topology (CPU only).
#
# Usage: benchmarks/rebalance.sh [BUILD_DIR] [WORK_DIR] [THREADS]
# KT_REBALANCE_STEPS="6 7" runs only those of steps 4-7 (1-3 always run; their files, and
# step 5's tables for step 6, come from an earlier run in WORK_DIR when present).
#
# Steps (each prints what it measured; every file lands in WORK_DIR, where
# the model, machine file and profiles of an earlier run are reused):
#  1. kimi-k2-slice, 4 layers x 32 q4_K experts, routing skewed per layer and
#     dependent on the input (kt-synth --route-skew, --route-input);
#  2. the machine file, its sim entry given a GPU's default kernel rates so
#     planner and rebalancer treat the sim as a GPU (the sim still executes
#     on this host's cores: its times are host times); profiles of prompt
#     set A (code; KT_REBALANCE_SET_A) and set B (Chinese, KT_REBALANCE_SET_B:
#     the synthetic model routes it further from code than prose);
#  3. plans from A (what the server starts with) and from B (hindsight), and
#     from A with the cache's bytes held back;
#  4. the expert cache on set B (kt-bench profile, decode steps only): hit
#     rate per layer, the accelerator's share and decode tok/s, LRU and LFU,
#     against the static plan from A and the hindsight plan - traffic the
#     cache's plan never saw;
#  5. kt-serve with the rebalancer off, plan A and plan B on set B (kt-load,
#     batches of requests, one at a time so a stream's gaps are decode steps,
#     not another request's prefill): per batch the accelerator's share of
#     routed pairs, decode tok/s, the gap between tokens (p99, max);
#  6. kt-serve from plan A with the rebalancer on: set A, then set B; per
#     batch the same and the migrations so far; after how many requests of B
#     the share is back to >= 0.9 x the hindsight plan's; the gap p99 of the
#     batches that migrated against the static plan's; every request well
#     formed (kt-load's checks);
#  7. CPU only on 2 synthetic NUMA nodes, experts spread by index: the
#     busiest / mean node pool per MoE layer on set B as kt-serve measured it
#     in its decode steps (GET /kt/placement), the rebalancer off and on
#     (after it moved), and the plan it wrote (--plan-out) predicted.
set -euo pipefail
build=${1:-build}
work=${2:-/tmp/kt-rebalance}
threads=${3:-$(nproc)}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
: >"$work/stderr.log"
trap 'echo "rebalance.sh: failed at line $LINENO; the last messages:" >&2; tail -n 5 "$work/stderr.log" >&2' ERR
bench=$build/tools/kt-bench
place=$build/tools/kt-place
synth=$build/tools/kt-synth
serve=$build/tools/kt-serve
load=$build/tools/kt-load
model=$work/k2-routing.gguf
set_a=${KT_REBALANCE_SET_A:-$here/prompts/code.jsonl}     # the traffic the server starts with
set_b=${KT_REBALANCE_SET_B:-$here/prompts/chinese.jsonl}  # the traffic it changes to
sa=$(basename "$set_a" .jsonl)
sb=$(basename "$set_b" .jsonl)
two_nodes="numa:2 core:1 pu:1"
gib=${KT_REBALANCE_GPU_GIB:-1.65}       # attention, dense FFN, buffers (~1.15 GiB) and ~7 experts per layer:
#                                         with 2.0 (12 per layer) plan A already held 0.92 x the hindsight share on set B
cache_gib=${KT_REBALANCE_CACHE_GIB:-0.4} # held back from plan A for the cache ...
slots=${KT_REBALANCE_CACHE_SLOTS:-5}     # ... which this many slots per MoE layer fill (15 experts)
batch=${KT_REBALANCE_BATCH:-8}           # requests per measured batch
batches_b=${KT_REBALANCE_BATCHES:-6}     # batches of set B with the rebalancer on
interval=${KT_REBALANCE_INTERVAL:-5}     # seconds between rebalancing rounds
port=${KT_REBALANCE_PORT:-18431}

say() { printf '\n== %s\n' "$*"; }
want() { [ -z "${KT_REBALANCE_STEPS:-}" ] || [[ " $KT_REBALANCE_STEPS " == *" $1 "* ]]; }

say "1. model: kimi-k2-slice, 4 layers x 32 experts, q4_K experts, routing skew 0.3..1.5 by layer, input-dependent"
[ -f "$model" ] || "$synth" --preset kimi-k2-slice --layers 4 --experts 32 --experts-type q4_k \
    --route-skew 0.3:1.5 --route-input 0.5 -q -o "$model"
ls -l "$model"

say "2. machine files ($threads threads; the sim rated as a GPU) and profiles of set A and set B"
gpu_like() { # the sim entry with a GPU's default kernel rates (its link stays the sim's), planned as a
    # device of its own: without shares_host false the cost model counts the sim's work against the host's
    # cores and memory bus (which is where it runs), so moving an expert onto it gains nothing and the
    # rebalancer, rightly, moves nothing
    jq '.accelerators |= map(if .backend == "sim" then (.decode |= map_values({gbps: 1000, overhead_us: 10})
        | .prefill_gflops |= map_values(50000) | .shares_host = false) else . end)' "$1" >"$2"
}
[ -f "$work/machine.json" ] || "$bench" machine -t "$threads" -o "$work/machine.json" >/dev/null 2>>"$work/stderr.log"
[ -f "$work/machine-2node.json" ] || "$bench" machine -t "$threads" --topology "$two_nodes" \
    -o "$work/machine-2node.json" >/dev/null 2>>"$work/stderr.log"
gpu_like "$work/machine.json" "$work/machine-gpu-like.json"
for set_file in "$set_a" "$set_b"; do
    s=$(basename "$set_file" .jsonl)
    [ -f "$work/profile-$s.json" ] || "$bench" profile -m "$model" -t "$threads" --prompts "$set_file" \
        --max-tokens 16 -o "$work/profile-$s.json" 2>>"$work/stderr.log" | grep -E "routed tokens"
done
ln -sf "profile-$sa.json" "$work/profile-a.json"
ln -sf "profile-$sb.json" "$work/profile-b.json"
echo "profiles: $work/profile-$sa.json (set A), $work/profile-$sb.json (set B)"

say "3. plans for the sim: from A and from B (hindsight) at $gib GiB; from A at $gib - $cache_gib GiB"
plan() { # profile gib out
    "$place" -m "$model" --profile "$work/profile-$1.json" --machine "$work/machine-gpu-like.json" --device sim \
        --gpu-memory "$2" --kv-tokens 4096 -o "$work/$3" 2>>"$work/stderr.log" | grep -E "^  kt-place "
}
echo "  plan              decode t/s  prefill t/s   on accel    worst     mean experts   (predicted)"
plan a "$gib" plan-a.yaml
plan b "$gib" plan-b.yaml
plan a "$(awk -v g="$gib" -v c="$cache_gib" 'BEGIN { print g - c }')" plan-a-cache.yaml
# the device keeps its whole budget: the cache takes what the plan left
sed -i -E "s/^(    memory_gib: ).*/\1$gib/" "$work/plan-a-cache.yaml"

if want 4; then
say "4. the expert cache on set B ($slots slots per MoE layer), decode steps: against plan A alone and plan B"
profile_b() { # label placement extra... (an earlier run's result is shown again)
    local label=$1 plan=$2
    shift 2
    echo "-- $label"
    local out=$work/cache-$sa-$sb-$label.txt
    [ -s "$out" ] ||
        "$bench" profile -m "$model" -t "$threads" --prompts "$set_b" --max-tokens 16 --placement "$work/$plan" "$@" \
            -o "$work/profile-b-$label.json" 2>>"$work/stderr.log" |
        grep -E "^decode:|accelerator, decode|expert cache" >"$out"
    cat "$out"
}
profile_b static-a plan-a.yaml
profile_b hindsight-b plan-b.yaml
profile_b cache-lru plan-a-cache.yaml --expert-cache "$slots"
profile_b cache-lfu plan-a-cache.yaml --expert-cache "$slots" --expert-cache-policy lfu
fi

# ---- kt-serve -------------------------------------------------------------------------------------

pid=
stop_server() {
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" || echo "kt-serve exited $?" >&2
    pid=
}
trap stop_server EXIT
start_server() { # log args...
    local log=$1
    shift
    "$serve" -m "${serve_model:-$model}" -t "$threads" --port "$port" -q --prefix-cache 0 "$@" 2>"$work/$log" &
    pid=$!
    for _ in $(seq 1200); do
        curl -sf -o /dev/null "http://127.0.0.1:$port/health" && return 0
        kill -0 "$pid" 2>/dev/null || { tail -n 5 "$work/$log" >&2; return 1; }
        sleep 0.1
    done
    return 1
}
metric_sum() { # the sum of the metric series matching a pattern
    curl -sf "http://127.0.0.1:$port/metrics" | awk -v p="$1" '$0 ~ p && $0 !~ /^#/ { s += $NF } END { printf "%.0f\n", s }'
}
# One batch of requests; prints: share tok/s gap_p99 gap_max migrations ok.  kt-serve runs with
# --max-seqs 1 in steps 5 and 6: the requests come one at a time, and its KV cache is then the
# 4096 tokens kt-place planned for (8 sequences' would not fit the budget the plan fills).
run_batch() { # prompts seed
    local dev0 all0 dev1 all1
    dev0=$(metric_sum '^kt:place_routed_pairs_total\{place="sim"\}')
    all0=$(metric_sum '^kt:place_routed_pairs_total\{')
    "$load" --port "$port" -c 1 -n "$batch" --max-tokens 16 --prompts "$1" --seed "$2" --temperature 0 \
        --json "$work/batch.json" >>"$work/stderr.log" 2>&1 || echo "kt-load: a request failed (see stderr.log)" >&2
    dev1=$(metric_sum '^kt:place_routed_pairs_total\{place="sim"\}')
    all1=$(metric_sum '^kt:place_routed_pairs_total\{')
    printf '%s %s %s %s %s %s\n' "$(awk -v d="$((dev1 - dev0))" -v a="$((all1 - all0))" 'BEGIN { print a ? d / a : 0 }')" \
        "$(jq .aggregate_decode_tok_s "$work/batch.json")" "$(jq .itl_p99_s "$work/batch.json")" \
        "$(jq .itl_max_s "$work/batch.json")" "$(metric_sum '^kt:expert_migrations_total\{')" \
        "$(jq .ok "$work/batch.json")"
}
table_head() { printf '%-6s %8s %10s %10s %10s %10s %6s\n' batch share tok/s gap_p99 gap_max migrated ok; }
table_row() { printf '%-6s %8.3f %10.2f %10.4f %10.4f %10s %6s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$7"; }

if want 5; then
say "5. kt-serve, the rebalancer off, set B in batches of $batch requests (one at a time, 16 tokens each)"
for p in a b; do
    echo "-- plan-$p.yaml"
    start_server "serve-$p.log" --placement "$work/plan-$p.yaml" --rebalance-interval 0 --max-seqs 1
    table_head
    run_batch "$set_b" 100 >/dev/null # warm-up
    : >"$work/static-$p.txt"
    for i in 1 2 3; do
        read -r share rate p99 max moved ok < <(run_batch "$set_b" $((100 + i)))
        table_row "B$i" "$share" "$rate" "$p99" "$max" "$moved" "$ok" | tee -a "$work/static-$p.txt"
    done
    stop_server
done
fi
if [ -s "$work/static-a.txt" ] && [ -s "$work/static-b.txt" ]; then # step 5's, now or from an earlier run
    hindsight=$(awk '{ s += $2 } END { printf "%.4f", s / NR }' "$work/static-b.txt")
    static_p99=$(awk '{ if ($4 > m) m = $4 } END { printf "%.4f", m }' "$work/static-a.txt")
    echo "the hindsight plan's share on B: $hindsight; the static plan's worst gap p99: $static_p99 s"
elif want 6; then
    echo "rebalance.sh: step 6 compares with step 5's static plans: run step 5 first (KT_REBALANCE_STEPS=\"5 6\")" >&2
    exit 1
fi

if want 6; then
say "6. kt-serve from plan A, the rebalancer on (every $interval s): set A, then set B"
start_server serve-rebalance.log --placement "$work/plan-a.yaml" --rebalance-interval "$interval" --max-seqs 1 \
    --machine "$work/machine-gpu-like.json" --plan-out "$work/plan-live.yaml"
table_head
for i in 1 2; do
    read -r share rate p99 max moved ok < <(run_batch "$set_a" $((200 + i)))
    table_row "A$i" "$share" "$rate" "$p99" "$max" "$moved" "$ok"
done
moved_after_a=$moved
: >"$work/rebalance.txt"
for i in $(seq "$batches_b"); do
    read -r share rate p99 max moved ok < <(run_batch "$set_b" $((300 + i)))
    table_row "B$i" "$share" "$rate" "$p99" "$max" "$moved" "$ok" | tee -a "$work/rebalance.txt"
done
curl -sf "http://127.0.0.1:$port/kt/placement" >"$work/placement-live.json"
stop_server
awk -v h="$hindsight" -v n="$batch" '
    !done && $2 >= 0.9 * h { printf "share back to >= 0.9 x hindsight (%.3f) after %d requests of set B\n", 0.9 * h, NR * n; done = 1 }
    END { if (!done) printf "share not back to 0.9 x hindsight (%.3f) within %d requests of set B\n", 0.9 * h, NR * n }' \
    "$work/rebalance.txt"
awk -v s="$static_p99" -v prev="$moved_after_a" '
    { moved = $6 - prev; prev = $6; if (moved > 0) { k++; if ($4 > m) m = $4 } }
    END { if (k) printf "gap p99 in the %d batch(es) of set B that migrated: worst %.4f s, %.2f x the static plan'"'"'s %.4f s\n", k, m, m / s, s;
          else print "no batch of set B migrated" }' "$work/rebalance.txt"
jq -r '"migrations: \(.migrations_total) ok, \(.migrations_failed) failed, \(.migrated_bytes_total / 1048576 | floor) MiB in \(.rebalancer.rounds) rounds; the last round predicted the MoE step \(.rebalancer.predicted_before_ms | . * 100 | round / 100) -> \(.rebalancer.predicted_after_ms | . * 100 | round / 100) ms; measured \(.rebalancer.measured_ms | . * 100 | round / 100) ms"' \
    "$work/placement-live.json"
fi

if want 6b; then
say "6b. what migrating costs a step: the tiny model, configs/tiny-sim.yaml on 2 synthetic nodes, rebalancing every 1 s"
# Without --machine the cost model's defaults rate the sim no faster than the host, so the rebalancer
# moves the sim's experts off it and spreads them over the nodes: a steady stream of migrations.
tiny=$work/tiny.gguf
[ -f "$tiny" ] || "$synth" --preset tiny -q -o "$tiny"
for mode in off on; do
    interval_6b=0
    [ $mode = on ] && interval_6b=1
    serve_model=$tiny KT_TOPOLOGY_SYNTHETIC=$two_nodes start_server "serve-6b-$mode.log" \
        --placement "$here/../configs/tiny-sim.yaml" --rebalance-interval "$interval_6b" --max-batch-tokens 32
    table_head
    : >"$work/6b-$mode.txt"
    for i in 1 2 3 4; do
        read -r share rate p99 max moved ok < <(batch=16 run_batch "$set_b" $((500 + i)))
        table_row "$mode$i" "$share" "$rate" "$p99" "$max" "$moved" "$ok" | tee -a "$work/6b-$mode.txt"
    done
    stop_server
done
# the batches in which experts moved against the worst batch without the rebalancer
awk 'FNR == 1 { f++ } f == 1 && $4 > off { off = $4 }
     f == 2 { if ($6 > prev) { k++; if ($4 > on) on = $4; n += $6 - prev } prev = $6 }
     END { if (k) printf "gap p99 in the %d batch(es) that migrated (%d experts): worst %.4f s, %.2f x the worst without the rebalancer (%.4f s)\n",
               k, n, on, on / off, off;
           else print "no batch migrated" }' "$work/6b-off.txt" "$work/6b-on.txt"
fi

if want 7; then
say "7. CPU only, 2 synthetic NUMA nodes, experts by index over both: node balance on set B, the rebalancer off and on"
cat >"$work/nodes-start.yaml" <<EOF
version: 1
description: benchmarks/rebalance.sh step 7, whole experts spread over both nodes by index
attention: cpu
cpu:
  nodes: auto
EOF
# The served traffic's balance: kt-serve sums, over the steps that only decode, each MoE layer's
# busiest and mean node pool busy time and each node pool's busy time (GET /kt/placement,
# layers[].node_balance); between two snapshots, per layer: the busiest / mean node per step
# (what a step waits for: the placement's imbalance plus the step-to-step jitter of threads that
# share these 2 vCPUs with the server's other threads), and the busiest / mean node total over
# the batches (how evenly the placement spread the layer's work).
snapshot() { curl -sf "http://127.0.0.1:$port/kt/placement" >"$work/$1"; }
balance_between() { # before.json after.json
    jq -rn --slurpfile a "$work/$1" --slurpfile b "$work/$2" '
        def r3: . * 1000 | round / 1000;
        [range(0; $b[0].layers | length) as $i | $b[0].layers[$i] as $l | $a[0].layers[$i] as $k
         | select($l.node_balance)
         | ($l.node_balance.busiest_s - ($k.node_balance.busiest_s // 0)) as $x
         | ($l.node_balance.mean_s - ($k.node_balance.mean_s // 0)) as $m
         | [range(0; $l.node_balance.node_busy_s | length) as $n
            | $l.node_balance.node_busy_s[$n] - ($k.node_balance.node_busy_s[$n] // 0)] as $t
         | {i: $i, sliced: $l.sliced, step: (if $m > 0 then $x / $m else null end),
            total: (if ($t | add) > 0 then ($t | max) / (($t | add) / ($t | length)) else null end)}] as $rows
        | "  per layer, busiest / mean node per decode step:   " + ([$rows[] | "\(.i): \(.step // "-" | if type == "number" then r3 else . end)\(if .sliced then "s" else "" end)"] | join("  ")),
          "  per layer, busiest / mean node total over them:  " + ([$rows[] | "\(.i): \(.total // "-" | if type == "number" then r3 else . end)\(if .sliced then "s" else "" end)"] | join("  ")),
          "  (s: the layer row-sliced over both nodes) worst per step \([$rows[].step // empty] | max | r3), worst total \([$rows[].total // empty] | max | r3)"'
}
echo "-- the rebalancer off: 2 batches"
KT_TOPOLOGY_SYNTHETIC=$two_nodes start_server serve-nodes-off.log --placement "$work/nodes-start.yaml" \
    --rebalance-interval 0 --machine "$work/machine-2node.json"
snapshot nodes-0.json
for i in 1 2; do run_batch "$set_b" $((400 + i)) >/dev/null; done
snapshot nodes-1.json
balance_between nodes-0.json nodes-1.json
stop_server
echo "-- the rebalancer on (every $interval s): 3 batches to move, then 2 batches measured"
KT_TOPOLOGY_SYNTHETIC=$two_nodes start_server serve-nodes.log --placement "$work/nodes-start.yaml" \
    --rebalance-interval "$interval" --machine "$work/machine-2node.json" --plan-out "$work/plan-nodes.yaml"
for i in 1 2 3; do run_batch "$set_b" $((400 + i)) >/dev/null; done
sleep "$interval"
for _ in $(seq 120); do # the round under way finishes first
    [ "$(curl -sf "http://127.0.0.1:$port/kt/placement" | jq .rebalancer.in_round)" = true ] || break
    sleep 1
done
snapshot nodes-2.json
for i in 1 2; do run_batch "$set_b" $((400 + i)) >/dev/null; done
snapshot nodes-3.json
balance_between nodes-2.json nodes-3.json
jq -r '"migrations: \(.migrations_total) ok, \(.migrations_failed) failed in \(.rebalancer.rounds) rounds; \([.layers[] | select(.sliced)] | length) layer(s) row-sliced"' \
    "$work/nodes-3.json"
stop_server
if [ -f "$work/plan-nodes.yaml" ]; then
    echo "-- the plan the rebalancer wrote, predicted on set B's profile"
    head -n 1 "$work/plan-nodes.yaml"
    KT_TOPOLOGY_SYNTHETIC=$two_nodes "$place" -m "$model" --profile "$work/profile-b.json" \
        --machine "$work/machine-2node.json" --evaluate "$work/plan-nodes.yaml" 2>>"$work/stderr.log" | grep -E "busiest"
fi
fi
