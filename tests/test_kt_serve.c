/*
 * test_kt_serve.c - kt-serve end to end over real HTTP, with curl: /health
 * reports load progress then ready; the info endpoints; every error case
 * answers the OpenAI envelope with the right status and parameter (400, 401,
 * 404, 405, 413, 429 with Retry-After); chat and text completions, streamed
 * and not; Kimi and DeepSeek tool calls and reasoning parsed from the
 * generated text; ": ping" during a long prefill and in the queue; clients
 * that hang up are cancelled, and the HTTP layer logs nothing; a timed-out
 * or drained stream ends with "abort" and an error event; SIGTERM lets a
 * running stream finish and exits 0, a second SIGTERM quits at once.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "profile.h"
#include "serve_harness.h"

static char kimi[1024], deepseek[1024], big[1024];

static json_t *parse(const struct kt_buf *b)
{
    json_error_t je;
    json_t *j = json_loads(kt_buf_str(b), 0, &je);
    KT_CHECK(j != NULL, "not JSON: %.300s", kt_buf_str(b));
    return j;
}

/* Expects status and an error envelope naming param (NULL: null) and code (NULL: any). */
static void expect_error(const struct test_server *s, const char *args, const char *path, const char *body,
                         int status, const char *param, const char *code)
{
    struct kt_buf out = {0};
    int got = http(s, args, path, body, &out, NULL);
    KT_CHECK(got == status, "%s %.80s: status %d, expected %d: %.300s", path, body ? body : "", got, status,
             kt_buf_str(&out));
    json_t *j = parse(&out);
    json_t *e = json_object_get(j, "error");
    KT_CHECK(json_is_string(json_object_get(e, "message")) && json_is_string(json_object_get(e, "type")),
             "no envelope: %.300s", kt_buf_str(&out));
    json_t *p = json_object_get(e, "param");
    if (param)
        KT_CHECK(json_is_string(p) && strcmp(json_string_value(p), param) == 0, "param: %.300s", kt_buf_str(&out));
    else
        KT_CHECK(json_is_null(p), "param should be null: %.300s", kt_buf_str(&out));
    if (code)
        KT_CHECK(json_is_string(json_object_get(e, "code")) &&
                     strcmp(json_string_value(json_object_get(e, "code")), code) == 0,
                 "code: %.300s", kt_buf_str(&out));
    json_decref(j);
    kt_buf_free(&out);
}

static void health_reports_loading_progress_then_ready(void)
{
    struct test_server s;
    if (!server_start(&s, big, "-t 2 -q", false))
        return;
    bool saw_loading = false, ready = false;
    struct kt_buf out = {0};
    for (double t0 = harness_now(); harness_now() - t0 < 120 && !ready;) {
        int code = http(&s, NULL, "/health", NULL, &out, NULL);
        if (code == 503) {
            json_t *j = parse(&out);
            const char *status = json_string_value(json_object_get(j, "status"));
            double progress = json_number_value(json_object_get(j, "progress"));
            KT_CHECK(status && strcmp(status, "loading") == 0 && progress >= 0 && progress <= 1, "%s",
                     kt_buf_str(&out));
            saw_loading = true;
            json_decref(j);
            int models = http(&s, NULL, "/v1/models", NULL, &out, NULL); /* 200 only if loading just ended */
            KT_CHECK(models == 503 || (models == 200 && http(&s, NULL, "/health", NULL, NULL, NULL) == 200),
                     "models while loading: %d", models);
        }
        ready = code == 200;
    }
    KT_CHECK(saw_loading && ready, "loading seen %d, ready %d", saw_loading, ready);
    KT_CHECK(server_stop(&s) == 0, "exit status");
    kt_buf_free(&out);
}

static void info_endpoints(const struct test_server *s)
{
    struct kt_buf out = {0};
    KT_CHECK(http(s, NULL, "/health", NULL, &out, NULL) == 200, "health");
    KT_CHECK(http(s, NULL, "/version", NULL, &out, NULL) == 200 && strstr(kt_buf_str(&out), "\"version\""), "version");
    KT_CHECK(http(s, NULL, "/v1/models", NULL, &out, NULL) == 200 && strstr(kt_buf_str(&out), "\"id\":\"kimi\""),
             "models: %s", kt_buf_str(&out));
    KT_CHECK(http(s, NULL, "/v1/models/kimi", NULL, &out, NULL) == 200, "one model");
    KT_CHECK(http(s, NULL, "/tokenize", "{\"prompt\": \"hello world\"}", &out, NULL) == 200 &&
                 strstr(kt_buf_str(&out), "\"count\":"),
             "tokenize: %s", kt_buf_str(&out));
    KT_CHECK(http(s, NULL, "/tokenize", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &out, NULL) ==
                 200, "tokenize messages: %s", kt_buf_str(&out));
    KT_CHECK(http(s, NULL, "/detokenize", "{\"tokens\": [104, 105]}", &out, NULL) == 200 &&
                 strstr(kt_buf_str(&out), "\"prompt\":"),
             "detokenize: %s", kt_buf_str(&out));
    KT_CHECK(http(s, NULL, "/metrics", NULL, &out, NULL) == 200 &&
                 strstr(kt_buf_str(&out), "vllm:num_requests_running{model_name=\"kimi\"}") &&
                 strstr(kt_buf_str(&out), "vllm:time_to_first_token_seconds_bucket") &&
                 strstr(kt_buf_str(&out), "kt:place_routed_share"),
             "metrics");
    kt_buf_free(&out);
}

static const char *const chat_hi = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4";

