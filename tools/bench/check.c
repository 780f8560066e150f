/*
 * check.c - `kt-bench check`: is this placement computing what the model
 * computes, on this machine?  A few prompts (built-in prose, code and
 * Chinese, or --prompts lines as `profile` reads them, rendered with the
 * chat template) run through the placement's engine (the candidate) and a
 * CPU reference engine that reads every weight from the file's GGUF rows,
 * in lockstep on the reference's greedy tokens (tools/cli/check.h does the
 * work).  Prints per prompt the logits' divergence (median, 9 rows in 10,
 * worst; per step the worst row), where the greedy tokens part, and at the
 * first row over the tolerance the divergence of the residual stream after
 * each layer and the layer where it starts; --json writes the whole report
 * (every row; a divergence that is not finite is null).
 *
 * Exit status: 0 PASS, 2 FAIL (naming the prompt and the layer), 1 the run
 * failed.  It drives the runtime and prints; it computes no model math.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "check.h"
#include "engine.h"
#include "placement_opt.h"
#include "preflight.h"
#include "prompts.h"
#include "tokenizer.h"

/* A prompt's name in the report: the built-in's label, or its line in --prompts. */
static void prompt_label(const struct kt_bench_options *o, const struct kt_tool_prompts *set, size_t i, char *out,
                         size_t size)
{
    if (o->prompts)
        snprintf(out, size, "line %u", set->items[i].line);
    else
        snprintf(out, size, "%s", kt_check_builtin_prompts[i].label);
}

static void print_report(const struct kt_bench_options *o, const struct kt_tool_prompts *set,
                         const struct kt_check_report *r)
{
    printf("\nrow divergence: max |candidate - reference| / max |reference| over a row of logits; a prompt passes "
           "with its median row <= %g and 9 rows in 10 <= %g\n\n",
           r->median_tol, r->p90_tol);
    printf("%-3s %-10s %7s %5s %10s %10s %10s  %-26s %s\n", "#", "prompt", "tokens", "rows", "median", "9 in 10",
           "worst", "greedy tokens", "verdict");
    for (size_t i = 0; i < r->n_prompts; i++) {
        const struct kt_check_prompt_report *pr = &r->prompts[i];
        char label[64], tokens[64];
        prompt_label(o, set, i, label, sizeof label);
        uint32_t generated = 0;
        for (uint32_t k = 0; k < pr->n_rows; k++)
            generated += pr->rows[k].generated;
        if (pr->parted_row >= 0)
            snprintf(tokens, sizeof tokens, "part at new token %d of %u", pr->parted_row - (int)pr->n_prompt + 2,
                     generated);
        else
            snprintf(tokens, sizeof tokens, "agree on all %u", generated);
        printf("%-3zu %-10s %7u %5u %10.3g %10.3g %10.3g  %-26s %s\n", i + 1, label, pr->n_prompt, pr->n_rows,
               pr->median, pr->p90, pr->worst, tokens, pr->pass ? "PASS" : "FAIL");
    }
    for (size_t i = 0; i < r->n_prompts; i++) {
        const struct kt_check_prompt_report *pr = &r->prompts[i];
        printf("\nprompt %zu, worst row of each step:", i + 1);
        bool decoding = false;
        for (uint32_t k = 0; k < pr->n_rows;) {
            const uint32_t step = pr->rows[k].step;
            const bool decode = pr->rows[k].pos >= pr->n_prompt;
            double worst = 0;
            for (; k < pr->n_rows && pr->rows[k].step == step; k++)
                worst = pr->rows[k].divergence > worst ? pr->rows[k].divergence : worst;
            printf("%s %.2g", step == 0 ? " prefill" : decode && !decoding ? " | decode" : "", worst);
            decoding = decoding || decode;
        }
        printf("\n");
        if (pr->break_row < 0)
            continue;
        const struct kt_check_row *row = &pr->rows[pr->break_row];
        char where[128];
        kt_check_break_words(r, pr, where, sizeof where);
        printf("  first row over %g: position %u (step %u), %.3g; the residual stream after each layer:\n   ",
               r->median_tol, row->pos, row->step + 1, row->divergence);
        for (uint32_t il = 0; il < r->n_layer; il++)
            printf(" %u:%.2g", il, pr->layer_divergence[il]);
        printf("\n  the divergence starts at: %s\n", where);
    }
    printf("\neach engine stepped %llu tokens: the reference in %.2f s, the candidate in %.2f s\n",
           (unsigned long long)r->tokens, 1e-9 * (double)r->reference_ns, 1e-9 * (double)r->candidate_ns);
    if (r->pass) {
        double median = 0, p90 = 0;
        for (size_t i = 0; i < r->n_prompts; i++) {
            median = r->prompts[i].median > median ? r->prompts[i].median : median;
            p90 = r->prompts[i].p90 > p90 ? r->prompts[i].p90 : p90;
        }
        printf("PASS: every prompt within the tolerance (largest median %.3g, largest 9-in-10 %.3g)\n", median, p90);
        return;
    }
    for (size_t i = 0; i < r->n_prompts; i++) {
        const struct kt_check_prompt_report *pr = &r->prompts[i];
        if (pr->pass)
            continue;
        char label[64], where[128];
        prompt_label(o, set, i, label, sizeof label);
        kt_check_break_words(r, pr, where, sizeof where);
        printf("FAIL: prompt %zu (%s): median %.3g (at most %g), 9 rows in 10 within %.3g (at most %g); the "
               "divergence starts at %s\n",
               i + 1, label, pr->median, r->median_tol, pr->p90, r->p90_tol, where);
    }
}

