/*
 * test_kt_serve_completions.c - /v1/completions as evaluation harnesses use
 * it, end to end over HTTP on the tiny synthetic model: lm-eval-harness's
 * loglikelihood request (its local-completions model: prompts as lists of
 * token ids, echo, logprobs 1, max_tokens 1 or 0, temperature 0, a seed)
 * gives the prompt's tokens with their logprobs - the first null, every
 * other equal to the log-softmax of the engine's own logits at the position
 * before, computed here through the engine API - then the generated token;
 * a continuation's sum is the same sent as text or as token ids; a list of
 * prompts gives the numbers each gives alone (within 1e-5), choices numbered prompt by
 * prompt; a prompt already in the prefix cache is still scored in full;
 * vLLM's prompt_logprobs (completions and chat) in vLLM's shape with ranks;
 * text_offset counts code points on a Chinese prompt; a streamed echo
 * carries the prompt's logprobs and the offsets go on after it; bad inputs
 * (a token id out of range, an empty list, a mixed list, too many prompts)
 * are 400s naming the problem.
 *
 * The server runs with --max-batch-tokens 16, so prompts longer than that
 * are prefilled (and scored) in chunks over several steps.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model.h"
#include "serve_harness.h"
#include "tokenizer.h"

static char g_path[1024];
static struct kt_model *g_model;
static struct kt_tokenizer *g_tok;
static uint32_t g_vocab;

/* ---- helpers ------------------------------------------------------------------------------------ */

static json_t *post(const struct test_server *s, const char *path, const char *body, int *code)
{
    struct kt_buf out = {0};
    *code = http(s, NULL, path, body, &out, NULL);
    json_error_t je;
    json_t *j = json_loads(kt_buf_str(&out), 0, &je);
    KT_CHECK(j != NULL, "not JSON: %.300s", kt_buf_str(&out));
    if (*code != 200 && *code != 400)
        fprintf(stderr, "%s -> %d: %.400s\n", path, *code, kt_buf_str(&out));
    kt_buf_free(&out);
    return j;
}

