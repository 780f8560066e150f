/*
 * pack_pipeline.h - repacking file slabs on worker threads while the loader
 * reads the next ones.
 *
 * The loader owns the reading; a pipeline owns `n_slots` staging buffers of
 * slot_bytes each and `n_threads` packers.  The loader takes a free slot
 * (waiting while all are busy), reads a slab into it and submits it with a
 * function that turns the staged bytes into their destination; a packer
 * runs that function and frees the slot.  Destinations of different jobs
 * never overlap, so jobs finish in any order.  Nothing here reads files or
 * reports errors: a job cannot fail, and creation fails only for memory or
 * threads, in which case the caller packs on its own thread.
 */
#ifndef KT_PACK_PIPELINE_H
#define KT_PACK_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

struct kt_pack_pipeline;

/* Runs on a packer: turns the slab staged in `src` into ctx's destination. */
typedef void (*kt_pack_job_fn)(const void *ctx, const uint8_t *src);

/* NULL if the buffers or threads cannot be had. */
struct kt_pack_pipeline *kt_pack_pipeline_create(int n_threads, size_t slot_bytes);

/* A free staging buffer of slot_bytes (waits for one). */
uint8_t *kt_pack_pipeline_acquire(struct kt_pack_pipeline *p);

/* Queues fn(ctx, buf) for buf from acquire; ctx is copied (ctx_bytes <= 128). */
void kt_pack_pipeline_submit(struct kt_pack_pipeline *p, uint8_t *buf, kt_pack_job_fn fn, const void *ctx,
                             size_t ctx_bytes);

/* Waits until every submitted job has run. */
void kt_pack_pipeline_drain(struct kt_pack_pipeline *p);

/* Drains, stops the packers and frees the buffers. */
void kt_pack_pipeline_destroy(struct kt_pack_pipeline *p);

#endif
