/*
 * test_kt_serve_kvpool.c - kt-serve's KV pool from --kv-memory, over real
 * HTTP: the start-up log says the pool and the context it gives (the
 * largest one sequence fits when the model's does not); eight greedy
 * streams at once through a pool that holds about one of them each get
 * exactly the text they get alone, no token lost or repeated, while
 * /metrics and /kt/stats count preemptions and the pool's blocks; a prompt
 * longer than the whole pool is refused with 413.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve_harness.h"

#define N_REQ 8
#define MAX_TOKENS 40
/* tiny: 4 layers x (128 + 16) floats x 4 bytes x 16 positions = 36 KiB a block: 0.43 MiB is 12 blocks, 192
 * positions, room for one of these requests at a time (prompt and output: at most 60 positions) and not four */
#define KV_MIB "0.43"

static char model[1024];

static const char *const prompts[N_REQ] = {
    "The river runs to the sea and",
    "Once upon a time in a land far away, there lived a king who",
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "Hello",
    "Rivers and mountains, oceans and plains: the world is wide and",
    "A",
    "The river runs to the sea and the sea runs to",
    "Seven small birds sat on a wire",
};

static char *read_text(const char *path)
{
    size_t len;
    char *t = kt_test_read_file(path, &len);
    return t ? t : strdup("");
}

static void body_for(char *out, size_t size, int i, bool stream)
{
    snprintf(out, size, "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true, "
                        "\"stream\": %s}", prompts[i], MAX_TOKENS, stream ? "true" : "false");
}

/* The text of a completions SSE stream: every chunk's choices[0].text in order; *chunks counts them. */
static char *stream_text(const char *sse, int *chunks, bool *done)
{
    struct kt_buf text = {0};
    *chunks = 0;
    *done = false;
    for (const char *line = sse; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        if (strncmp(line + 6, "[DONE]", 6) == 0) {
            *done = true;
            continue;
        }
        const char *end = strchr(line, '\n');
        json_error_t je;
        json_t *j = json_loadb(line + 6, end ? (size_t)(end - line - 6) : strlen(line + 6), 0, &je);
        const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
        if (t) {
            kt_buf_append(&text, t, strlen(t));
            ++*chunks;
        }
        json_decref(j);
    }
    char *s = strdup(kt_buf_str(&text));
    kt_buf_free(&text);
    return s;
}