/* A completions request that must succeed; NULL after a failed check. */
static json_t *complete(const struct test_server *s, const char *body)
{
    int code = 0;
    json_t *j = post(s, "/v1/completions", body, &code);
    KT_CHECK(code == 200 && j, "%d for %.300s", code, body);
    if (code != 200) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static json_t *choice(const json_t *j, size_t i)
{
    return json_array_get(json_object_get(j, "choices"), i);
}

static json_t *lp_field(const json_t *c, const char *key)
{
    return json_object_get(json_object_get(c, "logprobs"), key);
}

static int32_t *tokenize(const char *text, size_t *n)
{
    int32_t *ids = NULL;
    kt_err err = {0};
    KT_CHECK(kt_tokenize(g_tok, text, strlen(text), true, true, &ids, n, &err) == KT_OK, "tokenize: %s", err.msg);
    return ids;
}

/* "[1, 2, 3]" */
static void ids_json(struct kt_buf *b, const int32_t *ids, size_t n)
{
    kt_buf_puts(b, "[");
    for (size_t i = 0; i < n; i++)
        kt_buf_printf(b, "%s%d", i ? ", " : "", ids[i]);
    kt_buf_puts(b, "]");
}

/* The engine's own logits at every position of ids: (n, V), one prefill step. */
static float *engine_logits(const int32_t *ids, size_t n)
{
    const struct kt_engine_params p = {.n_ctx = 512, .n_threads = 2};
    return kt_test_engine_greedy(g_model, &p, ids, (uint32_t)n, 0, NULL, NULL, NULL);
}

/* log-softmax of row at token, in double */
static double log_softmax(const float *row, int32_t token)
{
    float max = row[0];
    for (uint32_t v = 1; v < g_vocab; v++)
        max = row[v] > max ? row[v] : max;
    double sum = 0;
    for (uint32_t v = 0; v < g_vocab; v++)
        sum += exp((double)row[v] - max);
    return (double)row[token] - ((double)max + log(sum));
}

static uint32_t rank_of(const float *row, int32_t token)
{
    uint32_t r = 0;
    for (uint32_t v = 0; v < g_vocab; v++)
        r += row[v] >= row[token];
    return r;
}

static size_t code_points(const char *s)
{
    size_t k = 0;
    for (; *s; s++)
        k += ((unsigned char)*s & 0xC0) != 0x80;
    return k;
}

/* A prompt of 49 tokens: prefilled (and scored) in four chunks of --max-batch-tokens 16. */
static const char *const long_prompt =
    "The keeper walks up the hill at dawn to read the barometer, the rain gauge and the wind vane, and writes "
    "every number down in pencil.";

/* ---- cases --------------------------------------------------------------------------------------- */

/* lm-eval-harness's loglikelihood request: the echoed prompt's logprobs are
 * the engine's log-softmax, the first is null, the generated token follows. */
static void echo_logprobs_are_the_engines_log_softmax(const struct test_server *s)
{
    size_t n = 0;
    int32_t *ids = tokenize(long_prompt, &n);
    float *logits = ids ? engine_logits(ids, n) : NULL;
    struct kt_buf body = {0};
    kt_buf_puts(&body, "{\"prompt\": [");
    ids_json(&body, ids, n);
    kt_buf_puts(&body, "], \"temperature\": 0, \"max_tokens\": 1, \"logprobs\": 1, \"seed\": 1234, \"echo\": true}");
    json_t *j = logits ? complete(s, kt_buf_str(&body)) : NULL;
    const json_t *c = choice(j, 0);
    const json_t *lps = lp_field(c, "token_logprobs"), *tops = lp_field(c, "top_logprobs"),
                 *tokens = lp_field(c, "tokens");
    KT_CHECK(n > 16 && json_array_size(lps) == n + 1 && json_array_size(tops) == n + 1 &&
                 json_array_size(tokens) == n + 1,
             "%zu prompt tokens + 1 generated: %zu logprobs", n, json_array_size(lps));
    KT_CHECK(json_is_null(json_array_get(lps, 0)) && json_is_null(json_array_get(tops, 0)),
             "the first prompt token has no logprob");
    double worst = 0;
    for (size_t p = 1; j && p < n && p < json_array_size(lps); p++) {
        const float *row = logits + (p - 1) * g_vocab;
        const double want = log_softmax(row, ids[p]), got = json_number_value(json_array_get(lps, p));
        worst = fabs(want - got) > worst ? fabs(want - got) : worst;
        /* top_logprobs: the token itself and the most likely one (logprobs 1) */
        const json_t *top = json_array_get(tops, p);
        int32_t best = 0;
        for (uint32_t v = 1; v < g_vocab; v++)
            best = row[v] > row[best] ? (int32_t)v : best;
        double top_max = -1e9;
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)top, k, x) top_max = json_number_value(x) > top_max ? json_number_value(x)
                                                                                           : top_max;
        KT_CHECK(json_object_size(top) >= 1 && json_object_size(top) <= 2 &&
                     fabs(top_max - log_softmax(row, best)) < 1e-4,
                 "position %zu: top_logprobs %zu entries, max %g, argmax's %g", p, json_object_size(top), top_max,
                 log_softmax(row, best));
    }
    KT_CHECK(worst < 1e-4, "echoed prompt logprobs differ from the engine's log-softmax by up to %g", worst);
    /* the generated token: greedy from the last position, with its logprob */
    if (j && logits && json_array_size(lps) == n + 1) {
        const float *row = logits + (n - 1) * g_vocab;
        int32_t best = 0;
        for (uint32_t v = 1; v < g_vocab; v++)
            best = row[v] > row[best] ? (int32_t)v : best;
        KT_CHECK(fabs(json_number_value(json_array_get(lps, n)) - log_softmax(row, best)) < 1e-4,
                 "the generated token's logprob");
        KT_CHECK(strcmp(json_string_value(json_object_get(c, "finish_reason")), "length") == 0, "finish length");
        const json_t *u = json_object_get(j, "usage");
        KT_CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == (json_int_t)n &&
                     json_integer_value(json_object_get(u, "completion_tokens")) == 1,
                 "usage");
    }
    json_decref(j);
    kt_buf_free(&body);
    free(logits);
    free(ids);
}

