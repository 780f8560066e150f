/*
 * test_sse_check.c - the event-stream checker kt-load and the soak test read
 * every stream with (tools/load/sse_check.c): a well-formed stream passes
 * whole or fed a byte at a time, n > 1 choices interleave, each choice's
 * content, tool calls and finish are kept; each way a stream can be broken -
 * a choice never finished or finished twice, the usage before a finish, no
 * [DONE], data after it, an error event, a multi-line event, a chunk without
 * the role first - is named.
 */
#include <string.h>

#include "sse_check.h"
#include "testlib.h"

#define CHUNK(choices) "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[" choices "]}\n\n"
#define ROLE(k) CHUNK("{\"index\":" #k ",\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}")
#define TEXT(k, t) CHUNK("{\"index\":" #k ",\"delta\":{\"content\":\"" t "\"},\"finish_reason\":null}")
#define END(k, why) CHUNK("{\"index\":" #k ",\"delta\":{},\"finish_reason\":\"" why "\"}")
#define USAGE(completion)                                                                                             \
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,"      \
    "\"completion_tokens\":" #completion ",\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n"
#define DONE "data: [DONE]\n\n"

/* Checks a whole stream; fills c (the caller frees it). */
static bool check(struct kt_sse_check *c, const char *stream, bool want_usage, bool bytewise)
{
    kt_sse_check_init(c);
    size_t len = strlen(stream);
    if (bytewise)
        for (size_t i = 0; i < len; i++)
            kt_sse_check_feed(c, stream + i, 1);
    else
        kt_sse_check_feed(c, stream, len);
    return kt_sse_check_finish(c, want_usage);
}

static void one_choice_with_usage_passes_fed_whole_or_bytewise(void)
{
    const char *stream = ROLE(0) ": ping\n\n" TEXT(0, "ri") TEXT(0, "ver\\u0000") END(0, "length") USAGE(2) DONE;
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        struct kt_sse_check c;
        KT_CHECK(check(&c, stream, true, bytewise), "bytewise %d: %s", bytewise, c.error);
        KT_CHECK(c.n_choices == 1 && !strcmp(c.choices[0].finish_reason, "length"), "one choice, length");
        KT_CHECK(c.choices[0].content.len == 6 && !memcmp(c.choices[0].content.bytes, "river\0", 6),
                 "content 'river\\0' (%zu bytes)", c.choices[0].content.len);
        KT_CHECK(c.completion_tokens == 2 && c.prompt_tokens == 7 && c.cached_tokens == 3, "usage %lld %lld %lld",
                 c.completion_tokens, c.prompt_tokens, c.cached_tokens);
        KT_CHECK(c.pings == 1 && c.content_events == 2,
                 "1 ping, 2 token events (the finish's empty delta is none): %zu %zu", c.pings, c.content_events);
        kt_sse_check_free(&c);
    }
}

static void interleaved_choices_each_open_and_finish_once(void)
{
    struct kt_sse_check c;
    const char *calls = CHUNK("{\"index\":1,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"functions.f:0\","
                              "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]},"
                              "\"finish_reason\":null}")
        CHUNK("{\"index\":1,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]},"
              "\"finish_reason\":null}");
    struct kt_buf s = {0};
    kt_buf_puts(&s, ROLE(0) ROLE(1) TEXT(0, "a") TEXT(1, "b"));
    kt_buf_puts(&s, calls);
    kt_buf_puts(&s, END(0, "stop") END(1, "tool_calls") USAGE(4) DONE);
    KT_CHECK(check(&c, kt_buf_str(&s), true, false), "%s", c.error);
    KT_CHECK(c.n_choices == 2 && !strcmp(c.choices[0].finish_reason, "stop") &&
                 !strcmp(c.choices[1].finish_reason, "tool_calls"),
             "two choices: %zu '%s' '%s'", c.n_choices, c.choices[0].finish_reason, c.choices[1].finish_reason);
    KT_CHECK(c.choices[0].tool_calls == 0 && c.choices[1].tool_calls == 1, "one tool call opened, in choice 1");
    KT_CHECK(!strcmp(kt_buf_str(&c.choices[0].content), "a") && !strcmp(kt_buf_str(&c.choices[1].content), "b"),
             "each choice's own content");
    kt_sse_check_free(&c);
    kt_buf_free(&s);
}

static void broken_streams_are_named(void)
{
    static const struct {
        const char *stream, *error;
        bool want_usage;
    } cases[] = {
        {ROLE(0) ROLE(1) TEXT(0, "a") END(0, "length") DONE, "choice 1 has no finish_reason", false},
        {ROLE(0) TEXT(0, "a") END(0, "length") END(0, "stop") DONE, "a chunk of a choice after its finish", false},
        {ROLE(0) ROLE(1) END(0, "length") USAGE(1) END(1, "length") DONE, "the usage before every choice finished",
         false},
        {ROLE(0) END(0, "length") USAGE(1), "no [DONE]", true},
        {ROLE(0) END(0, "length") DONE TEXT(0, "x"), "data after [DONE]", false},
        {ROLE(0) END(0, "length") DONE, "no usage chunk", true},
        {ROLE(0) "data: {\"error\":{\"message\":\"timeout\"}}\n\n" DONE, "error event", false},
        {ROLE(0) "data: {\"id\":\"c1\",\n\"object\":1}\n\n" DONE, "a multi-line event", false},
        {TEXT(0, "a") END(0, "length") DONE, "a choice's first chunk has no assistant role", false},
        {ROLE(0) END(0, "length") USAGE(1) DONE "data: {", "bytes after the last event", true},
        {ROLE(0) CHUNK("{\"index\":99,\"delta\":{}}") DONE, "a choice without a valid index", false},
        {ROLE(0) CHUNK("") DONE,
         "a chunk without choices or usage", false},
        {ROLE(0) END(0, "length") "data: {not json}\n\n" DONE, "not a JSON object", false},
        {DONE, "no choice", false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct kt_sse_check c;
        bool ok = check(&c, cases[k].stream, cases[k].want_usage, k % 2 == 1);
        KT_CHECK(!ok && strstr(c.error, cases[k].error), "case %zu: wanted '%s', got '%s'", k, cases[k].error, c.error);
        kt_sse_check_free(&c);
    }
}

int main(void)
{
    KT_RUN(one_choice_with_usage_passes_fed_whole_or_bytewise);
    KT_RUN(interleaved_choices_each_open_and_finish_once);
    KT_RUN(broken_streams_are_named);
    return kt_test_finish();
}
