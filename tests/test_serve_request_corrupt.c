/*
 * test_serve_request_corrupt.c - kt-serve's request parser on good and bad
 * bodies: each case's verdict (accepted, or the HTTP status and the
 * parameter the error names) and, for accepted ones, the values read.  Every
 * body is also written to $KT_TEST_TMP/corpus/serve_request, which
 * fuzz_serve_request_replay replays and ./dev.sh fuzz uses as seeds.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "serve_anthropic.h"
#include "serve_request.h"
#include "serve_text.h"
#include "testlib.h"

static char g_dir[1100];
static int g_written;

static void write_corpus(const char *body)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%04d.json", g_dir, g_written++);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(body, 1, strlen(body), f) == strlen(body);
    if (f && fclose(f) != 0)
        ok = false;
    KT_CHECK(ok, "cannot write %s: %s", path, strerror(errno));
}

/* Expects a refusal with status naming param (NULL: no parameter). */
static void refused(enum kt_api_kind kind, const char *body, int status, const char *param)
{
    write_corpus(body);
    struct kt_api_request r;
    struct kt_api_error e = {0};
    bool ok = kt_api_request_parse(kind, body, strlen(body), &r, &e);
    KT_CHECK(!ok, "accepted: %s", body);
    if (ok) {
        kt_api_request_free(&r);
        return;
    }
    KT_CHECK(e.http_status == status, "%s: status %d, expected %d (%s)", body, e.http_status, status, e.message);
    KT_CHECK(strcmp(e.param, param ? param : "") == 0, "%s: param '%s', expected '%s' (%s)", body, e.param,
             param ? param : "", e.message);
    KT_CHECK(e.message[0] != 0, "%s: no message", body);
}

static bool accepted(enum kt_api_kind kind, const char *body, struct kt_api_request *r)
{
    write_corpus(body);
    struct kt_api_error e = {0};
    bool ok = kt_api_request_parse(kind, body, strlen(body), r, &e);
    KT_CHECK(ok, "%s: refused: %d %s: %s", body, e.http_status, e.param, e.message);
    return ok;
}

#define USER "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]"

static void chat_fields_are_read(void)
{
    struct kt_api_request r;
    if (accepted(KT_API_CHAT,
                 "{" USER ", \"max_completion_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 20, "
                 "\"min_p\": 0.1, \"seed\": -1, \"stop\": \"END\", \"n\": 3, \"presence_penalty\": 1, "
                 "\"frequency_penalty\": -1, \"logprobs\": true, \"top_logprobs\": 4, \"stream\": true, "
                 "\"stream_options\": {\"include_usage\": true}, \"logit_bias\": {\"5\": -100, \"6\": 2.5}, "
                 "\"chat_template_kwargs\": {\"enable_thinking\": false}, \"user\": \"x\", \"unknown\": {\"a\": [1]}}",
                 &r)) {
        KT_CHECK(r.max_tokens == 7 && r.n == 3 && r.sampling.top_k == 20 && r.seed_given &&
                     r.sampling.seed == UINT64_MAX && r.n_stop == 1 && strcmp(r.stop[0], "END") == 0,
                 "values");
        KT_CHECK(r.logprobs && r.top_logprobs == 4 && r.stream && r.include_usage, "logprobs and stream");
        KT_CHECK(r.sampling.n_logit_bias == 2 && r.thinking == KT_CHAT_THINKING_OFF, "bias and thinking");
        KT_CHECK(r.tool_choice == KT_TOOL_CHOICE_NONE && r.parallel_tool_calls, "no tools");
        kt_api_request_free(&r);
    }
    if (accepted(KT_API_CHAT,
                 "{\"messages\": [{\"role\": \"developer\", \"content\": \"d\"}, {\"role\": \"user\", \"content\": "
                 "\"hi\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": "
                 "\"required\", \"parallel_tool_calls\": false, \"max_tokens\": null, \"temperature\": null}",
                 &r)) {
        KT_CHECK(r.messages.count == 2 && r.messages.items[0].role == KT_CHAT_SYSTEM, "developer is system");
        KT_CHECK(r.tool_choice == KT_TOOL_CHOICE_REQUIRED && !r.parallel_tool_calls && r.tools, "tools");
        KT_CHECK(r.max_tokens == 0 && r.sampling.temperature == 1.0f, "null is absent");
        kt_api_request_free(&r);
    }
}

