/*
 * cli.c - shared option-table parsing for kt's tools (see cli.h).  It must
 * never exit: it returns the status the tool's main returns.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- numbers ------------------------------------------------------------------------------ */

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

char *kt_cli_range_text(bool whole, double lo, double hi, unsigned bounds, char *out, size_t size)
{
    if (whole && isinf(hi))
        snprintf(out, size, "a whole number of at least %.0f", lo);
    else if (whole)
        snprintf(out, size, "a whole number from %.0f to %.0f", lo, hi);
    else if (isinf(hi))
        snprintf(out, size, "a number %s %g", bounds & KT_CLI_LO_OPEN ? ">" : ">=", lo);
    else
        snprintf(out, size, "a number in %c%g, %g%c", bounds & KT_CLI_LO_OPEN ? '(' : '[', lo, hi,
                 bounds & KT_CLI_HI_OPEN ? ')' : ']');
    return out;
}

/* "NAME 'ARG' is WHAT: give RANGE (HINT)" into why; false. */
static bool refuse(char *why, size_t why_size, const char *name, const char *arg, const char *what, const char *range,
                   const char *hint)
{
    snprintf(why, why_size, "%s '%s' is %s: give %s%s%s%s", name, arg, what, range, hint ? " (" : "", hint ? hint : "",
             hint ? ")" : "");
    return false;
}

/* A whole number written with a sign or too many digits is a number out of
 * range, not a word. */
static bool looks_whole(const char *s)
{
    s += *s == '-' || *s == '+';
    return *s && strspn(s, "0123456789") == strlen(s);
}

bool kt_cli_u64_arg(const char *name, const char *arg, uint64_t lo, uint64_t hi, const char *hint, uint64_t *out,
                    char *why, size_t why_size)
{
    if (kt_cli_parse_u64(arg, lo, hi, out))
        return true;
    char range[128];
    /* exact bounds: a double would round UINT64_MAX */
    if (hi == UINT64_MAX)
        snprintf(range, sizeof range, "a whole number of at least %llu", (unsigned long long)lo);
    else
        snprintf(range, sizeof range, "a whole number from %llu to %llu", (unsigned long long)lo,
                 (unsigned long long)hi);
    return refuse(why, why_size, name, arg, looks_whole(arg) ? "out of range" : "not a whole number", range, hint);
}

bool kt_cli_u32_arg(const char *name, const char *arg, uint32_t lo, uint32_t hi, const char *hint, uint32_t *out,
                    char *why, size_t why_size)
{
    uint64_t v;
    if (!kt_cli_u64_arg(name, arg, lo, hi, hint, &v, why, why_size))
        return false;
    *out = (uint32_t)v;
    return true;
}

bool kt_cli_double_arg(const char *name, const char *arg, double lo, double hi, unsigned bounds, const char *hint,
                       double *out, char *why, size_t why_size)
{
    char range[128];
    double v;
    bool number = kt_cli_parse_double(arg, &v);
    bool in = number && (bounds & KT_CLI_LO_OPEN ? v > lo : v >= lo) && (bounds & KT_CLI_HI_OPEN ? v < hi : v <= hi);
    if (in) {
        *out = v;
        return true;
    }
    kt_cli_range_text(false, lo, hi, bounds, range, sizeof range);
    /* strtod took the whole text but overflowed: a number, out of range */
    char *end = NULL;
    errno = 0;
    const double big = arg && *arg ? strtod(arg, &end) : 0;
    const bool overflow = !number && end && *end == 0 && errno == ERANGE && isinf(big);
    return refuse(why, why_size, name, arg, number || overflow ? "out of range" : "not a number", range, hint);
}