static void error_cases(const struct test_server *s)
{
    char body[512];
    const char *c = "/v1/chat/completions";
    expect_error(s, NULL, c, "{", 400, NULL, NULL);
    expect_error(s, NULL, c, "[1, 2]", 400, NULL, NULL);
    expect_error(s, NULL, c, "{\"max_tokens\": 4}", 400, "messages", NULL);
    snprintf(body, sizeof body, "%s, \"temperature\": 5}", chat_hi);
    expect_error(s, NULL, c, body, 400, "temperature", NULL);
    snprintf(body, sizeof body, "%s, \"top_p\": \"high\"}", chat_hi);
    expect_error(s, NULL, c, body, 400, "top_p", NULL);
    snprintf(body, sizeof body, "%s, \"stop\": [1]}", chat_hi);
    expect_error(s, NULL, c, body, 400, "stop", NULL);
    snprintf(body, sizeof body, "%s, \"top_logprobs\": 3}", chat_hi);
    expect_error(s, NULL, c, body, 400, "top_logprobs", NULL);
    /* vLLM's extensions kt does not carry out are refused, never ignored; their no-op values pass */
    snprintf(body, sizeof body, "%s, \"continue_final_message\": true}", chat_hi);
    expect_error(s, NULL, c, body, 400, "continue_final_message", NULL);
    snprintf(body, sizeof body, "%s, \"prompt_logprobs\": -1}", chat_hi); /* the whole vocabulary: not carried out */
    expect_error(s, NULL, c, body, 400, "prompt_logprobs", NULL);
    expect_error(s, NULL, "/v1/completions", "{\"prompt\": \"x\", \"min_tokens\": 4}", 400, "min_tokens", NULL);
    {
        struct kt_buf ok = {0};
        snprintf(body, sizeof body, "%s, \"continue_final_message\": false, "
                 "\"skip_special_tokens\": true, \"stop_token_ids\": []}", chat_hi);
        KT_CHECK(http(s, NULL, c, body, &ok, NULL) == 200, "no-op values of the extensions pass: %s",
                 ok.bytes ? ok.bytes : "");
        kt_buf_free(&ok);
    }
    snprintf(body, sizeof body, "%s, \"stream_options\": {\"include_usage\": true}}", chat_hi);
    expect_error(s, NULL, c, body, 400, "stream_options", NULL);
    snprintf(body, sizeof body, "%s, \"n\": 3}", chat_hi);
    expect_error(s, NULL, c, body, 400, "n", NULL); /* more choices than --max-seqs 2 */
    snprintf(body, sizeof body, "%s, \"response_format\": {\"type\": \"grammar\"}}", chat_hi);
    expect_error(s, NULL, c, body, 400, "response_format", NULL);
    snprintf(body, sizeof body, "%s, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
                                "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}}", chat_hi);
    expect_error(s, NULL, c, body, 400, "tool_choice", NULL);
    snprintf(body, sizeof body, "%s, \"logit_bias\": {\"99999999\": 5}}", chat_hi);
    expect_error(s, NULL, c, body, 400, "logit_bias", NULL);
    expect_error(s, NULL, c, "{\"messages\": [{\"role\": \"robot\", \"content\": \"hi\"}]}", 400, "messages", NULL);
    snprintf(body, sizeof body, "%s, \"model\": \"gpt-4o\"}", chat_hi);
    expect_error(s, NULL, c, body, 404, "model", "model_not_found");
    expect_error(s, NULL, c, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 100000}", 400,
                 "messages", "context_length_exceeded");
    expect_error(s, NULL, "/v1/completions", "{\"prompt\": [\"a\", [2]]}", 400, "prompt", NULL);
    expect_error(s, NULL, "/v1/completions", "{\"prompt\": \"a\", \"suffix\": \"b\"}", 400, "suffix", NULL);
    expect_error(s, NULL, "/v1/nothing", NULL, 404, NULL, "not_found");
    expect_error(s, "-X GET", c, NULL, 405, NULL, NULL);
    /* bodies over --max-body-bytes 16384: declared, and sent chunked */
    struct kt_buf big_body = {0};
    kt_buf_puts(&big_body, "{\"messages\": [{\"role\": \"user\", \"content\": \"");
    for (int i = 0; i < 20000; i++)
        kt_buf_puts(&big_body, "a");
    kt_buf_puts(&big_body, "\"}]}");
    expect_error(s, NULL, c, kt_buf_str(&big_body), 413, NULL, "request_too_large");
    expect_error(s, "-H 'Transfer-Encoding: chunked'", c, kt_buf_str(&big_body), 413, NULL, "request_too_large");
    kt_buf_free(&big_body);
    /* unknown fields are ignored */
    struct kt_buf out = {0};
    snprintf(body, sizeof body, "%s, \"user\": \"u1\", \"metadata\": {\"a\": 1}, \"frobnicate\": [true]}", chat_hi);
    KT_CHECK(http(s, NULL, c, body, &out, NULL) == 200, "unknown fields: %s", kt_buf_str(&out));
    kt_buf_free(&out);
}

static void chat_and_completions(const struct test_server *s)
{
    struct kt_buf out = {0};
    int code = http(s, NULL, "/v1/chat/completions",
                    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                    "\"content\": [{\"type\": \"text\", \"text\": \"Hello\"}]}], \"max_completion_tokens\": 6, "
                    "\"temperature\": 0, \"logprobs\": true, \"top_logprobs\": 2, \"seed\": 3}",
                    &out, NULL);
    json_t *j = parse(&out);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    KT_CHECK(code == 200 && json_is_string(json_object_get(j, "id")) &&
                 strcmp(json_string_value(json_object_get(j, "object")), "chat.completion") == 0,
             "chat: %s", kt_buf_str(&out));
    KT_CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")) <= 6, "usage");
    json_t *lp = json_object_get(json_object_get(choice, "logprobs"), "content");
    KT_CHECK(json_array_size(lp) >= 1 && json_array_size(json_object_get(json_array_get(lp, 0), "top_logprobs")) == 2,
             "logprobs: %s", kt_buf_str(&out));
    json_decref(j);

    code = http(s, NULL, "/v1/completions",
                "{\"prompt\": \"The river\", \"max_tokens\": 5, \"temperature\": 0, \"echo\": true, \"n\": 2}", &out,
                NULL);
    j = parse(&out);
    json_t *choices = json_object_get(j, "choices");
    const char *t0 = json_string_value(json_object_get(json_array_get(choices, 0), "text"));
    const char *t1 = json_string_value(json_object_get(json_array_get(choices, 1), "text"));
    KT_CHECK(code == 200 && t0 && t1 && strncmp(t0, "The river", 9) == 0 && strcmp(t0, t1) == 0,
             "completions (greedy n=2, echo): %s", kt_buf_str(&out));
    json_decref(j);
    kt_buf_free(&out);
}

