/*
 * machine.h - the machine file: what the cost model needs to know about the
 * host it predicts for, measured by `kt-bench machine`.  Per NUMA node the
 * memory bandwidth and the kernels' real throughput per weight format, per
 * accelerator its memory, link and kernel throughput.  Entries the file
 * lacks get stated defaults (KT_MACHINE_DEFAULT_*), each named in
 * `defaulted` so callers can warn.
 *
 * File format (JSON, version 1), written atomically:
 *
 *     {"version": 1, "kind": "Intel Xeon ... | 2 nodes | avx512", "topology": "",
 *      "nodes": [{"node": 0, "threads": 32, "memory_gib": 503.8, "triad_gbps": 180.1,
 *                 "fma_gflops": 2900, "int8_gops": 11000,
 *                 "decode": {"q4_K": {"gbps": 150.2, "overhead_us": 6.1}, ...},
 *                 "prefill_gflops": {"q4_K": 2100, ...}, "f32_cached_gbps": 400,
 *                 "decode_rows": {"q8_0": {"gbps": 90, "overhead_us": 8}, ...},
 *                 "prefill_rows_gflops": {"q8_0": 600, ...},
 *                 "prefill_fixed_gbps": {...}, "prefill_rows_fixed_gbps": {...},
 *                 "head_dequant_gelems": {"q8_0": 6, ...}, "attention_gflops": 40}, ...],
 *      "accelerators": [{"name": "sim", "backend": "sim", "memory_gib": 0,
 *                        "h2d_gbps": 25, "d2h_gbps": 25, "latency_us": 10,
 *                        "decode": {...}, "prefill_gflops": {...},
 *                        "prefill_fixed_gbps": {...}}],
 *      "network": {"bandwidth_gbps": 12.5, "latency_us": 5}}     (optional: the link between MPI ranks)
 *
 * Type names are GGUF's (kt_type_name).  Unknown keys, unknown types, a
 * figure that is not a finite non-negative number, a node given twice and
 * more than KT_MACHINE_MAX_NODES nodes are refused.
 *
 * How `kt-bench machine -t THREADS [--topology SYNTH]` takes each figure
 * (placement/README.md has the long form).  Nodes are the engine's expert
 * pools for that thread count (runtime/forward/engine.c): with one node with
 * cores, the step's pool of THREADS threads; with more, one pool per node,
 * THREADS - 1 workers in all, the stepping thread helping the first when a core
 * of its node is free of workers (kt_pools_caller_helps; then
 * `threads` counts it there).  Every node's figures are taken with all nodes
 * busy at once, as the engine runs them; on a synthetic topology the nodes
 * share this machine's cores.
 *   triad_gbps      STREAM triad (runtime/host/membw.h) on the node's threads,
 *                   arrays of 2 x L3, median of 5.
 *   fma_gflops,     runtime/host/peak.h's loops at the best level the kernels
 *   int8_gops       use, on the node's threads, median of 3.
 *   decode[t]       the engine's expert path (runtime/forward/moe.c's four
 *                   phases - gather, gate/up with SiLU, quantize, down - in its
 *                   task sizes, submitted to the pools as run_phase does, weights
 *                   in the expert store's layout: packed where the level has a
 *                   format) for one token over experts of 7168 x F (F: the
 *                   largest power of two <= 2048 whose expert is under 26 MB;
 *                   2048 for q4_K): calls of 1 expert of F = 256 and 1, 2, 4, 8
 *                   of F, weights read from memory (4 x L3 of copies in
 *                   rotation), medians of calls in interleaved rounds, fitted
 *                   to time = overhead_us + bytes / gbps by least squares of the
 *                   relative error.  A "call" is one group of units on one
 *                   node in one MoE step: bytes are the GGUF bytes of all the
 *                   experts it runs (gate, up, down), the overhead is paid once.
 *   prefill_gflops[t] the same path, 4 experts of F with 16 and with 48
 *                   tokens each: 2 x 3 x 7168 x F FLOPs per (token, expert)
 *                   pair over the time the 128 extra pairs add (the weights
 *                   are read either way).  So a node's expert time for a step
 *                   is overhead + bytes / gbps + pair FLOPs / prefill_gflops.
 *   decode_rows[t]  (node 0 only: host matrices run on the step's pool) one
 *                   token's absorbed attention heads as attention.c runs them -
 *                   items of up to 8 heads on the step's pool, each W_UK,h (512
 *                   rows of 128) and W_UV,h (128 rows of 512) in GGUF rows times
 *                   its quantized vector - for 8, 32, 64 and 128 heads a call,
 *                   weights from memory, fitted as decode[] is; types whose
 *                   128-wide rows are whole blocks (q8_0, bf16, f16, f32).
 *   prefill_rows_gflops[t] (node 0 only) kt_matmul_q over the four MLA projections
 *                   of V3 / Kimi-K2 (7168->1536, 1536->12288, 7168->576, 8192->7168) in
 *                   GGUF rows on the step's pool, activations quantized as the
 *                   forward pass does, at 16 and at 64 tokens: the FLOPs of the 48
 *                   extra tokens over the time they add, median of calls.  The
 *                   sim keeps its copies of host matrices in GGUF rows.
 *   prefill_fixed_gbps[t] from the same two points: the line through them at 0
 *                   tokens, less the decode overhead, as GB/s of the call's weights
 *                   (floored at 1% of the 16-token time).  The cost model prices a
 *                   call of 4 tokens or more (a gemm) with it, not the decode rate:
 *                   packed kernels overlap most of the read with the tokens' work,
 *                   GGUF-row gemms re-read blocks per token tile.
 *   prefill_rows_fixed_gbps[t] (node 0 only) the same of prefill_rows_gflops' line.
 *   head_dequant_gelems[t] (node 0 only) every thread of the step's pool
 *                   dequantizing its own head's W_UK,h (512 rows of 128, transposed,
 *                   kt_mat_dequantize_transposed) and W_UV,h (128 rows of 512),
 *                   in cache, over and over: weights a second, median of calls;
 *                   types whose 128-wide rows are whole blocks.
 *   attention_gflops (node 0 only) every thread running kt_attention_head for
 *                   one query over 64 keys of 192 and values of 128 (in cache):
 *                   2 x (192 + 128) FLOPs per key, median of calls.
 *   f32_cached_gbps (node 0 only) every thread of the step's pool multiplying
 *                   its own pair of 128 x 512 f32 matrices (in cache) by a
 *                   vector, over and over: GB/s of matrix read, median of calls.
 *   sim             decode and prefill_gflops as above on one thread (the sim
 *                   runs device work on its own host thread) over GGUF rows
 *                   (what the sim holds); the link is its modelled one
 *                   (25 GB/s, 10 us unless --sim-transfer-gbps/--sim-latency-us);
 *                   memory 0: the plan's budget decides.
 *   cuda0           memory: the backend's budget (free device memory); h2d and
 *                   d2h: 256 MiB copies with the backend's copy functions from
 *                   page-locked memory, median; latency_us: 64-byte copies.
 *                   Its kernel figures are not measured yet (defaulted).
 */