/* Sum of the continuation's logprobs (positions from..n-1 of the echoed prompt). */
static double continuation_sum(const json_t *c, size_t from, size_t n)
{
    double sum = 0;
    const json_t *lps = lp_field(c, "token_logprobs");
    for (size_t p = from; p < n; p++)
        sum += json_number_value(json_array_get(lps, p));
    return sum;
}

/* A context and a continuation sent as one string or as token ids score the
 * same; max_tokens 0 scores the prompt, generates nothing and ends "length". */
static void a_continuation_scores_the_same_as_text_or_ids(const struct test_server *s)
{
    const char *text = "The wind vane creaks and the rain gauge drips.";
    size_t n = 0, n_ctx = 0;
    int32_t *ids = tokenize(text, &n), *ctx = tokenize("The wind vane creaks", &n_ctx);
    struct kt_buf a = {0}, b = {0};
    kt_buf_printf(&a, "{\"prompt\": \"%s\", \"max_tokens\": 0, \"logprobs\": 1, \"echo\": true, \"temperature\": 0}",
                  text);
    kt_buf_puts(&b, "{\"prompt\": [");
    ids_json(&b, ids, n);
    kt_buf_puts(&b, "], \"max_tokens\": 0, \"logprobs\": 1, \"echo\": true, \"temperature\": 0}");
    json_t *ja = complete(s, kt_buf_str(&a)), *jb = complete(s, kt_buf_str(&b));
    const json_t *ca = choice(ja, 0), *cb = choice(jb, 0);
    KT_CHECK(json_array_size(lp_field(ca, "token_logprobs")) == n &&
                 json_array_size(lp_field(cb, "token_logprobs")) == n,
             "max_tokens 0: the prompt's %zu tokens alone (%zu, %zu)", n,
             json_array_size(lp_field(ca, "token_logprobs")), json_array_size(lp_field(cb, "token_logprobs")));
    const double sa = continuation_sum(ca, n_ctx, n), sb = continuation_sum(cb, n_ctx, n);
    KT_CHECK(n_ctx > 1 && n_ctx < n && sa < 0 && fabs(sa - sb) < 1e-9, "continuation sums: text %.9g, ids %.9g", sa,
             sb);
    for (int k = 0; k < 2; k++) {
        const json_t *c = k ? cb : ca, *j = k ? jb : ja;
        KT_CHECK(strcmp(json_string_value(json_object_get(c, "finish_reason")), "length") == 0 &&
                     json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")) == 0,
                 "max_tokens 0: nothing generated, finish_reason length");
    }
    KT_CHECK(strcmp(json_string_value(json_object_get(ca, "text")), text) == 0, "the echo is the prompt");
    json_decref(ja), json_decref(jb);
    kt_buf_free(&a), kt_buf_free(&b);
    free(ids), free(ctx);
}

/* Two completions logprobs objects with the same tokens, offsets and
 * alternatives, their numbers within 1e-5 (the engine's logits move by an
 * ulp with what shares a batch). */
static bool same_logprobs(const json_t *a, const json_t *b)
{
    if (!json_equal(json_object_get(a, "tokens"), json_object_get(b, "tokens")) ||
        !json_equal(json_object_get(a, "text_offset"), json_object_get(b, "text_offset")))
        return false;
    const json_t *la = json_object_get(a, "token_logprobs"), *lb = json_object_get(b, "token_logprobs");
    const json_t *ta = json_object_get(a, "top_logprobs"), *tb = json_object_get(b, "top_logprobs");
    if (json_array_size(la) != json_array_size(lb) || json_array_size(ta) != json_array_size(tb))
        return false;
    for (size_t i = 0; i < json_array_size(la); i++) {
        const json_t *x = json_array_get(la, i), *y = json_array_get(lb, i);
        if (json_is_null(x) != json_is_null(y) || fabs(json_number_value(x) - json_number_value(y)) > 1e-5)
            return false;
        const json_t *tx = json_array_get(ta, i), *ty = json_array_get(tb, i);
        if (json_object_size(tx) != json_object_size(ty))
            return false;
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)tx, k, v)
        {
            const json_t *w = json_object_get(ty, k);
            if (!w || fabs(json_number_value(v) - json_number_value(w)) > 1e-5)
                return false;
        }
    }
    return true;
}

