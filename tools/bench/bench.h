/*
 * bench.h - what kt-bench's parts share: the parsed command line and the two
 * jobs.  Each job measures its references (STREAM triad, compute peaks) in
 * the same run as what it divides by them, and writes an aligned table to
 * stdout and, with --json, the same numbers for machines.  Only tools/ code
 * prints; a job must never report a number it did not measure.
 */
#ifndef KT_BENCH_H
#define KT_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu/ref/ops.h"
#include "status.h"

struct kt_bench_options {
    const char *command;        /* "kernels", "model", "profile", "machine", "check" or "grammar" */
    uint32_t threads;           /* 0 until main sets the default (threads.h) */
    const char *json;           /* write results here too; NULL: table only */

    /* kernels */
    double seconds;             /* time per measurement (default 1) */
    uint32_t prefill_tokens;    /* tokens of the prefill shape (default 128) */
    unsigned isa_mask;          /* bit i: measure kernels of enum kt_isa i; 0: every level */

    /* model */
    const char *model;
    uint32_t prompt_tokens;     /* default 128 */
    uint32_t gen_tokens;        /* default 32 */
    uint64_t seed;              /* prompt tokens' seed (default 1) */
    const char *placement;      /* placement config v1; NULL: CPU only */
    bool cold;                  /* time the first prefill of a fresh engine; else one untimed first (warm buffers) */
    enum kt_row_type kv_type;   /* model, profile: the KV cache's row type (--kv-type; default bf16) */
    bool kv_type_given;         /* ... given: it wins over a placement config's kv_cache.type */

    /* profile (model, threads and placement too) */
    const char *prompts;        /* prompt lines: text or JSON chat messages */
    const char *output;         /* the profile file, or the machine file (-o); machine: NULL, table only */
    const char *svg;            /* profile, model: also draw a standalone SVG picture here */
    uint32_t max_tokens;        /* new tokens per prompt (default 64; check: KT_CHECK_MAX_TOKENS) */
    uint32_t batch;             /* prompts at once (default 1) */
    double half_life;           /* decay half-life in tokens; 0: none */
    uint32_t expert_cache_slots; /* profile: the device's expert cache, slots per MoE layer; 0: none */
    bool expert_cache_lfu;      /* ... LFU, else LRU */
    bool expert_cache_policy_given;

    /* machine (threads, output and seconds too: time per measured point, default 0.3) */
    const char *topology;       /* hwloc synthetic description; NULL: KT_TOPOLOGY_SYNTHETIC or this machine */
    double sim_transfer_gbps;   /* the sim's modelled link (default 25 GB/s, 10 us) */
    double sim_latency_us;

    /* model --predict */
    bool predict;               /* also the cost model's prediction of each layer (placement/cost.h) */
    const char *machine;        /* --predict: machine file (kt-bench machine); NULL: stated defaults */
    const char *profile;        /* --predict: routing profile; NULL: uniform routing */

    /* grammar (model, seed and json too) */
    uint32_t vocab_tokens;      /* the synthetic vocabulary's size without a model (default 163840) */
};

/* Exit status: 0 done, 1 the run failed (one line "kt-bench: why" on stderr). */
int kt_bench_kernels(const struct kt_bench_options *o);
int kt_bench_model(const struct kt_bench_options *o);
int kt_bench_profile(const struct kt_bench_options *o);
int kt_bench_machine(const struct kt_bench_options *o);
/* check (model, placement, prompts - NULL: the built-in ones -, max_tokens,
 * threads, json): 0 PASS, 2 FAIL, 1 the run failed. */
int kt_bench_check(const struct kt_bench_options *o);
/* grammar: the token mask's cost per generated token (bench/grammar.c). */
int kt_bench_grammar(const struct kt_bench_options *o);

/* network: the link between the ranks of an MPI job, hop by hop round the ring (bench/network.c);
 * prefill_tokens sizes the prefill chunk's message, machine (a "%r" in it: the rank) takes each
 * rank's hop, model (optional) gives the width. */
int kt_bench_network(const struct kt_bench_options *o);

/* One hop of the ring, from -> to, as its sender measured it (one way: half the median round trip). */
struct kt_bench_link {
    int from, to;
    char host[64];              /* from's host */
    double latency_us, gbps;    /* the line through a 64-byte and a 4 MiB message */
    double wake_us;             /* what a receiver that had waited 2 ms adds: its wait sees the message late */
    uint64_t decode_bytes, prefill_bytes; /* the pipeline's messages: a decode step's STEP of one token, a chunk's */
    double decode_us, prefill_us;         /* ... measured one way */
    double decode_fit_us, prefill_fit_us; /* ... as the line prices them (a receiver in a tight poll) */
};
struct kt_transport;
/* Every rank of the job calls it at the same point with the same arguments: rank 0 gets every hop
 * (links[r]: r -> r + 1, the last to 0), the others their own in links[0].  reps: round trips of
 * the small messages (a tenth, at least 3, of the large ones).  KT_ERR_IO: a rank did not answer. */
kt_status kt_bench_ring_links(struct kt_transport *t, uint32_t n_embd, uint32_t prefill_tokens, int reps,
                        struct kt_bench_link *links, kt_err *err);
/* kt-place's link model (kt_rank_link_seconds) of one step of n_tokens round the ring, priced with the
 * measured hops. */
double kt_bench_link_step_seconds(const struct kt_bench_link *links, int n_ranks, uint32_t n_embd, uint32_t n_tokens);
/* links[0 .. n) as a JSON array (a json_t *). */
void *kt_bench_links_json(const struct kt_bench_link *links, int n);

/* Shared helpers (bench/common.c). */
double kt_bench_now_seconds(void);
int kt_bench_write_json(void *root, const char *path); /* root: json_t *; 0 or 1 (after a message) */
uint32_t kt_bench_argmax(const float *x, uint32_t n); /* the first largest of x[0 .. n-1]: greedy decoding */

#endif
