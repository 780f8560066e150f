/*
 * check.c - the correctness check's core (see check.h): the reference
 * engine, the lockstep of the two engines, the comparison of their logits
 * and residual streams, and the report.  It never prints.
 */
#include "check.h"

#include "backend.h"
#include "cpu/dispatch.h"
#include "quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const struct kt_check_builtin kt_check_builtin_prompts[KT_CHECK_N_BUILTIN] = {
    {"prose", "In one short paragraph, explain why the sky is blue at noon but red at sunset."},
    {"code", "What does this C function return for a = {1, 2, 3} and n = 3, and what is wrong with it?\n\n"
             "int sum(const int *a, int n)\n{\n    int s;\n    for (int i = 0; i <= n; i++)\n        s += a[i];\n"
             "    return s;\n}\n"},
    {"chinese", "请用三句话介绍长城的历史，并说明它为什么被修建。"},
};

#define LAYER_FLOOR 1e-6 /* a residual stream within this of the reference's agrees with it */

double kt_check_divergence(const float *ref, const float *cand, size_t n)
{
    double diff = 0, big = 0;
    for (size_t i = 0; i < n; i++) {
        const double a = ref[i], b = cand[i];
        if (!isfinite(a) || !isfinite(b))
            return INFINITY;
        diff = fabs(a - b) > diff ? fabs(a - b) : diff;
        big = fabs(a) > big ? fabs(a) : big;
    }
    return diff == 0 ? 0 : diff / (big > 0 ? big : 1e-30);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* ---- the residual streams, layer by layer ------------------------------------------------ */

/* What the two engines' layer hooks share during a step: the reference steps
 * first and keeps its residual stream after every layer; the candidate then
 * measures its own against it. */
struct probe {
    uint32_t n_layer, n_embd, chunk;
    float *ref_x;               /* (n_layer, chunk, n_embd) the reference's residual stream this step */
    double *div;                /* (chunk, n_layer) the candidate's divergence per row and layer */
    uint32_t bad_n_embd;        /* nonzero: the candidate's rows had this width, not n_embd */
};

static void reference_hook(void *ctx, uint32_t il, const float *x, uint32_t n_tokens, uint32_t n_embd)
{
    struct probe *p = ctx;
    if (il < p->n_layer && n_tokens <= p->chunk && n_embd == p->n_embd)
        memcpy(p->ref_x + (size_t)il * p->chunk * n_embd, x, (size_t)n_tokens * n_embd * sizeof *x);
}

static void candidate_hook(void *ctx, uint32_t il, const float *x, uint32_t n_tokens, uint32_t n_embd)
{
    struct probe *p = ctx;
    if (n_embd != p->n_embd)
        p->bad_n_embd = n_embd;
    if (n_embd != p->n_embd || il >= p->n_layer)
        return;
    const float *ref = p->ref_x + (size_t)il * p->chunk * n_embd;
    for (uint32_t t = 0; t < n_tokens && t < p->chunk; t++)
        p->div[(size_t)t * p->n_layer + il] =
            kt_check_divergence(ref + (size_t)t * n_embd, x + (size_t)t * n_embd, n_embd);
}

/* Where a row's divergence starts (check.h): the first layer reaching a
 * hundredth of the largest and LAYER_FLOOR; n_layer when none exceeds the
 * floor.  Divergences are never NaN (kt_check_divergence). */
static int32_t start_layer(const double *d, uint32_t n_layer)
{
    double largest = 0;
    for (uint32_t il = 0; il < n_layer; il++)
        largest = d[il] > largest ? d[il] : largest;
    if (largest < LAYER_FLOOR)
        return (int32_t)n_layer;
    const double bar = largest / 100 > LAYER_FLOOR ? largest / 100 : LAYER_FLOOR;
    for (uint32_t il = 0; il < n_layer; il++)
        if (d[il] >= bar)
            return (int32_t)il;
    return (int32_t)n_layer;
}

/* ---- the lockstep ------------------------------------------------------------------------ */

struct run {
    struct kt_engine *ref, *cand;
    uint32_t cand_seq, n_vocab, chunk, max_tokens;
    double median_tol;
    const struct kt_tokenizer *tok;
    struct kt_batch_token *ref_batch, *cand_batch; /* [chunk] */
    float *ref_logits, *cand_logits;               /* (chunk, n_vocab) */
    struct probe probe;
    struct kt_check_report *report;
};

/* Both engines step the same n tokens (ref_batch; the candidate's differ
 * only in their sequence), every token wanting logits; their rows are
 * compared and appended to pr. */
static kt_status step_both(struct run *r, struct kt_check_prompt_report *pr, uint32_t n, uint32_t last_prompt_pos,
                           kt_err *err)
{
    for (uint32_t i = 0; i < n; i++) {
        r->cand_batch[i] = r->ref_batch[i];
        r->cand_batch[i].seq = r->cand_seq;
    }
    const uint64_t t0 = now_ns();
    kt_status st = kt_engine_step(r->ref, &(struct kt_batch){n, r->ref_batch}, r->ref_logits, err);
    if (st != KT_OK) {
        kt_err_prefix(err, "the reference engine");
        return st;
    }
    const uint64_t t1 = now_ns();
    r->probe.bad_n_embd = 0;
    if ((st = kt_engine_step(r->cand, &(struct kt_batch){n, r->cand_batch}, r->cand_logits, err)) != KT_OK) {
        kt_err_prefix(err, "the candidate engine");
        return st;
    }
    const uint64_t t2 = now_ns();
    if (r->probe.bad_n_embd)
        return kt_err_set(err, KT_ERR_INVALID,
                          "the candidate engine's residual stream is %u wide, the model's %u: create the candidate "
                          "over the model the check is given",
                          r->probe.bad_n_embd, r->probe.n_embd);
    r->report->reference_ns += t1 - t0;
    r->report->candidate_ns += t2 - t1;
    r->report->tokens += n;
    const uint32_t V = r->n_vocab, L = r->probe.n_layer;
    for (uint32_t i = 0; i < n; i++) {
        const float *a = r->ref_logits + (size_t)i * V, *b = r->cand_logits + (size_t)i * V;
        const uint32_t pos = r->ref_batch[i].pos;
        struct kt_check_row *row = &pr->rows[pr->n_rows];
        *row = (struct kt_check_row){.pos = pos, .step = pr->n_steps, .generated = pos >= last_prompt_pos,
                                     .divergence = kt_check_divergence(a, b, V), .ref_token = argmax(a, V),
                                     .cand_token = argmax(b, V)};
        if (pr->break_row < 0 && row->divergence > r->median_tol) {
            pr->break_row = (int32_t)pr->n_rows;
            if (!(pr->layer_divergence = malloc((L ? L : 1) * sizeof *pr->layer_divergence)))
                return kt_err_set(err, KT_ERR_NOMEM, "check: out of memory");
            memcpy(pr->layer_divergence, r->probe.div + (size_t)i * L, L * sizeof *pr->layer_divergence);
            pr->break_layer = start_layer(pr->layer_divergence, L);
        }
        if (pr->parted_row < 0 && row->generated && row->ref_token != row->cand_token)
            pr->parted_row = (int32_t)pr->n_rows;
        pr->n_rows++;
    }
    pr->n_steps++;
    return KT_OK;
}

/* One prompt through both engines: its chunks, then decode steps on the
 * reference's choices; the sequences are gone again afterwards. */
static kt_status run_prompt(struct run *r, const struct kt_check_prompt *p, struct kt_check_prompt_report *pr,
                            kt_err *err)
{
    *pr = (struct kt_check_prompt_report){.n_prompt = p->n_ids, .parted_row = -1, .break_row = -1,
                                          .break_layer = -1};
    if (!(pr->rows = calloc((size_t)p->n_ids + r->max_tokens, sizeof *pr->rows)))
        return kt_err_set(err, KT_ERR_NOMEM, "check: out of memory for %u rows", p->n_ids + r->max_tokens);
    kt_status st = kt_engine_seq_add(r->ref, 0, err);
    if (st != KT_OK)
        return st;
    if ((st = kt_engine_seq_add(r->cand, r->cand_seq, err)) != KT_OK) {
        kt_err_prefix(err, "the candidate engine's sequence %u (kt_check_params.seq: pick a free one)", r->cand_seq);
        kt_engine_seq_remove(r->ref, 0, NULL);
        return st;
    }
    uint32_t pos = 0;
    while (st == KT_OK && pos < p->n_ids) {
        const uint32_t n = p->n_ids - pos < r->chunk ? p->n_ids - pos : r->chunk;
        for (uint32_t i = 0; i < n; i++, pos++)
            r->ref_batch[i] = (struct kt_batch_token){p->ids[pos], 0, pos, true};
        st = step_both(r, pr, n, p->n_ids - 1, err);
    }
    for (uint32_t generated = 1; st == KT_OK && generated < r->max_tokens; generated++) {
        const int32_t next = pr->rows[pr->n_rows - 1].ref_token;
        if (r->tok && kt_token_is_eog(r->tok, next))
            break;
        r->ref_batch[0] = (struct kt_batch_token){next, 0, pos++, true};
        st = step_both(r, pr, 1, p->n_ids - 1, err);
    }
    kt_engine_seq_remove(r->ref, 0, NULL);
    kt_engine_seq_remove(r->cand, r->cand_seq, NULL);
    return st;
}

/* The prompt's median, 90th percentile and worst row, and its verdict. */
static kt_status summarize(struct kt_check_prompt_report *pr, double median_tol, double p90_tol, kt_err *err)
{
    double *d = malloc(pr->n_rows * sizeof *d);
    if (!d)
        return kt_err_set(err, KT_ERR_NOMEM, "check: out of memory");
    for (uint32_t i = 0; i < pr->n_rows; i++)
        d[i] = pr->rows[i].divergence;
    qsort(d, pr->n_rows, sizeof *d, cmp_double);
    const size_t last = pr->n_rows - 1;
    pr->median = d[(size_t)(0.5 * (double)last + 0.5)];
    pr->p90 = d[(size_t)(0.9 * (double)last + 0.5)];
    pr->worst = d[last];
    pr->pass = pr->median <= median_tol && pr->p90 <= p90_tol;
    free(d);
    return KT_OK;
}

/* ---- the check --------------------------------------------------------------------------- */

/* True when a candidate computes on a GPU products whose weights the CPU
 * reference multiplies with 8-bit activations (every integer dot product's
 * vec_dot_type is Q8_*): a GPU keeps those activations as floats. */
static bool gpu_floats_quantized_products(const struct kt_model *m, const struct kt_engine_params *cp)
{
    if (!cp->device || cp->device->kind != KT_BACKEND_CUDA)
        return false;
    const struct kt_cpu_kernels *k = kt_cpu_kernels();
    for (int c = 0; c < KT_CLASS_COUNT; c++)
        for (int t = 0; t < KT_TYPE_COUNT && t < 64; t++)
            if (m->class_types[c] >> t & 1 && k->type[t].vec_dot && k->type[t].vec_dot_type != KT_TYPE_F32 &&
                k->type[t].vec_dot_type != KT_TYPE_F16 && k->type[t].vec_dot_type != KT_TYPE_BF16)
                return true;
    return false;
}

kt_status kt_check_run(struct kt_model *m, struct kt_engine *candidate, const struct kt_check_prompt *prompts,
                       size_t n_prompts, const struct kt_check_params *params, struct kt_check_report *report,
                       kt_err *err)
{
    const struct kt_check_params p = params ? *params : (struct kt_check_params){0};
    const struct kt_engine_params *cp = kt_engine_params(candidate);
    const bool gpu_q = gpu_floats_quantized_products(m, cp);
    *report = (struct kt_check_report){.median_tol = p.median_tol > 0 ? p.median_tol
                                                     : gpu_q        ? KT_CHECK_MEDIAN_TOL_GPU_Q
                                                                    : KT_CHECK_MEDIAN_TOL,
                                       .p90_tol = p.p90_tol > 0 ? p.p90_tol
                                                  : gpu_q        ? KT_CHECK_P90_TOL_GPU_Q
                                                                 : KT_CHECK_P90_TOL,
                                       .max_tokens = p.max_tokens ? p.max_tokens : KT_CHECK_MAX_TOKENS,
                                       .n_layer = m->hp.n_layer};
    if (n_prompts == 0)
        return kt_err_set(err, KT_ERR_INVALID, "check: no prompts given (the built-in ones: kt_check_builtin_prompts)");
    uint64_t longest = 0;
    for (size_t i = 0; i < n_prompts; i++) {
        if (prompts[i].n_ids == 0 || !prompts[i].ids)
            return kt_err_set(err, KT_ERR_INVALID, "check: prompt %zu has no tokens: give it at least one", i + 1);
        longest = prompts[i].n_ids > longest ? prompts[i].n_ids : longest;
    }
    const uint64_t need = longest + report->max_tokens;
    if (need > cp->n_ctx)
        return kt_err_set(err, KT_ERR_INVALID,
                          "check: the longest prompt (%llu tokens) and %u new tokens need %llu positions, but the "
                          "candidate engine holds %u (n_ctx): create it with n_ctx >= %llu, or ask for fewer tokens",
                          (unsigned long long)longest, report->max_tokens, (unsigned long long)need, cp->n_ctx,
                          (unsigned long long)need);
    if (kt_engine_n_vocab(candidate) != m->hp.n_vocab)
        return kt_err_set(err, KT_ERR_INVALID,
                          "check: the candidate engine has %u vocabulary rows, the model %u: create the candidate over "
                          "the model the check is given",
                          kt_engine_n_vocab(candidate), m->hp.n_vocab);

    struct run r = {.cand = candidate, .cand_seq = p.seq, .n_vocab = m->hp.n_vocab, .max_tokens = report->max_tokens,
                    .median_tol = report->median_tol, .tok = p.tok, .report = report};
    r.chunk = kt_engine_max_batch_tokens(candidate) < KT_CHECK_CHUNK_TOKENS ? kt_engine_max_batch_tokens(candidate)
                                                                           : KT_CHECK_CHUNK_TOKENS;
    const struct kt_engine_params rp = {.n_ctx = (uint32_t)need, .max_seqs = 1,
                                        .n_threads = p.n_threads ? p.n_threads : cp->n_threads,
                                        .max_batch_tokens = r.chunk, .topology = cp->topology, .reference = true,
                                        .kv_type = cp->kv_type}; /* the placement is checked, not the cache's row type */
    kt_status st = kt_engine_create(m, &rp, &r.ref, err);
    if (st != KT_OK) {
        kt_err_prefix(err, "check: the reference engine");
        return st;
    }
    const uint32_t L = m->hp.n_layer, E = m->hp.n_embd;
    r.probe = (struct probe){.n_layer = L, .n_embd = E, .chunk = r.chunk};
    r.ref_batch = malloc(r.chunk * sizeof *r.ref_batch);
    r.cand_batch = malloc(r.chunk * sizeof *r.cand_batch);
    r.ref_logits = malloc((size_t)r.chunk * r.n_vocab * sizeof *r.ref_logits);
    r.cand_logits = malloc((size_t)r.chunk * r.n_vocab * sizeof *r.cand_logits);
    r.probe.ref_x = malloc(((size_t)L * r.chunk * E + 1) * sizeof *r.probe.ref_x);
    r.probe.div = calloc((size_t)r.chunk * L + 1, sizeof *r.probe.div);
    report->prompts = calloc(n_prompts, sizeof *report->prompts);
    if (!r.ref_batch || !r.cand_batch || !r.ref_logits || !r.cand_logits || !r.probe.ref_x || !r.probe.div ||
        !report->prompts) {
        st = kt_err_set(err, KT_ERR_NOMEM, "check: out of memory for %u-token chunks of %u logits", r.chunk,
                        r.n_vocab);
        goto done;
    }
    kt_engine_set_layer_hook(r.ref, reference_hook, &r.probe);
    kt_engine_set_layer_hook(candidate, candidate_hook, &r.probe);
    report->pass = true;
    for (size_t i = 0; i < n_prompts && st == KT_OK; i++) {
        struct kt_check_prompt_report *pr = &report->prompts[i];
        report->n_prompts = i + 1;
        if ((st = run_prompt(&r, &prompts[i], pr, err)) != KT_OK || (st = summarize(pr, report->median_tol,
                                                                                     report->p90_tol, err)) != KT_OK)
            kt_err_prefix(err, "check, prompt %zu", i + 1);
        report->pass = report->pass && pr->pass;
    }
    kt_engine_set_layer_hook(candidate, NULL, NULL);
done:
    kt_engine_destroy(r.ref);
    free(r.ref_batch), free(r.cand_batch), free(r.ref_logits), free(r.cand_logits);
    free(r.probe.ref_x), free(r.probe.div);
    if (st != KT_OK)
        report->pass = false;
    return st;
}

void kt_check_report_free(struct kt_check_report *r)
{
    for (size_t i = 0; r->prompts && i < r->n_prompts; i++) {
        free(r->prompts[i].rows);
        free(r->prompts[i].layer_divergence);
    }
    free(r->prompts);
    *r = (struct kt_check_report){0};
}

void kt_check_break_words(const struct kt_check_report *r, const struct kt_check_prompt_report *pr, char *out,
                          size_t size)
{
    if (pr->break_layer < 0)
        snprintf(out, size, "no row is over %g", r->median_tol);
    else if ((uint32_t)pr->break_layer == r->n_layer)
        snprintf(out, size, "every layer agrees (within 1e-6): the output norm and head");
    else
        snprintf(out, size, "layer %d", pr->break_layer);
}