/* ---- JSON ------------------------------------------------------------------------------------- */

static json_t *real_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *report_json(const struct kt_bench_options *o, const struct kt_tool_prompts *set,
                           const struct kt_check_report *r)
{
    json_t *root = json_object(), *prompts = json_array();
    json_object_set_new(root, "model", json_string(o->model));
    json_object_set_new(root, "placement", o->placement ? json_string(o->placement) : json_null());
    json_object_set_new(root, "median_tol", json_real(r->median_tol));
    json_object_set_new(root, "p90_tol", json_real(r->p90_tol));
    json_object_set_new(root, "max_tokens", json_integer(r->max_tokens));
    json_object_set_new(root, "n_layer", json_integer(r->n_layer));
    json_object_set_new(root, "tokens", json_integer((json_int_t)r->tokens));
    json_object_set_new(root, "reference_ns", json_integer((json_int_t)r->reference_ns));
    json_object_set_new(root, "candidate_ns", json_integer((json_int_t)r->candidate_ns));
    json_object_set_new(root, "pass", json_boolean(r->pass));
    for (size_t i = 0; i < r->n_prompts; i++) {
        const struct kt_check_prompt_report *pr = &r->prompts[i];
        json_t *p = json_object(), *rows = json_array();
        char label[64];
        prompt_label(o, set, i, label, sizeof label);
        json_object_set_new(p, "label", json_string(label));
        json_object_set_new(p, "prompt_tokens", json_integer(pr->n_prompt));
        json_object_set_new(p, "steps", json_integer(pr->n_steps));
        json_object_set_new(p, "median", real_or_null(pr->median));
        json_object_set_new(p, "p90", real_or_null(pr->p90));
        json_object_set_new(p, "worst", real_or_null(pr->worst));
        json_object_set_new(p, "pass", json_boolean(pr->pass));
        json_object_set_new(p, "parted_row", pr->parted_row >= 0 ? json_integer(pr->parted_row) : json_null());
        if (pr->break_row >= 0) {
            json_t *b = json_object(), *layers = json_array();
            json_object_set_new(b, "row", json_integer(pr->break_row));
            json_object_set_new(b, "layer", json_integer(pr->break_layer)); /* n_layer: the output head */
            for (uint32_t il = 0; il < r->n_layer; il++)
                json_array_append_new(layers, real_or_null(pr->layer_divergence[il]));
            json_object_set_new(b, "layer_divergence", layers);
            json_object_set_new(p, "break", b);
        } else {
            json_object_set_new(p, "break", json_null());
        }
        for (uint32_t k = 0; k < pr->n_rows; k++) {
            const struct kt_check_row *row = &pr->rows[k];
            json_array_append_new(rows, json_pack("{s:i, s:i, s:b, s:o, s:i, s:i}", "pos", row->pos, "step",
                                                  row->step, "generated", row->generated, "divergence",
                                                  real_or_null(row->divergence), "ref_token", row->ref_token,
                                                  "cand_token", row->cand_token));
        }
        json_object_set_new(p, "rows", rows);
        json_array_append_new(prompts, p);
    }
    json_object_set_new(root, "prompts", prompts);
    return root;
}

