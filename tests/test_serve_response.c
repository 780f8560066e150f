/*
 * test_serve_response.c - a response says what ended its job: a choice the
 * server ended (timed out, cancelled by a hang-up or a shutdown, failed in
 * the engine) streams finish_reason "abort" or "error", never "stop", and
 * the stream's error event comes after every choice's end, whichever way
 * the scheduler's publishing and the handler's takes interleave; the whole
 * (non-streamed) response of such a job is the error, with its status.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_response.h"
#include "testlib.h"

/* What the scheduler publishes, done here by hand under the job's lock. */
static void publish_text(struct kt_job *job, uint32_t c, const char *text)
{
    pthread_mutex_lock(&job->mu);
    kt_buf_puts(&job->choices[c].text, text);
    job->choices[c].n_tokens++;
    job->version++;
    pthread_mutex_unlock(&job->mu);
}

static void publish_end(struct kt_job *job, uint32_t c, enum kt_finish f)
{
    pthread_mutex_lock(&job->mu);
    job->choices[c].finish = f;
    if (f == KT_FINISH_ERROR)
        snprintf(job->error, sizeof job->error, "the engine failed");
    job->version++;
    pthread_mutex_unlock(&job->mu);
}

static void publish_done(struct kt_job *job)
{
    pthread_mutex_lock(&job->mu);
    job->done = true;
    job->version++;
    pthread_mutex_unlock(&job->mu);
}

static struct kt_job *make_job(enum kt_api_kind kind, const char *body, struct kt_api_request *r)
{
    struct kt_api_error e;
    KT_CHECK(kt_api_request_parse(kind, body, strlen(body), r, &e), "%s: %s", body, e.message);
    struct kt_prompt prompt = {.max_tokens = 16, .parse_output = kind == KT_API_CHAT};
    return kt_job_create(&prompt, r, 0);
}

static size_t count(const char *text, const char *what)
{
    size_t n = 0;
    for (const char *at = strstr(text, what); at; at = strstr(at + 1, what))
        n++;
    return n;
}

/* How the handler's takes fall against the scheduler's publishing. */
enum interleaving {
    TAKE_END_BEFORE_DONE, /* the choices' ends are streamed before the job is known to be done */
    TAKE_ALL_AT_ONCE,     /* text, ends and done in one take */
    INTERLEAVINGS
};

/* Streams a job of n choices: choice 0 ends with f0, the others with f.
 * Returns the SSE text (malloc'd). */
static char *stream_job(enum kt_api_kind kind, uint32_t n, enum kt_finish f0, enum kt_finish f, enum interleaving how)
{
    char body[256];
    snprintf(body, sizeof body, "{%s, \"stream\": true, \"n\": %u}",
             kind == KT_API_CHAT ? "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]" : "\"prompt\": \"hi\"", n);
    struct kt_api_request r;
    struct kt_job *job = make_job(kind, body, &r);
    struct kt_response w;
    struct kt_buf out = {0};
    KT_CHECK(job && kt_response_init(&w, &r, job, NULL, "id-1", "m"), "set-up");
    if (!job)
        return strdup("");
    for (uint32_t c = 0; c < n; c++)
        publish_text(job, c, "abc");
    if (how == TAKE_END_BEFORE_DONE) {
        kt_response_take(&w);
        KT_CHECK(!kt_response_stream(&w, &out), "not done yet");
    }
    for (uint32_t c = 0; c < n; c++)
        publish_end(job, c, c == 0 ? f0 : f);
    if (how == TAKE_END_BEFORE_DONE) {
        kt_response_take(&w);
        KT_CHECK(!kt_response_stream(&w, &out), "not done yet");
    }
    publish_done(job);
    kt_response_take(&w);
    KT_CHECK(kt_response_stream(&w, &out), "done");
    kt_response_free(&w);
    kt_job_release(job);
    kt_api_request_free(&r);
    char *text = strdup(kt_buf_str(&out));
    kt_buf_free(&out);
    return text;
}

static const char *reason_of(enum kt_finish f)
{
    return f == KT_FINISH_STOP ? "stop" : f == KT_FINISH_LENGTH ? "length" : f == KT_FINISH_ERROR ? "error" : "abort";
}