#ifndef KT_PLACEMENT_MACHINE_H
#define KT_PLACEMENT_MACHINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "quant.h"
#include "status.h"

#define KT_MACHINE_MAX_NODES KT_PLACEMENT_MAX_NODES
#define KT_MACHINE_MAX_ACCEL (KT_PLACEMENT_MAX_DEVICES - 1)

/* The stated defaults for figures a file lacks (placement/README.md): a
 * node's triad, peaks and expert overhead; a missing decode rate is
 * DECODE_SHARE x the node's triad, a missing prefill figure PREFILL_SHARE x
 * its int8 (quantized types) or FMA (float types) peak; an accelerator's link
 * is the sim's default (PCIe 4.0 x16 as measured, placement/config.c). */
#define KT_MACHINE_DEFAULT_TRIAD_GBPS 20.0
#define KT_MACHINE_DEFAULT_FMA_GFLOPS 100.0
#define KT_MACHINE_DEFAULT_INT8_GOPS 400.0
#define KT_MACHINE_DEFAULT_DECODE_SHARE 0.7
#define KT_MACHINE_DEFAULT_PREFILL_SHARE 0.25
#define KT_MACHINE_DEFAULT_OVERHEAD_US 20.0
#define KT_MACHINE_DEFAULT_LINK_GBPS 25.0
#define KT_MACHINE_DEFAULT_LINK_LATENCY_US 10.0
#define KT_MACHINE_DEFAULT_SIM_DECODE_GBPS 5.0       /* one host thread */
#define KT_MACHINE_DEFAULT_GPU_DECODE_GBPS 1000.0
#define KT_MACHINE_DEFAULT_GPU_OVERHEAD_US 10.0
#define KT_MACHINE_DEFAULT_GPU_PREFILL_GFLOPS 50000.0
/* The host's network to the other ranks of an MPI job (kt-place --ranks: the
 * activations between stages) when the file has no `network`: 10 Gbit
 * Ethernet's 1.25 GB/s and 50 us a message through MPI over TCP - stated
 * assumptions, not measurements. */