/* A list of prompts (as lm-eval batches them) gives each the numbers it gets
 * alone; choices are numbered prompt by prompt, n each. */
static void a_list_of_prompts_matches_one_at_a_time(const struct test_server *s)
{
    const char *texts[3] = {"Fog so thick the gulls walked.", long_prompt, "Storm from the south-west."};
    json_t *alone[3];
    struct kt_buf list = {0};
    kt_buf_puts(&list, "{\"prompt\": [");
    for (int i = 0; i < 3; i++) {
        size_t n = 0;
        int32_t *ids = tokenize(texts[i], &n);
        struct kt_buf one = {0};
        kt_buf_puts(&one, "{\"prompt\": [");
        ids_json(&one, ids, n);
        kt_buf_puts(&one, "], \"max_tokens\": 1, \"logprobs\": 1, \"echo\": true, \"temperature\": 0}");
        alone[i] = complete(s, kt_buf_str(&one));
        kt_buf_puts(&list, i ? ", " : "");
        ids_json(&list, ids, n);
        kt_buf_free(&one);
        free(ids);
    }
    kt_buf_puts(&list, "], \"max_tokens\": 1, \"logprobs\": 1, \"echo\": true, \"temperature\": 0, \"n\": 2}");
    json_t *j = complete(s, kt_buf_str(&list));
    KT_CHECK(json_array_size(json_object_get(j, "choices")) == 6, "3 prompts x n 2: %zu choices",
             json_array_size(json_object_get(j, "choices")));
    json_int_t prompt_tokens = 0;
    for (size_t k = 0; j && k < 6; k++) {
        const json_t *c = choice(j, k), *a = choice(alone[k / 2], 0);
        KT_CHECK(json_integer_value(json_object_get(c, "index")) == (json_int_t)k, "choice %zu has index %lld", k,
                 (long long)json_integer_value(json_object_get(c, "index")));
        KT_CHECK(same_logprobs(json_object_get(c, "logprobs"), json_object_get(a, "logprobs")) &&
                     json_equal(json_object_get(c, "text"), json_object_get(a, "text")),
                 "choice %zu (prompt %zu) differs from that prompt alone", k, k / 2);
        if (k % 2 == 0)
            prompt_tokens +=
                json_integer_value(json_object_get(json_object_get(alone[k / 2], "usage"), "prompt_tokens"));
    }
    KT_CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")) == prompt_tokens &&
                 json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")) == 6,
             "usage sums the prompts");
    /* the same prompt again, now in the prefix cache: scored in full, the same numbers */
    json_t *again = complete(s, "{\"prompt\": \"Fog so thick the gulls walked.\", \"max_tokens\": 1, \"logprobs\": 1, "
                                "\"echo\": true, \"temperature\": 0}");
    KT_CHECK(same_logprobs(json_object_get(choice(again, 0), "logprobs"),
                           json_object_get(choice(alone[0], 0), "logprobs")),
             "a cached prompt is scored the same");
    KT_CHECK(json_integer_value(json_object_get(json_object_get(json_object_get(again, "usage"), "prompt_tokens_details"),
                                                "cached_tokens")) == 0,
             "a prompt to score takes nothing from the prefix cache");
    json_decref(again);
    for (int i = 0; i < 3; i++)
        json_decref(alone[i]);
    json_decref(j);
    kt_buf_free(&list);
}

/* vLLM's prompt_logprobs: [null, {"id": {logprob, rank, decoded_token}}...],
 * the prompt token first with its rank, then the alternatives ranked 1, 2. */
