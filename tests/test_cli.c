/*
 * test_cli.c - the option parsing every tool shares (tools/cli/cli.h): an
 * unknown option, command word or value is answered with the closest known
 * ones (edit distance, or a beginning: --tmep and --temperature find
 * --temp, --top finds --top-k and --top-p, kernel finds kernels) and
 * nothing when none is close; a number out of range or not a number says
 * which, with the range and the hint; an option of another command names
 * the commands it belongs to; a usage error prints its line and the
 * synopsis, not the whole help.
 */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "testlib.h"

static void suggestions_find_slips_and_beginnings(void)
{
    static const char *const names[] = {"--temp", "--top-k", "--top-p", "--threads", "--ctx", "-t", "--seed"};
    const size_t n = sizeof names / sizeof names[0];
    struct {
        const char *word, *want;
    } cases[] = {
        {"--tmep", "did you mean '--temp'?"},                 /* swapped neighbours */
        {"--tem", "did you mean '--temp'?"},                  /* one left out */
        {"--temperature", "did you mean '--temp'?"},          /* a longer word it begins */
        {"--top", "did you mean '--top-k' or '--top-p'?"},    /* ties, in table order */
        {"--top_p", "did you mean '--top-p'?"},               /* one replaced */
        {"--thread", "did you mean '--threads'?"},
        {"--CTX", "did you mean '--ctx'?"},                   /* case alone */
        {"-T", "did you mean '-t'?"},
        {"--frobnicate", ""},                                 /* nothing close: no guess */
        {"-x", ""},                                           /* one letter: only its other case */
        {"--seeds", "did you mean '--seed'?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[256];
        kt_cli_suggest(cases[i].word, names, n, out, sizeof out);
        KT_CHECK(strcmp(out, cases[i].want) == 0, "'%s': got \"%s\", want \"%s\"", cases[i].word, out, cases[i].want);
    }
    static const char *const many[] = {"--max-seqs", "--max-waiting", "--max-batch-tokens", "--max-body-bytes"};
    char out[256];
    kt_cli_suggest("--max", many, 4, out, sizeof out);
    KT_CHECK(strcmp(out, "did you mean '--max-seqs', '--max-waiting' or '--max-batch-tokens'?") == 0,
             "at most three names: %s", out);
}

static void numbers_state_their_range(void)
{
    char why[512];
    uint32_t u = 7;
    KT_CHECK(kt_cli_u32_arg("--ctx", "64", 1, 1u << 24, NULL, &u, why, sizeof why) && u == 64, "64 is taken");
    KT_CHECK(!kt_cli_u32_arg("--ctx", "999999999", 1, 1u << 24, "positions", &u, why, sizeof why) &&
                 strcmp(why, "--ctx '999999999' is out of range: give a whole number from 1 to 16777216 "
                             "(positions)") == 0 && u == 64,
             "too large: %s", why);
    KT_CHECK(!kt_cli_u32_arg("--ctx", "-5", 1, 100, NULL, &u, why, sizeof why) &&
                 strcmp(why, "--ctx '-5' is out of range: give a whole number from 1 to 100") == 0,
             "negative: %s", why);
    KT_CHECK(!kt_cli_u32_arg("--ctx", "4k", 1, 100, NULL, &u, why, sizeof why) &&
                 strcmp(why, "--ctx '4k' is not a whole number: give a whole number from 1 to 100") == 0,
             "a word: %s", why);
    KT_CHECK(!kt_cli_u32_arg("--ctx", "99999999999999999999999", 1, 100, NULL, &u, why, sizeof why) &&
                 strstr(why, "is out of range"), "beyond 64 bits: %s", why);
    uint64_t seed;
    KT_CHECK(!kt_cli_u64_arg("--seed", "-1", 0, UINT64_MAX, NULL, &seed, why, sizeof why) &&
                 strcmp(why, "--seed '-1' is out of range: give a whole number of at least 0") == 0,
             "no upper bound: %s", why);

    float f = 0.5f;
    KT_CHECK(kt_cli_float_arg("--top-p", "1", 0, 1, KT_CLI_LO_OPEN, NULL, &f, why, sizeof why) && f == 1.0f, "1");
    KT_CHECK(!kt_cli_float_arg("--top-p", "0", 0, 1, KT_CLI_LO_OPEN, "1: off", &f, why, sizeof why) &&
                 strcmp(why, "--top-p '0' is out of range: give a number in (0, 1] (1: off)") == 0 && f == 1.0f,
             "an open bound: %s", why);
    KT_CHECK(!kt_cli_float_arg("--temp", "-1", 0, INFINITY, KT_CLI_CLOSED, "0: greedy", &f, why, sizeof why) &&
                 strcmp(why, "--temp '-1' is out of range: give a number >= 0 (0: greedy)") == 0,
             "no upper bound: %s", why);
    KT_CHECK(!kt_cli_float_arg("--temp", "1e39", 0, INFINITY, KT_CLI_CLOSED, NULL, &f, why, sizeof why) &&
                 strstr(why, "out of range") && strstr(why, "the largest float"), "beyond a float: %s", why);
    KT_CHECK(!kt_cli_float_arg("--temp", "hot", 0, INFINITY, KT_CLI_CLOSED, NULL, &f, why, sizeof why) &&
                 strstr(why, "'hot' is not a number"), "a word: %s", why);
    KT_CHECK(!kt_cli_float_arg("--temp", "nan", 0, INFINITY, KT_CLI_CLOSED, NULL, &f, why, sizeof why) &&
                 strstr(why, "'nan' is not a number"), "NaN: %s", why);
    double d;
    KT_CHECK(!kt_cli_double_arg("--min-gain", "1", 0, 1, KT_CLI_HI_OPEN, NULL, &d, why, sizeof why) &&
                 strstr(why, "give a number in [0, 1)"), "half open: %s", why);
    KT_CHECK(!kt_cli_double_arg("--timeout", "1e400", 0, 1e9, KT_CLI_CLOSED, NULL, &d, why, sizeof why) &&
                 strstr(why, "'1e400' is out of range"), "overflow is out of range: %s", why);
}

static void choices_name_every_choice(void)
{
    static const char *const devices[] = {"cuda", "sim", "cpu"};
    char why[512];
    KT_CHECK(kt_cli_choice_arg("--device", "sim", devices, 3, why, sizeof why) == 1, "sim is choice 1");
    KT_CHECK(kt_cli_choice_arg("--device", "cdua", devices, 3, why, sizeof why) == -1 &&
                 strcmp(why, "--device 'cdua' is not one of cuda, sim or cpu: did you mean 'cuda'?") == 0,
             "%s", why);
    KT_CHECK(kt_cli_choice_arg("--device", "tpu-pod", devices, 3, why, sizeof why) == -1 &&
                 strcmp(why, "--device 'tpu-pod' is not one of cuda, sim or cpu: give one of them") == 0,
             "%s", why);
    bool lfu = false;
    KT_CHECK(kt_cli_cache_policy_arg("lfu", &lfu, why, sizeof why) && lfu, "lfu");
    KT_CHECK(!kt_cli_cache_policy_arg("lfru", &lfu, why, sizeof why) && strstr(why, "--expert-cache-policy 'lfru'") &&
                 strstr(why, "lru or lfu"), "%s", why);
}

/* ---- kt_cli_parse, its stderr captured ----------------------------------------------------------- */

struct opts {
    uint32_t ctx;
    bool quiet;
    const char *model;
};
#define OPTS(o) ((struct opts *)(o))
KT_CLI_U32_OPTION(opt_ctx, ctx, 1, 4096, "--ctx", NULL)
KT_CLI_STRING_OPTION(opt_model, model)

static bool opt_quiet(void *o, const char *arg, char *why, size_t ws)
{
    (void)arg, (void)why, (void)ws;
    OPTS(o)->quiet = true;
    return true;
}

enum { RUN = 1, BENCH = 2 };
static const char *const commands[] = {"run", "bench"};
static const struct kt_cli_option table[] = {
    {"--ctx", NULL, "N", 0, "positions", opt_ctx},
    {"--quiet", "-q", NULL, 0, "quiet", opt_quiet},
    {"--model", "-m", "MODEL", BENCH, "the model", opt_model},
};

static int usage_calls;
static void usage(FILE *f)
{
    usage_calls++;
    fprintf(f, "usage: tool [options]\n\noptions:\n  (the whole help)\n");
}

static const struct kt_cli cli = {.prog = "tool", .options = table, .n_options = 3, .usage = usage,
                                  .synopsis = "usage: tool [options]\n", .command_names = commands, .n_commands = 2};

/* Parses args (split at spaces) for command; stderr in err_out (malloc'd). */
static int parse(const char *args, unsigned command, struct opts *o, char **err_out)
{
    char buf[512], *argv[32] = {"tool"};
    int argc = 1;
    snprintf(buf, sizeof buf, "%s", args);
    for (char *t = strtok(buf, " "); t && argc < 31; t = strtok(NULL, " "))
        argv[argc++] = t;
    const char *path = kt_test_path("cli-stderr.txt");
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    int rc = kt_cli_parse(&cli, argc, argv, 1, command, o);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t n = 0;
    *err_out = kt_test_read_file(path, &n);
    unlink(path);
    return rc;
}

static void usage_errors_print_one_line_and_the_synopsis(void)
{
    struct {
        const char *args;
        unsigned command;
        const char *want;
    } cases[] = {
        {"--ctz 5", 0, "tool: unknown option '--ctz': did you mean '--ctx'?\n"},
        {"--qiuet", 0, "tool: unknown option '--qiuet': did you mean '--quiet'?\n"},
        {"--ctz=5", 0, "tool: unknown option '--ctz': did you mean '--ctx'?\n"},
        {"--mdoel x", RUN, "tool: unknown option '--mdoel'\n"},     /* --model is not run's: no guess of it */
        {"--model x", RUN, "tool: --model does not apply to run: it is an option of bench\n"},
        {"--ctx 0", 0, "tool: --ctx '0' is out of range: give a whole number from 1 to 4096\n"},
        {"--ctx", 0, "tool: --ctx needs a value: give --ctx N\n"},
        {"--quiet=yes", 0, "tool: --quiet takes no value ('--quiet=yes' given): give --quiet alone\n"},
        {"stray", 0, "tool: unexpected operand 'stray': options start with '-'\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct opts o = {0};
        char *err = NULL;
        usage_calls = 0;
        int rc = parse(cases[i].args, cases[i].command, &o, &err);
        char want[512];
        snprintf(want, sizeof want, "%susage: tool [options]\n'tool --help' lists every option\n", cases[i].want);
        KT_CHECK(rc == 2 && err && strcmp(err, want) == 0 && usage_calls == 0, "'%s': rc %d, stderr:\n%s",
                 cases[i].args, rc, err ? err : "(none)");
        free(err);
    }
    struct opts o = {0};
    char *err = NULL;
    int rc = parse("--ctx=64 -q", BENCH, &o, &err);
    KT_CHECK(rc == -1 && o.ctx == 64 && o.quiet && err && !err[0], "good options: rc %d, ctx %u, quiet %d, '%s'", rc,
             o.ctx, o.quiet, err ? err : "");
    free(err);
}

int main(void)
{
    KT_RUN(suggestions_find_slips_and_beginnings);
    KT_RUN(numbers_state_their_range);
    KT_RUN(choices_name_every_choice);
    KT_RUN(usage_errors_print_one_line_and_the_synopsis);
    return kt_test_finish();
}
