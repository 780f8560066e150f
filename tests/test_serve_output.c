/*
 * test_serve_output.c - the streaming output parser and stop matcher: every
 * way of cutting the model's text into pushes gives the same reasoning,
 * content and tool calls as one push, for both families' formats; markers
 * split across pushes never leak into content; stop strings are held back
 * until decided.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_output.h"
#include "serve_text.h"
#include "testlib.h"

struct expect {
    const char *reasoning, *content;
    size_t n_calls;
    const char *ids[3], *names[3], *args[3];
};

/* Pushes text in pieces cut at every byte boundary pattern given by seed (0: one push). */
static void parse(const struct kt_output_params *p, const char *text, unsigned long long seed, struct kt_output *o)
{
    kt_output_init(o, p);
    size_t len = strlen(text), at = 0;
    while (at < len) {
        size_t k = seed ? 1 + kt_test_rand_u64(&seed) % 7 : len;
        if (k > len - at)
            k = len - at;
        kt_output_push(o, text + at, k);
        at += k;
    }
    kt_output_finish(o);
}

static void check(const char *what, const struct kt_output_params *p, const char *text, const struct expect *x)
{
    for (unsigned long long seed = 0; seed < 40; seed++) {
        struct kt_output o;
        parse(p, text, seed, &o);
        KT_CHECK(strcmp(kt_buf_str(&o.reasoning), x->reasoning) == 0, "%s seed %llu: reasoning '%s'", what, seed,
                 kt_buf_str(&o.reasoning));
        KT_CHECK(strcmp(kt_buf_str(&o.content), x->content) == 0, "%s seed %llu: content '%s'", what, seed,
                 kt_buf_str(&o.content));
        KT_CHECK(o.n_calls == x->n_calls, "%s seed %llu: %zu calls", what, seed, o.n_calls);
        for (size_t i = 0; i < o.n_calls && i < x->n_calls; i++) {
            KT_CHECK(strcmp(o.calls[i].id, x->ids[i]) == 0, "%s: id '%s'", what, o.calls[i].id);
            KT_CHECK(strcmp(o.calls[i].name, x->names[i]) == 0, "%s: name '%s'", what, o.calls[i].name);
            KT_CHECK(strcmp(kt_buf_str(&o.calls[i].arguments), x->args[i]) == 0, "%s seed %llu: args '%s'", what,
                     seed, kt_buf_str(&o.calls[i].arguments));
        }
        kt_output_free(&o);
    }
}

static void kimi_tool_calls_keep_their_ids(void)
{
    struct kt_output_params p = {.family = KT_CHAT_FAMILY_KIMI, .reasoning = true, .tools = true};
    check("kimi two calls", &p,
          "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
          "<|tool_call_argument_begin|>{\"city\": \"Beijing\"}<|tool_call_end|><|tool_call_begin|> functions.get_time:1 "
          "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
          &(struct expect){"", "Let me check.", 2, {"functions.get_weather:0", "functions.get_time:1"},
                           {"get_weather", "get_time"}, {"{\"city\": \"Beijing\"}", "{}"}});
    check("kimi reasoning then call without closing think", &p,
          "<think>need the weather<|tool_calls_section_begin|><|tool_call_begin|>functions.get.weather:3"
          "<|tool_call_argument_begin|>{\"a\":1}<|tool_call_end|>",
          &(struct expect){"need the weather", "", 1, {"functions.get.weather:3"}, {"get.weather"}, {"{\"a\":1}"}});
    check("kimi call cut off in its arguments", &p,
          "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"x\": \"<|to",
          &(struct expect){"", "", 1, {"functions.f:0"}, {"f"}, {"{\"x\": \"<|to"}});
    struct kt_output_params single = p;
    single.single_tool_call = true;
    check("kimi parallel_tool_calls=false keeps the first", &single,
          "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
          "<|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
          &(struct expect){"", "", 1, {"functions.a:0"}, {"a"}, {"{}"}});
    struct kt_output_params no_tools = {.family = KT_CHAT_FAMILY_KIMI, .reasoning = false};
    check("kimi without tool parsing leaves markers in content", &no_tools, "<think>x</think><|tool_call_begin|>y",
          &(struct expect){"", "<think>x</think><|tool_call_begin|>y", 0, {0}, {0}, {0}});
}

