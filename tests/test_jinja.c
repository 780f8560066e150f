/*
 * test_jinja.c - the Jinja interpreter (runtime/text/jinja.h): the golden
 * corpus of tests/golden/chat rendered through it byte for byte (the eight
 * published templates kt also renders natively, and the variants kt has no
 * native renderer for), one test per construct, every limit, and the chat
 * API's fallback: a template kt does not recognise renders and serves.
 *
 * The goldens are data made by render.mjs with @huggingface/jinja; when the
 * interpreter disagrees with one, the interpreter is wrong.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "gguf.h"
#include "jinja.h"
#include "serve_harness.h"
#include "serve_prompt.h"
#include "serve_request.h"

/* ------------------------------------------------------------- helpers --- */

static const char *golden_dir(void)
{
    static char dir[1024];
    const char *src = getenv("KT_SOURCE_DIR");
    if (src) {
        snprintf(dir, sizeof dir, "%s/tests/golden/chat", src);
    } else { /* run by hand: this file's directory */
        const char *slash = strrchr(__FILE__, '/');
        int len = slash ? (int)(slash - __FILE__) : 1;
        snprintf(dir, sizeof dir, "%.*s/golden/chat", len, slash ? __FILE__ : ".");
    }
    return dir;
}

static char *read_golden_file(const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", golden_dir(), name);
    size_t bytes = 0;
    char *text = kt_test_read_file(path, &bytes);
    KT_CHECK(text != NULL, "cannot read %s", path);
    return text;
}

static json_t *load_golden_json(const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", golden_dir(), name);
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    KT_CHECK(doc != NULL, "%s: %s (line %d)", path, jerr.text, jerr.line);
    return doc;
}

static void report_difference(const char *what, const char *got, const char *want)
{
    size_t i = 0;
    while (got[i] && got[i] == want[i])
        i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "%s: first difference at byte %zu\n  jinja:  \"%.140s\"\n  golden: \"%.140s\"\n", what, i,
            got + from, want + from);
}

/* Renders source with the JSON context (NULL: none) under limits (NULL:
 * defaults); the output, or NULL with err set. */
static char *render(const char *source, const char *context_json, const kt_jinja_limits *limits, kt_err *err)
{
    json_t *ctx = NULL;
    if (context_json) {
        json_error_t jerr;
        ctx = json_loads(context_json, 0, &jerr);
        KT_CHECK(ctx != NULL, "bad test JSON %s: %s", context_json, jerr.text);
    }
    kt_jinja_template *t = NULL;
    char *out = NULL;
    if (kt_jinja_parse(source, strlen(source), &t, err) == KT_OK)
        kt_jinja_render(t, ctx, limits, &out, NULL, err);
    kt_jinja_destroy(t);
    json_decref(ctx);
    return out;
}

/* Checks that source renders exactly want. */
#define EXPECT(source, context, want)                                                                     \
    do {                                                                                                  \
        kt_err err_ = {0};                                                                                \
        char *got_ = render(source, context, NULL, &err_);                                                \
        KT_CHECK(got_ && strcmp(got_, want) == 0, "%s: got \"%s\" (%s), want \"%s\"", source,             \
                 got_ ? got_ : "NULL", got_ ? "" : err_.msg, want);                                       \
        free(got_);                                                                                       \
    } while (0)

/* Checks that source fails with status and a message containing needle. */
#define EXPECT_ERROR(source, context, limits, want_status, needle)                                             \
    do {                                                                                                  \
        kt_err err_ = {0};                                                                                \
        char *got_ = render(source, context, limits, &err_);                                              \
        KT_CHECK(!got_ && err_.status == (want_status) && strstr(err_.msg, needle), "%.80s: got \"%.80s\" / %s (%s)", \
                 source, got_ ? got_ : "NULL", err_.msg, kt_status_name(err_.status));                    \
        free(got_);                                                                                       \
    } while (0)


/* ------------------------------------------------------------ constructs --- */