static void completion_fields_are_read(void)
{
    struct kt_api_request r;
    if (accepted(KT_API_COMPLETION, "{\"prompt\": [\"only one\"], \"echo\": true, \"max_tokens\": 3.0}", &r)) {
        KT_CHECK(r.n_prompts == 1 && r.prompts[0].text && strcmp(r.prompts[0].text, "only one") == 0 && r.echo &&
                     r.max_tokens == 3 && !r.no_generation,
                 "text");
        kt_api_request_free(&r);
    }
    if (accepted(KT_API_COMPLETION, "{\"prompt\": [1, 2, 3], \"logprobs\": 2, \"best_of\": 1}", &r)) {
        KT_CHECK(r.n_prompts == 1 && r.prompts[0].n_ids == 3 && r.prompts[0].ids[2] == 3 && r.logprobs &&
                     r.top_logprobs == 2 && strcmp(r.prompts[0].where, "prompt") == 0,
                 "ids");
        kt_api_request_free(&r);
    }
    /* lm-eval-harness's loglikelihood shape: a list of token-id prompts, echo, logprobs, max_tokens 0 or 1 */
    if (accepted(KT_API_COMPLETION, "{\"prompt\": [[5, 6], [7, 8, 9]], \"max_tokens\": 0, \"echo\": true, "
                                    "\"logprobs\": 1, \"temperature\": 0, \"seed\": 1234}", &r)) {
        KT_CHECK(r.n_prompts == 2 && r.prompts[1].n_ids == 3 && r.prompts[1].ids[0] == 7 &&
                     strcmp(r.prompts[1].where, "prompt[1]") == 0 && r.no_generation && r.max_tokens == 0 && r.echo &&
                     r.logprobs && r.top_logprobs == 1,
                 "a list of id prompts");
        kt_api_request_free(&r);
    }
    if (accepted(KT_API_COMPLETION, "{\"prompt\": [\"a\", \"b\", \"c\"], \"prompt_logprobs\": 3}", &r)) {
        KT_CHECK(r.n_prompts == 3 && strcmp(r.prompts[2].text, "c") == 0 && r.prompt_logprobs &&
                     r.prompt_top_logprobs == 3 && !r.no_generation,
                 "a list of text prompts, prompt_logprobs");
        kt_api_request_free(&r);
    }
    if (accepted(KT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"prompt_logprobs\": 0}",
                 &r)) {
        KT_CHECK(r.prompt_logprobs && r.prompt_top_logprobs == 0, "chat prompt_logprobs 0");
        kt_api_request_free(&r);
    }
}

