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

/* Shared helpers (bench/common.c). */
double kt_bench_now_seconds(void);
int kt_bench_write_json(void *root, const char *path); /* root: json_t *; 0 or 1 (after a message) */
uint32_t kt_bench_argmax(const float *x, uint32_t n); /* the first largest of x[0 .. n-1]: greedy decoding */

#endif