bool kt_cli_float_arg(const char *name, const char *arg, double lo, double hi, unsigned bounds, const char *hint,
                      float *out, char *why, size_t why_size)
{
    double v;
    if (!kt_cli_double_arg(name, arg, lo, hi, bounds, hint, &v, why, why_size))
        return false;
    if (!isfinite((float)v)) { /* beyond a float, whatever hi said */
        char range[160];
        kt_cli_range_text(false, lo, hi, bounds, range, sizeof range);
        snprintf(range + strlen(range), sizeof range - strlen(range), " below %g, the largest float", (double)FLT_MAX);
        return refuse(why, why_size, name, arg, "out of range", range, hint);
    }
    *out = (float)v;
    return true;
}

/* ---- words: choices and suggestions ------------------------------------------------------------ */

/* Edits (insert, delete, replace, swap two neighbours) from a[0..n) to
 * b[0..m); UINT_MAX for words too long to be slips of each other. */
static unsigned edit_distance(const char *a, size_t n, const char *b, size_t m)
{
    enum { MAX = 63 };
    unsigned d[MAX + 1][MAX + 1];
    if (n > MAX || m > MAX)
        return UINT_MAX;
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (unsigned)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (unsigned)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            unsigned best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            best = d[i - 1][j] + 1 < best ? d[i - 1][j] + 1 : best;
            best = d[i][j - 1] + 1 < best ? d[i][j - 1] + 1 : best;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

/* How close name is to word, lower is closer: 0 the same but for case, then
 * the edits, then (allowed + 1) one beginning the other; UINT_MAX: not close. */
static unsigned closeness(const char *word, const char *name)
{
    word += strspn(word, "-"), name += strspn(name, "-");
    const size_t n = strlen(word), m = strlen(name);
    if (n == m && strcasecmp(word, name) == 0)
        return strcmp(word, name) ? 0 : UINT_MAX;
    if (n < 2)
        return UINT_MAX;
    const unsigned allowed = n <= 4 ? 1 : n <= 8 ? 2 : 3;
    const unsigned d = edit_distance(word, n, name, m);
    if (d <= allowed)
        return d;
    const size_t shorter = n < m ? n : m;
    if (shorter >= 3 && strncasecmp(word, name, shorter) == 0)
        return allowed + 1;
    return UINT_MAX;
}

char *kt_cli_suggest(const char *word, const char *const *names, size_t n, char *out, size_t size)
{
    enum { MAX_SHOWN = 3 };
    unsigned best = UINT_MAX;
    for (size_t i = 0; i < n; i++) {
        unsigned c = names[i] ? closeness(word, names[i]) : UINT_MAX;
        best = c < best ? c : best;
    }
    const char *shown[MAX_SHOWN];
    size_t n_shown = 0;
    for (size_t i = 0; i < n && best != UINT_MAX && n_shown < MAX_SHOWN; i++) {
        bool seen = false;
        for (size_t k = 0; k < n_shown; k++)
            seen |= names[i] && strcmp(shown[k], names[i]) == 0;
        if (names[i] && !seen && closeness(word, names[i]) == best)
            shown[n_shown++] = names[i];
    }
    size_t len = 0;
    out[0] = 0;
    for (size_t k = 0; k < n_shown && len < size; k++)
        len += (size_t)snprintf(out + len, size - len, "%s'%s'%s",
                                k == 0 ? "did you mean " : k + 1 == n_shown ? " or " : ", ", shown[k],
                                k + 1 == n_shown ? "?" : "");
    return out;
}

int kt_cli_choice_arg(const char *name, const char *arg, const char *const *choices, size_t n, char *why,
                      size_t why_size)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(arg, choices[i]) == 0)
            return (int)i;
    char list[256] = "", hint[256];
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i == 0 ? "" : i + 1 == n ? " or " : ", ",
                                choices[i]);
    kt_cli_suggest(arg, choices, n, hint, sizeof hint);
    snprintf(why, why_size, "%s '%s' is not one of %s: %s", name, arg, list, hint[0] ? hint : "give one of them");
    return -1;
}