static void tool_calls_and_reasoning(const struct test_server *s)
{
    struct kt_buf out = {0};
    int code = http(s, NULL, "/v1/chat/completions",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": [{\"type\": "
                    "\"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}}], "
                    "\"kt_test_forced_output\": \"<think>need the tool</think>Checking.<|tool_calls_section_begin|>"
                    "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\\\"city\\\": "
                    "\\\"Paris\\\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>\"}",
                    &out, NULL);
    json_t *j = parse(&out);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    KT_CHECK(code == 200 && strcmp(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls") == 0,
             "%s", kt_buf_str(&out));
    KT_CHECK(json_string_value(json_object_get(msg, "reasoning_content")) &&
                 strcmp(json_string_value(json_object_get(msg, "reasoning_content")), "need the tool") == 0 &&
                 strcmp(json_string_value(json_object_get(msg, "content")), "Checking.") == 0,
             "%s", kt_buf_str(&out));
    KT_CHECK(call && strcmp(json_string_value(json_object_get(call, "id")), "functions.get_weather:0") == 0 &&
                 strcmp(json_string_value(json_object_get(json_object_get(call, "function"), "name")), "get_weather") ==
                     0 &&
                 strcmp(json_string_value(json_object_get(json_object_get(call, "function"), "arguments")),
                        "{\"city\": \"Paris\"}") == 0,
             "%s", kt_buf_str(&out));
    json_decref(j);
    /* thinking off: no reasoning split */
    code = http(s, NULL, "/v1/chat/completions",
                "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": {\"thinking\": "
                "false}, \"kt_test_forced_output\": \"<think>a</think>b<|im_end|>\"}",
                &out, NULL);
    KT_CHECK(code == 200 && strstr(kt_buf_str(&out), "\"content\":\"<think>a</think>b\"") &&
                 !strstr(kt_buf_str(&out), "reasoning_content"),
             "%s", kt_buf_str(&out));
    /* a named tool_choice opens the call in the prompt: the model writes only the arguments */
    code = http(s, NULL, "/v1/chat/completions",
                "{\"messages\": [{\"role\": \"user\", \"content\": \"Rome?\"}], \"tools\": [{\"type\": \"function\", "
                "\"function\": {\"name\": \"get_weather\"}}], \"tool_choice\": {\"type\": \"function\", \"function\": "
                "{\"name\": \"get_weather\"}}, \"kt_test_forced_output\": \"{\\\"city\\\": \\\"Rome\\\"}<|tool_call_end|>"
                "<|tool_calls_section_end|><|im_end|>\"}",
                &out, NULL);
    KT_CHECK(code == 200 && strstr(kt_buf_str(&out), "\"id\":\"functions.get_weather:0\"") &&
                 strstr(kt_buf_str(&out), "\"arguments\":\"{\\\"city\\\": \\\"Rome\\\"}\"") &&
                 strstr(kt_buf_str(&out), "\"finish_reason\":\"tool_calls\""),
             "named tool_choice: %s", kt_buf_str(&out));
    kt_buf_free(&out);
}

static void streaming_pings_and_usage(const struct test_server *s)
{
    struct kt_buf out = {0}, body = {0};
    kt_buf_puts(&body, "{\"messages\": [{\"role\": \"user\", \"content\": \"");
    for (int i = 0; i < 150; i++) /* ~600 tokens: 40 steps of 16 */
        kt_buf_puts(&body, "river stone ");
    /* ignore_eos: which 3 tokens come depends, in the last bits, on how the
     * prompt was chunked (prefix-cache hits left by earlier cases move the
     * chunk boundaries, and each chunk's attention form rounds its own way),
     * and an end-of-generation token among them would end the stream early */
    kt_buf_puts(&body, "\"}], \"max_tokens\": 3, \"ignore_eos\": true, \"stream\": true, "
                       "\"stream_options\": {\"include_usage\": true}}");
    int code = http(s, "-N", "/v1/chat/completions", kt_buf_str(&body), &out, NULL);
    const char *t = kt_buf_str(&out);
    KT_CHECK(code == 200 && strncmp(t, "data: {", 7) == 0, "stream start: %.200s", t);
    KT_CHECK(strstr(t, ": ping\n\n") != NULL, "no ping during a %zu-byte prompt's prefill", body.len);
    KT_CHECK(strstr(t, "\"role\":\"assistant\"") && strstr(t, "\"finish_reason\":\"length\"") &&
                 strstr(t, "\"choices\":[],") && strstr(t, "\"completion_tokens\":3"),
             "stream: %.2000s", t);
    size_t len = strlen(t);
    KT_CHECK(len > 14 && strcmp(t + len - 14, "data: [DONE]\n\n") == 0, "stream end");
    kt_buf_free(&out), kt_buf_free(&body);
}

/* A completions stream waiting behind a full batch sends pings like a chat
 * stream: it used to spin on the job without waiting, and never pinged. */
/* Starts n long requests in the background, one at a time: each next one
 * only once the server has taken the last (--max-waiting 1 turns a second
 * arrival into a 429 while the first still waits to be admitted). True when
 * the server then shows `running` running and `waiting` waiting, as /metrics
 * tells, within 60 s each; the curls' pids are appended to the file `pids`. */
static bool start_long_requests(const struct test_server *s, const char *pids, int n, int running, int waiting)
{
    for (int i = 0; i < n; i++) {
        kt_test_system("curl -s --max-time 120 -o /dev/null -d '{\"prompt\": \"x\", \"max_tokens\": 8000, "
                       "\"ignore_eos\": true}' http://127.0.0.1:%d/v1/completions & echo $! >> %s",
                       s->port, pids);
        int want_running = i + 1 < running ? i + 1 : running, want_waiting = i + 1 - want_running;
        bool there = false;
        for (double t0 = harness_now(); !there && harness_now() - t0 < 60; usleep(20000))
            there = server_metric(s, "vllm:num_requests_running{") == want_running &&
                    server_metric(s, "vllm:num_requests_waiting{") == want_waiting;
        if (!there)
            return false;
    }
    return server_metric(s, "vllm:num_requests_running{") == running &&
           server_metric(s, "vllm:num_requests_waiting{") == waiting;
}

/* Both sequences (--max-seqs 2) are held by long requests, known to run from
 * /metrics rather than guessed from a sleep (a fixed 300 ms failed on loaded
 * hosts: the background curls had not connected yet, and the stream ran at
 * once). The stream then waits in the queue, and pings while it waits; the
 * long requests' clients are killed once it waits, which cancels them. */
static void a_queued_completions_stream_pings(const struct test_server *s)
{
    KT_CHECK(wait_idle(s, 30), "an earlier case left requests running");
    char pids[512];
    snprintf(pids, sizeof pids, "%s", kt_test_path("queued-stream.pids"));
    unlink(pids);
    bool both = start_long_requests(s, pids, 2, 2, 0);
    KT_CHECK(both, "the two long requests did not both run within 60 s");
    /* in the background: once the stream waits in the queue, and has had time to ping, free the sequences */
    kt_test_system("(for i in $(seq 1200); do curl -s http://127.0.0.1:%d/metrics | grep -q "
                   "'^vllm:num_requests_waiting{.*} 1$' && break; sleep 0.05; done; sleep 0.2; kill $(cat %s)) "
                   ">/dev/null 2>&1 &",
                   s->port, pids);
    struct kt_buf out = {0};
    int code = both ? http(s, "-N", "/v1/completions",
                           "{\"prompt\": \"x\", \"max_tokens\": 2, \"ignore_eos\": true, \"stream\": true}", &out, NULL)
                    : 0;
    kt_test_system("kill $(cat %s) 2>/dev/null", pids);
    unlink(pids);
    const char *t = kt_buf_str(&out);
    KT_CHECK(!both || (code == 200 && strncmp(t, ": ping\n\n", 8) == 0 && strstr(t, "\"finish_reason\":\"length\"")),
             "a queued completions stream: %.400s", t);
    KT_CHECK(wait_idle(s, 30), "the long requests are still running");
    kt_buf_free(&out);
}

static long aborted_so_far(const struct test_server *s)
{
    struct kt_buf out = {0};
    http(s, NULL, "/metrics", NULL, &out, NULL);
    const char *at = strstr(kt_buf_str(&out), "finished_reason=\"abort\"} ");
    long n = at ? atol(at + strlen("finished_reason=\"abort\"} ")) : -1;
    kt_buf_free(&out);
    return n;
}

static void full_queue_429_and_hangups_cancel(const struct test_server *s)
{
    long aborted_before = aborted_so_far(s);
    /* two long requests fill --max-seqs 2, a third waits (--max-waiting 1): the next gets 429 */
    char pids[512];
    snprintf(pids, sizeof pids, "%s", kt_test_path("full-queue.pids"));
    unlink(pids);
    KT_CHECK(start_long_requests(s, pids, 3, 2, 1), "two long requests did not run with a third waiting within 60 s");
    struct kt_buf out = {0}, head = {0};
    int code = http(s, NULL, "/v1/completions", "{\"prompt\": \"y\", \"max_tokens\": 2}", &out, &head);
    KT_CHECK(code == 429 && strcasestr(kt_buf_str(&head), "Retry-After:"), "queue full: %d %s", code,
             kt_buf_str(&out));
    /* the clients hang up; their jobs are cancelled and the server is idle again */
    kt_test_system("kill $(cat %s) 2>/dev/null", pids);
    unlink(pids);
    KT_CHECK(wait_idle(s, 30), "requests still running after their clients left");
    KT_CHECK(aborted_so_far(s) == aborted_before + 3, "3 more aborted: %ld, then %ld", aborted_before,
             aborted_so_far(s));
    kt_buf_free(&out), kt_buf_free(&head);
}

/* A client that hangs up - halfway through its request, during a stream,
 * while its whole response is made, or with a reset - is routine: the HTTP
 * layer logs nothing about it (every hang-up used to log an "application
 * error"), and the jobs are cancelled. */
static void client_hangups_log_nothing_alarming(const struct test_server *s)
{
    size_t len = 0;
    char *before = kt_test_read_file(s->log, &len);
    size_t log_start = before ? len : 0;
    free(before);
    double aborted = server_metric(s, "vllm:request_success_total{model_name=\"kimi\",finished_reason=\"abort\"}");

    int fd = raw_connect(s);
    KT_CHECK(fd >= 0 && raw_send(fd, "POST /v1/completions HTTP/1.1\r\nHost: kt\r\nContent-Length: 100\r\n\r\n{\"pro"),
             "half a request");
    usleep(100000);
    close(fd);
    const char *lng = "{\"prompt\": \"x\", \"max_tokens\": 1500, \"ignore_eos\": true%s}";
    char body[256], cmd[1024];
    snprintf(body, sizeof body, lng, ", \"stream\": true");
    snprintf(cmd, sizeof cmd, "curl -sN --max-time 1 -o /dev/null -d '%s' http://127.0.0.1:%d/v1/completions", body,
             s->port);
    kt_test_system("%s", cmd);
    snprintf(body, sizeof body, lng, "");
    snprintf(cmd, sizeof cmd, "curl -s --max-time 1 -o /dev/null -d '%s' http://127.0.0.1:%d/v1/completions", body,
             s->port);
    kt_test_system("%s", cmd);
    /* a stream reset while it flows: the server's next write fails */
    fd = raw_connect(s);
    snprintf(body, sizeof body, lng, ", \"stream\": true");
    char request[512];
    snprintf(request, sizeof request, "POST /v1/completions HTTP/1.1\r\nHost: kt\r\nContent-Type: application/json\r\n"
                                      "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
    KT_CHECK(fd >= 0 && raw_send(fd, request), "a streaming request");
    char buf[512];
    KT_CHECK(fd >= 0 && read(fd, buf, sizeof buf) > 0, "the stream's first bytes");
    struct linger reset = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    close(fd);

    KT_CHECK(wait_idle(s, 30), "requests still running after their clients left");
    double aborted_after = server_metric(s, "vllm:request_success_total{model_name=\"kimi\",finished_reason=\"abort\"}");
    KT_CHECK(aborted_after == aborted + 3, "3 more aborted: %g, then %g", aborted, aborted_after);
    char *log = kt_test_read_file(s->log, &len);
    const char *fresh = log && len >= log_start ? log + log_start : "";
    KT_CHECK(!strstr(fresh, "kt-serve: http:") && !strstr(fresh, "error"), "hang-ups logged:\n%s", fresh);
    free(log);
}

static void api_key_is_required_when_set(void)
{
    struct test_server s;
    if (!server_start(&s, kimi, "-t 2 -q --api-key sesame --served-model-name kimi", true))
        return;
    expect_error(&s, NULL, "/v1/models", NULL, 401, NULL, "invalid_api_key");
    expect_error(&s, "-H 'Authorization: Bearer sesam'", "/v1/models", NULL, 401, NULL, "invalid_api_key");
    struct kt_buf out = {0};
    KT_CHECK(http(&s, "-H 'Authorization: Bearer sesame'", "/v1/models", NULL, &out, NULL) == 200, "with the key");
    KT_CHECK(http(&s, NULL, "/health", NULL, &out, NULL) == 200, "health needs no key");
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

/* --cors-origins: a listed origin's preflight and responses carry
 * Access-Control-Allow-Origin (with Vary), another origin's do not; without
 * the option nobody's do, and a preflight is 204 either way (no key asked). */
static void cors_allows_the_listed_origins_only(void)
{
    struct test_server s;
    if (!server_start(&s, kimi, "-t 2 -q --api-key sesame --cors-origins http://localhost:3000,https://app.example",
                      true))
        return;
    struct kt_buf out = {0}, head = {0};
    const char *pre = "-X OPTIONS -H 'Origin: https://app.example' -H 'Access-Control-Request-Method: POST' "
                      "-H 'Access-Control-Request-Headers: authorization, content-type'";
    KT_CHECK(http(&s, pre, "/v1/chat/completions", NULL, &out, &head) == 204 && head.bytes &&
                 strstr(head.bytes, "Access-Control-Allow-Origin: https://app.example") &&
                 strstr(head.bytes, "Access-Control-Allow-Methods: ") && strstr(head.bytes, "Authorization") &&
                 strstr(head.bytes, "Vary: Origin"),
             "preflight of an allowed origin: %s", head.bytes ? head.bytes : "");
    KT_CHECK(http(&s, "-H 'Origin: http://localhost:3000' -H 'Authorization: Bearer sesame'", "/v1/models", NULL, &out,
                  &head) == 200 && head.bytes && strstr(head.bytes, "Access-Control-Allow-Origin: http://localhost:3000"),
             "a response to an allowed origin: %s", head.bytes ? head.bytes : "");
    KT_CHECK(http(&s, "-H 'Origin: http://localhost:3000'", "/v1/models", NULL, &out, &head) == 401 && head.bytes &&
                 strstr(head.bytes, "Access-Control-Allow-Origin: http://localhost:3000"),
             "an error to an allowed origin carries it too, so the page can read why");
    KT_CHECK(http(&s, "-X OPTIONS -H 'Origin: https://evil.example'", "/v1/chat/completions", NULL, &out, &head) ==
                     204 && head.bytes && !strstr(head.bytes, "Access-Control-Allow-Origin"),
             "preflight of another origin: %s", head.bytes ? head.bytes : "");
    KT_CHECK(http(&s, "-H 'Origin: http://localhost:30001' -H 'Authorization: Bearer sesame'", "/v1/models", NULL,
                  &out, &head) == 200 && head.bytes && !strstr(head.bytes, "Access-Control-Allow-Origin"),
             "an origin that only starts like a listed one");
    KT_CHECK(server_stop(&s) == 0, "exit status");
    if (!server_start(&s, kimi, "-t 2 -q", true))
        goto done;
    KT_CHECK(http(&s, "-X OPTIONS -H 'Origin: http://localhost:3000'", "/v1/models", NULL, &out, &head) == 204 &&
                 head.bytes && !strstr(head.bytes, "Access-Control-Allow-Origin") && strstr(head.bytes, "Allow: "),
             "without --cors-origins: %s", head.bytes ? head.bytes : "");
    KT_CHECK(server_stop(&s) == 0, "exit status");
done:
    kt_buf_free(&out), kt_buf_free(&head);
}

static void metrics_name_the_sim_device_by_its_config_name(void)
{
    struct test_server s;
    char args[1200];
    snprintf(args, sizeof args, "-t 2 -q --served-model-name kimi --placement '%s/configs/tiny-sim.yaml'",
             getenv("KT_SOURCE_DIR") ? getenv("KT_SOURCE_DIR") : ".");
    if (!server_start(&s, kimi, args, true))
        return;
    struct kt_buf out = {0};
    KT_CHECK(http(&s, NULL, "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                  "\"max_tokens\": 2}", &out, NULL) == 200, "chat: %s", kt_buf_str(&out));
    KT_CHECK(http(&s, NULL, "/metrics", NULL, &out, NULL) == 200, "metrics");
    KT_CHECK(strstr(kt_buf_str(&out), "kt:device_busy_seconds_total{model_name=\"kimi\",device=\"sim\"}") &&
                 strstr(kt_buf_str(&out), "kt:place_routed_share{place=\"sim\"}") &&
                 !strstr(kt_buf_str(&out), "device=\"device\""),
             "the sim device is not labelled \"sim\":\n%s", kt_buf_str(&out));
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

static void deepseek_tool_calls(void)
{
    struct test_server s;
    if (!server_start(&s, deepseek, "-t 2 -q --test-forced-output", true))
        return;
    struct kt_buf out = {0};
    int code = http(&s, NULL, "/v1/chat/completions",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"time?\"}], \"tools\": [{\"type\": \"function\", "
                    "\"function\": {\"name\": \"get_time\"}}], \"kt_test_forced_output\": \"<think>hm</think>"
                    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\\n```json\\n{}\\n```"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>\"}",
                    &out, NULL);
    json_t *j = parse(&out);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    KT_CHECK(code == 200 && json_is_null(json_object_get(msg, "content")) &&
                 strcmp(json_string_value(json_object_get(json_object_get(call, "function"), "name")), "get_time") == 0 &&
                 strcmp(json_string_value(json_object_get(json_object_get(call, "function"), "arguments")), "{}") == 0 &&
                 strncmp(json_string_value(json_object_get(call, "id")), "call_", 5) == 0,
             "%s", kt_buf_str(&out));
    json_decref(j);
    /* DeepSeek's template declares no tools: kt-serve describes them in the system prompt */
    const char *msgs = "\"messages\": [{\"role\": \"user\", \"content\": \"time?\"}]";
    char body[512];
    snprintf(body, sizeof body, "{%s}", msgs);
    http(&s, NULL, "/tokenize", body, &out, NULL);
    j = parse(&out);
    json_int_t plain = json_integer_value(json_object_get(j, "count"));
    json_decref(j);
    snprintf(body, sizeof body, "{%s, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}]}", msgs);
    http(&s, NULL, "/tokenize", body, &out, NULL);
    j = parse(&out);
    KT_CHECK(json_integer_value(json_object_get(j, "count")) > plain + 20, "tools add a declaration: %s",
             kt_buf_str(&out));
    json_decref(j);
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

/* A stream the server ended says so: its choice's last chunk has
 * finish_reason "abort" (never "stop"), then the error event with code, then
 * [DONE]. */
static void check_aborted_stream(const char *t, const char *what, const char *code)
{
    const char *error = strstr(t, "data: {\"error\":");
    const char *last_finish = NULL;
    for (const char *at = strstr(t, "\"finish_reason\":\""); at; at = strstr(at + 1, "\"finish_reason\":\""))
        last_finish = at;
    char want_code[96];
    snprintf(want_code, sizeof want_code, "\"code\":\"%s\"", code);
    size_t len = strlen(t);
    KT_CHECK(!strstr(t, "\"finish_reason\":\"stop\"") && last_finish &&
                 strncmp(last_finish, "\"finish_reason\":\"abort\"", 23) == 0,
             "%s: the stream's end must say abort, never stop: %.3000s", what, t);
    KT_CHECK(error && last_finish < error && strstr(error, want_code), "%s: an error event (%s) after the end: %.3000s",
             what, code, t);
    KT_CHECK(len > 14 && strcmp(t + len - 14, "data: [DONE]\n\n") == 0, "%s: [DONE] last: %.3000s", what, t);
}

static void request_timeout_ends_long_requests(void)
{
    struct test_server s;
    if (!server_start(&s, kimi, "-t 1 -q --served-model-name kimi --request-timeout 2", true))
        return;
    const char *lng = "{\"prompt\": \"x\", \"max_tokens\": 3000, \"ignore_eos\": true%s}";
    char body[256];
    snprintf(body, sizeof body, lng, "");
    double t0 = harness_now();
    expect_error(&s, NULL, "/v1/completions", body, 504, NULL, "timeout");
    KT_CHECK(harness_now() - t0 < 10, "the timeout took %.1f s", harness_now() - t0);
    struct kt_buf out = {0};
    snprintf(body, sizeof body, lng, ", \"stream\": true");
    KT_CHECK(http(&s, "-N", "/v1/completions", body, &out, NULL) == 200, "stream: %.300s", kt_buf_str(&out));
    check_aborted_stream(kt_buf_str(&out), "a timed-out completions stream", "timeout");
    KT_CHECK(http(&s, "-N", "/v1/chat/completions",
                  "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 3000, \"ignore_eos\": "
                  "true, \"stream\": true, \"stream_options\": {\"include_usage\": true}}",
                  &out, NULL) == 200,
             "chat stream: %.300s", kt_buf_str(&out));
    check_aborted_stream(kt_buf_str(&out), "a timed-out chat stream", "timeout");
    KT_CHECK(server_metric(&s, "vllm:request_success_total{model_name=\"kimi\",finished_reason=\"abort\"}") == 3 &&
                 server_metric(&s, "vllm:request_success_total{model_name=\"kimi\",finished_reason=\"stop\"}") == 0,
             "3 requests aborted, none stopped");
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

/* Starts a long stream with curl in the background, its output in file;
 * returns once the stream has begun. */
static void start_long_stream(const struct test_server *s, const char *file)
{
    unlink(file);
    kt_test_system("curl -sN --max-time 120 -o %s -d '{\"prompt\": \"x\", \"max_tokens\": 3000, \"ignore_eos\": true, "
                   "\"stream\": true}' http://127.0.0.1:%d/v1/completions &",
                   file, s->port);
    size_t len = 0;
    for (double t0 = harness_now(); harness_now() - t0 < 30 && len == 0; usleep(20000)) {
        char *text = kt_test_read_file(file, &len);
        free(text);
    }
    KT_CHECK(len > 0, "the stream never began");
}

/* Waits up to wait_s for curl to finish writing file (it ends with [DONE]). */
static char *stream_result(const char *file, double wait_s)
{
    size_t len = 0;
    char *text = NULL;
    for (double t0 = harness_now(); harness_now() - t0 < wait_s; usleep(50000)) {
        free(text);
        text = kt_test_read_file(file, &len);
        if (text && len >= 14 && strcmp(text + len - 14, "data: [DONE]\n\n") == 0)
            break;
    }
    return text;
}

static void sigterm_ends_a_stream_past_the_shutdown_timeout_as_aborted(void)
{
    struct test_server s;
    if (!server_start(&s, kimi, "-t 1 -q --shutdown-timeout 1", true))
        return;
    char file[1024];
    snprintf(file, sizeof file, "%s", kt_test_path("drained-stream"));
    start_long_stream(&s, file);
    double t0 = harness_now();
    KT_CHECK(server_stop(&s) == 0, "kt-serve's exit status after SIGTERM");
    KT_CHECK(harness_now() - t0 < 15, "stopping took %.1f s with --shutdown-timeout 1", harness_now() - t0);
    char *text = stream_result(file, 10);
    check_aborted_stream(text ? text : "", "a stream cut off by the drain", "server_shutting_down");
    free(text);
    unlink(file);
}

static void a_second_sigterm_quits_at_once(void)
{
    struct test_server s;
    if (!server_start(&s, kimi, "-t 1 --shutdown-timeout 300", true))
        return;
    char file[1024];
    snprintf(file, sizeof file, "%s", kt_test_path("second-signal-stream"));
    start_long_stream(&s, file);
    kill(s.pid, SIGTERM);
    usleep(500000);
    int status = 0;
    KT_CHECK(waitpid(s.pid, &status, WNOHANG) == 0, "kt-serve stopped before its stream finished");
    double t0 = harness_now();
    kill(s.pid, SIGTERM);
    pid_t done = 0;
    while (done == 0 && harness_now() - t0 < 10) {
        usleep(10000);
        done = waitpid(s.pid, &status, WNOHANG);
    }
    KT_CHECK(done == s.pid && harness_now() - t0 < 2, "a second SIGTERM took %.1f s", harness_now() - t0);
    KT_CHECK(done == s.pid && WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM,
             "exit status %d after a second SIGTERM, expected %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
             128 + SIGTERM);
    if (done != s.pid) {
        kill(s.pid, SIGKILL);
        waitpid(s.pid, &status, 0);
    }
    size_t len = 0;
    char *log = kt_test_read_file(s.log, &len);
    KT_CHECK(log && strstr(log, "SIGTERM again: quitting now"), "the log says why: %s", log ? log : "(none)");
    free(log);
    unlink(file);
}

static void sigterm_finishes_the_running_stream_and_exits_0(void)
{
    struct test_server s;
    if (!server_start(&s, kimi, "-t 2 -q --shutdown-timeout 300", true))
        return;
    char out_file[1024], cmd[2048];
    snprintf(out_file, sizeof out_file, "%s", kt_test_path("sigterm-stream"));
    snprintf(cmd, sizeof cmd,
             "curl -sN --max-time 60 -o %s -d '{\"prompt\": \"x\", \"max_tokens\": 60, \"ignore_eos\": true, "
             "\"stream\": true}' http://127.0.0.1:%d/v1/completions &",
             out_file, s.port);
    kt_test_system("%s", cmd);
    usleep(500000);
    KT_CHECK(server_stop(&s) == 0, "kt-serve's exit status after SIGTERM");
    usleep(200000);
    size_t len = 0;
    char *text = kt_test_read_file(out_file, &len);
    KT_CHECK(text && strstr(text, "\"finish_reason\":\"length\"") && strstr(text, "data: [DONE]"),
             "the stream in flight was finished: %.300s", text ? text : "(none)");
    free(text);
    unlink(out_file);
}

/* Sums a profile JSON's token totals; NAN when it is not one. */
static double profile_tokens(const char *text, const char *where)
{
    struct kt_profile *p = NULL;
    kt_err err = {0};
    KT_CHECK(text && kt_profile_parse(text, strlen(text), where, &p, &err) == KT_OK, "%s", err.msg);
    double t = p ? p->tokens[KT_PROFILE_DECODE] + p->tokens[KT_PROFILE_PREFILL] : NAN;
    for (uint32_t il = 0; p && il < p->n_layer; il++) /* each MoE layer routes every token to 8 experts */
        for (int ph = 0; ph < 2; ph++) {
            double sum = 0;
            for (uint32_t x = 0; x < p->n_expert; x++)
                sum += p->counts[ph][il * p->n_expert + x];
            KT_CHECK(sum == (il == 0 ? 0 : 8 * p->tokens[ph]), "%s: phase %d layer %u: %g routed of %g tokens", where,
                     ph, il, sum, p->tokens[ph]);
        }
    kt_profile_destroy(p);
    return t;
}

/* GET /kt/profile counts what was served (every prompt token and every
 * generated one but the last, which is never stepped); --profile-out writes
 * the same every interval and at exit. */
static void profile_endpoint_and_file_count_what_was_served(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s", kt_test_path("served-profile.json"));
    unlink(path);
    char args[1400];
    snprintf(args, sizeof args, "-t 2 -q --max-batch-tokens 16 --profile-out %s --profile-interval 0.2 "
             "--profile-half-life 0", path);
    struct test_server s;
    if (!server_start(&s, kimi, args, true))
        return;
    struct kt_buf out = {0};
    KT_CHECK(http(&s, NULL, "/kt/profile", NULL, &out, NULL) == 200, "before any request: %s", kt_buf_str(&out));
    KT_CHECK(profile_tokens(kt_buf_str(&out), "GET /kt/profile") == 0, "nothing served yet");
    long served = 0;
    for (int r = 0; r < 2; r++) {
        int code = http(&s, NULL, "/v1/completions",
                        r ? "{\"prompt\": \"A longer prompt: the river runs past the old mill and on to the sea\", "
                            "\"max_tokens\": 3, \"temperature\": 0, \"ignore_eos\": true}"
                          : "{\"prompt\": \"The river\", \"max_tokens\": 5, \"temperature\": 0, \"ignore_eos\": true}",
                        &out, NULL);
        json_t *j = parse(&out);
        json_t *usage = json_object_get(j, "usage");
        KT_CHECK(code == 200 && usage, "completion: %s", kt_buf_str(&out));
        served += (long)json_integer_value(json_object_get(usage, "prompt_tokens")) +
                  (long)json_integer_value(json_object_get(usage, "completion_tokens")) - 1;
        json_decref(j);
    }
    KT_CHECK(http(&s, NULL, "/kt/profile", NULL, &out, NULL) == 200, "%s", kt_buf_str(&out));
    double live = profile_tokens(kt_buf_str(&out), "GET /kt/profile");
    KT_CHECK(live == (double)served, "the profile counts %g tokens, %ld were served", live, served);
    KT_CHECK(strstr(kt_buf_str(&out), "\"version\":2") && strstr(kt_buf_str(&out), "\"fingerprint\":"),
             "a version 2 profile with the model's identity: %.200s", kt_buf_str(&out));
    expect_error(&s, "-X POST", "/kt/profile", NULL, 405, NULL, NULL);
    /* the interval's write, while it runs */
    size_t len = 0;
    char *text = NULL;
    for (double t0 = harness_now(); !text && harness_now() - t0 < 10; usleep(50000)) {
        text = kt_test_read_file(path, &len);
        if (text && profile_tokens(text, path) != (double)served) /* an earlier write: wait for the next */
            free(text), text = NULL;
    }
    KT_CHECK(text != NULL, "%s was not written while serving", path);
    free(text);
    unlink(path);
    KT_CHECK(server_stop(&s) == 0, "exit status");
    text = kt_test_read_file(path, &len);
    KT_CHECK(text && profile_tokens(text, path) == (double)served, "%s after exit: %.200s", path, text ? text : "(none)");
    free(text);
    unlink(path);
    kt_buf_free(&out);

    /* a place the profile cannot go: refused before loading */
    char log[1024];
    snprintf(log, sizeof log, "%s", kt_test_path("profile-out.log"));
    int rc = kt_test_system("%s -m %s --port 0 -q --profile-out /nonexistent-dir/p.json 2> %s", kt_test_tool("kt-serve"),
                            kimi, log);
    KT_CHECK(rc == 1, "--profile-out into a missing folder: exit %d", rc);
    text = kt_test_read_file(log, &len);
    KT_CHECK(text && strstr(text, "--profile-out /nonexistent-dir/p.json: the folder /nonexistent-dir: No such file") &&
                 !strstr(text, "listening"),
             "log: %s", text ? text : "(none)");
    free(text);
    unlink(log);
}

int main(void)
{
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    snprintf(kimi, sizeof kimi, "%s", kt_test_path("serve-kimi.gguf"));
    snprintf(deepseek, sizeof deepseek, "%s", kt_test_path("serve-deepseek.gguf"));
    snprintf(big, sizeof big, "%s", kt_test_path("serve-big.gguf"));
    if (!make_model(kimi, "tiny", NULL) || !make_model(deepseek, "tiny-v3", NULL) ||
        !make_model(big, "tiny", "--experts 256")) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    KT_RUN(health_reports_loading_progress_then_ready);
    struct test_server s;
    if (server_start(&s, kimi,
                     "-t 2 -q --served-model-name kimi --max-seqs 2 --max-waiting 1 --max-batch-tokens 16 --ctx 8192 "
                     "--max-body-bytes 16384 --sse-ping-interval 0.02 --test-forced-output",
                     true)) {
        RUN_WITH(info_endpoints, &s);
        RUN_WITH(error_cases, &s);
        RUN_WITH(chat_and_completions, &s);
        RUN_WITH(tool_calls_and_reasoning, &s);
        RUN_WITH(streaming_pings_and_usage, &s);
        RUN_WITH(a_queued_completions_stream_pings, &s);
        RUN_WITH(full_queue_429_and_hangups_cancel, &s);
        RUN_WITH(client_hangups_log_nothing_alarming, &s);
        KT_CHECK(server_stop(&s) == 0, "exit status");
    }
    KT_RUN(api_key_is_required_when_set);
    KT_RUN(cors_allows_the_listed_origins_only);
    KT_RUN(metrics_name_the_sim_device_by_its_config_name);
    KT_RUN(deepseek_tool_calls);
    KT_RUN(request_timeout_ends_long_requests);
    KT_RUN(sigterm_ends_a_stream_past_the_shutdown_timeout_as_aborted);
    KT_RUN(a_second_sigterm_quits_at_once);
    KT_RUN(sigterm_finishes_the_running_stream_and_exits_0);
    KT_RUN(profile_endpoint_and_file_count_what_was_served);
    unlink(kimi), unlink(deepseek), unlink(big);
    return kt_test_finish();
}
