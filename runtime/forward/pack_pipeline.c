/*
 * pack_pipeline.c - staging slots and packer threads (see pack_pipeline.h).
 *
 * One mutex guards the slot states and the job queue; a slot is FREE (the
 * loader may take it), FILLING (the loader reads into it), QUEUED or
 * PACKING.  There are n_threads + 1 slots so the loader always has one to
 * read into while every packer works.  It must never free a buffer a packer
 * may still read: destroy drains first.
 */
#include "pack_pipeline.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PACKERS 16
#define MAX_SLOTS (MAX_PACKERS + 1)
#define CTX_BYTES 128

enum slot_state { SLOT_FREE, SLOT_FILLING, SLOT_QUEUED, SLOT_PACKING };

struct slot {
    uint8_t *buf;                   /* (slot_bytes) */
    enum slot_state state;
    kt_pack_job_fn fn;
    _Alignas(16) uint8_t ctx[CTX_BYTES];
    uint64_t seq;                   /* submission order: packers take the oldest */
};

struct kt_pack_pipeline {
    pthread_mutex_t mu;
    pthread_cond_t job_ready, slot_freed;
    struct slot slots[MAX_SLOTS];
    int n_slots, n_threads, n_started;
    uint64_t next_seq;
    bool stop;
    pthread_t threads[MAX_PACKERS];
};

/* The oldest queued slot, or -1. */
static int oldest_queued(const struct kt_pack_pipeline *p)
{
    int best = -1;
    for (int i = 0; i < p->n_slots; i++)
        if (p->slots[i].state == SLOT_QUEUED && (best < 0 || p->slots[i].seq < p->slots[best].seq))
            best = i;
    return best;
}

static void *packer_main(void *arg)
{
    struct kt_pack_pipeline *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int i;
        while ((i = oldest_queued(p)) < 0 && !p->stop)
            pthread_cond_wait(&p->job_ready, &p->mu);
        if (i < 0)
            break;
        struct slot *s = &p->slots[i];
        s->state = SLOT_PACKING;
        pthread_mutex_unlock(&p->mu);
        s->fn(s->ctx, s->buf);
        pthread_mutex_lock(&p->mu);
        s->state = SLOT_FREE;
        pthread_cond_broadcast(&p->slot_freed);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

struct kt_pack_pipeline *kt_pack_pipeline_create(int n_threads, size_t slot_bytes)
{
    n_threads = n_threads < 1 ? 1 : n_threads > MAX_PACKERS ? MAX_PACKERS : n_threads;
    struct kt_pack_pipeline *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->job_ready, NULL);
    pthread_cond_init(&p->slot_freed, NULL);
    p->n_threads = n_threads;
    p->n_slots = n_threads + 1;
    for (int i = 0; i < p->n_slots; i++)
        if (!(p->slots[i].buf = malloc(slot_bytes ? slot_bytes : 1)))
            goto fail;
    for (; p->n_started < n_threads; p->n_started++)
        if (pthread_create(&p->threads[p->n_started], NULL, packer_main, p) != 0)
            goto fail;
    return p;
fail:
    kt_pack_pipeline_destroy(p);
    return NULL;
}

uint8_t *kt_pack_pipeline_acquire(struct kt_pack_pipeline *p)
{
    pthread_mutex_lock(&p->mu);
    for (;;) {
        for (int i = 0; i < p->n_slots; i++)
            if (p->slots[i].state == SLOT_FREE) {
                p->slots[i].state = SLOT_FILLING;
                pthread_mutex_unlock(&p->mu);
                return p->slots[i].buf;
            }
        pthread_cond_wait(&p->slot_freed, &p->mu);
    }
}

void kt_pack_pipeline_submit(struct kt_pack_pipeline *p, uint8_t *buf, kt_pack_job_fn fn, const void *ctx,
                             size_t ctx_bytes)
{
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_slots; i++) {
        struct slot *s = &p->slots[i];
        if (s->buf != buf || s->state != SLOT_FILLING)
            continue;
        s->fn = fn;
        memcpy(s->ctx, ctx, ctx_bytes < CTX_BYTES ? ctx_bytes : CTX_BYTES);
        s->seq = p->next_seq++;
        s->state = SLOT_QUEUED;
        pthread_cond_signal(&p->job_ready);
        break;
    }
    pthread_mutex_unlock(&p->mu);
}

void kt_pack_pipeline_drain(struct kt_pack_pipeline *p)
{
    pthread_mutex_lock(&p->mu);
    for (;;) {
        bool busy = false;
        for (int i = 0; i < p->n_slots; i++)
            busy |= p->slots[i].state == SLOT_QUEUED || p->slots[i].state == SLOT_PACKING;
        if (!busy || p->n_started == 0)
            break;
        pthread_cond_wait(&p->slot_freed, &p->mu);
    }
    /* slots taken for filling but never submitted go back */
    for (int i = 0; i < p->n_slots; i++)
        if (p->slots[i].state == SLOT_FILLING)
            p->slots[i].state = SLOT_FREE;
    pthread_mutex_unlock(&p->mu);
}

void kt_pack_pipeline_destroy(struct kt_pack_pipeline *p)
{
    if (!p)
        return;
    kt_pack_pipeline_drain(p);
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->job_ready);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->threads[i], NULL);
    for (int i = 0; i < p->n_slots; i++)
        free(p->slots[i].buf);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->job_ready);
    pthread_cond_destroy(&p->slot_freed);
    free(p);
}
