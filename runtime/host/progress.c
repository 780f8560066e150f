/*
 * progress.c - the byte-count progress reporter (see progress.h).
 *
 * Writes only to the FILE* it was given, never to stdout/stderr on its own,
 * and never blocks a caller for long: counting is one atomic add, and a
 * thread that finds another one drawing skips its turn.
 */
#include "progress.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TTY_REDRAW_S 0.1     /* at most ~10 redraws a second */
#define LOG_PERIOD_S 5.0     /* a log line at least this often ... */
#define LOG_STEP_PERCENT 10  /* ... or at every 10% */
#define BAR_WIDTH 24

struct kt_progress {
    FILE *out;                 /* NULL: count only */
    char label[64];
    uint64_t total_bytes;
    bool tty;
    double start_s;

    _Atomic uint64_t done_bytes;
    pthread_mutex_t draw_lock; /* guards everything below */
    double last_draw_s;
    int next_log_percent;      /* LOG mode: next 10% mark to report */
    int last_line_len;         /* TTY mode: to blank out a longer previous line */
    bool finished;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kt_format_bytes(char *buf, size_t size, uint64_t bytes)
{
    const double mib = 1024.0 * 1024.0, gib = mib * 1024.0;
    if ((double)bytes >= gib)
        snprintf(buf, size, "%.2f GiB", (double)bytes / gib);
    else
        snprintf(buf, size, "%.1f MiB", (double)bytes / mib);
}

void kt_format_rate(char *buf, size_t size, double bytes_per_s)
{
    if (bytes_per_s >= 1e9)
        snprintf(buf, size, "%.2f GB/s", bytes_per_s / 1e9);
    else
        snprintf(buf, size, "%.1f MB/s", bytes_per_s / 1e6);
}

/* done/total in one unit chosen from the total: "2.21/4.90 GiB". */
static void format_fraction(char *buf, size_t size, uint64_t done, uint64_t total)
{
    const double mib = 1024.0 * 1024.0, gib = mib * 1024.0;
    if ((double)total >= gib)
        snprintf(buf, size, "%.2f/%.2f GiB", (double)done / gib, (double)total / gib);
    else
        snprintf(buf, size, "%.1f/%.1f MiB", (double)done / mib, (double)total / mib);
}

static void format_eta(char *buf, size_t size, double seconds)
{
    if (!(seconds >= 0) || seconds > 359999) {
        snprintf(buf, size, "--:--");
        return;
    }
    unsigned s = (unsigned)(seconds + 0.5);
    if (s >= 3600)
        snprintf(buf, size, "%u:%02u:%02u", s / 3600, s / 60 % 60, s % 60);
    else
        snprintf(buf, size, "%u:%02u", s / 60, s % 60);
}

static int percent_of(uint64_t done, uint64_t total)
{
    if (total == 0 || done >= total)
        return 100;
    return (int)((double)done * 100.0 / (double)total);
}

/* "  45%  2.21/4.90 GiB  512.3 MB/s  ETA 0:05" into buf. */
static void format_status(char *buf, size_t size, uint64_t done, uint64_t total, double elapsed)
{
    char frac[48], rate[32], eta[24];
    double bps = elapsed > 0 ? (double)done / elapsed : 0;
    format_fraction(frac, sizeof frac, done, total);
    kt_format_rate(rate, sizeof rate, bps);
    format_eta(eta, sizeof eta, bps > 0 && total >= done ? (double)(total - done) / bps : -1);
    snprintf(buf, size, "%3d%%  %s  %s  ETA %s", percent_of(done, total), frac, rate, eta);
}

static void draw_tty(struct kt_progress *p, uint64_t done, double elapsed)
{
    char bar[BAR_WIDTH + 1], status[160], line[320];
    int filled = p->total_bytes ? (int)((double)(done < p->total_bytes ? done : p->total_bytes) * BAR_WIDTH /
                                        (double)p->total_bytes)
                                : BAR_WIDTH;
    for (int i = 0; i < BAR_WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[BAR_WIDTH] = 0;
    format_status(status, sizeof status, done, p->total_bytes, elapsed);
    int len = snprintf(line, sizeof line, "%s [%s] %s", p->label, bar, status);
    if (len < 0)
        return;
    int pad = p->last_line_len > len ? p->last_line_len - len : 0;
    fprintf(p->out, "\r%s%*s", line, pad, "");
    fflush(p->out);
    p->last_line_len = len;
}

static void draw_log(struct kt_progress *p, uint64_t done, double elapsed)
{
    char status[160];
    format_status(status, sizeof status, done, p->total_bytes, elapsed);
    fprintf(p->out, "%s: %s\n", p->label, status);
    fflush(p->out);
}

struct kt_progress *kt_progress_create(FILE *out, const char *label, uint64_t total_bytes,
                                       enum kt_progress_mode mode)
{
    struct kt_progress *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->out = out;
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    p->total_bytes = total_bytes;
    if (mode == KT_PROGRESS_AUTO)
        p->tty = out && isatty(fileno(out));
    else
        p->tty = mode == KT_PROGRESS_TTY;
    p->start_s = now_s();
    p->last_draw_s = p->start_s;
    p->next_log_percent = LOG_STEP_PERCENT;
    atomic_init(&p->done_bytes, 0);
    pthread_mutex_init(&p->draw_lock, NULL);
    return p;
}

void kt_progress_add(struct kt_progress *p, uint64_t bytes)
{
    if (!p)
        return;
    uint64_t done = atomic_fetch_add_explicit(&p->done_bytes, bytes, memory_order_relaxed) + bytes;
    if (!p->out || pthread_mutex_trylock(&p->draw_lock) != 0)
        return;
    if (!p->finished) {
        double t = now_s();
        double elapsed = t - p->start_s;
        if (p->tty) {
            if (t - p->last_draw_s >= TTY_REDRAW_S) {
                draw_tty(p, done, elapsed);
                p->last_draw_s = t;
            }
        } else {
            int pct = percent_of(done, p->total_bytes);
            bool step = pct >= p->next_log_percent && pct < 100; /* 100% is the final line's */
            if (step || t - p->last_draw_s >= LOG_PERIOD_S) {
                draw_log(p, done, elapsed);
                p->last_draw_s = t;
                while (p->next_log_percent <= pct)
                    p->next_log_percent += LOG_STEP_PERCENT;
            }
        }
    }
    pthread_mutex_unlock(&p->draw_lock);
}

void kt_progress_finish(struct kt_progress *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->draw_lock);
    if (!p->finished && p->out) {
        uint64_t done = atomic_load(&p->done_bytes);
        double elapsed = now_s() - p->start_s;
        char bytes[32], rate[32];
        if (p->tty) {
            draw_tty(p, done, elapsed);
            fputc('\n', p->out);
        }
        kt_format_bytes(bytes, sizeof bytes, done);
        kt_format_rate(rate, sizeof rate, elapsed > 0 ? (double)done / elapsed : 0);
        fprintf(p->out, "%s: %s (%llu bytes) in %.2f s, %s\n", p->label, bytes, (unsigned long long)done, elapsed,
                rate);
        fflush(p->out);
    }
    p->finished = true;
    pthread_mutex_unlock(&p->draw_lock);
}

uint64_t kt_progress_done_bytes(const struct kt_progress *p)
{
    return p ? atomic_load(&((struct kt_progress *)p)->done_bytes) : 0;
}

double kt_progress_elapsed_s(const struct kt_progress *p)
{
    return p ? now_s() - p->start_s : 0;
}

void kt_progress_destroy(struct kt_progress *p)
{
    if (!p)
        return;
    pthread_mutex_destroy(&p->draw_lock);
    free(p);
}
