/*
 * fuzz.h - what a fuzz target (tests/fuzz/fuzz_*.c) offers its two drivers:
 * libFuzzer, and replay.c, which runs the target over files under ctest with
 * any compiler.  A target must never keep state between inputs.
 */
#ifndef KT_FUZZ_H
#define KT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses one input; returns 0.  Aborts (or trips a sanitizer) only on a bug. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Receives one generated input; label names it in messages. */
typedef void (*kt_fuzz_emit_fn)(const uint8_t *data, size_t size, const char *label);

/* Optional: a target may define this to hand replay.c a seed set it builds
 * itself (valid files and simple mutations of them), so the replay needs no
 * checked-in corpus. */
void kt_fuzz_seeds(kt_fuzz_emit_fn emit) __attribute__((weak));

/* For a kt_fuzz_seeds of text formats: each seed whole, every truncation of
 * it, and every one-byte change of it to each of values (labels "seedS",
 * "seedS-truncated-N", "seedS-byteI=XX"). */
static inline void kt_fuzz_mutated_seeds(kt_fuzz_emit_fn emit, const char *const *seeds, size_t n_seeds,
                                         const char *values, size_t n_values)
{
    char label[64];
    for (size_t seed = 0; seed < n_seeds; seed++) {
        const uint8_t *text = (const uint8_t *)seeds[seed];
        const size_t n = strlen(seeds[seed]);
        uint8_t *m = malloc(n ? n : 1);
        if (!m)
            abort();
        snprintf(label, sizeof label, "seed%zu", seed);
        emit(text, n, label);
        for (size_t cut = 0; cut < n; cut++) {
            snprintf(label, sizeof label, "seed%zu-truncated-%zu", seed, cut);
            emit(text, cut, label);
        }
        for (size_t i = 0; i < n; i++)
            for (size_t v = 0; v < n_values; v++) {
                if (text[i] == (uint8_t)values[v])
                    continue;
                memcpy(m, text, n);
                m[i] = (uint8_t)values[v];
                snprintf(label, sizeof label, "seed%zu-byte%zu=%02x", seed, i, (unsigned)(uint8_t)values[v]);
                emit(m, n, label);
            }
        free(m);
    }
}

#endif
