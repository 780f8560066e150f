/*
 * self_check.c - kt-serve --self-check: before kt-serve listens, the engine
 * it will serve with runs the correctness check (tools/cli/check.h) on the
 * built-in prompts, in lockstep with a CPU reference engine that reads
 * every weight from its GGUF rows; a FAIL refuses to serve.
 *
 * prepare runs before any weight is read: it renders the prompts with the
 * chat template the server serves with (--chat-template's when given),
 * tokenizes them and refuses a --ctx too short for them.  run leaves the engine
 * as it found it: no sequence (the check removes its own) and every counter
 * and routing count reset, so /metrics and the profile start from zero.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "prompts.h"
#include "server.h"

kt_status kt_serve_self_check_prepare(struct kt_server *s, kt_err *err)
{
    if (s->o.test_self_check_reference) { /* the reference's file opens, before any weight is read */
        struct kt_model *reference = NULL;
        kt_status st = kt_model_open(s->o.test_self_check_reference, &reference, err);
        kt_model_close(reference);
        if (st != KT_OK)
            return st;
    }
    struct kt_tool_prompts *set = calloc(1, sizeof *set);
    if (!set)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    s->check_prompts = set;
    kt_status st = KT_OK;
    for (size_t i = 0; st == KT_OK && i < KT_CHECK_N_BUILTIN; i++)
        st = kt_tool_prompts_add_text(set, kt_check_builtin_prompts[i].text, err);
    if (st == KT_OK && s->format != KT_CHAT_FORMAT_UNKNOWN)
        st = kt_tool_prompts_tokenize_with(s->format, s->chat_template, s->tok, "--self-check's built-in prompt", set,
                                           err); /* the template the server renders with */
    for (size_t i = 0; st == KT_OK && s->format == KT_CHAT_FORMAT_UNKNOWN && i < set->n; i++) {
        /* no chat template to render them with: their text as it is */
        const char *text = kt_check_builtin_prompts[i].text;
        st = kt_tokenize(s->tok, text, strlen(text), true, true, &set->items[i].ids, &set->items[i].n_ids, err);
    }
    size_t longest = 0;
    for (size_t i = 0; st == KT_OK && i < set->n; i++)
        longest = set->items[i].n_ids > longest ? set->items[i].n_ids : longest;
    const uint64_t need = longest + KT_CHECK_MAX_TOKENS;
    if (st == KT_OK && need > s->ep.n_ctx)
        st = kt_err_set(err, KT_ERR_INVALID,
                        "--self-check needs --ctx %llu or more (its longest prompt is %zu tokens, then %u new ones), "
                        "but --ctx is %u: raise --ctx, or drop --self-check",
                        (unsigned long long)need, longest, KT_CHECK_MAX_TOKENS, s->ep.n_ctx);
    return st;
}

void kt_serve_self_check_free(struct kt_server *s)
{
    if (s->check_prompts)
        kt_tool_prompts_free(s->check_prompts);
    free(s->check_prompts);
    s->check_prompts = NULL;
}

/* The largest of each prompt's median, 9-in-10 and worst row. */
static void largest(const struct kt_check_report *r, double *median, double *p90, double *worst)
{
    *median = *p90 = *worst = 0;
    for (size_t i = 0; i < r->n_prompts; i++) {
        const struct kt_check_prompt_report *pr = &r->prompts[i];
        *median = pr->median > *median ? pr->median : *median;
        *p90 = pr->p90 > *p90 ? pr->p90 : *p90;
        *worst = pr->worst > *worst ? pr->worst : *worst;
    }
}

kt_status kt_serve_self_check_run(struct kt_server *s, bool *pass, kt_err *err)
{
    const struct kt_tool_prompts *set = s->check_prompts;
    struct kt_check_prompt prompts[KT_CHECK_N_BUILTIN];
    struct kt_check_report report = {0};
    struct kt_model *reference = s->model;
    kt_status st = KT_OK;
    *pass = false;
    if (s->o.test_self_check_reference &&
        (st = kt_model_open(s->o.test_self_check_reference, &reference, err)) != KT_OK)
        return st;
    for (size_t i = 0; i < set->n && i < KT_CHECK_N_BUILTIN; i++)
        prompts[i] = (struct kt_check_prompt){set->items[i].ids, (uint32_t)set->items[i].n_ids};
    fprintf(stderr, "kt-serve: --self-check: %zu built-in prompts through the engine and a CPU reference reading "
                    "every weight from %s, up to %u new tokens each\n",
            set->n, s->o.test_self_check_reference ? s->o.test_self_check_reference : s->o.model,
            KT_CHECK_MAX_TOKENS);
    const struct kt_check_params cp = {.seq = 0, .tok = s->tok};
    st = kt_check_run(reference, s->engine, prompts, set->n, &cp, &report, err);
    kt_engine_stats_reset(s->engine); /* the check's steps are not served traffic */
    if (st != KT_OK) {
        kt_err_prefix(err, "--self-check");
        goto done;
    }
    double median, p90, worst;
    largest(&report, &median, &p90, &worst);
    uint64_t rows = 0;
    for (size_t i = 0; i < report.n_prompts; i++)
        rows += report.prompts[i].n_rows;
    *pass = report.pass;
    if (report.pass) {
        fprintf(stderr, "kt-serve: --self-check PASS: %zu prompts, %llu rows of logits: largest median %.3g (at most "
                        "%g), largest 9-in-10 %.3g (at most %g), worst row %.3g; the reference took %.2f s, the "
                        "engine %.2f s\n",
                report.n_prompts, (unsigned long long)rows, median, report.median_tol, p90, report.p90_tol, worst,
                1e-9 * (double)report.reference_ns, 1e-9 * (double)report.candidate_ns);
        goto done;
    }
    for (size_t i = 0; i < report.n_prompts; i++) {
        const struct kt_check_prompt_report *pr = &report.prompts[i];
        if (pr->pass)
            continue;
        char where[160];
        kt_check_break_words(&report, pr, where, sizeof where);
        fprintf(stderr, "kt-serve: --self-check FAIL: prompt %zu (%s, %u tokens): median %.3g (at most %g), 9 rows "
                        "in 10 within %.3g (at most %g), worst row %.3g; the divergence starts at %s\n",
                i + 1, kt_check_builtin_prompts[i].label, pr->n_prompt, pr->median, report.median_tol, pr->p90,
                report.p90_tol, pr->worst, where);
    }
done:
    kt_check_report_free(&report);
    if (reference != s->model)
        kt_model_close(reference);
    return st;
}