/* ---- the run ----------------------------------------------------------------------------------- */

int kt_bench_check(const struct kt_bench_options *o)
{
    int rc = 1;
    kt_err err = {0};
    struct kt_tool_prompts set = {0};
    struct kt_model *m = NULL;
    struct kt_tokenizer *tok = NULL;
    struct kt_engine *e = NULL;
    struct kt_check_prompt *prompts = NULL;
    struct kt_check_report report = {0};

    if (o->prompts && kt_tool_prompts_read(o->prompts, &set, &err) != KT_OK)
        goto fail;
    for (size_t i = 0; !o->prompts && i < KT_CHECK_N_BUILTIN; i++)
        if (kt_tool_prompts_add_text(&set, kt_check_builtin_prompts[i].text, &err) != KT_OK)
            goto fail;
    if (kt_model_open(o->model, &m, &err) != KT_OK)
        goto fail;
    if (kt_tokenizer_create(m->gguf, &tok, &err) != KT_OK) {
        kt_err_prefix(&err, "%s", o->model);
        goto fail;
    }
    if (kt_tool_prompts_tokenize(m, tok, o->prompts ? o->prompts : "built-in prompt", &set, &err) != KT_OK)
        goto fail;
    size_t longest = 0;
    if (!(prompts = calloc(set.n, sizeof *prompts))) {
        kt_err_set(&err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < set.n; i++) {
        prompts[i] = (struct kt_check_prompt){set.items[i].ids, (uint32_t)set.items[i].n_ids};
        longest = set.items[i].n_ids > longest ? set.items[i].n_ids : longest;
    }
    const uint32_t max_tokens = o->max_tokens ? o->max_tokens : KT_CHECK_MAX_TOKENS;
    if (kt_tool_check_positions("the longest prompt and --max-tokens", longest + max_tokens, m, o->model,
                                "shorten the prompts or lower --max-tokens", &err) != KT_OK)
        goto fail;
    struct kt_engine_params ep = {.n_ctx = (uint32_t)(longest + max_tokens), .max_seqs = 1, .n_threads = o->threads,
                                  .progress = isatty(2) ? stderr : NULL};
    struct kt_engine_plan plan = {0};
    if (o->placement && kt_tool_placement_apply(o->placement, m, &ep, &plan, &err) != KT_OK)
        goto fail;
    kt_status created = kt_engine_create(m, &ep, &e, &err);
    kt_engine_plan_free(&plan); /* only read at creation */
    if (created != KT_OK)
        goto fail;

    printf("kt-bench check: %s, the candidate %s against the reference (every weight in its GGUF rows, on the CPU); "
           "%zu %s prompts, up to %u new tokens each (the reference's greedy choices), %u threads\n",
           o->model, o->placement ? o->placement : "CPU-only (no --placement)", set.n,
           o->prompts ? "--prompts" : "built-in", max_tokens, o->threads);
    fflush(stdout);
    const struct kt_check_params cp = {.max_tokens = max_tokens, .seq = 0, .n_threads = o->threads, .tok = tok};
    if (kt_check_run(m, e, prompts, set.n, &cp, &report, &err) != KT_OK)
        goto fail;
    print_report(o, &set, &report);
    rc = report.pass ? 0 : 2;
    if (o->json) {
        json_t *root = report_json(o, &set, &report);
        if (kt_bench_write_json(root, o->json) != 0)
            rc = 1;
        json_decref(root);
    }
    goto done;
fail:
    fprintf(stderr, "kt-bench: %s\n", err.msg);
done:
    kt_check_report_free(&report);
    free(prompts);
    kt_engine_destroy(e);
    kt_tokenizer_destroy(tok);
    kt_model_close(m);
    kt_tool_prompts_free(&set);
    return rc;
}