static void check_prompt_logprobs(const json_t *pl, const int32_t *ids, size_t n, const float *logits,
                                  const char *what)
{
    KT_CHECK(json_array_size(pl) == n && json_is_null(json_array_get(pl, 0)), "%s: %zu entries for %zu tokens", what,
             json_array_size(pl), n);
    for (size_t p = 1; p < n && p < json_array_size(pl); p++) {
        const float *row = logits + (p - 1) * g_vocab;
        const json_t *d = json_array_get(pl, p);
        char key[16];
        snprintf(key, sizeof key, "%d", ids[p]);
        const json_t *e = json_object_get(d, key);
        KT_CHECK(e && fabs(json_number_value(json_object_get(e, "logprob")) - log_softmax(row, ids[p])) < 1e-4,
                 "%s: position %zu's token", what, p);
        uint32_t rank = rank_of(row, ids[p]);
        json_int_t got = json_integer_value(json_object_get(e, "rank"));
        KT_CHECK(got == (json_int_t)rank || (rank <= 2 && got <= 2), "%s: position %zu: rank %lld, want %u", what, p,
                 (long long)got, rank);
        KT_CHECK(json_is_string(json_object_get(e, "decoded_token")) && json_object_size(d) >= 2 &&
                     json_object_size(d) <= 3,
                 "%s: position %zu: %zu entries", what, p, json_object_size(d));
        const char *k;
        const json_t *x;
        int ranked1 = 0;
        json_object_foreach((json_t *)d, k, x) ranked1 += json_integer_value(json_object_get(x, "rank")) == 1;
        KT_CHECK(ranked1 == 1, "%s: position %zu: one entry ranked 1", what, p);
    }
}

static void prompt_logprobs_in_vllms_shape(const struct test_server *s)
{
    size_t n = 0;
    int32_t *ids = tokenize(long_prompt, &n);
    float *logits = ids ? engine_logits(ids, n) : NULL;
    struct kt_buf body = {0};
    kt_buf_printf(&body, "{\"prompt\": \"%s\", \"max_tokens\": 0, \"prompt_logprobs\": 2}", long_prompt);
    json_t *j = logits ? complete(s, kt_buf_str(&body)) : NULL;
    const json_t *c = choice(j, 0);
    KT_CHECK(json_is_null(json_object_get(c, "logprobs")) &&
                 strcmp(json_string_value(json_object_get(c, "text")), "") == 0,
             "without echo and logprobs: no text, no logprobs");
    if (j)
        check_prompt_logprobs(json_object_get(c, "prompt_logprobs"), ids, n, logits, "completions");
    json_decref(j);
    free(logits), free(ids);
    kt_buf_free(&body);

    /* chat: the rendered prompt's, on the response (as vLLM puts it) */
    int code = 0;
    j = post(s, "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"Read the barometer.\"}], "
                                        "\"max_tokens\": 1, \"temperature\": 0, \"prompt_logprobs\": 1}", &code);
    const json_t *pl = json_object_get(j, "prompt_logprobs");
    KT_CHECK(code == 200 && json_array_size(pl) ==
                                (size_t)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")) &&
                 json_is_null(json_array_get(pl, 0)) && json_is_object(json_array_get(pl, 1)),
             "chat prompt_logprobs: %d, %zu entries", code, json_array_size(pl));
    json_decref(j);
}

/* text_offset counts code points (as vLLM counts Python str length): on a
 * Chinese prompt a CJK token advances it by 1, not by its 3 bytes, and the
 * offsets index the echoed text. */