#define KT_MACHINE_DEFAULT_NET_GBPS 1.25
#define KT_MACHINE_DEFAULT_NET_LATENCY_US 50.0

/* A kernel's time for one call (one matrix or one expert at decode shapes):
 * overhead_us + bytes / gbps.  gbps 0: not measured. */
struct kt_machine_rate {
    double gbps;                 /* weight bytes read per second, in 1e9 */
    double overhead_us;
};

struct kt_machine_node {
    int node;                    /* topology index */
    uint32_t threads;            /* threads the figures were taken with */
    uint64_t memory_bytes;       /* RAM of the node */
    double triad_gbps;           /* STREAM triad, every node busy at once */
    double fma_gflops, int8_gops; /* peaks of the node's threads */
    struct kt_machine_rate decode[KT_TYPE_COUNT]; /* matrices and experts at decode shapes */
    double prefill_gflops[KT_TYPE_COUNT];         /* packed kernels at prefill shapes; 0: not measured */
    /* f32 matrix-vector products over a matrix that stays in cache (one
     * attention head's 128 x 512 W_UK), every thread at once, in GB/s of
     * matrix read: the attention heads' work (expanded keys and values per
     * position, scores and weighted sums).  0: not measured (decode[f32] then). */
    double f32_cached_gbps;
    /* gemv over matrices kept in GGUF rows (not repacked), at decode shapes:
     * the per-head W_UK / W_UV reads of the absorbed attention form.  gbps
     * 0: not measured (decode[] then). */
    struct kt_machine_rate decode_rows[KT_TYPE_COUNT];
    /* matrix products over GGUF rows at prefill shapes (what a sim device runs its
     * attention projections and output head on, on the step's pool): GFLOP/s of
     * extra tokens, as prefill_gflops.  0: not measured (prefill_gflops then). */
    double prefill_rows_gflops[KT_TYPE_COUNT];
    /* The fixed part of a prefill call (gemm from KT_COST_GEMM_TOKENS tokens on):
     * the weights' bytes over the time the measured line gives at no tokens,
     * less the decode overhead - the weights' read, overlapped with the
     * tokens' work or not.  prefill_fixed_gbps for the expert path,
     * prefill_rows_fixed_gbps for prefill_rows_gflops' products.  0: not
     * measured (the decode rate then). */
    double prefill_fixed_gbps[KT_TYPE_COUNT];
    double prefill_rows_fixed_gbps[KT_TYPE_COUNT];
    /* The expanded attention form's per-head work besides its f32 products:
     * dequantizing W_UK,h (transposed) and W_UV,h, in 1e9 weights a second,
     * and the scores and weighted sums (kt_attention_head), in GFLOP/s of
     * 2 (dk + dv) per (query, key) pair; every thread of the step's pool at
     * once.  0: not measured (f32_cached_gbps then). */
    double head_dequant_gelems[KT_TYPE_COUNT];
    double attention_gflops;
};

