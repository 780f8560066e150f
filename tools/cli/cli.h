/*
 * cli.h - the command-line parsing kt's tools share: a table of options,
 * each parsing its own value into the tool's options struct, "--name value",
 * "--name=value" and short forms, and the number parsers the options use.
 * Tools own their options struct, usage text and semantics; this file never
 * decides what an option means and prints only the usage errors it finds.
 *
 * Every refusal names the value, what is allowed and what to do: a number
 * out of its range says the range ("--ctx '0' is out of range: give a whole
 * number from 1 to 16777216"), an unknown option the closest known ones
 * ("did you mean '--temp'?").  A usage error prints that one line, the
 * tool's synopsis and where the full help is, so the line stays in view.
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
    void (*usage)(FILE *f);              /* prints the tool's whole help (--help) */
    const char *synopsis;                /* "usage: ..." lines after a usage error; NULL: the whole help */
    /* Names of the commands, by bit (command bit 1 << i is command_names[i]);
     * NULL: a tool without commands. */
    const char *const *command_names;
    size_t n_commands;
    /* Takes a non-option argument; NULL: operands are usage errors. */
    kt_cli_apply_fn operand;
};

/* Parses argv[first..argc) for a command (one bit; 0 = no commands).
 * Returns -1 to go on, 0 after printing help to stdout (-h/--help), or 2
 * after printing "PROG: why" and the synopsis to stderr.  "--" ends options. */
int kt_cli_parse(const struct kt_cli *cli, int argc, char **argv, int first, unsigned command, void *opts);

/* Prints "PROG: " + fmt(a), the synopsis and a pointer to --help to stderr;
 * returns 2. */
int kt_cli_usage_error(const struct kt_cli *cli, const char *fmt, const char *a);

/* Prints one aligned help line per option; label (may be NULL) names the
 * commands an option applies to, in a column of its own. */
void kt_cli_print_options(FILE *f, const struct kt_cli *cli, const char *(*label)(unsigned commands));

/* The names among names[0..n) closest to word by edit distance (inserted,
 * deleted, replaced or swapped neighbouring characters) and close enough to
 * be a slip - at most 1 edit for words of up to 4 characters, 2 up to 8, 3
 * beyond - or of which word is a beginning, or which begin word (3
 * characters at least; "--temperature" finds "--temp").  Writes
 * " (did you mean 'A' or 'B'?)" into out, or "" when none is close; at most
 * three names, the closest first.  Returns out. */
char *kt_cli_suggest(const char *word, const char *const *names, size_t n, char *out, size_t size);

/* ---- numbers ------------------------------------------------------------------------------ */

/* Whole decimal numbers in [lo, hi], no sign; finite floats.  Silent. */
bool kt_cli_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
bool kt_cli_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);
bool kt_cli_parse_float(const char *s, float *out);
bool kt_cli_parse_double(const char *s, double *out);

/* Option values within their range; false with why saying which of the
 * two went wrong and the range ("--top-p '0' is out of range: give a number
 * in (0, 1]"), hint (NULL: none) appended in parentheses ("1: off").  A
 * bound of a real range is closed unless the bounds flag opens it; an
 * infinite hi is no upper bound. */
enum { KT_CLI_CLOSED = 0, KT_CLI_LO_OPEN = 1, KT_CLI_HI_OPEN = 2 };
bool kt_cli_u32_arg(const char *name, const char *arg, uint32_t lo, uint32_t hi, const char *hint, uint32_t *out,
                    char *why, size_t why_size);
bool kt_cli_u64_arg(const char *name, const char *arg, uint64_t lo, uint64_t hi, const char *hint, uint64_t *out,
                    char *why, size_t why_size);
bool kt_cli_double_arg(const char *name, const char *arg, double lo, double hi, unsigned bounds, const char *hint,
                       double *out, char *why, size_t why_size);
bool kt_cli_float_arg(const char *name, const char *arg, double lo, double hi, unsigned bounds, const char *hint,
                      float *out, char *why, size_t why_size);
/* "a whole number from 1 to 4096"; "a number in (0, 1]", "a number >= 0" */
char *kt_cli_range_text(bool whole, double lo, double hi, unsigned bounds, char *out, size_t size);

/* A word out of a fixed set (an option's value: --device cuda|sim|cpu):
 * its index, or -1 with why = "NAME 'ARG' is not one of A, B or C (did you
 * mean 'B'?)". */
int kt_cli_choice_arg(const char *name, const char *arg, const char *const *choices, size_t n, char *why,
                      size_t why_size);
/* --expert-cache-policy: "lru" (lfu false) or "lfu" (true). */
bool kt_cli_cache_policy_arg(const char *arg, bool *lfu, char *why, size_t why_size);

/* Option handlers that store into a field of the tool's options struct,
 * reached through the tool's OPTS(o) cast (defined before use): a string
 * kept as given, a whole number in [lo, hi], or a real number within its
 * bounds (NAME for the message, HINT or NULL appended to it). */
#define KT_CLI_STRING_OPTION(fn, field)                                                                             \
    static bool fn(void *o, const char *arg, char *why, size_t ws)                                                  \
    {                                                                                                               \
        (void)why, (void)ws;                                                                                        \
        OPTS(o)->field = arg;                                                                                       \
        return true;                                                                                                \
    }
#define KT_CLI_U32_OPTION(fn, field, lo, hi, name, hint)                                                            \
    static bool fn(void *o, const char *arg, char *why, size_t ws)                                                  \
    {                                                                                                               \
        return kt_cli_u32_arg(name, arg, lo, hi, hint, &OPTS(o)->field, why, ws);                                   \
    }
#define KT_CLI_DOUBLE_OPTION(fn, field, lo, hi, bounds, name, hint)                                                 \
    static bool fn(void *o, const char *arg, char *why, size_t ws)                                                  \
    {                                                                                                               \
        return kt_cli_double_arg(name, arg, lo, hi, bounds, hint, &OPTS(o)->field, why, ws);                        \
    }

#endif
