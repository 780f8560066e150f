/*
 * cli.h - the command-line parsing kt's tools share: a table of options,
 * each parsing its own value into the tool's options struct, "--name value",
 * "--name=value" and short forms, and the number parsers the options use.
 * Tools own their options struct, usage text and semantics; this file never
 * decides what an option means and prints only the usage errors it finds.
 */
#ifndef KT_CLI_H
#define KT_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Applies an option's value (NULL for a flag) to the tool's options; false
 * with why filled when the value is bad. */
typedef bool (*kt_cli_apply_fn)(void *opts, const char *arg, char *why, size_t why_size);

struct kt_cli_option {
    const char *long_name;      /* "--ctx" */
    const char *short_name;     /* "-m" or NULL */
    const char *arg_name;       /* "N"; NULL for a flag */
    unsigned commands;          /* commands it applies to (bit mask); 0 = every command */
    const char *help;
    kt_cli_apply_fn apply;
};

struct kt_cli {
    const char *prog;                    /* "kt-run": prefixes every error */
    const struct kt_cli_option *options;
    size_t n_options;
    void (*usage)(FILE *f);              /* prints the tool's usage */
    /* Takes a non-option argument; NULL: operands are usage errors. */
    kt_cli_apply_fn operand;
};

/* Parses argv[first..argc) for a command (one bit; 0 = no commands).
 * Returns -1 to go on, 0 after printing help to stdout (-h/--help), or 2
 * after printing "PROG: why" and the usage to stderr.  "--" ends options. */
int kt_cli_parse(const struct kt_cli *cli, int argc, char **argv, int first, unsigned command, void *opts);

/* Prints "PROG: " + fmt(a) and the usage to stderr; returns 2. */
int kt_cli_usage_error(const struct kt_cli *cli, const char *fmt, const char *a);

/* Prints one aligned help line per option; label (may be NULL) names the
 * commands an option applies to, in a column of its own. */
void kt_cli_print_options(FILE *f, const struct kt_cli *cli, const char *(*label)(unsigned commands));

/* Whole decimal numbers in [lo, hi], no sign; finite floats. */
bool kt_cli_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
bool kt_cli_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);
bool kt_cli_parse_float(const char *s, float *out);
bool kt_cli_parse_double(const char *s, double *out);
/* --expert-cache-policy: "lru" (lfu false) or "lfu" (true); false for anything else. */
bool kt_cli_parse_cache_policy(const char *s, bool *lfu);

/* Fills why with "WHAT: 'ARG' is not valid" and returns false. */
bool kt_cli_invalid(char *why, size_t why_size, const char *what, const char *arg);

/* Option handlers that store into a field of the tool's options struct,
 * reached through the tool's OPTS(o) cast (defined before use): a string
 * kept as given, or a whole number in [lo, hi] (NAME for the message). */
#define KT_CLI_STRING_OPTION(fn, field)                                                                             \
    static bool fn(void *o, const char *arg, char *why, size_t ws)                                                  \
    {                                                                                                               \
        (void)why, (void)ws;                                                                                        \
        OPTS(o)->field = arg;                                                                                       \
        return true;                                                                                                \
    }
#define KT_CLI_U32_OPTION(fn, field, lo, hi, name)                                                                  \
    static bool fn(void *o, const char *arg, char *why, size_t ws)                                                  \
    {                                                                                                               \
        return kt_cli_parse_u32(arg, lo, hi, &OPTS(o)->field) || kt_cli_invalid(why, ws, name, arg);               \
    }

#endif