struct kt_machine_accel {
    char name[32];               /* "sim", "cuda0", ... */
    enum kt_place_backend backend;
    uint64_t memory_bytes;
    double h2d_gbps, d2h_gbps, latency_us;
    struct kt_machine_rate decode[KT_TYPE_COUNT];
    double prefill_gflops[KT_TYPE_COUNT];
    double prefill_fixed_gbps[KT_TYPE_COUNT]; /* as the node's; 0: not measured */
    /* The sim: its work runs on the host's cores and reads the host's memory,
     * so the cost model counts it against the CPU's (true for a sim entry
     * unless the file says otherwise).  false: a device of its own - a what-if
     * that plans the sim as the GPU whose rates the entry carries. */
    bool shares_host;
};

#define KT_MACHINE_MAX_DEFAULTED 32

struct kt_machine {
    char kind[160];              /* kt_machine_this_kind() where it was measured */
    char topology[128];          /* the KT_TOPOLOGY_SYNTHETIC it was measured under; "" for the real one */
    int n_nodes;
    struct kt_machine_node nodes[KT_MACHINE_MAX_NODES];
    int n_accel;
    struct kt_machine_accel accel[KT_MACHINE_MAX_ACCEL];
    /* "network": {"bandwidth_gbps": GB/s, "latency_us": us} - the link to the other ranks of an MPI
     * job, each message latency_us + bytes / bandwidth; both optional (KT_MACHINE_DEFAULT_NET_*);
     * network_given: the file has the entry.  Measured by `mpirun kt-bench network --machine FILE` (each
     * rank's hop to the next rank, through kt's transport), or written by hand. */
    double net_gbps, net_latency_us;
    bool network_given;
    /* Entries that were missing and got defaults ("nodes[0].decode.q6_K: 20 GB/s assumed"). */
    uint32_t n_defaulted;
    char defaulted[KT_MACHINE_MAX_DEFAULTED][96];
};

/* Reads a machine file (at most 16 MiB).  KT_ERR_IO unreadable, KT_ERR_FORMAT
 * "FILE: where: problem" malformed (NaN, negative or non-numeric figures,
 * unknown keys or types, too many nodes). */
kt_status kt_machine_load(const char *path, struct kt_machine **out, kt_err *err);
kt_status kt_machine_parse(const char *text, size_t len, const char *name, struct kt_machine **out, kt_err *err);
kt_status kt_machine_save(const struct kt_machine *m, const char *path, kt_err *err); /* atomic */

/* "CPU model | N nodes | best ISA" of this host, as kind: the model from
 * /proc/cpuinfo (else CPUID's brand string), the node count of the topology
 * kt runs on (KT_TOPOLOGY_SYNTHETIC's when set), the CPU's best kernel level. */
void kt_machine_this_kind(char *buf, size_t size);

/* KT_OK when m was measured on a machine of this kind; else KT_ERR_INVALID
 * "NAME: measured on KIND, this machine is KIND". */
kt_status kt_machine_check_kind(const struct kt_machine *m, const char *name, kt_err *err);

/* Default figures for a machine nobody measured (every entry defaulted). */
void kt_machine_defaults(struct kt_machine *m, int n_nodes);

/* Seconds one call of a type-t matrix of `bytes` bytes takes on a rate table
 * (a type without figures: the nearest measured type's per-byte figures). */
double kt_machine_decode_seconds(const struct kt_machine_rate *rates, int type, uint64_t bytes);

#endif