static void text_offset_counts_characters(const struct test_server *s)
{
    const char *text = "天气的，天气。的天气。";
    struct kt_buf body = {0};
    kt_buf_printf(&body, "{\"prompt\": \"%s\", \"max_tokens\": 1, \"logprobs\": 0, \"echo\": true, \"temperature\": 0}",
                  text);
    json_t *j = complete(s, kt_buf_str(&body));
    const json_t *c = choice(j, 0), *tokens = lp_field(c, "tokens"), *offsets = lp_field(c, "text_offset");
    const size_t n = json_array_size(tokens);
    KT_CHECK(n > 2 && json_array_size(offsets) == n, "%zu tokens, %zu offsets", n, json_array_size(offsets));
    size_t multibyte = 0;
    struct kt_buf all = {0}, after_first = {0}; /* the prompt tokens' texts from the first, and after it (a BOS) */
    for (size_t i = 0; i + 1 < n && json_array_size(offsets) == n; i++) {
        const char *t = json_string_value(json_array_get(tokens, i));
        const json_int_t step = json_integer_value(json_array_get(offsets, i + 1)) -
                                json_integer_value(json_array_get(offsets, i));
        KT_CHECK(step == (json_int_t)code_points(t), "token %zu '%s': offset step %lld, %zu code points", i, t,
                 (long long)step, code_points(t));
        multibyte += strlen(t) > code_points(t) && !strstr(t, "\xEF\xBF\xBD"); /* a whole character, not a piece */
        kt_buf_puts(&all, t);
        if (i > 0)
            kt_buf_puts(&after_first, t);
    }
    KT_CHECK(multibyte > 0, "some token holds a whole multi-byte character");
    /* this prompt's tokens are whole characters (kt-synth's vocabulary is fixed): they spell it (after a BOS
     * where the model adds one), and each offset, less the first's, is the token's place in the text */
    const int first = strcmp(kt_buf_str(&all), text) == 0 ? 0 : strcmp(kt_buf_str(&after_first), text) == 0 ? 1 : -1;
    KT_CHECK(first >= 0, "the tokens spell the prompt: '%s'", kt_buf_str(&all));
    if (first >= 0) {
        const json_int_t base = json_integer_value(json_array_get(offsets, (size_t)first));
        size_t at = 0;
        for (size_t i = (size_t)first; i + 1 < n; i++) {
            KT_CHECK(json_integer_value(json_array_get(offsets, i)) - base == (json_int_t)at,
                     "token %zu starts at code point %zu of the text", i, at);
            at += code_points(json_string_value(json_array_get(tokens, i)));
        }
        KT_CHECK(at == code_points(text) && strlen(text) > 2 * at, "%zu code points in %zu bytes", at, strlen(text));
    }
    json_decref(j);
    kt_buf_free(&body), kt_buf_free(&all), kt_buf_free(&after_first);
}

/* A streamed echo carries the prompt's logprobs in its first chunk; the
 * generated tokens' text_offset goes on from there; a list of prompts
 * streams every choice and one [DONE]. */
static void a_streamed_echo_carries_the_prompts_logprobs(const struct test_server *s)
{
    struct kt_buf out = {0};
    int code = http(s, "-N", "/v1/completions",
                    "{\"prompt\": [\"Fog so thick the gulls walked.\", \"Hot.\"], \"max_tokens\": 2, \"logprobs\": 1, "
                    "\"echo\": true, \"temperature\": 0, \"ignore_eos\": true, \"stream\": true, "
                    "\"stream_options\": {\"include_usage\": true}}",
                    &out, NULL);
    KT_CHECK(code == 200, "stream: %d", code);
    size_t seen[2] = {0}, n_done = 0, n_usage = 0;
    json_int_t next_offset[2] = {0};
    bool first_null[2] = {false};
    for (const char *line = kt_buf_str(&out); line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        if (strncmp(line + 6, "[DONE]", 6) == 0) {
            n_done++;
            continue;
        }
        json_error_t je;
        json_t *j = json_loadb(line + 6, strcspn(line + 6, "\n"), 0, &je);
        n_usage += json_is_object(json_object_get(j, "usage"));
        const json_t *c = choice(j, 0);
        const json_int_t index = json_integer_value(json_object_get(c, "index"));
        const json_t *offsets = lp_field(c, "text_offset");
        if (c && index >= 0 && index < 2 && json_array_size(offsets)) {
            if (seen[index] == 0)
                first_null[index] = json_is_null(json_array_get(lp_field(c, "token_logprobs"), 0));
            KT_CHECK(json_integer_value(json_array_get(offsets, 0)) == next_offset[index],
                     "choice %lld: a chunk's text_offset starts at %lld, after %lld", (long long)index,
                     (long long)json_integer_value(json_array_get(offsets, 0)), (long long)next_offset[index]);
            const json_t *tokens = lp_field(c, "tokens");
            size_t last = json_array_size(tokens) - 1;
            next_offset[index] = json_integer_value(json_array_get(offsets, last)) +
                                 (json_int_t)code_points(json_string_value(json_array_get(tokens, last)));
            seen[index] += json_array_size(tokens);
        }
        json_decref(j);
    }
    size_t n0 = 0, n1 = 0;
    free(tokenize("Fog so thick the gulls walked.", &n0));
    free(tokenize("Hot.", &n1));
    KT_CHECK(seen[0] == n0 + 2 && seen[1] == n1 + 2, "tokens streamed: %zu and %zu, want %zu and %zu", seen[0],
             seen[1], n0 + 2, n1 + 2);
    KT_CHECK(first_null[0] && first_null[1], "each echo starts with the first prompt token's null");
    KT_CHECK(n_done == 1 && n_usage == 1, "one usage chunk and one [DONE]: %zu, %zu", n_usage, n_done);
    kt_buf_free(&out);
}

