/*
 * expert_store.c - loading routed experts into per-expert buffers (see
 * expert_store.h for the layout and the promises).
 *
 * Per MoE layer and node holding copies: one anonymous mapping of
 * copies x stride bytes, aligned to 2 MiB and advised MADV_HUGEPAGE, bound to
 * that node when libnuma works.
 * The layer's expert tensors are then read in file order, each expert slab
 * pread() straight into its place in the expert's buffer (chunks <= 32 MiB)
 * or, when the kernel level repacks that type, into a staging buffer that a
 * packer thread packs into place while the next slab is read
 * (pack_pipeline.h; packing on this thread if no packer can be had); every 64 MiB read is dropped from
 * the page cache with POSIX_FADV_DONTNEED.  A row-sliced layer's slabs all
 * go through staging: each slice node's rows are packed or copied from there
 * into its share.  A checkpoint directory's experts (kt_model_experts_streamed)
 * come instead from kt_model_read_expert, converted from each expert's own
 * tensors into the slab's kt type, through the same staging and packing.
 * It never touches the model's mapping of the file and never writes to the file.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "expert_store.h"

#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cgroup.h"
#include "cpu/dispatch.h"
#include "meminfo.h"
#include "pack_pipeline.h"
#include "progress.h"

#define EXPERT_ALIGN (4ull << 10)   /* each expert buffer starts on a page */
#define LAYER_ALIGN (2ull << 20)    /* huge-page boundary */
#define READ_CHUNK (32ull << 20)    /* most bytes per pread */
#define DROP_EVERY (64ull << 20)    /* page-cache bytes dropped at a time */
#define READ_AHEAD (256ull << 20)    /* bytes asked for ahead of the copy (WILLNEED) */

/* One expert matrix inside a tensor's expert slab: rows [first_row,
 * first_row + n_rows) of the slab go to dst_offset, packed with `packed`
 * (NULL: copied as they are). */
struct slab_part {
    int64_t first_row, n_rows;
    uint64_t dst_offset;
    const struct kt_packed_format *packed;
    int matrix;                     /* 0 gate, 1 up, 2 down: which rows of a slice it keeps */
};

/* One expert tensor of a layer in file order and the matrices its slab holds. */
struct slab {
    const struct kt_gguf_tensor *t;
    uint64_t slab_bytes;            /* one expert's bytes in the file */
    size_t row_bytes;               /* GGUF bytes of one row */
    int n_parts;                    /* 2 for a fused gate_up slab */
    struct slab_part part[2];
};

/* A mapping of a layer made while serving, on one node. */
struct layer_map {
    uint8_t *base;
    size_t bytes;
    bool shares;                    /* experts' shares, else whole copies */
};

struct store_layer {
    struct kt_expert_layout layout;
    struct slab slabs[3];           /* file order */
    int n_slabs;
    uint64_t stride;                /* expert_bytes rounded up to EXPERT_ALIGN */
    uint64_t slice_stride[KT_EXPERT_MAX_NODES]; /* sliced: node n's share bytes rounded up to EXPERT_ALIGN */
    bool moe;
    /* expert copies (homes + replicas) on each node at load, which size
     * base[]: not kept up as experts move while serving (own, maps) */
    uint32_t copies_on[KT_EXPERT_MAX_NODES];
    uint8_t *base[KT_EXPERT_MAX_NODES];      /* (copies_on[n], stride) bound to node n; NULL if none */
    size_t map_bytes[KT_EXPERT_MAX_NODES];
    struct kt_stored_expert *experts; /* [n_expert] */
    /* [n_expert * KT_EXPERT_MAX_NODES] expert x's copy on node n made while
     * serving (a move or a replica): its own mapping; NULL: a slot of
     * base[n] or none.  Made at the layer's first change. */
    uint8_t **own;
    size_t *own_bytes;
    /* Mappings made while serving by slicing or unslicing experts (shares or
     * whole copies of several experts, one node each): kept until no expert
     * of their kind is left in the layer.  base_shares: base[] holds shares
     * (the layer was loaded sliced), else whole copies. */
    struct layer_map *maps;
    uint32_t n_maps;
    bool base_shares;
};