static void bad_fields_name_themselves(void)
{
    const enum kt_api_kind C = KT_API_CHAT, P = KT_API_COMPLETION;
    refused(C, "", 400, NULL);
    refused(C, "{\"messages\": ", 400, NULL);
    refused(C, "\"text\"", 400, NULL);
    refused(C, "{\"a\": 1, \"a\": 2}", 400, NULL);
    refused(C, "{}", 400, "messages");
    refused(C, "{\"messages\": {}}", 400, "messages");
    refused(C, "{\"messages\": [{\"content\": \"hi\"}]}", 400, "messages");
    refused(C, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", 400, "messages");
    refused(C, "{" USER ", \"temperature\": -0.1}", 400, "temperature");
    refused(C, "{" USER ", \"temperature\": \"1\"}", 400, "temperature");
    refused(C, "{" USER ", \"top_p\": 0}", 400, "top_p");
    refused(C, "{" USER ", \"top_k\": -2}", 400, "top_k");
    refused(C, "{" USER ", \"min_p\": 2}", 400, "min_p");
    refused(C, "{" USER ", \"presence_penalty\": 3}", 400, "presence_penalty");
    refused(C, "{" USER ", \"frequency_penalty\": true}", 400, "frequency_penalty");
    refused(C, "{" USER ", \"max_tokens\": 0}", 400, "max_tokens");
    refused(C, "{" USER ", \"max_completion_tokens\": 1.5}", 400, "max_completion_tokens");
    refused(C, "{" USER ", \"n\": 0}", 400, "n");
    refused(C, "{" USER ", \"seed\": \"x\"}", 400, "seed");
    refused(C, "{" USER ", \"stop\": [\"a\", 2]}", 400, "stop");
    refused(C, "{" USER ", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\","
               "\"13\",\"14\",\"15\",\"16\",\"17\"]}", 400, "stop");
    refused(C, "{" USER ", \"logprobs\": 1}", 400, "logprobs");
    refused(C, "{" USER ", \"logprobs\": true, \"top_logprobs\": 21}", 400, "top_logprobs");
    refused(C, "{" USER ", \"stream\": \"yes\"}", 400, "stream");
    refused(C, "{" USER ", \"stream\": true, \"stream_options\": []}", 400, "stream_options");
    refused(C, "{" USER ", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}", 400,
            "stream_options.include_usage");
    refused(C, "{" USER ", \"logit_bias\": {\"x\": 1}}", 400, "logit_bias");
    refused(C, "{" USER ", \"logit_bias\": {\"1\": 101}}", 400, "logit_bias");
    refused(C, "{" USER ", \"tools\": {}}", 400, "tools");
    refused(C, "{" USER ", \"tools\": [{\"type\": \"function\", \"function\": {}}]}", 400, "tools[0]");
    refused(C, "{" USER ", \"tool_choice\": \"required\"}", 400, "tool_choice");
    refused(C, "{" USER ", \"tool_choice\": \"sometimes\"}", 400, "tool_choice");
    refused(C, "{" USER ", \"parallel_tool_calls\": 0}", 400, "parallel_tool_calls");
    refused(C, "{" USER ", \"chat_template_kwargs\": {\"thinking\": \"on\"}}", 400, "chat_template_kwargs.thinking");
    refused(C, "{" USER ", \"response_format\": {\"type\": \"json_schema\"}}", 400, "response_format");
    refused(C, "{" USER ", \"model\": 5}", 400, "model");
    refused(P, "{}", 400, "prompt");
    refused(P, "{\"prompt\": []}", 400, "prompt");
    refused(P, "{\"prompt\": [[1], []]}", 400, "prompt");
    refused(P, "{\"prompt\": [[1], \"a\"]}", 400, "prompt");
    refused(P, "{\"prompt\": \"x\", \"prompt_logprobs\": -1}", 400, "prompt_logprobs");
    refused(P, "{\"prompt\": \"x\", \"prompt_logprobs\": 21}", 400, "prompt_logprobs");
    refused(P, "{\"prompt\": \"x\", \"prompt_logprobs\": 1, \"stream\": true}", 400, "prompt_logprobs");
    refused(C, "{" USER ", \"prompt_logprobs\": 1, \"stream\": true}", 400, "prompt_logprobs");
    refused(P, "{\"prompt\": \"x\", \"max_tokens\": -1}", 400, "max_tokens");
    refused(P, "{\"prompt\": \"x\", \"max_completion_tokens\": 0}", 400, "max_completion_tokens");
    refused(P, "{\"prompt\": [1, -1]}", 400, "prompt");
    refused(P, "{\"prompt\": \"x\", \"logprobs\": 6}", 400, "logprobs");
    refused(P, "{\"prompt\": \"x\", \"best_of\": 3}", 400, "best_of");
    struct kt_buf deep = {0};
    kt_buf_puts(&deep, "{\"messages\": ");
    for (int i = 0; i < 100; i++)
        kt_buf_puts(&deep, "[");
    for (int i = 0; i < 100; i++)
        kt_buf_puts(&deep, "]");
    kt_buf_puts(&deep, "}");
    refused(C, kt_buf_str(&deep), 400, NULL);
    kt_buf_free(&deep);
}

static bool prepare_corpus_dir(void)
{
    const char *tmp = getenv("KT_TEST_TMP");
    char parent[1024];
    snprintf(parent, sizeof parent, "%s/corpus", tmp && *tmp ? tmp : "/tmp");
    snprintf(g_dir, sizeof g_dir, "%s/serve_request", parent);
    if ((mkdir(parent, 0755) != 0 && errno != EEXIST) || (mkdir(g_dir, 0755) != 0 && errno != EEXIST)) {
        KT_CHECK(false, "mkdir %s: %s", g_dir, strerror(errno));
        return false;
    }
    DIR *d = opendir(g_dir); /* start from an empty directory */
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
        if (e->d_name[0] != '.')
            unlink(path);
    }
    if (d)
        closedir(d);
    return true;
}

/* Expects a 400 naming 'prompt' whose message holds says and not says_not (NULL: no check). */
/* Error texts quote the client's bytes (a field name cut at %.40s, say): the
 * message and param stay well-formed UTF-8 so both error shapes (OpenAI's,
 * Anthropic's) build as JSON.  Found by fuzz_serve_request in CI: an
 * unknown Anthropic field whose name a cut split inside a code point. */