static void the_log_says_the_pool_and_the_context_it_gives(void)
{
    struct test_server s;
    if (!server_start(&s, model, "-t 2 -q --kv-type f32 --max-seqs 4 --kv-memory " KV_MIB, true))
        return;
    size_t len;
    char *log = kt_test_read_file(s.log, &len);
    KT_CHECK(log && strstr(log, "KV cache: ") && strstr(log, "12 blocks of 16 positions") && strstr(log, "--kv-memory") &&
                 strstr(log, "--ctx 192, the largest one sequence fits in the pool"),
             "log: %s", log ? log : "(none)");
    free(log);
    struct kt_buf out = {0};
    KT_CHECK(http(&s, NULL, "/v1/models", NULL, &out, NULL) == 200 && strstr(kt_buf_str(&out), "192"),
             "/v1/models: %s", kt_buf_str(&out));
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

static void concurrent_streams_through_a_small_pool_match_each_alone(void)
{
    struct test_server s;
    if (!server_start(&s, model, "-t 2 -q --kv-type f32 --max-seqs 4 --max-batch-tokens 32 --prefix-cache 2 --ctx 1024 "
                                 "--kv-memory " KV_MIB, true))
        return;
    char body[1024], *alone[N_REQ];
    struct kt_buf out = {0};
    for (int i = 0; i < N_REQ; i++) { /* one at a time: each fits the pool alone */
        body_for(body, sizeof body, i, false);
        int code = http(&s, NULL, "/v1/completions", body, &out, NULL);
        json_error_t je;
        json_t *j = json_loads(kt_buf_str(&out), 0, &je);
        const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
        KT_CHECK(code == 200 && t, "alone %d: %d %s", i, code, kt_buf_str(&out));
        alone[i] = strdup(t ? t : "");
        json_decref(j);
    }
    const double before = server_metric(&s, "kt:preemptions_total{");
    KT_CHECK(before == 0, "one request at a time preempted %g", before);

    /* all at once, streamed, each its own curl */
    char cmd[16384] = "";
    for (int i = 0; i < N_REQ; i++) {
        char path[1024], req[1024];
        snprintf(req, sizeof req, "%s", kt_test_path("kvpool-req"));
        snprintf(req + strlen(req), sizeof req - strlen(req), "%d.json", i);
        snprintf(path, sizeof path, "%s", kt_test_path("kvpool-out"));
        body_for(body, sizeof body, i, true);
        FILE *f = fopen(req, "wb");
        if (f) {
            fputs(body, f);
            fclose(f);
        }
        snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd),
                 "curl -sN --max-time 300 -o %s%d.sse -H 'Content-Type: application/json' --data-binary @%s "
                 "http://127.0.0.1:%d/v1/completions & ",
                 path, i, req, s.port);
    }
    snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "wait");
    KT_CHECK(kt_test_system("%s", cmd) == 0, "curl");
    for (int i = 0; i < N_REQ; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s%d.sse", kt_test_path("kvpool-out"), i);
        char *sse = read_text(path);
        int chunks;
        bool done;
        char *text = stream_text(sse, &chunks, &done);
        KT_CHECK(done && strcmp(text, alone[i]) == 0, "stream %d: '%s' under pressure, '%s' alone (%d chunks)%s", i,
                 text, alone[i], chunks, done ? "" : ", no [DONE]");
        free(text);
        free(sse);
        unlink(path);
        snprintf(path, sizeof path, "%s%d.json", kt_test_path("kvpool-req"), i);
        unlink(path);
        free(alone[i]);
    }
    KT_CHECK(wait_idle(&s, 30), "the server did not go idle");
    const double preempted = server_metric(&s, "kt:preemptions_total{");
    KT_CHECK(preempted > 0 && server_metric(&s, "vllm:num_preemptions_total{") == preempted,
             "preemptions: kt %g, vllm %g", preempted, server_metric(&s, "vllm:num_preemptions_total{"));
    const double used = server_metric(&s, "kt:kv_cache_blocks_used{"), free_blocks = server_metric(&s, "kt:kv_cache_blocks_free{");
    KT_CHECK(used + free_blocks == 12 && server_metric(&s, "kt:kv_cache_block_tokens{") == 16,
             "blocks: %g used, %g free", used, free_blocks);
    printf("  %g preemptions for %d streams\n", preempted, N_REQ);

    KT_CHECK(http(&s, NULL, "/kt/stats", NULL, &out, NULL) == 200, "/kt/stats");
    json_error_t je;
    json_t *j = json_loads(kt_buf_str(&out), 0, &je);
    json_t *kv = json_object_get(j, "kv_cache");
    KT_CHECK(json_integer_value(json_object_get(j, "preemptions_total")) == (json_int_t)preempted &&
                 json_integer_value(json_object_get(kv, "blocks")) == 12 &&
                 json_integer_value(json_object_get(kv, "block_tokens")) == 16,
             "/kt/stats: %s", kt_buf_str(&out));
    json_decref(j);

    /* a prompt the whole pool cannot hold: 413, named as such (the context, 1024, would take it) */
    struct kt_buf prompt = {0};
    for (int i = 0; i < 120; i++)
        kt_buf_printf(&prompt, "w%d ", i);
    char big[4096];
    snprintf(big, sizeof big, "{\"prompt\": \"%s\", \"max_tokens\": 4}", kt_buf_str(&prompt));
    kt_buf_free(&prompt);
    int code = http(&s, NULL, "/v1/completions", big, &out, NULL);
    KT_CHECK(code == 413 && strstr(kt_buf_str(&out), "kv_cache_exceeded") && strstr(kt_buf_str(&out), "192 positions"),
             "a prompt over the pool: %d %s", code, kt_buf_str(&out));
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

int main(void)
{
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    snprintf(model, sizeof model, "%s", kt_test_path("kvpool-tiny.gguf"));
    if (!make_model(model, "tiny", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    KT_RUN(the_log_says_the_pool_and_the_context_it_gives);
    KT_RUN(concurrent_streams_through_a_small_pool_match_each_alone);
    unlink(model);
    return kt_test_finish();
}