bool kt_cli_cache_policy_arg(const char *arg, bool *lfu, char *why, size_t why_size)
{
    static const char *const policies[] = {"lru", "lfu"};
    int i = kt_cli_choice_arg("--expert-cache-policy", arg, policies, 2, why, why_size);
    if (i < 0)
        return false;
    *lfu = i == 1;
    return true;
}

/* ---- the option table ------------------------------------------------------------------------- */

int kt_cli_usage_error(const struct kt_cli *cli, const char *fmt, const char *a)
{
    fprintf(stderr, "%s: ", cli->prog);
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    if (cli->synopsis)
        fprintf(stderr, "%s'%s --help' lists every option\n", cli->synopsis, cli->prog);
    else
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

static bool applies(const struct kt_cli_option *d, unsigned command)
{
    return !d->commands || !command || (d->commands & command);
}

/* "unknown option '--tmep': did you mean '--temp'?" among the options of command. */
static int unknown_option(const struct kt_cli *cli, const char *a, const char *eq, unsigned command)
{
    char name[128], hint[256], line[512];
    snprintf(name, sizeof name, "%.*s", (int)(eq ? (size_t)(eq - a) : strlen(a)), a);
    const char **names = calloc(2 * cli->n_options + 1, sizeof *names);
    size_t n = 0;
    for (size_t k = 0; names && k < cli->n_options; k++)
        if (applies(&cli->options[k], command)) {
            names[n++] = cli->options[k].long_name;
            names[n++] = cli->options[k].short_name;
        }
    hint[0] = 0;
    if (names)
        kt_cli_suggest(name, names, n, hint, sizeof hint);
    free(names);
    snprintf(line, sizeof line, "unknown option '%s'%s%s", name, hint[0] ? ": " : "", hint);
    return kt_cli_usage_error(cli, "%s", line);
}

/* "--model does not apply to kernels: it is an option of model, profile and check" */
static int wrong_command(const struct kt_cli *cli, const struct kt_cli_option *d, unsigned command)
{
    char line[512], list[256] = "";
    size_t len = 0, n = 0, total = 0;
    const char *current = "this command";
    for (size_t i = 0; i < cli->n_commands; i++) {
        total += (d->commands >> i) & 1;
        if (command == 1u << i)
            current = cli->command_names[i];
    }
    for (size_t i = 0; i < cli->n_commands && len < sizeof list; i++)
        if ((d->commands >> i) & 1) {
            n++;
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", n == 1 ? "" : n == total ? " and " : ", ",
                                    cli->command_names[i]);
        }
    if (total)
        snprintf(line, sizeof line, "%s does not apply to %s: it is an option of %s", d->long_name, current, list);
    else
        snprintf(line, sizeof line, "%s does not apply to %s", d->long_name, current);
    return kt_cli_usage_error(cli, "%s", line);
}

int kt_cli_parse(const struct kt_cli *cli, int argc, char **argv, int first, unsigned command, void *opts)
{
    char why[512];
    bool operands_only = false;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (operands_only || a[0] != '-' || a[1] == 0) {
            if (!cli->operand)
                return kt_cli_usage_error(cli, "unexpected operand '%s': options start with '-'", a);
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
            return unknown_option(cli, a, eq, command);
        if (!applies(d, command))
            return wrong_command(cli, d, command);
        const char *arg = NULL;
        if (d->arg_name) {
            if (eq)
                arg = eq + 1;
            else if (i + 1 < argc)
                arg = argv[++i];
            else {
                snprintf(why, sizeof why, "%s needs a value: give %s %s", d->long_name, d->long_name, d->arg_name);
                return kt_cli_usage_error(cli, "%s", why);
            }
        } else if (eq) {
            snprintf(why, sizeof why, "%s takes no value ('%s' given): give %s alone", d->long_name, a, d->long_name);
            return kt_cli_usage_error(cli, "%s", why);
        }
        if (!d->apply(opts, arg, why, sizeof why))
            return kt_cli_usage_error(cli, "%s", why);
    }
    return -1;
}