static void error_texts_stay_utf8(void)
{
    const char *body = "{\"messages\": [{\"role\": \"user\", \"cont<\xef\xbd\x9c" "tent\": \"hi\"}], "
                       "\"tool_choice<\xef\xbd\x9c" "tool\xe2\x96\x81" "c<|tool_calls_section_begin|>all\xe2\x96\x81"
                       "begin\xef\xbd\x9c" ">\": \"sometimes\"}";
    write_corpus(body);
    struct kt_api_request r;
    struct kt_api_error e = {0};
    const bool ok = kt_anthropic_request_parse(body, strlen(body), false, &r, NULL, &e);
    KT_CHECK(!ok && e.http_status == 400, "accepted, or not a 400: %d %s", e.http_status, e.message);
    if (ok)
        kt_api_request_free(&r);
    json_t *j = kt_anthropic_error_json(&e), *o = kt_api_error_json(&e);
    KT_CHECK(j && json_object_get(j, "error") && o && json_object_get(json_object_get(o, "error"), "message"),
             "an error shape did not build for: %s", e.message);
    json_decref(j), json_decref(o);
    /* every cut of a 3-byte code point at the end of a message */
    for (int cut = 1; cut <= 3; cut++) {
        struct kt_api_error t = {0};
        char msg[sizeof t.message];
        memset(msg, 'a', sizeof msg);
        memcpy(msg + sizeof msg - 1 - cut, "\xef\xbd\x9c", (size_t)cut);
        msg[sizeof msg - 1] = 0;
        kt_api_error_invalid(&t, "\xe2\x96", "%s", msg);
        json_t *x = kt_api_error_json(&t);
        KT_CHECK(json_object_get(json_object_get(x, "error"), "message") && json_object_get(json_object_get(x,
                 "error"), "param"), "a message ending in %d bytes of a code point", cut);
        json_decref(x);
    }
}

static void prompt_refused_saying(const char *body, const char *says, const char *says_not)
{
    write_corpus(body);
    struct kt_api_request r;
    struct kt_api_error e = {0};
    bool ok = kt_api_request_parse(KT_API_COMPLETION, body, strlen(body), &r, &e);
    if (ok)
        kt_api_request_free(&r);
    KT_CHECK(!ok && e.http_status == 400 && strcmp(e.param, "prompt") == 0 && strstr(e.message, says) &&
                 (!says_not || !strstr(e.message, says_not)),
             "%s: %d '%s': %s", body, e.http_status, e.param, e.message);
}

/* A prompt refused says what is wrong with it: a bad token id is named with
 * its index and value (it used to be called "a batch of prompts"). */
static void prompt_errors_say_what_is_wrong(void)
{
    prompt_refused_saying("{\"prompt\": [1.5]}", "prompt[0] is 1.5", "batch");
    prompt_refused_saying("{\"prompt\": [1, 2, -3]}", "prompt[2] is -3", "batch");
    prompt_refused_saying("{\"prompt\": [1, \"a\"]}", "prompt[1] is a string", "batch");
    prompt_refused_saying("{\"prompt\": [[7, 0.5]]}", "prompt[0][1] is 0.5", "batch");
    prompt_refused_saying("{\"prompt\": [1, 4294967296]}", "prompt[1] is 4294967296", NULL);
    prompt_refused_saying("{\"prompt\": []}", "an empty list", NULL);
    prompt_refused_saying("{\"prompt\": [[1], [2], []]}", "prompt[2] is an empty list of token ids", NULL);
    prompt_refused_saying("{\"prompt\": [\"a\", 2]}", "prompt[1] is an integer, but prompt[0] is a string", NULL);
    prompt_refused_saying("{\"prompt\": [[1], \"b\"]}", "prompt[1] is a string, but prompt[0] is an array", NULL);
    prompt_refused_saying("{\"prompt\": [[1], [2, -4]]}", "prompt[1][1] is -4", NULL);
    prompt_refused_saying("{\"prompt\": true}", "not a boolean", NULL);
    prompt_refused_saying("{\"max_tokens\": 3}", "'prompt' is required", NULL);
}

int main(void)
{
    if (!prepare_corpus_dir())
        return kt_test_finish();
    KT_RUN(chat_fields_are_read);
    KT_RUN(completion_fields_are_read);
    KT_RUN(bad_fields_name_themselves);
    KT_RUN(prompt_errors_say_what_is_wrong);
    KT_RUN(error_texts_stay_utf8);
    printf("wrote %d request bodies to %s\n", g_written, g_dir);
    return kt_test_finish();
}