static void streams_end_with_what_ended_them(void)
{
    const enum kt_finish ends[] = {KT_FINISH_STOP, KT_FINISH_LENGTH, KT_FINISH_TIMEOUT, KT_FINISH_CANCELLED,
                                   KT_FINISH_ERROR};
    const int statuses[] = {0, 0, 504, 503, 500};
    for (int kind = 0; kind < 2; kind++)
        for (uint32_t n = 1; n <= 2; n++)
            for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
                for (int how = 0; how < INTERLEAVINGS; how++) {
                    enum kt_api_kind k = kind ? KT_API_CHAT : KT_API_COMPLETION;
                    /* n = 2: choice 0 stopped on its own, choice 1 ended as ends[i] */
                    enum kt_finish f0 = n == 2 ? KT_FINISH_STOP : ends[i];
                    char *t = stream_job(k, n, f0, ends[i], (enum interleaving)how);
                    char expect[64];
                    snprintf(expect, sizeof expect, "\"finish_reason\":\"%s\"", reason_of(ends[i]));
                    bool failed = statuses[i] != 0;
                    size_t stops = count(t, "\"finish_reason\":\"stop\"");
                    const char *error = strstr(t, "data: {\"error\":");
                    const char *last_finish = NULL;
                    for (const char *at = strstr(t, "\"finish_reason\":\""); at; at = strstr(at + 1, "\"finish_reason\":\""))
                        last_finish = at;
                    size_t len = strlen(t);
                    KT_CHECK(count(t, expect) == (n == 2 && ends[i] == KT_FINISH_STOP ? 2 : 1) &&
                                 stops == (size_t)((n == 2) + (ends[i] == KT_FINISH_STOP)),
                             "kind %d, n %u, %s, interleaving %d: finish reasons:\n%s", kind, n,
                             kt_finish_name(ends[i]), how, t);
                    KT_CHECK(count(t, kind ? "\"content\":\"abc\"" : "\"text\":\"abc\"") == n,
                             "kind %d, n %u, %s, interleaving %d: the text before the end is lost:\n%s", kind, n,
                             kt_finish_name(ends[i]), how, t);
                    KT_CHECK(failed == (error != NULL) && (!error || (last_finish && last_finish < error)),
                             "kind %d, n %u, %s, interleaving %d: the error event must follow every end:\n%s", kind,
                             n, kt_finish_name(ends[i]), how, t);
                    KT_CHECK(len > 14 && strcmp(t + len - 14, "data: [DONE]\n\n") == 0, "no [DONE] last:\n%s", t);
                    free(t);
                }
}

static void whole_responses_of_ended_jobs_are_errors(void)
{
    const enum kt_finish ends[] = {KT_FINISH_TIMEOUT, KT_FINISH_CANCELLED, KT_FINISH_ERROR, KT_FINISH_LENGTH};
    const int statuses[] = {504, 503, 500, 200};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        struct kt_api_request r;
        struct kt_job *job = make_job(KT_API_COMPLETION, "{\"prompt\": \"hi\"}", &r);
        struct kt_response w;
        if (!job || !kt_response_init(&w, &r, job, NULL, "id-2", "m")) {
            KT_CHECK(false, "set-up");
            return;
        }
        publish_text(job, 0, "abc");
        publish_end(job, 0, ends[i]);
        publish_done(job);
        kt_response_take(&w);
        struct kt_api_error e;
        json_t *j = kt_response_final(&w, &e);
        char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
        KT_CHECK(statuses[i] == 200 ? j && strstr(text, "\"finish_reason\":\"length\"")
                                    : !j && e.http_status == statuses[i],
                 "%s: %s / status %d", kt_finish_name(ends[i]), text ? text : "(error)", j ? 200 : e.http_status);
        free(text);
        json_decref(j);
        kt_response_free(&w);
        kt_job_release(job);
        kt_api_request_free(&r);
    }
}

int main(void)
{
    KT_RUN(streams_end_with_what_ended_them);
    KT_RUN(whole_responses_of_ended_jobs_are_errors);
    return kt_test_finish();
}