struct kt_expert_store {
    uint32_t n_layer, n_expert;
    struct store_layer *layers;     /* [n_layer] */
    uint64_t bytes, data_bytes;
    uint64_t file_bytes;            /* expert bytes read from the file */
    uint64_t staging_bytes;         /* the largest slab that is packed: the staging buffer */
    double load_s;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t round_up(uint64_t n, uint64_t a)
{
    return (n + a - 1) / a * a;
}

/* The format the level in use repacks `type` into, or NULL. */
static const struct kt_packed_format *packed_for(int type, bool keep_gguf_layout)
{
    if (keep_gguf_layout || type < 0 || type >= KT_TYPE_COUNT)
        return NULL;
    return kt_cpu_kernels()->type[type].packed;
}

/* Bytes of n_rows rows of tensor t's type in `packed` (NULL: GGUF rows). */
static uint64_t matrix_bytes(const struct kt_gguf_tensor *t, const struct kt_packed_format *packed, int64_t n_rows)
{
    return packed ? kt_packed_bytes(packed, t->ne[0], n_rows) : (uint64_t)n_rows * kt_type_row_bytes(t->type, t->ne[0]);
}

static struct slab make_slab(const struct kt_gguf_tensor *t, uint64_t n_expert)
{
    return (struct slab){.t = t, .slab_bytes = t->nbytes / n_expert, .row_bytes = kt_type_row_bytes(t->type, t->ne[0])};
}

/* Lays out one expert's matrices (gate, up, down, 64-byte aligned) and lists
 * the layer's expert tensors in file order with the matrices each slab fills. */
static void plan_layer(const struct kt_model *m, uint32_t il, struct store_layer *sl, bool keep_gguf_layout)
{
    const struct kt_layer *L = &m->layers[il];
    const uint64_t Ne = m->hp.n_expert;
    const int64_t f = m->hp.n_ff_exp, E = m->hp.n_embd;
    struct kt_expert_layout *lay = &sl->layout;
    const struct kt_gguf_tensor *gate_t = L->ffn_gate_up_exps ? L->ffn_gate_up_exps : L->ffn_gate_exps;
    const struct kt_gguf_tensor *up_t = L->ffn_gate_up_exps ? L->ffn_gate_up_exps : L->ffn_up_exps;
    const struct kt_gguf_tensor *down_t = L->ffn_down_exps;
    lay->gate_packed = packed_for(gate_t->type, keep_gguf_layout);
    lay->up_packed = packed_for(up_t->type, keep_gguf_layout);
    lay->down_packed = packed_for(down_t->type, keep_gguf_layout);
    lay->gate_offset = 0;
    lay->up_offset = round_up(matrix_bytes(gate_t, lay->gate_packed, f), 64);
    lay->down_offset = lay->up_offset + round_up(matrix_bytes(up_t, lay->up_packed, f), 64);
    lay->expert_bytes = lay->down_offset + matrix_bytes(down_t, lay->down_packed, E);
    sl->stride = round_up(lay->expert_bytes, EXPERT_ALIGN);
    sl->moe = true;

    int n = 0;
    if (L->ffn_gate_up_exps) {
        struct slab *s = &sl->slabs[n++];
        *s = make_slab(gate_t, Ne);
        s->n_parts = 2;
        s->part[0] = (struct slab_part){0, f, lay->gate_offset, lay->gate_packed, 0};
        s->part[1] = (struct slab_part){f, f, lay->up_offset, lay->up_packed, 1};
    } else {
        struct slab *s = &sl->slabs[n++];
        *s = make_slab(gate_t, Ne);
        s->n_parts = 1;
        s->part[0] = (struct slab_part){0, f, lay->gate_offset, lay->gate_packed, 0};
        s = &sl->slabs[n++];
        *s = make_slab(up_t, Ne);
        s->n_parts = 1;
        s->part[0] = (struct slab_part){0, f, lay->up_offset, lay->up_packed, 1};
    }
    struct slab *s = &sl->slabs[n++];
    *s = make_slab(down_t, Ne);
    s->n_parts = 1;
    s->part[0] = (struct slab_part){0, E, lay->down_offset, lay->down_packed, 2};
    sl->n_slabs = n;
    for (int i = 1; i < n; i++) /* insertion sort by file offset */
        for (int j = i; j > 0 && sl->slabs[j].t->offset < sl->slabs[j - 1].t->offset; j--) {
            struct slab tmp = sl->slabs[j];
            sl->slabs[j] = sl->slabs[j - 1];
            sl->slabs[j - 1] = tmp;
        }
}

void kt_expert_slice_rows(int64_t n_rows, int n_parts, int part, int64_t *first, int64_t *n)
{
    const int64_t blocks = (n_rows + KT_EXPERT_SLICE_ROWS - 1) / KT_EXPERT_SLICE_ROWS;
    const int64_t b0 = blocks * part / n_parts, b1 = blocks * (part + 1) / n_parts;
    const int64_t r0 = b0 * KT_EXPERT_SLICE_ROWS, r1 = b1 * KT_EXPERT_SLICE_ROWS < n_rows ? b1 * KT_EXPERT_SLICE_ROWS
                                                                                          : n_rows;
    *first = r0 < n_rows ? r0 : n_rows;
    *n = r1 > *first ? r1 - *first : 0;
}

/* Each slice node's share of the layer's experts: rows of the intermediate
 * (gate and up) and of the outputs (down), laid out like a whole expert. */
static void plan_slices(const struct kt_model *m, struct store_layer *sl, uint16_t slice_nodes)
{
    struct kt_expert_layout *lay = &sl->layout;
    const int64_t f = m->hp.n_ff_exp, E = m->hp.n_embd;
    const int n_parts = __builtin_popcount(slice_nodes);
    lay->sliced = true;
    lay->slice_nodes = slice_nodes;
    int part = 0;
    for (int node = 0; node < KT_EXPERT_MAX_NODES; node++) {
        if (!(slice_nodes >> node & 1))
            continue;
        struct kt_expert_slice *s = &lay->slice[node];
        kt_expert_slice_rows(f, n_parts, part, &s->ff_first, &s->n_ff);
        kt_expert_slice_rows(E, n_parts, part, &s->out_first, &s->n_out);
        part++;
        uint64_t rows_bytes[3] = {0};
        for (int i = 0; i < sl->n_slabs; i++)
            for (int p = 0; p < sl->slabs[i].n_parts; p++) {
                const struct slab_part *sp = &sl->slabs[i].part[p];
                rows_bytes[sp->matrix] = matrix_bytes(sl->slabs[i].t, sp->packed, sp->matrix == 2 ? s->n_out : s->n_ff);
            }
        s->gate_offset = 0;
        s->up_offset = round_up(rows_bytes[0], 64);
        s->down_offset = s->up_offset + round_up(rows_bytes[1], 64);
        s->bytes = s->down_offset + rows_bytes[2];
        sl->slice_stride[node] = round_up(s->bytes ? s->bytes : 1, EXPERT_ALIGN);
    }
}

/* Each expert's home and replica nodes, and the copies each node holds. */
static kt_status place_copies(struct store_layer *sl, uint32_t il, uint32_t n_expert,
                              const struct kt_expert_store_params *d, kt_err *err)
{
    if (!(sl->experts = calloc(n_expert, sizeof *sl->experts)))
        return kt_err_set(err, KT_ERR_NOMEM, "expert store: out of memory");
    for (uint32_t x = 0; x < n_expert; x++) {
        struct kt_stored_expert *se = &sl->experts[x];
        const size_t at = (size_t)il * n_expert + x;
        const int home = d->home_nodes               ? d->home_nodes[at]
                         : d->round_robin_nodes > 1 ? (int)(x % (uint32_t)d->round_robin_nodes)
                                                     : 0;
        const uint16_t replicas = d->replica_nodes ? (uint16_t)(d->replica_nodes[at] & ~(1u << (home & 15))) : 0;
        if (home < 0 || home >= KT_EXPERT_MAX_NODES)
            return kt_err_set(err, KT_ERR_INVALID, "expert store: layer %u expert %u: home node %d is not 0..%d", il,
                              x, home, KT_EXPERT_MAX_NODES - 1);
        if (sl->layout.sliced && replicas)
            return kt_err_set(err, KT_ERR_INVALID,
                              "expert store: layer %u expert %u: replicas in a row-sliced layer (every node already "
                              "holds a share of every expert)",
                              il, x);
        se->home_node = home;
        se->nodes = sl->layout.sliced ? sl->layout.slice_nodes : (uint16_t)(replicas | 1u << home);
        for (int n = 0; n < KT_EXPERT_MAX_NODES; n++)
            sl->copies_on[n] += se->nodes >> n & 1;
    }
    return KT_OK;
}

/* True if any matrix of the slab is repacked (so it is read into staging). */
static bool slab_packs(const struct slab *s)
{
    for (int i = 0; i < s->n_parts; i++)
        if (s->part[i].packed)
            return true;
    return false;
}

/* True if the slab is read into staging first: it is repacked, or sliced over nodes. */
static bool slab_staged(const struct store_layer *sl, const struct slab *s)
{
    return sl->layout.sliced || slab_packs(s);
}

/* A 2 MiB-aligned anonymous mapping of `bytes`, huge pages advised, bound to
 * `node` when libnuma is usable.  NULL if the mapping fails. */
static uint8_t *map_layer(size_t bytes, int node)
{
    const size_t over = bytes + LAYER_ALIGN;
    uint8_t *raw = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uint8_t *p = (uint8_t *)round_up((uintptr_t)raw, LAYER_ALIGN);
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (raw + over > p + bytes)
        munmap(p + bytes, (size_t)(raw + over - (p + bytes)));
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* advice: fine if THP is off */
#endif
    if (numa_available() >= 0 && node <= numa_max_node())
        numa_tonode_memory(p, bytes, node);
    return p;
}

/* Reads `bytes` at file offset `off` into dst, in chunks, counting progress. */
static kt_status read_full(int fd, const char *path, const struct kt_gguf_tensor *t, uint32_t x, uint8_t *dst,
                           uint64_t bytes, uint64_t off, struct kt_progress *prog, kt_err *err)
{
    uint64_t done = 0;
    while (done < bytes) {
        uint64_t want = bytes - done < READ_CHUNK ? bytes - done : READ_CHUNK;
        ssize_t got = pread(fd, dst + done, (size_t)want, (off_t)(off + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            struct stat st;
            long long size = fstat(fd, &st) == 0 ? (long long)st.st_size : -1;
            if (got < 0)
                return kt_err_set(err, KT_ERR_IO, "%s: reading %s (expert %u) at byte %llu: %s", path, t->name, x,
                                  (unsigned long long)(off + done), strerror(errno));
            return kt_err_set(err, KT_ERR_IO,
                              "%s: %s (expert %u) needs bytes up to %llu but the file ends at %lld (truncated?)",
                              path, t->name, x, (unsigned long long)(off + bytes), size);
        }
        done += (uint64_t)got;
        kt_progress_add(prog, (uint64_t)got);
    }
    return KT_OK;
}

/* A staged slab and the expert whose buffer (or, sliced, whose shares) its matrices go to. */
struct pack_job {
    const struct slab *sb;
    const struct store_layer *sl;
    uint32_t x;
};

/* rows (n_rows of the slab's tensor) into dst, packed or copied. */
static void put_rows(const struct slab *sb, const struct slab_part *part, const uint8_t *rows, int64_t n_rows,
                     uint8_t *dst)
{
    if (part->packed)
        part->packed->pack(sb->t->ne[0], rows, sb->row_bytes, n_rows, dst);
    else
        memcpy(dst, rows, (size_t)n_rows * sb->row_bytes);
}

/* Turns one staged file slab into its matrices (packed or copied): into the
 * expert's buffer, or each slice node's rows into that node's share. */
static void pack_slab(const void *ctx, const uint8_t *staged)
{
    const struct pack_job *j = ctx;
    const struct slab *sb = j->sb;
    const struct kt_expert_layout *lay = &j->sl->layout;
    const struct kt_stored_expert *se = &j->sl->experts[j->x];
    for (int p = 0; p < sb->n_parts; p++) {
        const struct slab_part *part = &sb->part[p];
        const uint8_t *rows = staged + (size_t)part->first_row * sb->row_bytes;
        if (!lay->sliced) {
            put_rows(sb, part, rows, part->n_rows, (uint8_t *)se->data + part->dst_offset);
            continue;
        }
        for (int node = 0; node < KT_EXPERT_MAX_NODES; node++) {
            const struct kt_expert_slice *s = &lay->slice[node];
            if (!se->slice[node])
                continue;
            const int64_t first = part->matrix == 2 ? s->out_first : s->ff_first;
            const int64_t n = part->matrix == 2 ? s->n_out : s->n_ff;
            const uint64_t at = part->matrix == 0 ? s->gate_offset : part->matrix == 1 ? s->up_offset : s->down_offset;
            if (n > 0)
                put_rows(sb, part, rows + (size_t)first * sb->row_bytes, n, (uint8_t *)se->slice[node] + at);
        }
    }
}

/* Copies (or stages and packs) the expert slabs of one layer, tensor by
 * tensor in file order.  Packed slabs go through `packers` when there is
 * one, else through `staging` on this thread. */
static kt_status load_layer(const struct kt_model *m, struct store_layer *sl, int fd,
                            struct kt_pack_pipeline *packers, uint8_t *staging, struct kt_progress *prog, kt_err *err)
{
    const struct kt_gguf *g = m->gguf;
    for (int i = 0; i < sl->n_slabs; i++) {
        const struct slab *sb = &sl->slabs[i];
        const bool packs = slab_staged(sl, sb);
        const uint64_t slab = sb->slab_bytes;
        const uint64_t start = g->data_offset + sb->t->offset;
        const uint64_t end = start + sb->t->nbytes;
        uint64_t drop_from = start, ahead_to = start;
        for (uint32_t x = 0; x < m->hp.n_expert; x++) {
            const uint64_t off = start + x * slab;
            const struct pack_job job = {sb, sl, x};
            /* Keep READ_AHEAD bytes of the tensor in flight while we copy. */
            while (fd >= 0 && ahead_to < end && ahead_to < off + slab + READ_AHEAD / 2) {
                const uint64_t ahead = end - ahead_to < READ_AHEAD ? end - ahead_to : READ_AHEAD;
                posix_fadvise(fd, (off_t)ahead_to, (off_t)ahead, POSIX_FADV_WILLNEED);
                ahead_to += ahead;
            }
            uint8_t *into = !packs ? (uint8_t *)sl->experts[x].data + sb->part[0].dst_offset
                            : packers ? kt_pack_pipeline_acquire(packers)
                                      : staging;
            kt_status st = fd >= 0 ? read_full(fd, g->path, sb->t, x, into, slab, off, prog, err)
                                   : kt_model_read_expert(m, sb->t, x, into, err);
            if (st != KT_OK)
                return st; /* the caller drains the packers */
            if (fd < 0)
                kt_progress_add(prog, slab);
            if (packs && packers)
                kt_pack_pipeline_submit(packers, into, pack_slab, &job, sizeof job);
            else if (packs)
                pack_slab(&job, staging);
            if (fd >= 0 && (off + slab - drop_from >= DROP_EVERY || x + 1 == m->hp.n_expert)) {
                posix_fadvise(fd, (off_t)drop_from, (off_t)(off + slab - drop_from), POSIX_FADV_DONTNEED);
                drop_from = off + slab;
            }
        }
    }
    return KT_OK;
}

/* Packer threads beside the reading one: every other CPU this process may
 * use, at most 8; one where its limits cannot be read. */
static int packer_threads(void)
{
    struct kt_cpu_budget cpus;
    const int n = kt_cpu_budget_read(NULL, &cpus, NULL) == KT_OK ? cpus.cpus - 1 : 1;
    return n < 1 ? 1 : n > 8 ? 8 : n;
}

kt_status kt_expert_store_create(const struct kt_model *m, const struct kt_expert_store_params *p,
                                 struct kt_expert_store **out, kt_err *err)
{
    *out = NULL;
    const struct kt_expert_store_params d = p ? *p : (struct kt_expert_store_params){0};
    const struct kt_gguf *g = m->gguf;
    kt_status st = KT_OK;
    struct kt_progress *prog = NULL;
    int fd = -1;
    uint8_t *staging = NULL; /* (staging_bytes) one file slab of a type that gets repacked, without packers */
    struct kt_pack_pipeline *packers = NULL;
    struct kt_expert_store *s = calloc(1, sizeof *s);
    if (!s)
        return kt_err_set(err, KT_ERR_NOMEM, "expert store: out of memory");
    s->n_layer = m->hp.n_layer;
    s->n_expert = m->hp.n_expert;
    s->layers = calloc(s->n_layer ? s->n_layer : 1, sizeof *s->layers);
    if (!s->layers) {
        st = kt_err_set(err, KT_ERR_NOMEM, "expert store: out of memory");
        goto fail;
    }

    /* Plan every layer (of the range) and check the total fits before allocating any of it. */
    const uint32_t layer_end = d.layer_begin || d.layer_end ? d.layer_end : s->n_layer;
    for (uint32_t il = 0; il < s->n_layer; il++) {
        if (!m->layers[il].is_moe || !s->n_expert || il < d.layer_begin || il >= layer_end)
            continue;
        struct store_layer *sl = &s->layers[il];
        plan_layer(m, il, sl, d.keep_gguf_layout);
        if (d.sliced_layers && d.sliced_layers[il]) {
            if (__builtin_popcount(d.slice_nodes) < 2) {
                st = kt_err_set(err, KT_ERR_INVALID,
                                "expert store: layer %u is row-sliced over %d node(s): it needs two or more",
                                il, __builtin_popcount(d.slice_nodes));
                goto fail;
            }
            plan_slices(m, sl, d.slice_nodes);
        }
        if ((st = place_copies(sl, il, s->n_expert, &d, err)) != KT_OK)
            goto fail;
        sl->layout.n_sliced = sl->layout.sliced ? s->n_expert : 0;
        sl->base_shares = sl->layout.sliced;
        for (int n = 0; n < KT_EXPERT_MAX_NODES; n++) {
            const uint64_t stride = sl->layout.sliced ? sl->slice_stride[n] : sl->stride;
            const uint64_t bytes = sl->layout.sliced ? sl->layout.slice[n].bytes : sl->layout.expert_bytes;
            sl->map_bytes[n] = (size_t)round_up(sl->copies_on[n] * stride, LAYER_ALIGN);
            s->bytes += sl->map_bytes[n];
            s->data_bytes += bytes * sl->copies_on[n];
        }
        for (int i = 0; i < sl->n_slabs; i++)
            s->file_bytes += sl->slabs[i].t->nbytes;
        for (int i = 0; i < sl->n_slabs; i++)
            if (slab_staged(sl, &sl->slabs[i]) && sl->slabs[i].slab_bytes > s->staging_bytes)
                s->staging_bytes = sl->slabs[i].slab_bytes;
    }
    if (s->bytes == 0) {
        *out = s;
        return KT_OK;
    }
    if (!g->path[0]) {
        st = kt_err_set(err, KT_ERR_INVALID, "expert store: the model was not opened from a file");
        goto fail;
    }
    const int n_packers = s->staging_bytes ? packer_threads() : 0;
    if ((st = kt_meminfo_check(d.host_root,
                               d.other_host_bytes ? "loading the routed experts, packing the host matrices and the "
                                                    "KV cache"
                                                  : "loading the routed experts",
                               s->bytes + (uint64_t)(n_packers + 1) * s->staging_bytes + d.other_host_bytes,
                               err)) != KT_OK)
        goto fail;
    if (n_packers)
        packers = kt_pack_pipeline_create(n_packers, (size_t)s->staging_bytes);
    if (s->staging_bytes && !packers && !(staging = malloc((size_t)s->staging_bytes))) {
        st = kt_err_set(err, KT_ERR_NOMEM, "expert store: cannot allocate a %llu-byte staging buffer",
                        (unsigned long long)s->staging_bytes);
        goto fail;
    }

    /* a checkpoint's experts come converted from their own tensors (fd stays -1) */
    if (!kt_model_experts_streamed(m)) {
        fd = open(g->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            st = kt_err_set(err, KT_ERR_IO, "%s: cannot open: %s", g->path, strerror(errno));
            goto fail;
        }
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* larger readahead */
    }
    const double t0 = now_s();
    prog = kt_progress_create(d.progress, "loading experts", s->file_bytes, KT_PROGRESS_AUTO);
    for (uint32_t il = 0; il < s->n_layer; il++) {
        struct store_layer *sl = &s->layers[il];
        if (!sl->moe)
            continue;
        uint32_t used[KT_EXPERT_MAX_NODES] = {0};
        for (int n = 0; n < KT_EXPERT_MAX_NODES; n++) {
            if (!sl->copies_on[n])
                continue;
            if (!(sl->base[n] = map_layer(sl->map_bytes[n], n))) {
                st = kt_err_set(err, KT_ERR_NOMEM, "expert store: cannot allocate %zu bytes for layer %u on node %d",
                                sl->map_bytes[n], il, n);
                goto fail;
            }
        }
        for (uint32_t x = 0; x < s->n_expert; x++) {
            struct kt_stored_expert *se = &sl->experts[x];
            for (int n = 0; n < KT_EXPERT_MAX_NODES; n++) {
                if (!(se->nodes >> n & 1))
                    continue;
                if (sl->layout.sliced)
                    se->slice[n] = sl->base[n] + (size_t)used[n]++ * sl->slice_stride[n];
                else
                    se->copy[n] = sl->base[n] + (size_t)used[n]++ * sl->stride;
            }
            se->data = sl->layout.sliced ? NULL : se->copy[se->home_node];
        }
        if ((st = load_layer(m, sl, fd, packers, staging, prog, err)) != KT_OK)
            goto fail;
        if (packers)
            kt_pack_pipeline_drain(packers); /* home copies complete before replicas copy them */
        for (uint32_t x = 0; x < s->n_expert; x++) {
            struct kt_stored_expert *se = &sl->experts[x];
            for (int n = 0; n < KT_EXPERT_MAX_NODES; n++)
                if (se->copy[n] && n != se->home_node)
                    memcpy((uint8_t *)se->copy[n], se->data, sl->layout.expert_bytes);
        }
    }
    kt_pack_pipeline_destroy(packers); /* drains: every expert is in place after this */
    packers = NULL;
    s->load_s = now_s() - t0;
    kt_progress_finish(prog);
    kt_progress_destroy(prog);
    if (fd >= 0)
        close(fd);
    free(staging);
    *out = s;
    return KT_OK;

fail:
    if (prog && d.progress && isatty(fileno(d.progress)))
        fputc('\n', d.progress); /* end a half-drawn progress line before the caller's message */
    kt_pack_pipeline_destroy(packers); /* before the buffers it writes go away */
    kt_progress_destroy(prog);
    if (fd >= 0)
        close(fd);
    free(staging);
    kt_expert_store_destroy(s);
    return st;
}

void kt_expert_store_destroy(struct kt_expert_store *s)
{
    if (!s)
        return;
    for (uint32_t il = 0; s->layers && il < s->n_layer; il++) {
        struct store_layer *sl = &s->layers[il];
        for (int n = 0; n < KT_EXPERT_MAX_NODES; n++)
            if (sl->base[n])
                munmap(sl->base[n], sl->map_bytes[n]);
        free(sl->experts);
        for (size_t i = 0; sl->own && i < (size_t)s->n_expert * KT_EXPERT_MAX_NODES; i++)
            if (sl->own[i])
                munmap(sl->own[i], sl->own_bytes[i]);
        free(sl->own), free(sl->own_bytes);
        for (uint32_t i = 0; i < sl->n_maps; i++)
            munmap(sl->maps[i].base, sl->maps[i].bytes);
        free(sl->maps);
    }
    free(s->layers);
    free(s);
}

const struct kt_stored_expert *kt_expert_store_expert(const struct kt_expert_store *s, uint32_t il, uint32_t x)
{
    static const struct kt_stored_expert none = {.data = NULL, .home_node = -1};
    if (il >= s->n_layer || x >= s->n_expert || !s->layers[il].experts)
        return &none;
    return &s->layers[il].experts[x];
}

const struct kt_expert_layout *kt_expert_store_layout(const struct kt_expert_store *s, uint32_t il)
{
    return &s->layers[il].layout;
}

uint64_t kt_expert_store_bytes(const struct kt_expert_store *s)
{
    return s->bytes;
}

uint64_t kt_expert_store_data_bytes(const struct kt_expert_store *s)
{
    return s->data_bytes;
}

double kt_expert_store_load_s(const struct kt_expert_store *s)
{
    return s->load_s;
}

/* ---- moving an expert between nodes ---------------------------------------------------------- */

struct kt_expert_copy {
    uint32_t il, x;
    int node;
    uint8_t *buf;                   /* its own mapping, bound to node */
    size_t map_bytes;
};

kt_status kt_expert_store_copy(const struct kt_expert_store *s, uint32_t il, uint32_t x, int node,
                               struct kt_expert_copy **out, kt_err *err)
{
    *out = NULL;
    if (il >= s->n_layer || x >= s->n_expert || !s->layers[il].experts)
        return kt_err_set(err, KT_ERR_INVALID, "expert store: no routed expert %u in layer %u", x, il);
    const struct store_layer *sl = &s->layers[il];
    const struct kt_stored_expert *se = &sl->experts[x];
    if (node < 0 || node >= KT_EXPERT_MAX_NODES)
        return kt_err_set(err, KT_ERR_INVALID, "expert store: node %d is not 0 to %d", node, KT_EXPERT_MAX_NODES - 1);
    if (!se->data)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "layer %u expert %u is row-sliced: it has no home to move", il, x);
    if (se->nodes >> node & 1)
        return kt_err_set(err, KT_ERR_INVALID, "layer %u expert %u already has a copy on node %d", il, x, node);
    struct kt_expert_copy *c = calloc(1, sizeof *c);
    const size_t bytes = (size_t)round_up(sl->layout.expert_bytes, 4096);
    if (!c || !(c->buf = map_layer(bytes, node))) {
        free(c);
        return kt_err_set(err, KT_ERR_NOMEM, "expert store: no memory on node %d for layer %u expert %u (%zu bytes)",
                          node, il, x, bytes);
    }
    c->il = il, c->x = x, c->node = node, c->map_bytes = bytes;
    memcpy(c->buf, se->data, sl->layout.expert_bytes);
    *out = c;
    return KT_OK;
}

/* The own-mapping table of layer sl, made at its first change; false out of memory. */
static bool track_copies(const struct kt_expert_store *s, struct store_layer *sl)
{
    if (!sl->own) {
        sl->own = calloc((size_t)s->n_expert * KT_EXPERT_MAX_NODES, sizeof *sl->own);
        sl->own_bytes = calloc((size_t)s->n_expert * KT_EXPERT_MAX_NODES, sizeof *sl->own_bytes);
        if (!sl->own || !sl->own_bytes) {
            free(sl->own), free(sl->own_bytes);
            sl->own = NULL, sl->own_bytes = NULL;
        }
    }
    return sl->own != NULL;
}

/* Expert x's copy on `node` gives its memory back: its own mapping goes; a
 * slot of the layer's load-time mapping keeps its address space (counted in
 * kt_expert_store_bytes) and returns its pages. */
static void release_copy(struct kt_expert_store *s, struct store_layer *sl, uint32_t x, int node)
{
    struct kt_stored_expert *se = &sl->experts[x];
    const size_t i = (size_t)x * KT_EXPERT_MAX_NODES + (size_t)node;
    if (sl->own && sl->own[i]) {
        munmap(sl->own[i], sl->own_bytes[i]);
        s->bytes -= sl->own_bytes[i];
        sl->own[i] = NULL, sl->own_bytes[i] = 0;
    } else {
        madvise((void *)se->copy[node], (size_t)sl->stride, MADV_DONTNEED);
    }
    se->copy[node] = NULL;
    se->nodes = (uint16_t)(se->nodes & ~(1u << node));
}

/* Copy c becomes expert c->x's copy on c->node, its own mapping. */
static void adopt_copy(struct kt_expert_store *s, struct store_layer *sl, struct kt_expert_copy *c)
{
    struct kt_stored_expert *se = &sl->experts[c->x];
    const size_t i = (size_t)c->x * KT_EXPERT_MAX_NODES + (size_t)c->node;
    se->copy[c->node] = c->buf;
    se->nodes = (uint16_t)(se->nodes | 1u << c->node);
    sl->own[i] = c->buf, sl->own_bytes[i] = c->map_bytes;
    s->bytes += c->map_bytes;
    free(c);
}

kt_status kt_expert_store_switch(struct kt_expert_store *s, struct kt_expert_copy *c, kt_err *err)
{
    struct store_layer *sl = &s->layers[c->il];
    struct kt_stored_expert *se = &sl->experts[c->x];
    if (!track_copies(s, sl)) { /* cannot keep track of it: the old home stays */
        const uint32_t il = c->il, x = c->x;
        kt_expert_copy_discard(c);
        return kt_err_set(err, KT_ERR_NOMEM, "expert store: out of memory moving layer %u expert %u (it stays)", il, x);
    }
    const int old = se->home_node, node = c->node;
    const uint32_t x = c->x;
    adopt_copy(s, sl, c); /* frees c */
    se->data = se->copy[node];
    se->home_node = node;
    release_copy(s, sl, x, old);
    return KT_OK;
}

kt_status kt_expert_store_add_replica(struct kt_expert_store *s, struct kt_expert_copy *c, kt_err *err)
{
    struct store_layer *sl = &s->layers[c->il];
    if (!track_copies(s, sl)) {
        const uint32_t il = c->il, x = c->x;
        kt_expert_copy_discard(c);
        return kt_err_set(err, KT_ERR_NOMEM, "expert store: out of memory adding a replica of layer %u expert %u", il,
                          x);
    }
    adopt_copy(s, sl, c);
    return KT_OK;
}

kt_status kt_expert_store_drop_replica(struct kt_expert_store *s, uint32_t il, uint32_t x, int node, kt_err *err)
{
    if (il >= s->n_layer || x >= s->n_expert || !s->layers[il].experts)
        return kt_err_set(err, KT_ERR_INVALID, "expert store: no routed expert %u in layer %u", x, il);
    struct store_layer *sl = &s->layers[il];
    const struct kt_stored_expert *se = &sl->experts[x];
    if (node < 0 || node >= KT_EXPERT_MAX_NODES || !(se->nodes >> node & 1) || !se->data)
        return kt_err_set(err, KT_ERR_INVALID, "layer %u expert %u has no replica on node %d", il, x, node);
    if (node == se->home_node)
        return kt_err_set(err, KT_ERR_INVALID, "layer %u expert %u lives on node %d: its home is not a replica", il, x,
                          node);
    if (!track_copies(s, sl))
        return kt_err_set(err, KT_ERR_NOMEM, "expert store: out of memory dropping a replica of layer %u expert %u",
                          il, x);
    release_copy(s, sl, x, node);
    return KT_OK;
}

void kt_expert_copy_discard(struct kt_expert_copy *c)
{
    if (!c)
        return;
    munmap(c->buf, c->map_bytes);
    free(c);
}

uint64_t kt_expert_copy_bytes(const struct kt_expert_copy *c)
{
    return c ? c->map_bytes : 0;
}

/* ---- slicing experts while serving ------------------------------------------------------------ */

/*
 * A layer goes from whole to row-sliced and back in one move or in parts: a
 * copy covers experts [x0, x1) and its switch gives those experts' old copies
 * back at once (a copy made while serving is unmapped; a slot of a larger
 * mapping returns its pages), keeping the new mappings in sl->maps.  A layer
 * sliced in part (0 < n_sliced < n_expert) computes correctly: moe.c runs its
 * sliced experts over the slice nodes and the others whole.  Once no expert
 * of a kind is left, the mappings that held that kind go.
 */

struct kt_layer_slices {
    uint32_t il, x0, x1;
    struct kt_expert_layout layout;             /* the sliced layout: its nodes and shares */
    uint64_t stride[KT_EXPERT_MAX_NODES];        /* node n's share of one expert, rounded up */
    uint8_t *base[KT_EXPERT_MAX_NODES];          /* (x1 - x0, stride[n]) bound to node n */
    size_t map_bytes[KT_EXPERT_MAX_NODES];
};

/* Tensor and packed format of matrix `matrix` (0 gate, 1 up, 2 down) of the layer. */
static const struct slab *matrix_slab(const struct store_layer *sl, int matrix, const struct kt_packed_format **packed)
{
    for (int i = 0; i < sl->n_slabs; i++)
        for (int p = 0; p < sl->slabs[i].n_parts; p++)
            if (sl->slabs[i].part[p].matrix == matrix) {
                *packed = sl->slabs[i].part[p].packed;
                return &sl->slabs[i];
            }
    return NULL;
}

/* A layer copy's mappings, one per node (slices or whole experts): unmapped; their bytes. */
static void unmap_nodes(uint8_t *const base[KT_EXPERT_MAX_NODES], const size_t bytes[KT_EXPERT_MAX_NODES])
{
    for (int n = 0; n < KT_EXPERT_MAX_NODES; n++)
        if (base[n])
            munmap(base[n], bytes[n]);
}

static uint64_t nodes_bytes(const size_t bytes[KT_EXPERT_MAX_NODES])
{
    uint64_t sum = 0;
    for (int n = 0; n < KT_EXPERT_MAX_NODES; n++)
        sum += bytes[n];
    return sum;
}

/* Room in sl->maps for one more copy's mappings; false out of memory. */
static bool reserve_maps(struct store_layer *sl)
{
    struct layer_map *maps = realloc(sl->maps, (sl->n_maps + KT_EXPERT_MAX_NODES) * sizeof *maps);
    if (maps)
        sl->maps = maps;
    return maps != NULL;
}

/* A copy's mappings become the layer's (after reserve_maps), counted in the
 * store's bytes; the copy's pointers are cleared. */
static void keep_maps(struct kt_expert_store *s, struct store_layer *sl, uint8_t *base[KT_EXPERT_MAX_NODES],
                      const size_t bytes[KT_EXPERT_MAX_NODES], bool shares)
{
    for (int n = 0; n < KT_EXPERT_MAX_NODES; n++)
        if (base[n]) {
            sl->maps[sl->n_maps++] = (struct layer_map){base[n], bytes[n], shares};
            s->bytes += bytes[n];
            base[n] = NULL;
        }
}

/* No expert of the layer is kept whole (shares false) or sliced (true) any
 * more: the mappings that held that kind go. */
static void drop_kind(struct kt_expert_store *s, struct store_layer *sl, bool shares)
{
    for (int n = 0; sl->base_shares == shares && n < KT_EXPERT_MAX_NODES; n++)
        if (sl->base[n]) {
            munmap(sl->base[n], sl->map_bytes[n]);
            s->bytes -= sl->map_bytes[n];
            sl->base[n] = NULL, sl->map_bytes[n] = 0;
        }
    uint32_t kept = 0;
    for (uint32_t i = 0; i < sl->n_maps; i++) {
        if (sl->maps[i].shares != shares) {
            sl->maps[kept++] = sl->maps[i];
            continue;
        }
        munmap(sl->maps[i].base, sl->maps[i].bytes);
        s->bytes -= sl->maps[i].bytes;
    }
    sl->n_maps = kept;
}

/* KT_OK if [x0, x1) is a non-empty range of layer il's experts, each sliced
 * (want_sliced) or whole. */
static kt_status check_range(const struct kt_expert_store *s, uint32_t il, uint32_t x0, uint32_t x1, bool want_sliced,
                             kt_err *err)
{
    if (il >= s->n_layer || !s->layers[il].experts)
        return kt_err_set(err, KT_ERR_INVALID, "expert store: layer %u has no routed experts", il);
    if (x0 >= x1 || x1 > s->n_expert)
        return kt_err_set(err, KT_ERR_INVALID, "layer %u: experts [%u, %u) are not a range of its %u", il, x0, x1,
                          s->n_expert);
    for (uint32_t x = x0; x < x1; x++)
        if ((s->layers[il].experts[x].data == NULL) != want_sliced)
            return kt_err_set(err, KT_ERR_INVALID, "layer %u expert %u is %s already", il, x,
                              want_sliced ? "whole" : "row-sliced");
    return KT_OK;
}

void kt_layer_slices_discard(struct kt_layer_slices *c)
{
    if (!c)
        return;
    unmap_nodes(c->base, c->map_bytes);
    free(c);
}

uint64_t kt_layer_slices_bytes(const struct kt_layer_slices *c)
{
    return c ? nodes_bytes(c->map_bytes) : 0;
}

uint64_t kt_expert_store_slice_bytes(const struct kt_expert_store *s, const struct kt_model *m, uint32_t il,
                                     uint16_t slice_nodes, uint32_t n_experts)
{
    if (il >= s->n_layer || !s->layers[il].experts || __builtin_popcount(slice_nodes) < 2)
        return 0;
    struct store_layer plan = s->layers[il]; /* plan_slices writes only its layout and strides */
    plan_slices(m, &plan, slice_nodes);
    uint64_t bytes = 0;
    for (int n = 0; n < KT_EXPERT_MAX_NODES; n++)
        if (slice_nodes >> n & 1)
            bytes += round_up((uint64_t)n_experts * plan.slice_stride[n], LAYER_ALIGN);
    return bytes;
}

uint64_t kt_expert_store_whole_bytes(const struct kt_expert_store *s, uint32_t il)
{
    return il < s->n_layer && s->layers[il].experts ? s->layers[il].stride : 0;
}

kt_status kt_expert_store_slice_copy(const struct kt_expert_store *s, const struct kt_model *m, uint32_t il,
                                     uint16_t slice_nodes, uint32_t x0, uint32_t x1, struct kt_layer_slices **out,
                                     kt_err *err)
{
    *out = NULL;
    kt_status st = check_range(s, il, x0, x1, false, err);
    if (st != KT_OK)
        return st;
    const struct store_layer *sl = &s->layers[il];
    if (__builtin_popcount(slice_nodes) < 2)
        return kt_err_set(err, KT_ERR_INVALID, "layer %u: slicing needs two or more nodes (0x%x)", il, slice_nodes);
    if (sl->layout.n_sliced && slice_nodes != sl->layout.slice_nodes)
        return kt_err_set(err, KT_ERR_INVALID, "layer %u is sliced over nodes 0x%x, not 0x%x", il,
                          sl->layout.slice_nodes, slice_nodes);
    struct kt_layer_slices *c = calloc(1, sizeof *c);
    if (!c)
        return kt_err_set(err, KT_ERR_NOMEM, "expert store: out of memory");
    struct store_layer plan = *sl; /* plan_slices writes only its layout and strides */
    plan_slices(m, &plan, slice_nodes);
    c->il = il, c->x0 = x0, c->x1 = x1;
    c->layout = plan.layout;
    for (int n = 0; n < KT_EXPERT_MAX_NODES; n++) {
        if (!(slice_nodes >> n & 1))
            continue;
        c->stride[n] = plan.slice_stride[n];
        c->map_bytes[n] = (size_t)round_up((uint64_t)(x1 - x0) * c->stride[n], LAYER_ALIGN);
        if (!(c->base[n] = map_layer(c->map_bytes[n], n))) {
            const size_t bytes = c->map_bytes[n];
            kt_layer_slices_discard(c);
            return kt_err_set(err, KT_ERR_NOMEM, "expert store: no memory on node %d to slice layer %u (%zu bytes)", n,
                              il, bytes);
        }
    }
    const uint64_t whole_at[3] = {sl->layout.gate_offset, sl->layout.up_offset, sl->layout.down_offset};
    for (int matrix = 0; matrix < 3; matrix++) {
        const struct kt_packed_format *packed = NULL;
        const struct slab *sb = matrix_slab(sl, matrix, &packed);
        if (!sb)
            continue;
        for (int n = 0; n < KT_EXPERT_MAX_NODES; n++) {
            if (!c->base[n])
                continue;
            const struct kt_expert_slice *sh = &c->layout.slice[n];
            const int64_t first = matrix == 2 ? sh->out_first : sh->ff_first, rows = matrix == 2 ? sh->n_out : sh->n_ff;
            const uint64_t at = matrix == 0 ? sh->gate_offset : matrix == 1 ? sh->up_offset : sh->down_offset;
            /* rows from a whole block on: the same bytes packing them alone gives */
            const uint64_t from = whole_at[matrix] + matrix_bytes(sb->t, packed, first);
            const uint64_t bytes = matrix_bytes(sb->t, packed, rows);
            for (uint32_t x = x0; rows > 0 && x < x1; x++)
                memcpy(c->base[n] + (size_t)(x - x0) * c->stride[n] + at, sl->experts[x].data + from, bytes);
        }
    }
    *out = c;
    return KT_OK;
}

kt_status kt_expert_store_slice_switch(struct kt_expert_store *s, struct kt_layer_slices *c, kt_err *err)
{
    struct store_layer *sl = &s->layers[c->il];
    kt_status st = check_range(s, c->il, c->x0, c->x1, false, err);
    if (st == KT_OK && sl->layout.n_sliced && c->layout.slice_nodes != sl->layout.slice_nodes)
        st = kt_err_set(err, KT_ERR_INVALID, "layer %u was sliced over other nodes meanwhile", c->il);
    if (st == KT_OK && !reserve_maps(sl))
        st = kt_err_set(err, KT_ERR_NOMEM, "expert store: out of memory slicing layer %u (it stays as it was)", c->il);
    if (st != KT_OK) {
        kt_layer_slices_discard(c);
        return st;
    }
    if (!sl->layout.n_sliced) {
        sl->layout.slice_nodes = c->layout.slice_nodes;
        memcpy(sl->layout.slice, c->layout.slice, sizeof sl->layout.slice);
        memcpy(sl->slice_stride, c->stride, sizeof sl->slice_stride);
    }
    for (uint32_t x = c->x0; x < c->x1; x++) {
        struct kt_stored_expert *se = &sl->experts[x];
        for (int n = 0; n < KT_EXPERT_MAX_NODES; n++) /* its whole copies go: home and replicas */
            if (se->nodes >> n & 1) {
                release_copy(s, sl, x, n);
                s->data_bytes -= sl->layout.expert_bytes;
            }
        se->data = NULL;
        se->nodes = sl->layout.slice_nodes;
        for (int n = 0; n < KT_EXPERT_MAX_NODES; n++) {
            se->copy[n] = NULL;
            se->slice[n] = c->base[n] ? c->base[n] + (size_t)(x - c->x0) * c->stride[n] : NULL;
            s->data_bytes += c->base[n] ? sl->layout.slice[n].bytes : 0;
        }
    }
    keep_maps(s, sl, c->base, c->map_bytes, true);
    sl->layout.n_sliced += c->x1 - c->x0;
    if (sl->layout.n_sliced == s->n_expert) { /* no whole expert left */
        sl->layout.sliced = true;
        drop_kind(s, sl, false);
        free(sl->own), free(sl->own_bytes); /* every entry was released */
        sl->own = NULL, sl->own_bytes = NULL;
    }
    free(c);
    (void)err;
    return KT_OK;
}

/* ---- making sliced experts whole again while serving ------------------------------------------ */

struct kt_layer_whole {
    uint32_t il, x0, x1;
    int *home;                               /* [x1 - x0] each expert's node */
    uint32_t *slot;                          /* [x1 - x0] its place in base[home] */
    uint32_t count[KT_EXPERT_MAX_NODES];     /* experts homed on each node */
    uint8_t *base[KT_EXPERT_MAX_NODES];      /* (count[n], stride) bound to node n */
    size_t map_bytes[KT_EXPERT_MAX_NODES];
};

void kt_layer_whole_discard(struct kt_layer_whole *c)
{
    if (!c)
        return;
    unmap_nodes(c->base, c->map_bytes);
    free(c->home), free(c->slot);
    free(c);
}

uint64_t kt_layer_whole_bytes(const struct kt_layer_whole *c)
{
    return c ? nodes_bytes(c->map_bytes) : 0;
}

kt_status kt_expert_store_whole_copy(const struct kt_expert_store *s, uint32_t il, const int *homes, uint32_t x0,
                                     uint32_t x1, struct kt_layer_whole **out, kt_err *err)
{
    *out = NULL;
    kt_status st = check_range(s, il, x0, x1, true, err);
    if (st != KT_OK)
        return st;
    const struct store_layer *sl = &s->layers[il];
    const uint32_t n = x1 - x0;
    struct kt_layer_whole *c = calloc(1, sizeof *c);
    if (!c || !(c->home = calloc(n, sizeof *c->home)) || !(c->slot = calloc(n, sizeof *c->slot))) {
        kt_layer_whole_discard(c);
        return kt_err_set(err, KT_ERR_NOMEM, "expert store: out of memory");
    }
    c->il = il, c->x0 = x0, c->x1 = x1;
    for (uint32_t x = x0; x < x1; x++) {
        if (homes[x] < 0 || homes[x] >= KT_EXPERT_MAX_NODES) {
            const int h = homes[x];
            kt_layer_whole_discard(c);
            return kt_err_set(err, KT_ERR_INVALID, "layer %u expert %u: home node %d is not 0..%d", il, x, h,
                              KT_EXPERT_MAX_NODES - 1);
        }
        c->home[x - x0] = homes[x];
        c->slot[x - x0] = c->count[homes[x]]++;
    }
    for (int node = 0; node < KT_EXPERT_MAX_NODES; node++) {
        if (!c->count[node])
            continue;
        c->map_bytes[node] = (size_t)round_up((uint64_t)c->count[node] * sl->stride, LAYER_ALIGN);
        if (!(c->base[node] = map_layer(c->map_bytes[node], node))) {
            const size_t bytes = c->map_bytes[node];
            kt_layer_whole_discard(c);
            return kt_err_set(err, KT_ERR_NOMEM, "expert store: no memory on node %d to make layer %u whole (%zu "
                              "bytes)", node, il, bytes);
        }
    }
    /* each node's share goes back where the whole expert keeps those rows:
     * the inverse of kt_expert_store_slice_copy, the same bytes */
    const uint64_t whole_at[3] = {sl->layout.gate_offset, sl->layout.up_offset, sl->layout.down_offset};
    for (int matrix = 0; matrix < 3; matrix++) {
        const struct kt_packed_format *packed = NULL;
        const struct slab *sb = matrix_slab(sl, matrix, &packed);
        if (!sb)
            continue;
        for (int node = 0; node < KT_EXPERT_MAX_NODES; node++) {
            if (!(sl->layout.slice_nodes >> node & 1))
                continue;
            const struct kt_expert_slice *sh = &sl->layout.slice[node];
            const int64_t first = matrix == 2 ? sh->out_first : sh->ff_first, rows = matrix == 2 ? sh->n_out : sh->n_ff;
            const uint64_t at = matrix == 0 ? sh->gate_offset : matrix == 1 ? sh->up_offset : sh->down_offset;
            const uint64_t to = whole_at[matrix] + matrix_bytes(sb->t, packed, first);
            const uint64_t bytes = matrix_bytes(sb->t, packed, rows);
            for (uint32_t x = x0; rows > 0 && x < x1; x++)
                memcpy(c->base[c->home[x - x0]] + (size_t)c->slot[x - x0] * sl->stride + to,
                       sl->experts[x].slice[node] + at, bytes);
        }
    }
    *out = c;
    return KT_OK;
}

kt_status kt_expert_store_whole_switch(struct kt_expert_store *s, struct kt_layer_whole *c, kt_err *err)
{
    struct store_layer *sl = &s->layers[c->il];
    kt_status st = check_range(s, c->il, c->x0, c->x1, true, err);
    if (st == KT_OK && !reserve_maps(sl))
        st = kt_err_set(err, KT_ERR_NOMEM, "expert store: out of memory making layer %u whole (it stays as it was)",
                        c->il);
    if (st != KT_OK) {
        kt_layer_whole_discard(c);
        return st;
    }
    for (uint32_t x = c->x0; x < c->x1; x++) {
        struct kt_stored_expert *se = &sl->experts[x];
        const int home = c->home[x - c->x0];
        for (int n = 0; n < KT_EXPERT_MAX_NODES; n++) /* its shares give their pages back */
            if (se->slice[n]) {
                madvise((void *)se->slice[n], (size_t)sl->slice_stride[n], MADV_DONTNEED);
                s->data_bytes -= sl->layout.slice[n].bytes;
            }
        memset(se->copy, 0, sizeof se->copy);
        memset(se->slice, 0, sizeof se->slice);
        se->copy[home] = c->base[home] + (size_t)c->slot[x - c->x0] * sl->stride;
        se->data = se->copy[home];
        se->home_node = home;
        se->nodes = (uint16_t)(1u << home);
        s->data_bytes += sl->layout.expert_bytes;
    }
    keep_maps(s, sl, c->base, c->map_bytes, false);
    sl->layout.n_sliced -= c->x1 - c->x0;
    sl->layout.sliced = false;
    if (!sl->layout.n_sliced) { /* no share left */
        drop_kind(s, sl, true);
        sl->layout.slice_nodes = 0;
        memset(sl->layout.slice, 0, sizeof sl->layout.slice);
        memset(sl->slice_stride, 0, sizeof sl->slice_stride);
    }
    kt_layer_whole_discard(c);
    (void)err;
    return KT_OK;
}