static void reasoning_splits_at_think(void)
{
    struct kt_output_params p = {.family = KT_CHAT_FAMILY_KIMI, .reasoning = true, .tools = true};
    check("think block", &p, "<think>step 1\nstep 2</think>The answer is 4.",
          &(struct expect){"step 1\nstep 2", "The answer is 4.", 0, {0}, {0}, {0}});
    check("no think block", &p, "<thin and more", &(struct expect){"", "<thin and more", 0, {0}, {0}, {0}});
    check("think never closed", &p, "<think>still thinking", &(struct expect){"still thinking", "", 0, {0}, {0}, {0}});
    struct kt_output_params open = {.family = KT_CHAT_FAMILY_DEEPSEEK, .reasoning = true, .reasoning_open = true};
    check("deepseek forced open", &open, "hmm</think>\n\nyes", &(struct expect){"hmm", "\n\nyes", 0, {0}, {0}, {0}});
}

static void deepseek_tool_calls_with_fences(void)
{
    struct kt_output_params p = {.family = KT_CHAT_FAMILY_DEEPSEEK, .reasoning = true, .tools = true,
                                 .id_prefix = "call_x_"};
    check("deepseek two calls", &p,
          "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
          "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
          "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
          &(struct expect){"", "Sure.", 2, {"call_x_0", "call_x_1"}, {"get_weather", "get_time"},
                           {"{\"city\": \"Paris\"}", "{}"}});
    check("deepseek drifted begin marker, fence cut off", &p,
          "<｜tool_calls_begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": [1, 2]}\n``",
          &(struct expect){"", "", 1, {"call_x_0"}, {"f"}, {"{\"a\": [1, 2]}"}});
}

static void stop_strings_hold_back_partial_matches(void)
{
    const char *const stops[] = {"STOP", "\n\n"};
    struct kt_stop s;
    struct kt_buf out = {0};
    kt_stop_init(&s, stops, 2);
    KT_CHECK(!kt_stop_push(&s, "abc ST", 6, &out), "no stop yet");
    KT_CHECK(strcmp(kt_buf_str(&out), "abc ") == 0, "'ST' held back: '%s'", kt_buf_str(&out));
    KT_CHECK(!kt_stop_push(&s, "ART S", 5, &out), "not a stop");
    KT_CHECK(strcmp(kt_buf_str(&out), "abc START ") == 0, "'%s'", kt_buf_str(&out));
    KT_CHECK(kt_stop_push(&s, "TOP and more", 12, &out) && s.matched == 0, "STOP matched");
    KT_CHECK(strcmp(kt_buf_str(&out), "abc START ") == 0, "nothing after the stop: '%s'", kt_buf_str(&out));
    kt_stop_free(&s);
    kt_buf_free(&out);

    kt_stop_init(&s, stops, 2);
    kt_stop_push(&s, "tail\n", 5, &out);
    kt_stop_flush(&s, &out);
    KT_CHECK(strcmp(kt_buf_str(&out), "tail\n") == 0, "flush releases the held newline: '%s'", kt_buf_str(&out));
    kt_stop_free(&s);
    kt_buf_free(&out);

    int which;
    const char *const markers[] = {"<a>", "<ab>"};
    KT_CHECK(kt_text_scan("x<ab>", 5, markers, 2, &which) == 1 && which == 1, "earliest, longest: %d", which);
    KT_CHECK(kt_text_scan("xy<a", 4, markers, 2, &which) == 2 && which == -1, "prefix held back");
}

int main(void)
{
    KT_RUN(kimi_tool_calls_keep_their_ids);
    KT_RUN(reasoning_splits_at_think);
    KT_RUN(deepseek_tool_calls_with_fences);
    KT_RUN(stop_strings_hold_back_partial_matches);
    return kt_test_finish();
}
