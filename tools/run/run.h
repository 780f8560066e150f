/*
 * run.h - what kt-run's parts share: the parsed command line.  Only tools/
 * code prints; the runtime it calls never does.
 */
#ifndef KT_RUN_H
#define KT_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu/ref/ops.h"

#define KT_RUN_MAX_GPU_COUNTS 16

struct kt_run_options {
    const char *model;
    bool info;
    uint32_t ctx;               /* 0: 4096, or the model's training context if smaller */
    int gpu_experts[KT_RUN_MAX_GPU_COUNTS];
    int n_gpu_experts;
    bool gpu_experts_given;     /* --gpu-experts: only with --info */

    /* generation */
    const char *prompt;         /* -p: raw text, tokenized with BOS as the model adds it */
    const char *chat;           /* --chat: one user turn through the model's chat template */
    const char *system;         /* --system: system turn for --chat */
    const char *chat_template;  /* --chat-template: a Jinja template file in place of the model's */
    uint32_t n_predict;         /* -n: most tokens to generate */
    bool ignore_eos;            /* keep going past end-of-generation tokens */
    float temperature, top_p, min_p;
    int32_t top_k;
    float repeat_penalty, presence_penalty, frequency_penalty;
    bool seed_given;
    uint64_t seed;
    uint32_t threads;           /* 0: the CPUs this process may use (threads.h) */
    uint32_t batch;             /* --batch: most tokens a step (prefill chunk); 0: the engine's 256 */
    uint32_t micro_batches;     /* --micro-batches (under mpirun); 0: the number of ranks */
    uint32_t rank_timeout;      /* --rank-timeout seconds (under mpirun); 0: 120 */
    const char *logits_out;     /* float32 logits of the last position of every step */
    bool bandwidth;             /* measure a STREAM triad and report decode bytes/s against it */
    bool quiet;                 /* do not stream the generated text */
    const char *placement;      /* --placement: placement config v1 (configs/); NULL: CPU only */
    enum kt_row_type kv_type;   /* --kv-type: the KV cache's row type (kv_type.h; default bf16) */
    bool kv_type_given;         /* ... given: it wins over a placement config's kv_cache.type */
};

int kt_run_info(const struct kt_run_options *o);
int kt_run_generate(const struct kt_run_options *o);

#endif