static void jinja_whitespace_control_follows_trim_and_lstrip_blocks(void)
{
    EXPECT("a\n  {% if true %}\n  b\n  {% endif %}\nc", NULL, "a\n  b\nc");
    EXPECT("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    EXPECT("x\n  {{ 1 }}\n", NULL, "x\n  1");                /* lstrip not before {{ }}, trailing newline dropped */
    EXPECT("x\n  {%+ if true %}y{% endif %}", NULL, "x\n  y"); /* + keeps the indentation */
    EXPECT("{% if true +%}\ny{% endif %}", NULL, "\ny");       /* + keeps the newline */
    EXPECT("a {# note #}\nb", NULL, "a b");
    EXPECT("  {# note #}\nb", NULL, "b");
    EXPECT("{{- ' x ' -}}\n", NULL, " x ");
    EXPECT("a\n\n", NULL, "a\n");
    EXPECT("{{ 'a' }}  {% if true %}b{% endif %}", NULL, "a  b"); /* not at a line start: kept */
}

static void jinja_if_elif_else_and_truthiness(void)
{
    const char *t = "{% if x == 1 %}one{% elif x == 2 %}two{% elif x %}other{% else %}none{% endif %}";
    EXPECT(t, "{\"x\": 1}", "one");
    EXPECT(t, "{\"x\": 2}", "two");
    EXPECT(t, "{\"x\": \"s\"}", "other");
    EXPECT(t, "{\"x\": 0}", "none");
    EXPECT(t, "{}", "none");
    EXPECT("{% if [] or {} or '' or 0.0 or none %}t{% else %}f{% endif %}", NULL, "f");
    EXPECT("{{ 1 if x else 2 }}|{{ 'y' if x }}|", "{\"x\": false}", "2||");
    EXPECT("{{ none or 'd' }} {{ 'a' and 'b' }} {{ not 0 }}", NULL, "d b True");
}

static void jinja_for_loop_variables_else_and_unpacking(void)
{
    EXPECT("{% for x in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
           "{{ loop.revindex }},{% endfor %}",
           "{\"xs\": [\"a\", \"b\"]}", "01TrueFalse22,12FalseTrue21,");
    EXPECT("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    EXPECT("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\": {\"b\": 1, \"a\": [2]}}",
           "b=1;a=[2];");
    EXPECT("{% for k in d %}{{ k }}{% endfor %}", "{\"d\": {\"x\": 1, \"y\": 2}}", "xy");
    EXPECT("{% for c in 'hé!' %}[{{ c }}]{% endfor %}", NULL, "[h][é][!]");
    EXPECT("{% for x in range(10) if x is odd %}{{ x }}{{ '.' if loop.last }}{% endfor %}", NULL, "13579.");
    EXPECT("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}"
           "{{ x }}{% endfor %}",
           NULL, "02");
    EXPECT("{% for x in range(3, 0, -1) %}{{ x }}{% endfor %}|{% for x in range(0, 7, 3) %}{{ x }}{% endfor %}",
           NULL, "321|036");
    EXPECT("{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }} {% endfor %}", "{\"xs\": [1, 2, 3]}",
           "-2 1-3 2- ");
    /* A set inside a loop stays in the loop; a namespace carries it out. */
    EXPECT("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set n = n + x %}"
           "{% set ns.n = ns.n + x %}{% endfor %}{{ n }} {{ ns.n }}",
           NULL, "0 3");
}

static void jinja_set_namespace_and_block_set(void)
{
    EXPECT("{% set a, b = 1, 'x' %}{{ a }}{{ b }}", NULL, "1x");
    EXPECT("{% set ns = namespace(found=false, items=[]) %}{% set ns.found = true %}{{ ns.found }} {{ ns.items }}",
           NULL, "True []");
    EXPECT("{% set block %}  in {{ 1 + 1 }}  {% endset %}[{{ block }}]", NULL, "[  in 2  ]");
    EXPECT_ERROR("{% set x = 1 %}{% set x.y = 2 %}", NULL, NULL, KT_ERR_INVALID, "not a namespace");
}

static void jinja_macros_take_arguments_defaults_and_keywords(void)
{
    const char *t = "{% macro greet(name, greeting='Hello', end='!') -%}"
                    "{{ greeting }}, {{ name }}{{ end }}{%- endmacro %}"
                    "{{ greet('A') }}|{{ greet('B', 'Hi') }}|{{ greet(name='C', end='?') }}";
    EXPECT(t, NULL, "Hello, A!|Hi, B!|Hello, C?");
    EXPECT("{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}", NULL, "321");
    EXPECT("{% macro m() %}{{ g }}{% endmacro %}{% set g = 'global' %}{{ m() }}", NULL, "global");
    EXPECT_ERROR("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, NULL, KT_ERR_INVALID, "takes 1 arguments");
    EXPECT_ERROR("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", NULL, NULL, KT_ERR_INVALID, "no parameter 'b'");
}

static void jinja_operators_follow_python(void)
{
    EXPECT("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }}", NULL,
           "3 -4 1 2 3.5 1024 7");
    EXPECT("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 }}", NULL,
           "a1None ababab [1, 2] 2.5 0.30000000000000004");
    EXPECT("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1, 'a'] == [1, 'a'] }}",
           NULL, "True False True True True True");
    EXPECT("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 'z' not in d }}", "{\"d\": {\"k\": 0}}",
           "True True True True");
    EXPECT("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[5] }}", "{\"xs\": [1, 2, 3]}",
           "13[2, 3][1, 2][3, 2, 1]");
    EXPECT("{{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ 'abc'[-1] }}", NULL, "é él olléh c");
    EXPECT("{{ d.a.b }} {{ d['a']['b'] }} {{ d.x }}|{{ d.x is defined }}", "{\"d\": {\"a\": {\"b\": 5}}}",
           "5 5 |False");
    EXPECT("{{ {'a': 1, 'b': [true, none, 'q\\'s']} }} {{ (1, 2) | length }} {{ -(3) }} {{ 1e3 }} {{ 2.0 }}", NULL,
           "{'a': 1, 'b': [True, None, \"q's\"]} 2 -3 1000.0 2.0");
    EXPECT("{{ 'a' 'b' }} {{ \"\\u00e9\\n\\t\\\\\" }}", NULL, "ab é\n\t\\");
    EXPECT_ERROR("{{ 'a' + 1 }}", NULL, NULL, KT_ERR_INVALID, "unsupported operand");
    EXPECT_ERROR("{{ 1 // 0 }}", NULL, NULL, KT_ERR_INVALID, "by zero");
    EXPECT_ERROR("{{ 9223372036854775807 + 1 }}", NULL, NULL, KT_ERR_INVALID, "overflow");
    EXPECT_ERROR("{{ x.y }}", NULL, NULL, KT_ERR_INVALID, "undefined");
}

static void jinja_tests_answer_as_jinja2(void)
{
    EXPECT("{{ x is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}"
           "{{ l is iterable }}{{ s is iterable }}{{ 3 is number }}{{ 3 is integer }}{{ 3.0 is float }}"
           "{{ true is boolean }}{{ l is sequence }}",
           "{\"x\": 1, \"n\": null, \"s\": \"\", \"d\": {}, \"l\": []}",
           "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
    EXPECT("{{ d is string }}{{ 3 is string }}{{ n is not none }}{{ 1 is mapping }}", "{\"d\": {}, \"n\": null}",
           "FalseFalseFalseFalse");
    EXPECT("{{ 4 is even }}{{ 4 is odd }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 'x' is equalto 'x' }}"
           "{{ 2 is eq 3 }}{{ 1 is in [1] }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 3 is gt 2 }}",
           NULL, "TrueFalseTrueFalseTrueFalseTrueTrueTrueTrue");
    EXPECT("{% macro m() %}{% endmacro %}{{ m is callable }}{{ x is callable }}", "{\"x\": 1}", "TrueFalse");
    EXPECT("{{ not x is defined }}", NULL, "True"); /* is binds tighter than not */
    EXPECT_ERROR("{{ x is frobnicated }}", NULL, NULL, KT_ERR_INVALID, "no test named");
}

static void jinja_filters_follow_jinja2_and_hf(void)
{
    EXPECT("[{{ '  a b \\n' | trim }}][{{ 'xxaxx' | trim('x') }}]{{ 'aBc' | upper }}{{ 'aBc' | lower }}"
           "{{ 'hello world' | title }}{{ 'hELLO' | capitalize }}",
           NULL, "[a b][a]ABCabcHello WorldHello");
    EXPECT("{{ xs | length }}{{ 'héé' | length }}{{ d | length }}{{ xs | count }}{{ xs | first }}{{ xs | last }}",
           "{\"xs\": [1, 2, 3], \"d\": {\"a\": 1}}", "33131" "3");
    EXPECT("{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ xs | join(', ') }}"
           " {{ xs | join }}",
           "{\"xs\": [1, \"x\", 2.5]}", "a+b+c bba 1, x, 2.5 1x2.5");
    EXPECT("{{ x | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ n | d('e') }}",
           "{\"n\": null}", "d  d None");
    EXPECT("{{ 3.9 | int }} {{ '42' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ '2.5' | float }} {{ 3 | string }}"
           "{{ [1] | string }}",
           NULL, "3 42 0 7 2.5 3[1]");
    EXPECT("{{ d | items | list }} {{ 'ab' | list }} {{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }}"
           " {{ [1, 2] | reverse | list }} {{ [1, 2, 1] | unique | list }}",
           "{\"d\": {\"k\": \"v\"}}", "[['k', 'v']] ['a', 'b'] [1, 2, 3] ['A', 'b', 'c'] [2, 1] [1, 2]");
    EXPECT("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|"
           "{{ ms | rejectattr('role', 'eq', 'user') | list | length }}|{{ ms | selectattr('tool') | list | length }}|"
           "{{ [1, 2, 3, 4] | select('even') | list }}|{{ [1, 2] | map('string') | join }}",
           "{\"ms\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"tool\", \"content\": \"b\", \"tool\": 1},"
           " {\"role\": \"user\", \"content\": \"c\"}]}",
           "a,c|1|1|[2, 4]|12");
    EXPECT("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(1, blank=true) }}",
           NULL, "a\n  b\n\n  c|  a\n  b|a\n \n b");
    EXPECT("{{ [3, -1] | max }}{{ [3, -1] | min }}{{ [1, 2.5] | sum }}{{ -3 | abs }}{{ 2.567 | round(2) }}", NULL,
           "3-13.532.57");
    EXPECT("{% filter upper %}a{{ 'b' }}{% endfilter %}", NULL, "AB");
    EXPECT_ERROR("{{ 1 | frobnicate }}", NULL, NULL, KT_ERR_INVALID, "no filter named");
}

static void jinja_tojson_is_python_json_dumps(void)
{
    const char *ctx = "{\"v\": {\"s\": \"é\\\"\\\\\\n\\u0001\", \"n\": [1, 1.0, 1e-05, 1e16, -0.0, true, null],"
                      " \"e\": {}, \"l\": []}}";
    EXPECT("{{ v | tojson }}", ctx,
           "{\"s\": \"é\\\"\\\\\\n\\u0001\", \"n\": [1, 1.0, 1e-05, 1e+16, -0.0, true, null], \"e\": {}, \"l\": []}");
    EXPECT("{{ v.s | tojson(ensure_ascii=true) }} {{ '😀' | tojson(true) }}", ctx,
           "\"\\u00e9\\\"\\\\\\n\\u0001\" \"\\ud83d\\ude00\"");
    EXPECT("{{ {'b': 1, 'a': [1, {}]} | tojson(indent=2) }}", NULL, "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    {}\n  ]\n}");
    EXPECT("{{ {'b': 1, 'a': [1, 2]} | tojson(separators=(',', ':'), sort_keys=true) }}", NULL,
           "{\"a\":[1,2],\"b\":1}");
    EXPECT_ERROR("{{ x | tojson }}", NULL, NULL, KT_ERR_INVALID, "not JSON serializable");
}

static void jinja_string_and_dict_methods(void)
{
    EXPECT("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'a,b,,c'.split(',') }}"
           "{{ ' a  b '.split() }}{{ 'a b c'.split(' ', 1) }}",
           NULL, "TrueTrue['a', 'b', '', 'c']['a', 'b']['a', 'b c']");
    EXPECT("[{{ '  x '.strip() }}][{{ '  x '.lstrip() }}][{{ '  x '.rstrip() }}][{{ 'xyx'.strip('x') }}]"
           "{{ 'aXa'.replace('a', 'b') }}{{ 'ab'.upper() }}{{ 'AB'.lower() }}{{ 'ab cd'.title() }}",
           NULL, "[x][x ][  x][y]bXbABabAb Cd");
    EXPECT("{{ 'abcb'.find('b') }}{{ 'abc'.find('z') }}{{ 'abcb'.count('b') }}{{ '-'.join(['a', 'b']) }}"
           "{{ 'pre_x'.removeprefix('pre_') }}{{ 'a\\nb'.splitlines() }}",
           NULL, "1-12a-bx['a', 'b']");
    EXPECT("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.keys() | list }} {{ d.values() | list }}"
           " {{ d.items() | list | length }}",
           "{\"d\": {\"a\": 1, \"b\": 2}}", "1 None 5 ['a', 'b'] [1, 2] 2");
    EXPECT("{{ '</think>x'.split('</think>')[-1] }}", NULL, "x");
    EXPECT_ERROR("{{ 'a'.frob() }}", NULL, NULL, KT_ERR_INVALID, "no method 'frob'");
    EXPECT_ERROR("{{ 'a'.split('') }}", NULL, NULL, KT_ERR_INVALID, "empty separator");
}

static void jinja_globals_range_raise_exception_and_dict(void)
{
    EXPECT("{{ range(3) | list }} {{ range(2, 4) | list }} {{ range(0) | list }} {{ dict(a=1) }}", NULL,
           "[0, 1, 2] [2, 3] [] {'a': 1}");
    EXPECT_ERROR("{% if true %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}", NULL, NULL,
                 KT_ERR_INVALID, "raised an error: Conversation roles must alternate");
    EXPECT_ERROR("{{ nosuch() }}", NULL, NULL, KT_ERR_INVALID, "'nosuch' is undefined");
    kt_err err = {0};
    char *date = render("{{ strftime_now('%Y') }}", NULL, NULL, &err);
    KT_CHECK(date && strlen(date) == 4 && date[0] >= '2', "strftime_now: %s", date ? date : err.msg);
    free(date);
}

static void jinja_syntax_errors_name_the_line(void)
{
    EXPECT_ERROR("a\n{% if x %}\nb", NULL, NULL, KT_ERR_FORMAT, "line 2: 'if' is never closed");
    EXPECT_ERROR("{{ 1 +", NULL, NULL, KT_ERR_FORMAT, "unterminated");
    EXPECT_ERROR("\n\n{% endfor %}", NULL, NULL, KT_ERR_FORMAT, "line 3");
    EXPECT_ERROR("{% include 'x' %}", NULL, NULL, KT_ERR_FORMAT, "'include' is not supported");
    EXPECT_ERROR("{{ 'abc }}", NULL, NULL, KT_ERR_FORMAT, "unterminated string");
    EXPECT_ERROR("{# x", NULL, NULL, KT_ERR_FORMAT, "unterminated comment");
    EXPECT_ERROR("{{ a b }}", NULL, NULL, KT_ERR_FORMAT, "expected '}}'");
    EXPECT_ERROR("{{ x[] }}", NULL, NULL, KT_ERR_FORMAT, "empty subscript");
    EXPECT_ERROR("{{ 99999999999999999999 }}", NULL, NULL, KT_ERR_FORMAT, "does not fit");
    EXPECT_ERROR("{{ '\\u12' }}", NULL, NULL, KT_ERR_FORMAT, "truncated");
    EXPECT_ERROR("{% for x in y recursive %}{% endfor %}", NULL, NULL, KT_ERR_FORMAT, "recursive");
    EXPECT_ERROR("{% break %}", NULL, NULL, KT_ERR_INVALID, "outside a loop");
}

/* ---------------------------------------------------------------- limits --- */

static void jinja_limits_stop_hostile_templates(void)
{
    kt_jinja_limits few_steps = {.max_steps = 10000, .max_depth = 400, .max_output_bytes = 16 << 20};
    kt_jinja_limits small = {.max_steps = 1000000, .max_depth = 400, .max_output_bytes = 4096};
    /* steps: a long loop */
    EXPECT_ERROR("{% for i in range(100000) %}{% endfor %}", NULL, &few_steps, KT_ERR_INVALID,
                 "more than 10000 steps");
    EXPECT_ERROR("{% for i in range(4000) %}{% for j in range(4000) %}{% endfor %}{% endfor %}", NULL, NULL,
                 KT_ERR_INVALID, "more than 10000000 steps");
    /* a range too long to build */
    EXPECT_ERROR("{% for i in range(9223372036854775807) %}{% endfor %}", NULL, NULL, KT_ERR_INVALID,
                 "a list of");
    EXPECT_ERROR("{% for i in range(-9223372036854775807, 9223372036854775807, 1) %}{% endfor %}", NULL, NULL,
                 KT_ERR_INVALID, "a list of");
    /* depth: unbounded recursion */
    EXPECT_ERROR("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, KT_ERR_INVALID,
                 "nests deeper than 400");
    /* output bytes: the render, a string, a list */
    EXPECT_ERROR("{% for i in range(200) %}0123456789012345678901234567890123456789{% endfor %}", NULL, &small,
                 KT_ERR_INVALID,
                 "output exceeds the limit of 4096 bytes");
    EXPECT_ERROR("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                 NULL, NULL, KT_ERR_INVALID, "exceeds the limit of 16777216");
    EXPECT_ERROR("{{ 'x' * 100000000000 }}", NULL, NULL, KT_ERR_INVALID, "exceeds the limit");
    EXPECT_ERROR("{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
                 NULL, NULL, KT_ERR_INVALID, "a list of");
    EXPECT_ERROR("{{ [1] * 100000000000 }}", NULL, NULL, KT_ERR_INVALID, "a list of");
    EXPECT_ERROR("{{ 'ab' | replace('', 'x' * 3000) }}", NULL, &small, KT_ERR_INVALID, "exceeds the limit");
    /* nesting: the parser refuses it before anything recurses */
    char *deep = kt_test_xmalloc(4 * 1000 + 16);
    size_t n = 0;
    n += (size_t)sprintf(deep + n, "{{ ");
    for (int i = 0; i < 1000; i++)
        deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 1000; i++)
        deep[n++] = ')';
    strcpy(deep + n, " }}");
    EXPECT_ERROR(deep, NULL, NULL, KT_ERR_FORMAT, "nested deeper than 128");
    n = 0;
    for (int i = 0; i < 300; i++)
        n += (size_t)sprintf(deep + n, "{%% if 1 %%}");
    deep[n] = '\0';
    EXPECT_ERROR(deep, NULL, NULL, KT_ERR_FORMAT, "nested deeper than 128");
    free(deep);
    /* a long flat chain parses (it is a loop) but evaluates only as deep as the limit */
    char *chain = kt_test_xmalloc(3 * 5000 + 16);
    n = (size_t)sprintf(chain, "{{ 1");
    for (int i = 0; i < 5000; i++)
        n += (size_t)sprintf(chain + n, "+1");
    strcpy(chain + n, " }}");
    EXPECT_ERROR(chain, NULL, NULL, KT_ERR_INVALID, "nests deeper than");
    free(chain);
    /* work proportional to a value's size costs steps: no quadratic loop escapes the budget */
    EXPECT("[{{ '' * 100000000000 }}]{{ [] * 100000000000 }}", NULL, "[][]");
    EXPECT("{{ ('ab' * 500000)[::-1] | length }}", NULL, "1000000");
    EXPECT_ERROR("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s[5] }}{% endfor %}", NULL, NULL,
                 KT_ERR_INVALID, "steps");
    EXPECT_ERROR("{% set l = range(100000) | list %}{% for i in range(100000) %}{% if l == l | list %}{% endif %}"
                 "{% endfor %}",
                 NULL, NULL, KT_ERR_INVALID, "steps");
    EXPECT_ERROR("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}",
                 NULL, NULL, KT_ERR_INVALID, "steps");
    EXPECT_ERROR("{% for i in range(100000) %}{% set l = range(100000) %}{% endfor %}", NULL, NULL, KT_ERR_INVALID,
                 "steps");
    /* within the limits the same constructs render */
    EXPECT("{% macro f(n) %}{% if n < 20 %}{{ f(n + 1) }}{% else %}{{ n }}{% endif %}{% endmacro %}{{ f(0) }}", NULL,
           "20");
}

/* -------------------------------------------------------------- goldens --- */

/* Renders every case of cases.json with the templates listed under key
 * through kt_chat_render(KT_CHAT_JINJA): the path a served chat takes. */
static int render_golden_list(json_t *cases, json_t *goldens, const char *key)
{
    size_t i, j;
    json_t *tmpl, *c;
    int renders = 0;
    json_array_foreach(json_object_get(cases, key), i, tmpl) {
        const char *file = json_string_value(json_object_get(tmpl, "file"));
        char *text = read_golden_file(file);
        if (!text)
            continue;
        json_array_foreach(json_object_get(cases, "cases"), j, c) {
            const char *case_name = json_string_value(json_object_get(c, "name"));
            const char *want = json_string_value(json_object_get(json_object_get(goldens, file), case_name));
            KT_CHECK(want != NULL, "no golden for %s / %s", file, case_name);
            if (!want)
                continue;
            kt_err err = {0};
            kt_chat_messages messages;
            kt_status st = kt_chat_messages_from_json(json_object_get(c, "messages"), &messages, &err);
            KT_CHECK(st == KT_OK, "%s: messages: %s", case_name, err.msg);
            if (st != KT_OK)
                continue;
            json_t *thinking = json_object_get(c, "thinking");
            kt_chat_options options = {
                .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
                .tools = json_object_get(c, "tools"),
                .thinking = !thinking ? KT_CHAT_THINKING_DEFAULT
                            : json_is_true(thinking) ? KT_CHAT_THINKING_ON : KT_CHAT_THINKING_OFF,
                .bos_token = json_string_value(json_object_get(tmpl, "bos_token")),
                .eos_token = json_string_value(json_object_get(tmpl, "eos_token")),
                .template_text = text,
            };
            char *out = NULL;
            st = kt_chat_render(KT_CHAT_JINJA, messages.items, messages.count, &options, &out, &err);
            KT_CHECK(st == KT_OK, "%s / %s: %s", file, case_name, err.msg);
            if (out) {
                bool same = strcmp(out, want) == 0;
                KT_CHECK(same, "%s / %s differs from the golden render", file, case_name);
                if (!same) {
                    char what[300];
                    snprintf(what, sizeof what, "%s / %s", file, case_name);
                    report_difference(what, out, want);
                }
                renders++;
            }
            free(out);
            kt_chat_messages_free(&messages);
        }
        free(text);
    }
    return renders;
}

static void jinja_renders_the_published_templates_as_their_goldens(void)
{
    json_t *cases = load_golden_json("cases.json");
    json_t *goldens = load_golden_json("goldens.json");
    if (cases && goldens) {
        int renders = render_golden_list(cases, goldens, "templates");
        KT_CHECK(renders == 8 * 20, "compared %d renders, want 160 (8 templates x 20 cases)", renders);
    }
    json_decref(cases);
    json_decref(goldens);
}

/* Templates kt has no native renderer for: a community patch of a Kimi
 * template (one string changed), the compact-JSON Kimi-K2-Thinking revision,
 * DeepSeek-V3.1 (its thinking switch), and a template built from macros, a
 * namespace and loop.last. */
static void jinja_renders_templates_kt_does_not_recognise_as_their_goldens(void)
{
    json_t *cases = load_golden_json("cases.json");
    json_t *goldens = load_golden_json("goldens.json");
    if (cases && goldens) {
        size_t i;
        json_t *tmpl;
        json_array_foreach(json_object_get(cases, "jinja_templates"), i, tmpl) {
            const char *file = json_string_value(json_object_get(tmpl, "file"));
            char *text = read_golden_file(file);
            kt_err err = {0};
            kt_chat_format format = KT_CHAT_KIMI_K2_INSTRUCT;
            KT_CHECK(text && kt_chat_format_detect(text, &format, &err) == KT_ERR_UNSUPPORTED,
                     "%s is a native revision (%s)", file, kt_chat_format_name(format));
            KT_CHECK(text && kt_chat_format_resolve(text, &format, &err) == KT_OK && format == KT_CHAT_JINJA,
                     "%s resolves to %s: %s", file, kt_chat_format_name(format), err.msg);
            free(text);
        }
        int renders = render_golden_list(cases, goldens, "jinja_templates");
        KT_CHECK(renders == 4 * 20, "compared %d renders, want 80 (4 templates x 20 cases)", renders);
    }
    json_decref(cases);
    json_decref(goldens);
}

/* ------------------------------------------------------------ chat API --- */

static void jinja_resolve_keeps_native_revisions_and_refuses_what_cannot_parse(void)
{
    json_t *cases = load_golden_json("cases.json");
    size_t i;
    json_t *tmpl;
    json_array_foreach(json_object_get(cases, "templates"), i, tmpl) {
        const char *file = json_string_value(json_object_get(tmpl, "file"));
        char *text = read_golden_file(file);
        kt_err err = {0};
        kt_chat_format format = KT_CHAT_JINJA;
        KT_CHECK(text && kt_chat_format_resolve(text, &format, &err) == KT_OK &&
                     strcmp(kt_chat_format_name(format), json_string_value(json_object_get(tmpl, "format"))) == 0,
                 "%s resolves to %s", file, kt_chat_format_name(format));
        free(text);
    }
    json_decref(cases);
    kt_err err = {0};
    kt_chat_format format = KT_CHAT_JINJA;
    KT_CHECK(kt_chat_format_resolve(NULL, &format, &err) == KT_ERR_UNSUPPORTED && format == KT_CHAT_FORMAT_UNKNOWN,
             "no template");
    KT_CHECK(kt_chat_format_resolve("{% if %}", &format, &err) == KT_ERR_UNSUPPORTED &&
                 strstr(err.msg, "not recognised and not rendered") && strstr(err.msg, "line 1"),
             "unparsable: %s", err.msg);
    KT_CHECK(kt_chat_format_resolve("{{ messages[0].content }}", &format, &err) == KT_OK && format == KT_CHAT_JINJA,
             "a foreign template");
    /* a published revision with a statement added keeps every pinned substring: the probe renders catch it */
    char *r1 = read_golden_file("deepseek-r1.jinja");
    const char *at = r1 ? strstr(r1, "{{ bos_token }}{{ ns.system_prompt }}") : NULL;
    if (at) {
        size_t head = (size_t)(at - r1);
        char added[16384];
        snprintf(added, sizeof added, "%.*s{{ bos_token }}{{ ns.system_prompt }}{%% if tools %%}{{ tools | tojson }}"
                 "{%% endif %%}%s", (int)head, r1, at + strlen("{{ bos_token }}{{ ns.system_prompt }}"));
        KT_CHECK(kt_chat_format_detect(added, &format, &err) == KT_OK && format == KT_CHAT_DEEPSEEK_R1,
                 "the pins still match");
        KT_CHECK(kt_chat_format_resolve(added, &format, &err) == KT_OK && format == KT_CHAT_JINJA,
                 "R1 with a tools block resolves to %s", kt_chat_format_name(format));
    }
    KT_CHECK(at != NULL, "deepseek-r1.jinja changed");
    free(r1);
    KT_CHECK(strcmp(kt_chat_format_name(KT_CHAT_JINJA), "jinja") == 0, "name");
    KT_CHECK(kt_chat_format_renders_tools(KT_CHAT_JINJA), "jinja renders tools");
    size_t n = 9;
    KT_CHECK(kt_chat_stop_strings(KT_CHAT_JINJA, &n) == NULL && n == 0, "no family stop strings");
    kt_chat_message user = {.role = KT_CHAT_USER, .content = "hi"};
    char *out = NULL;
    KT_CHECK(kt_chat_render(KT_CHAT_JINJA, &user, 1, NULL, &out, &err) == KT_ERR_UNSUPPORTED && !out,
             "jinja without its text");
}

/* What kt_chat_render hands the template: normalised messages, tools, flags and tokens. */
static void jinja_chat_render_passes_hf_variables(void)
{
    const char *tmpl = "{% for m in messages %}{{ m.role }}:{{ m.content | tojson }}"
                       "{% if m.name is defined %} name={{ m.name }}{% endif %}"
                       "{% if m.tool_call_id is defined %} id={{ m.tool_call_id }}{% endif %}"
                       "{% if m.reasoning_content is defined %} r={{ m.reasoning_content }}{% endif %}"
                       "{% for c in m.tool_calls | default([]) %} call={{ c | tojson }}{% endfor %};"
                       "{% endfor %}|{{ tools | length if tools is not none else 'none' }}|{{ add_generation_prompt }}|"
                       "{{ bos_token }}{{ eos_token }}|{{ documents }}|"
                       "{{ thinking }}{{ enable_thinking }}";
    kt_chat_tool_call call = {.id = NULL, .name = "f", .arguments = "{\"a\": 1}"};
    kt_chat_message msgs[] = {
        {.role = KT_CHAT_SYSTEM, .content = "s", .name = "sys"},
        {.role = KT_CHAT_ASSISTANT, .content = NULL, .reasoning_content = "why", .tool_calls = &call,
         .n_tool_calls = 1},
        {.role = KT_CHAT_TOOL, .content = "r", .tool_call_id = "c1"},
    };
    json_t *tools = json_loads("[{\"type\": \"function\"}]", 0, NULL);
    kt_chat_options opts = {.add_generation_prompt = true, .tools = tools, .bos_token = "<b>", .eos_token = "<e>",
                            .thinking = KT_CHAT_THINKING_OFF, .template_text = tmpl};
    char *out = NULL;
    kt_err err = {0};
    KT_CHECK(kt_chat_render(KT_CHAT_JINJA, msgs, 3, &opts, &out, &err) == KT_OK, "%s", err.msg);
    const char *want = "system:\"s\" name=sys;assistant:\"\" r=why call={\"type\": \"function\", \"function\": "
                       "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}};tool:\"r\" id=c1;|1|True|<b><e>|None|FalseFalse";
    KT_CHECK(out && strcmp(out, want) == 0, "got %s", out ? out : "NULL");
    free(out);
    opts = (kt_chat_options){.template_text = tmpl};
    KT_CHECK(kt_chat_render(KT_CHAT_JINJA, msgs, 1, &opts, &out, &err) == KT_OK && out &&
                 strcmp(out, "system:\"s\" name=sys;|none|False||None|") == 0,
             "defaults: %s", out ? out : err.msg);
    free(out);
    /* The template's own errors come back as the render's. */
    opts.template_text = "{{ raise_exception('only user and assistant roles') }}";
    KT_CHECK(kt_chat_render(KT_CHAT_JINJA, msgs, 1, &opts, &out, &err) == KT_ERR_INVALID && !out &&
                 strstr(err.msg, "only user and assistant roles"),
             "raise: %s", err.msg);
    json_decref(tools);
}


/* ------------------------------------------------------------- serving --- */

/* KT_RUN for a case that takes two arguments. */
#define KT_RUN_2(fn, a, b)                                                                 \
    do {                                                                                   \
        int before_ = kt_test_failures;                                                    \
        fn(a, b);                                                                          \
        printf("%s %s\n", kt_test_failures == before_ ? "ok  " : "FAIL", #fn);             \
        fflush(stdout);                                                                    \
    } while (0)

#define PATCHED "kimi-k2-instruct-0905-patched.jinja"

/* Copies the GGUF file `from` to `to` with tokenizer.chat_template replaced. */
static bool copy_with_template(const char *from, const char *to, const char *template_text)
{
    struct kt_gguf *g = NULL;
    struct kt_gguf_writer *w = NULL;
    kt_err err = {0};
    kt_status st = kt_gguf_open(from, &g, &err);
    if (st == KT_OK)
        st = kt_gguf_writer_create(to, &w, &err);
    for (uint64_t i = 0; st == KT_OK && i < g->n_kv; i++)
        st = strcmp(g->kv[i].key, "tokenizer.chat_template") == 0
                 ? kt_gguf_writer_set_str(w, g->kv[i].key, template_text, &err)
                 : kt_gguf_writer_set(w, g->kv[i].key, &g->kv[i].value, &err);
    for (uint64_t i = 0; st == KT_OK && i < g->n_tensors; i++)
        st = kt_gguf_writer_add_tensor(w, g->tensors[i].name, g->tensors[i].type, g->tensors[i].n_dims,
                                       g->tensors[i].ne, &err);
    if (st == KT_OK)
        st = kt_gguf_writer_write_header(w, &err);
    for (uint64_t i = 0; st == KT_OK && i < g->n_tensors; i++)
        st = kt_gguf_writer_write_data(w, g->tensors[i].data, g->tensors[i].nbytes, &err);
    if (st == KT_OK)
        st = kt_gguf_writer_finish(w, &err);
    KT_CHECK(st == KT_OK, "copying %s: %s", from, err.msg);
    kt_gguf_writer_destroy(w);
    kt_gguf_close(g);
    return st == KT_OK;
}

/* The golden render of case `name` for the patched template. */
static char *patched_golden(const char *name)
{
    json_t *goldens = load_golden_json("goldens.json");
    const char *want = json_string_value(json_object_get(json_object_get(goldens, PATCHED), name));
    char *copy = want ? strdup(want) : NULL;
    json_decref(goldens);
    KT_CHECK(copy != NULL, "no golden %s / %s", PATCHED, name);
    return copy;
}

static const char CHAT_BODY[] = "{\"messages\": [{\"role\": \"system\", \"content\": \"You are a helpful "
                                "assistant.\"}, {\"role\": \"user\", \"content\": \"Hello!\"}], \"max_tokens\": 4}";

static struct kt_tokenizer *open_tokenizer(const char *model, struct kt_gguf **g)
{
    struct kt_tokenizer *tok = NULL;
    kt_err err = {0};
    *g = NULL;
    KT_CHECK(kt_gguf_open(model, g, &err) == KT_OK && kt_tokenizer_create(*g, &tok, &err) == KT_OK, "%s: %s", model,
             err.msg);
    return tok;
}

/* What a server reads off a template it renders with the interpreter: the
 * family from the tool-call markers the template writes, else from the
 * vocabulary's special tokens; thinking from <think>; whether tools are read. */
static void jinja_traits_take_the_family_from_the_template_or_the_vocabulary(const char *kimi_model)
{
    static const struct {
        const char *file;
        kt_chat_family family;
        bool thinks, renders_tools;
    } expect[] = {
        {"kimi-k2-instruct-0905-patched.jinja", KT_CHAT_FAMILY_KIMI, false, true},
        {"kimi-k2-thinking-compact-tools.jinja", KT_CHAT_FAMILY_KIMI, true, true},
        {"kimi-k2-instruct.jinja", KT_CHAT_FAMILY_KIMI, false, true},
        {"deepseek-r1.jinja", KT_CHAT_FAMILY_DEEPSEEK, true, false},
        {"deepseek-r1-think.jinja", KT_CHAT_FAMILY_DEEPSEEK, true, false},
        {"deepseek-v3-0324.jinja", KT_CHAT_FAMILY_DEEPSEEK, false, false},
        /* DeepSeek's markers with V3.1's call form (NAME<｜tool▁sep｜>ARGS): not read as V3's */
        {"deepseek-v3.1.jinja", KT_CHAT_FAMILY_UNKNOWN, true, false},
        {"chatml-macros.jinja", KT_CHAT_FAMILY_UNKNOWN, true, true},
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        char *text = read_golden_file(expect[i].file);
        if (!text)
            continue;
        kt_chat_traits t = kt_chat_traits_of(KT_CHAT_JINJA, text, NULL);
        KT_CHECK(t.family == expect[i].family && t.thinks == expect[i].thinks &&
                     t.renders_tools == expect[i].renders_tools,
                 "%s: family %s thinks %d tools %d", expect[i].file, kt_chat_family_name(t.family), t.thinks,
                 t.renders_tools);
        free(text);
    }
    /* native revisions carry their own */
    kt_chat_traits r1 = kt_chat_traits_of(KT_CHAT_DEEPSEEK_R1_THINK, NULL, NULL);
    kt_chat_traits k2 = kt_chat_traits_of(KT_CHAT_KIMI_K2_INSTRUCT_0905, NULL, NULL);
    KT_CHECK(r1.family == KT_CHAT_FAMILY_DEEPSEEK && r1.thinks && !r1.renders_tools, "r1-think traits");
    KT_CHECK(k2.family == KT_CHAT_FAMILY_KIMI && !k2.thinks && k2.renders_tools, "0905 traits");
    KT_CHECK(kt_chat_traits_of(KT_CHAT_FORMAT_UNKNOWN, NULL, NULL).family == KT_CHAT_FAMILY_UNKNOWN, "unknown");
    size_t n = 0;
    const char *const *stops = kt_chat_family_stop_strings(KT_CHAT_FAMILY_DEEPSEEK, &n);
    KT_CHECK(n == 1 && strcmp(stops[0], "<｜end▁of▁sentence｜>") == 0, "deepseek stops");
    stops = kt_chat_family_stop_strings(KT_CHAT_FAMILY_KIMI, &n);
    KT_CHECK(n == 4 && strcmp(stops[0], "<|im_end|>") == 0, "kimi stops");
    KT_CHECK(kt_chat_family_stop_strings(KT_CHAT_FAMILY_UNKNOWN, &n) == NULL && n == 0, "unknown stops");

    /* a template that writes no markers: the vocabulary decides */
    char ds_model[1024];
    snprintf(ds_model, sizeof ds_model, "%s", kt_test_path("jinja-traits-v3.gguf"));
    struct kt_gguf *kg = NULL, *dg = NULL;
    struct kt_tokenizer *kimi = open_tokenizer(kimi_model, &kg), *ds = NULL;
    if (make_model(ds_model, "tiny-v3", NULL))
        ds = open_tokenizer(ds_model, &dg);
    const char *plain = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
    KT_CHECK(kt_chat_traits_of(KT_CHAT_JINJA, plain, NULL).family == KT_CHAT_FAMILY_UNKNOWN, "no vocabulary");
    if (kimi)
        KT_CHECK(kt_chat_traits_of(KT_CHAT_JINJA, plain, kimi).family == KT_CHAT_FAMILY_KIMI &&
                     !kt_chat_traits_of(KT_CHAT_JINJA, plain, kimi).renders_tools,
                 "Kimi's vocabulary");
    if (ds)
        KT_CHECK(kt_chat_traits_of(KT_CHAT_JINJA, plain, ds).family == KT_CHAT_FAMILY_DEEPSEEK, "DeepSeek's vocabulary");
    char *v31 = read_golden_file("deepseek-v3.1.jinja");
    if (v31 && ds) /* the template's markers win over the vocabulary */
        KT_CHECK(kt_chat_traits_of(KT_CHAT_JINJA, v31, ds).family == KT_CHAT_FAMILY_UNKNOWN, "V3.1 on V3's vocabulary");
    free(v31);
    kt_tokenizer_destroy(kimi), kt_tokenizer_destroy(ds);
    kt_gguf_close(kg), kt_gguf_close(dg);
    unlink(ds_model);
}

/* The GGUF's own template is none kt renders natively: the serve prompt API
 * renders it through the interpreter, as the golden says. */
static void jinja_a_gguf_with_an_unrecognised_template_renders_its_chat_prompts(const char *model)
{
    struct kt_gguf *g = NULL;
    kt_err err = {0};
    KT_CHECK(kt_gguf_open(model, &g, &err) == KT_OK, "%s", err.msg);
    if (!g)
        return;
    char why[512] = "", *text = NULL;
    kt_chat_format format = kt_serve_chat_template(g, NULL, &text, why, sizeof why);
    KT_CHECK(format == KT_CHAT_JINJA && text, "format %s: %s", kt_chat_format_name(format), why);
    /* callers that keep no text still see a template they cannot render */
    KT_CHECK(kt_serve_chat_format(g, why, sizeof why) == KT_CHAT_FORMAT_UNKNOWN && strstr(why, "natively"),
             "without text: %s", why);
    struct kt_serve_model m = {.format = format, .chat_template = text, .n_ctx = 4096, .n_vocab = 1000};
    struct kt_api_request r;
    struct kt_api_error e;
    KT_CHECK(kt_api_request_parse(KT_API_CHAT, CHAT_BODY, strlen(CHAT_BODY), &r, &e), "request");
    char *prompt = NULL, *want = patched_golden("system_user");
    KT_CHECK(kt_prompt_render_chat(&m, &r, &prompt, &e), "render");
    KT_CHECK(prompt && want && strcmp(prompt, want) == 0, "prompt \"%s\"", prompt ? prompt : "NULL");
    free(prompt), free(want), free(text);
    kt_api_request_free(&r);
    kt_gguf_close(g);
}

/* The same file served over HTTP: kt-serve says it renders the template
 * with the interpreter, /tokenize's chat form holds the golden's tokens, a
 * chat completion answers; --chat-template overrides a template kt knows. */
static void jinja_kt_serve_serves_a_chat_with_a_template_kt_does_not_recognise(const char *model, const char *known)
{
    struct test_server s;
    char *want = patched_golden("system_user");
    if (!want || !server_start(&s, model, "-t 2 -q", true)) {
        free(want);
        return;
    }
    size_t len;
    char *log = kt_test_read_file(s.log, &len);
    KT_CHECK(log && strstr(log, "chat template: jinja (unrecognised template: rendered by the interpreter)"),
             "log: %s", log ? log : "(none)");
    free(log);
    struct kt_buf out = {0}, detok = {0};
    KT_CHECK(http(&s, NULL, "/tokenize", CHAT_BODY, &out, NULL) == 200, "tokenize: %s", kt_buf_str(&out));
    json_t *tok = json_loads(kt_buf_str(&out), 0, NULL);
    json_t *body = json_pack("{sO}", "tokens", json_object_get(tok, "tokens"));
    char *body_text = json_dumps(body, 0);
    KT_CHECK(http(&s, NULL, "/detokenize", body_text, &detok, NULL) == 200, "detokenize: %s", kt_buf_str(&detok));
    json_t *d = json_loads(kt_buf_str(&detok), 0, NULL);
    const char *prompt = json_string_value(json_object_get(d, "prompt"));
    KT_CHECK(prompt && strcmp(prompt, want) == 0, "served prompt \"%s\"", prompt ? prompt : kt_buf_str(&detok));
    KT_CHECK(http(&s, NULL, "/v1/chat/completions", CHAT_BODY, &out, NULL) == 200 &&
                 strstr(kt_buf_str(&out), "\"choices\""),
             "chat: %s", kt_buf_str(&out));
    KT_CHECK(server_stop(&s) == 0, "exit status");
    json_decref(d), json_decref(body), json_decref(tok), free(body_text);

    /* --chat-template FILE in place of the model's own (a native revision) */
    char args[1400];
    snprintf(args, sizeof args, "-t 2 -q --chat-template %s/%s", golden_dir(), PATCHED);
    if (server_start(&s, known, args, true)) {
        log = kt_test_read_file(s.log, &len);
        KT_CHECK(log && strstr(log, "rendered by the interpreter"), "log: %s", log ? log : "(none)");
        free(log);
        KT_CHECK(http(&s, NULL, "/tokenize", CHAT_BODY, &out, NULL) == 200, "tokenize");
        tok = json_loads(kt_buf_str(&out), 0, NULL);
        body = json_pack("{sO}", "tokens", json_object_get(tok, "tokens"));
        body_text = json_dumps(body, 0);
        KT_CHECK(http(&s, NULL, "/detokenize", body_text, &detok, NULL) == 200, "detokenize");
        d = json_loads(kt_buf_str(&detok), 0, NULL);
        prompt = json_string_value(json_object_get(d, "prompt"));
        KT_CHECK(prompt && strcmp(prompt, want) == 0, "overridden prompt \"%s\"", prompt ? prompt : "NULL");
        KT_CHECK(server_stop(&s) == 0, "exit status");
        json_decref(d), json_decref(body), json_decref(tok), free(body_text);
    }
    kt_buf_free(&out), kt_buf_free(&detok);
    free(want);
}

/* --chat-template is refused before a weight is read when it cannot be used;
 * kt-run --info names how the template renders. */
static void jinja_chat_template_option_refuses_early_and_info_names_the_family(const char *model, const char *known)
{
    char log[1024], bad[1024];
    snprintf(log, sizeof log, "%s", kt_test_path("chat-template.log"));
    snprintf(bad, sizeof bad, "%s", kt_test_path("bad.jinja"));
    FILE *f = fopen(bad, "w");
    if (f) {
        fputs("{% if messages %}never closed", f);
        fclose(f);
    }
    int rc = kt_test_system("%s -m %s --port 0 -q --chat-template /nonexistent/t.jinja 2> %s",
                            kt_test_tool("kt-serve"), known, log);
    size_t len;
    char *text = kt_test_read_file(log, &len);
    KT_CHECK(rc == 1 && text && strstr(text, "--chat-template /nonexistent/t.jinja: cannot read") &&
                 !strstr(text, "listening"),
             "kt-serve, unreadable: exit %d, %s", rc, text ? text : "(none)");
    free(text);
    rc = kt_test_system("%s -m %s --port 0 -q --chat-template %s 2> %s", kt_test_tool("kt-serve"), known, bad, log);
    text = kt_test_read_file(log, &len);
    KT_CHECK(rc == 1 && text && strstr(text, "never closed") && !strstr(text, "listening"),
             "kt-serve, unparsable: exit %d, %s", rc, text ? text : "(none)");
    free(text);
    rc = kt_test_system("%s --info %s --chat-template /nonexistent/t.jinja > %s 2>&1", kt_test_tool("kt-run"), known,
                        log);
    text = kt_test_read_file(log, &len);
    KT_CHECK(rc == 2 && text && strstr(text, "cannot read"), "kt-run, unreadable: exit %d, %s", rc,
             text ? text : "(none)");
    free(text);
    rc = kt_test_system("%s --info %s > %s 2>&1", kt_test_tool("kt-run"), model, log);
    text = kt_test_read_file(log, &len);
    KT_CHECK(rc == 0 && text && strstr(text, "jinja (unrecognised template: rendered by the interpreter)"),
             "kt-run --info, unrecognised: exit %d, %s", rc, text ? text : "(none)");
    free(text);
    rc = kt_test_system("%s --info %s > %s 2>&1", kt_test_tool("kt-run"), known, log);
    text = kt_test_read_file(log, &len);
    KT_CHECK(rc == 0 && text && strstr(text, "kimi-k2-instruct (rendered natively)"),
             "kt-run --info, native: exit %d, %s", rc, text ? text : "(none)");
    free(text);
    /* kt-run --chat renders through the interpreter too */
    rc = kt_test_system("%s -m %s --chat hi -n 2 -t 2 -q > %s 2>&1", kt_test_tool("kt-run"), model, log);
    text = kt_test_read_file(log, &len);
    KT_CHECK(rc == 0 && text && strstr(text, "jinja"), "kt-run --chat: exit %d, %s", rc, text ? text : "(none)");
    free(text);
    unlink(log), unlink(bad);
}

int main(void)
{
    KT_RUN(jinja_whitespace_control_follows_trim_and_lstrip_blocks);
    KT_RUN(jinja_if_elif_else_and_truthiness);
    KT_RUN(jinja_for_loop_variables_else_and_unpacking);
    KT_RUN(jinja_set_namespace_and_block_set);
    KT_RUN(jinja_macros_take_arguments_defaults_and_keywords);
    KT_RUN(jinja_operators_follow_python);
    KT_RUN(jinja_tests_answer_as_jinja2);
    KT_RUN(jinja_filters_follow_jinja2_and_hf);
    KT_RUN(jinja_tojson_is_python_json_dumps);
    KT_RUN(jinja_string_and_dict_methods);
    KT_RUN(jinja_globals_range_raise_exception_and_dict);
    KT_RUN(jinja_syntax_errors_name_the_line);
    KT_RUN(jinja_limits_stop_hostile_templates);
    KT_RUN(jinja_renders_the_published_templates_as_their_goldens);
    KT_RUN(jinja_renders_templates_kt_does_not_recognise_as_their_goldens);
    KT_RUN(jinja_resolve_keeps_native_revisions_and_refuses_what_cannot_parse);
    KT_RUN(jinja_chat_render_passes_hf_variables);

    char known[1024], model[1024];
    snprintf(known, sizeof known, "%s", kt_test_path("jinja-kimi.gguf"));
    snprintf(model, sizeof model, "%s", kt_test_path("jinja-patched.gguf"));
    char *patched = read_golden_file(PATCHED);
    if (patched && make_model(known, "tiny", NULL) && copy_with_template(known, model, patched)) {
        RUN_WITH(jinja_a_gguf_with_an_unrecognised_template_renders_its_chat_prompts, model);
        RUN_WITH(jinja_traits_take_the_family_from_the_template_or_the_vocabulary, known);
        if (have_curl()) {
            KT_RUN_2(jinja_kt_serve_serves_a_chat_with_a_template_kt_does_not_recognise, model, known);
        } else {
            printf("skipped jinja_kt_serve_serves_a_chat_with_a_template_kt_does_not_recognise: no curl\n");
        }
        KT_RUN_2(jinja_chat_template_option_refuses_early_and_info_names_the_family, model, known);
    } else {
        KT_CHECK(false, "could not make the test models");
    }
    free(patched);
    unlink(known), unlink(model);
    return kt_test_finish();
}
