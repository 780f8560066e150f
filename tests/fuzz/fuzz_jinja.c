/*
 * fuzz_jinja.c - fuzz target for the chat-template interpreter
 * (kt_jinja_parse, then kt_jinja_render under small limits).
 *
 * An input is a template; bytes after its first NUL, when they parse as a
 * JSON object, are the context (otherwise a chat with tools and tool calls
 * is).  An input whose first byte is 0x01 is all template, NULs included.  Promises: parsing fails only with KT_ERR_FORMAT or KT_ERR_NOMEM and a
 * message naming the line; rendering ends within its limits (output at most
 * max_output_bytes, NUL-terminated at its length) or fails with
 * KT_ERR_INVALID or KT_ERR_NOMEM and a message naming the line, never with
 * output.  A broken promise aborts.  No files touched, no state kept.
 *
 * kt_fuzz_seeds hands replay.c the real templates of tests/golden/chat (the
 * published Kimi-K2 and DeepSeek revisions and the variants), their
 * truncations and one-byte changes; a libFuzzer run takes that folder as its
 * seed corpus (fuzz_jinja tests/golden/chat).
 */
#include "fuzz.h"

#include <dirent.h>
#include <stdbool.h>

#include "jinja.h"

static void require(bool cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_jinja: broken promise: %s\n", what);
        abort();
    }
}

static const char DEFAULT_CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi "
    "\\u00e9\"}, {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"think\", \"tool_calls\": "
    "[{\"id\": \"functions.f:0\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
    "\"{\\\"x\\\": 1}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"functions.f:0\", \"content\": \"42\"}, "
    "{\"role\": \"user\", \"content\": \"</think>and?\", \"name\": \"bob\"}], \"tools\": [{\"type\": \"function\", "
    "\"function\": {\"name\": \"f\", \"description\": \"d\", \"parameters\": {\"type\": \"object\", \"x\": 1.5}}}], "
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    /* A first byte 0x01: the rest is all template, NUL bytes included. */
    bool whole = size > 0 && data[0] == 0x01;
    if (whole)
        text++, size--;
    const char *nul = whole ? NULL : memchr(text, '\0', size);
    size_t source_len = nul ? (size_t)(nul - text) : size;
    char *source = malloc(source_len ? source_len : 1); /* exactly sized: an overread is caught */
    if (!source)
        return 0;
    memcpy(source, text, source_len);
    json_t *ctx = NULL;
    if (nul)
        ctx = json_loadb(nul + 1, size - source_len - 1, 0, NULL);
    if (!json_is_object(ctx)) {
        json_decref(ctx);
        ctx = json_loads(DEFAULT_CONTEXT, 0, NULL);
        require(ctx != NULL, "the default context parses");
    }
    kt_jinja_template *t = NULL;
    kt_err err = {0};
    kt_status st = kt_jinja_parse(source, source_len, &t, &err);
    if (st != KT_OK) {
        require(!t, "no template on failure");
        require(st == KT_ERR_FORMAT || st == KT_ERR_NOMEM, "parse status");
        require(st == KT_ERR_NOMEM || strncmp(err.msg, "chat template line ", 19) == 0, "parse message names the line");
    } else {
        const kt_jinja_limits limits = {.max_steps = 200000, .max_depth = 200, .max_output_bytes = 1 << 16};
        char *out = (char *)1;
        size_t len = 7;
        st = kt_jinja_render(t, ctx, &limits, &out, &len, &err);
        if (st == KT_OK) {
            require(out != NULL && len <= limits.max_output_bytes && out[len] == '\0', "output within its limit");
        } else {
            require(out == NULL && len == 0, "no output on failure");
            require(st == KT_ERR_INVALID || st == KT_ERR_NOMEM, "render status");
            require(st == KT_ERR_NOMEM || strncmp(err.msg, "chat template line ", 19) == 0,
                    "render message names the line");
        }
        free(out);
    }
    kt_jinja_destroy(t);
    json_decref(ctx);
    free(source);
    return 0;
}

#ifdef KT_GOLDEN_CHAT_DIR
static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void kt_fuzz_seeds(kt_fuzz_emit_fn emit)
{
    DIR *dir = opendir(KT_GOLDEN_CHAT_DIR);
    if (!dir) {
        fprintf(stderr, "fuzz_jinja: no seed templates in %s\n", KT_GOLDEN_CHAT_DIR);
        abort(); /* the seed corpus is part of the test */
    }
    char *seeds[64];
    size_t n = 0;
    struct dirent *d;
    while ((d = readdir(dir)) && n < 64) {
        size_t len = strlen(d->d_name);
        if (len < 6 || strcmp(d->d_name + len - 6, ".jinja") != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", KT_GOLDEN_CHAT_DIR, d->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        char *buf = malloc(1 << 16);
        size_t got = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
        fclose(f);
        if (!buf)
            continue;
        buf[got] = '\0';
        seeds[n++] = buf;
    }
    closedir(dir);
    require(n >= 8, "the golden templates are there");
    qsort(seeds, n, sizeof *seeds, by_name);
    /* A brace, a percent sign, a minus and a quote break tags, trimming and literals. */
    kt_fuzz_mutated_seeds(emit, (const char *const *)seeds, n, "{%-'", 4);
    for (size_t i = 0; i < n; i++)
        free(seeds[i]);
    /* Hostile ones: every limit, NUL bytes inside a template, a context of its own. */
    static const struct { const char *bytes; size_t size; } hostile[] = {
#define SEED(s) {s, sizeof s - 1}
        SEED("{% for i in range(100000000) %}{% endfor %}"),
        SEED("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
        SEED("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
        SEED("{{ ((((((((((((((((((((((((((((((((((((((((1)))))))))))))))))))))))))))))))))))))))) }}"),
        SEED("{{ 'ab' * 9223372036854775807 }}{{ [1] * 9223372036854775807 }}{{ range(-9223372036854775807, "
             "9223372036854775807) }}"),
        SEED("{{ 'x'[::-9223372036854775807] }}{{ [1, 2][-9223372036854775807:9223372036854775807:3] }}"),
        SEED("\x01{# a \0 #}{{ 'x\0y' | length }}{% if '\0' in 'a\0' %}nul{% endif %}"),
        SEED("{{ messages | tojson(indent=2) }}\0{\"messages\": [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}"),
        SEED("{% for m in messages %}{{ m.content[::-1] }}{% endfor %}\0{\"messages\": [{\"content\": \"h\u00e9\"}]}"),
#undef SEED
    };
    for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++) {
        char label[32];
        snprintf(label, sizeof label, "hostile%zu", i);
        emit((const uint8_t *)hostile[i].bytes, hostile[i].size, label);
    }
}
#endif