static void expect_400(const struct test_server *s, const char *path, const char *body, const char *param,
                       const char *says)
{
    int code = 0;
    json_t *j = post(s, path, body, &code);
    const json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    KT_CHECK(code == 400 && strcmp(json_string_value(json_object_get(e, "param")) ? json_string_value(json_object_get(
                                                                                        e, "param"))
                                                                                  : "",
                                   param) == 0 &&
                 msg && strstr(msg, says),
             "%s: %d, param %s, '%s' (want '%s')", body, code, json_string_value(json_object_get(e, "param")),
             msg ? msg : "", says);
    json_decref(j);
}

static void bad_inputs_are_400s_naming_the_problem(const struct test_server *s)
{
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\": [[1, 2], [3, %u]], \"max_tokens\": 1}", g_vocab);
    char says[64];
    snprintf(says, sizeof says, "prompt[1][1]: token id %u is outside the vocabulary", g_vocab);
    expect_400(s, "/v1/completions", body, "prompt", says);
    snprintf(body, sizeof body, "{\"prompt\": [1, 2, %u], \"max_tokens\": 1}", g_vocab + 7);
    snprintf(says, sizeof says, "prompt[2]: token id %u", g_vocab + 7);
    expect_400(s, "/v1/completions", body, "prompt", says);
    expect_400(s, "/v1/completions", "{\"prompt\": []}", "prompt", "empty list");
    expect_400(s, "/v1/completions", "{\"prompt\": [[1], []]}", "prompt", "prompt[1] is an empty list");
    expect_400(s, "/v1/completions", "{\"prompt\": [\"a\", [1, 2]]}", "prompt",
               "prompt[1] is an array, but prompt[0] is a string");
    expect_400(s, "/v1/completions", "{\"prompt\": [[1, 2], 3]}", "prompt", "prompt[1] is an integer");
    expect_400(s, "/v1/completions", "{\"prompt\": \"x\", \"prompt_logprobs\": 1, \"stream\": true}", "prompt_logprobs",
               "stream");
    expect_400(s, "/v1/completions", "{\"prompt\": \"x\", \"prompt_logprobs\": -1}", "prompt_logprobs", "-1");
    expect_400(s, "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 0}",
               "max_tokens", "max_tokens");
    /* more prompts than the queue holds (--max-waiting 8) */
    expect_400(s, "/v1/completions", "{\"prompt\": [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\"]}",
               "prompt", "--max-waiting");
}

int main(void)
{
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    snprintf(g_path, sizeof g_path, "%s", kt_test_path("completions-tiny.gguf"));
    if (!make_model(g_path, "tiny", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    kt_err err = {0};
    if (kt_model_open(g_path, &g_model, &err) != KT_OK || kt_tokenizer_create(g_model->gguf, &g_tok, &err) != KT_OK) {
        KT_CHECK(false, "%s: %s", g_path, err.msg);
        return kt_test_finish();
    }
    g_vocab = g_model->hp.n_vocab;
    struct test_server s;
    if (server_start(&s, g_path, "-t 2 -q --kv-type f32 --max-seqs 4 --ctx 512 --max-batch-tokens 16 --max-waiting 8", true)) {
        RUN_WITH(echo_logprobs_are_the_engines_log_softmax, &s);
        RUN_WITH(a_continuation_scores_the_same_as_text_or_ids, &s);
        RUN_WITH(a_list_of_prompts_matches_one_at_a_time, &s);
        RUN_WITH(prompt_logprobs_in_vllms_shape, &s);
        RUN_WITH(text_offset_counts_characters, &s);
        RUN_WITH(a_streamed_echo_carries_the_prompts_logprobs, &s);
        RUN_WITH(bad_inputs_are_400s_naming_the_problem, &s);
        KT_CHECK(server_stop(&s) == 0, "exit status");
    }
    kt_tokenizer_destroy(g_tok);
    kt_model_close(g_model);
    unlink(g_path);
    return kt_test_finish();
}
