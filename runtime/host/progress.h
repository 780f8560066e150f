/*
 * progress.h - a byte-count progress reporter for long writes and loads.
 *
 * It writes only to the stream its caller hands it (kt-synth and kt-serve pass
 * stderr); with no stream it stays silent.  On a terminal it redraws one line
 * (bar, bytes done/total, throughput, ETA) at most ~10 times a second;
 * elsewhere (a log file, CI) it prints a line every ~10% or 5 s.  It never
 * decides anything: callers report bytes, it reports them back.
 */
#ifndef KT_PROGRESS_H
#define KT_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

enum kt_progress_mode {
    KT_PROGRESS_AUTO, /* TTY when isatty(fileno(out)), else LOG */
    KT_PROGRESS_TTY,  /* one redrawn line ('\r'), throttled to ~10 redraws/s */
    KT_PROGRESS_LOG,  /* a line per ~10% of the total or per 5 s, whichever comes first */
};

struct kt_progress;

/* out may be NULL (a reporter that only counts).  label is copied.
 * NULL if memory runs out; every function below accepts NULL. */
struct kt_progress *kt_progress_create(FILE *out, const char *label, uint64_t total_bytes,
                                       enum kt_progress_mode mode);

/* Adds done bytes; safe to call from several threads at once.  Drawing
 * happens on whichever thread's call finds it due. */
void kt_progress_add(struct kt_progress *p, uint64_t bytes);

/* Prints the final line: total bytes, seconds, average throughput. */
void kt_progress_finish(struct kt_progress *p);

uint64_t kt_progress_done_bytes(const struct kt_progress *p);
double kt_progress_elapsed_s(const struct kt_progress *p);

void kt_progress_destroy(struct kt_progress *p);

/* Human-readable helpers used by the reporter and by tools' summaries:
 * "512.0 MiB" / "4.90 GiB" (binary) and "131.4 MB/s" / "1.21 GB/s" (decimal). */
void kt_format_bytes(char *buf, size_t size, uint64_t bytes);
void kt_format_rate(char *buf, size_t size, double bytes_per_s);

#endif
