/*
 * cli.c - shared option-table parsing for kt's tools (see cli.h).  It must
 * never exit: it returns the status the tool's main returns.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

bool kt_cli_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool kt_cli_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    uint64_t v;
    if (!kt_cli_parse_u64(s, lo, hi, &v))
        return false;
    *out = (uint32_t)v;
    return true;
}

bool kt_cli_parse_double(const char *s, double *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

bool kt_cli_parse_float(const char *s, float *out)
{
    double v;
    if (!kt_cli_parse_double(s, &v) || !isfinite((float)v))
        return false;
    *out = (float)v;
    return true;
}

bool kt_cli_invalid(char *why, size_t why_size, const char *what, const char *arg)
{
    snprintf(why, why_size, "%s: '%s' is not valid", what, arg);
    return false;
}

int kt_cli_usage_error(const struct kt_cli *cli, const char *fmt, const char *a)
{
    fprintf(stderr, "%s: ", cli->prog);
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    cli->usage(stderr);
    return 2;
}

void kt_cli_print_options(FILE *f, const struct kt_cli *cli, const char *(*label)(unsigned commands))
{
    for (size_t i = 0; i < cli->n_options; i++) {
        const struct kt_cli_option *d = &cli->options[i];
        char left[64];
        snprintf(left, sizeof left, "%s%s%s%s%s", d->short_name ? d->short_name : "", d->short_name ? ", " : "",
                 d->long_name, d->arg_name ? " " : "", d->arg_name ? d->arg_name : "");
        if (label)
            fprintf(f, "  %-24s %-8s %s\n", left, label(d->commands), d->help);
        else
            fprintf(f, "  %-24s %s\n", left, d->help);
    }
    if (label)
        fprintf(f, "  %-24s %-8s %s\n", "-h, --help", "", "show this help");
    else
        fprintf(f, "  %-24s %s\n", "-h, --help", "show this help");
}

static const struct kt_cli_option *find_option(const struct kt_cli *cli, const char *a, const char *eq)
{
    size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
    for (size_t k = 0; k < cli->n_options; k++) {
        const struct kt_cli_option *c = &cli->options[k];
        if ((strlen(c->long_name) == name_len && !strncmp(a, c->long_name, name_len)) ||
            (!eq && c->short_name && !strcmp(a, c->short_name)))
            return c;
    }
    return NULL;
}

int kt_cli_parse(const struct kt_cli *cli, int argc, char **argv, int first, unsigned command, void *opts)
{
    char why[256];
    bool operands_only = false;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (operands_only || a[0] != '-' || a[1] == 0) {
            if (!cli->operand)
                return kt_cli_usage_error(cli, "unexpected operand '%s'", a);
            if (!cli->operand(opts, a, why, sizeof why))
                return kt_cli_usage_error(cli, "%s", why);
            continue;
        }
        if (!strcmp(a, "--")) {
            operands_only = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli->usage(stdout);
            return 0;
        }
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        const struct kt_cli_option *d = find_option(cli, a, eq);
        if (!d)
            return kt_cli_usage_error(cli, "unknown option '%s'", a);
        if (d->commands && command && !(d->commands & command))
            return kt_cli_usage_error(cli, "%s does not apply to this command", d->long_name);
        const char *arg = NULL;
        if (d->arg_name) {
            if (eq)
                arg = eq + 1;
            else if (i + 1 < argc)
                arg = argv[++i];
            else
                return kt_cli_usage_error(cli, "%s needs a value", d->long_name);
        } else if (eq) {
            return kt_cli_usage_error(cli, "%s takes no value", d->long_name);
        }
        if (!d->apply(opts, arg, why, sizeof why))
            return kt_cli_usage_error(cli, "%s", why);
    }
    return -1;
}

bool kt_cli_parse_cache_policy(const char *s, bool *lfu)
{
    if (strcmp(s, "lru") != 0 && strcmp(s, "lfu") != 0)
        return false;
    *lfu = strcmp(s, "lfu") == 0;
    return true;
}
