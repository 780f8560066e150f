/*
 * rebalance.c - kt-serve's live placement and its rebalancer (issue 13).
 *
 * The live placement says where every routed expert lives now: GET
 * /kt/placement returns it with each expert's heat in the live profile, and
 * --plan-out writes it as a placement config kt-serve can start from.
 *
 * Every --rebalance-interval seconds a thread of its own plans from a copy
 * of the live profile with kt-place's planner (placement/planner.h), for
 * the batch it decodes at (the mean of the last decode steps), picks
 * the moves worth their bytes (placement/rebalance.h: hysteresis, best gain
 * per byte first) and makes them without holding up a step:
 *   - a copy to another NUMA node is made here, while steps run
 *     (kt_engine_expert_copy), and so is the host copy of an expert going
 *     onto the device (kt_engine_expert_upload_read: the file's pages, which
 *     the load dropped from the page cache, are read here - between two
 *     steps a read from disk held the next step up by 40-360 ms on
 *     kimi-k2-slice), with at most --migration-budget-mib of copies waiting
 *     for their switch;
 *   - the scheduler thread, between two steps (kt_serve_after_step), makes
 *     each copy the expert's home, takes experts off the device and uploads
 *     at most one expert a step onto it (the copy is queued ahead of that
 *     step's device work, never waited for by the host); on an idle server
 *     the rebalancer pokes the scheduler (kt_sched_poke), which makes them
 *     at once (kt_serve_make_moves), one upload a pass.
 * The rebalancer's thread runs at nice 10: its planning and copies yield to
 * the steps on a shared core.  A move that fails leaves the old home serving; either way the live
 * placement is read back from the engine, and the move is logged.  The next
 * round waits until the last one's moves are all made, so it plans from the
 * placement that runs.  mu guards what the rebalancer, the scheduler thread
 * and the HTTP handlers share.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "expert_store.h"
#include "machine.h"
#include "planner.h"
#include "preflight.h"
#include "rebalance.h"
#include "server.h"
#include "small_file.h"
#include "topology.h"

#define LOG_SIZE 64                        /* migrations kept for GET /kt/placement */
#define MAX_PLACES (KT_EXPERT_MAX_NODES + KT_PLACEMENT_MAX_DEVICES)
#define MIN_PROFILE_TOKENS 16              /* a round needs this much routing seen */
#define RECENT_STEPS 32                    /* decode steps the measured step time is the mean of */
#define BUSY_STRIDE (2 + 16)               /* per layer: busiest, mean, then each node pool's busy time */

/* A move on its way: the copy made on the target node, if it needed one
 * (a layer to slice: its shares). */
struct handoff {
    struct kt_move mv;
    struct kt_expert_copy *copy;
    struct kt_layer_slices *slices;
    struct kt_layer_whole *whole;          /* KT_MOVE_LAYER_WHOLE: the experts put back together */
    struct kt_expert_upload *upload;       /* onto the device: the expert staged in host memory */
    uint64_t bytes;                        /* the memory its copy holds until it is made (the budget's) */
};

static void handoff_discard(const struct handoff *h)
{
    kt_expert_copy_discard(h->copy);
    kt_layer_slices_discard(h->slices);
    kt_layer_whole_discard(h->whole);
    kt_expert_upload_discard(h->upload);
}

struct migration {
    double time;                           /* unix seconds */
    enum kt_move_kind kind;
    uint32_t layer, expert;
    int from, to;                          /* places */
    uint64_t bytes;
    bool ok;
};

struct kt_serve_placement {
    pthread_mutex_t mu;
    pthread_cond_t cv;                     /* the rebalancer waits here: a hand-off made, or stop */
    struct kt_placement *live;             /* guarded by mu */
    struct handoff *queue;                 /* [max_queue] ring, guarded by mu */
    uint32_t q_head, q_len, max_queue;
    uint64_t queued_bytes;
    bool stop;
    pthread_t thread;
    bool started;

    struct kt_machine *mach;
    int accel;                             /* the device's index in live->devices; 0: none */
    uint32_t replicas_hot_per_layer;       /* the config's, for --plan-out */

    /* guarded by mu: what /kt/placement and /metrics report */
    uint64_t rounds, moves_ok, moves_failed, bytes_moved, layers_sliced, layers_whole;
    uint64_t layer_parts;                  /* parts of layer moves switched (a layer's one move: one part) */
    uint64_t max_queued_bytes;             /* the most the copies in flight ever held */
    bool in_round;                         /* a round has moves to hand off or waits for them to be made */
    uint64_t pair_moves[MAX_PLACES][MAX_PLACES], pair_bytes[MAX_PLACES][MAX_PLACES];
    double before_s, after_s;              /* the last round's predicted MoE step, now and planned */
    uint32_t pending;                      /* homes the last round left as served */
    struct migration log[LOG_SIZE];
    uint64_t n_log;                        /* written in all; the last LOG_SIZE are kept */
    char last_error[256];

    /* guarded by mu: what the steps measured (measure_step) */
    uint64_t place_pairs[MAX_PLACES];      /* routed (token, expert) pairs each place ran, since the start */
    double recent_s[RECENT_STEPS];         /* the last decode steps' MoE layers, seconds */
    uint32_t recent_tokens[RECENT_STEPS];  /* ... and their tokens */
    uint64_t n_recent;                     /* written in all; the last RECENT_STEPS are kept */
    /* the scheduler thread's: the engine's counts after the step before */
    uint64_t seen_moe_ns, seen_tokens[2];
    /* [n_layer * 16] each layer's node pairs at the last step, and the pairs
     * per place summed step by step (a layer sliced while serving counts its
     * pairs on every slice node from then on, not before) */
    uint64_t *seen_node_pairs;
    uint64_t sum_pairs[MAX_PLACES];
    /* [n_layer * BUSY_STRIDE] each layer's busiest and mean node pool busy
     * time, summed per step, then each node pool's busy time
     * (kt_engine_layer_stats): at the last step (the scheduler thread's), in
     * the last step, and over the steps that only decoded (guarded by mu).
     * Busiest / mean per step is the layer's node balance as each step felt
     * it (a step waits for its slowest pool); busiest / mean of the nodes'
     * totals is how evenly the placement spread the layer's work, with the
     * steps' jitter averaged out */
    uint64_t *seen_node_busy, *step_node_busy, *decode_node_busy;

    /* guarded by mu: the device's expert cache after the last step (--expert-cache; NULL: none) */
    struct kt_expert_cache_stats cache;    /* every layer's counters summed */
    struct kt_expert_cache_stats *cache_layers; /* [n_layer] */
    uint8_t *cached;                       /* [n_layer * n_expert] 1: live in a slot */
};

/* ---- places: CPU nodes first, then devices ----------------------------------------------------- */

static int place_of(const struct kt_placement *p, const struct kt_expert_home *h)
{
    return h->device > 0 ? p->n_nodes + h->device - 1 : h->node;
}

static void place_name(const struct kt_placement *p, int place, char *buf, size_t cap)
{
    if (place < p->n_nodes)
        snprintf(buf, cap, "node %d", place);
    else
        snprintf(buf, cap, "%s", p->devices[place - p->n_nodes + 1].name);
}

static int n_places(const struct kt_placement *p)
{
    int n = p->n_nodes + p->n_devices - 1;
    return n < MAX_PLACES ? n : MAX_PLACES;
}

static struct kt_expert_home engine_home(const struct kt_server *s, int accel, const struct kt_expert_home *was,
                                         uint32_t il, uint32_t x);
static void account(struct kt_placement *p, const struct kt_expert_home *a, const struct kt_expert_home *b,
                    uint64_t bytes);

/* ---- creating, starting, stopping -------------------------------------------------------------- */

kt_status kt_serve_placement_preflight(const struct kt_server *s, const struct kt_placement *live,
                                       struct kt_machine **mach, kt_err *err)
{
    *mach = NULL;
    kt_status st = s->o.plan_out ? kt_tool_check_writable("--plan-out", s->o.plan_out, err) : KT_OK;
    if (st != KT_OK)
        return st;
    if (live->n_nodes > KT_EXPERT_MAX_NODES)
        return kt_err_set(err, KT_ERR_INVALID,
                          "the placement spans %d NUMA nodes; kt-serve moves experts on at most %d: give a "
                          "placement whose cpu.nodes are among the first %d",
                          live->n_nodes, KT_EXPERT_MAX_NODES, KT_EXPERT_MAX_NODES);
    if (!s->o.machine) {
        if (!(*mach = calloc(1, sizeof **mach)))
            return kt_err_set(err, KT_ERR_NOMEM, "out of memory");
        kt_machine_defaults(*mach, live->n_nodes);
        return KT_OK;
    }
    st = kt_machine_load(s->o.machine, mach, err);
    if (st == KT_OK)
        st = kt_machine_check_kind(*mach, s->o.machine, err);
    if (st != KT_OK)
        kt_err_prefix(err, "--machine");
    if (st == KT_OK && (*mach)->n_nodes != live->n_nodes)
        st = kt_err_set(err, KT_ERR_INVALID,
                        "--machine %s describes %d NUMA node(s), this machine has %d: give the file `kt-bench "
                        "machine -o FILE` writes here",
                        s->o.machine, (*mach)->n_nodes, live->n_nodes);
    if (st != KT_OK) {
        free(*mach);
        *mach = NULL;
    }
    return st;
}

kt_status kt_serve_placement_create(struct kt_server *s, struct kt_placement *live,
                                    const struct kt_placement_config *config, struct kt_machine *mach, kt_err *err)
{
    struct kt_serve_placement *sp = calloc(1, sizeof *sp);
    if (!sp) {
        kt_placement_destroy(live);
        free(mach);
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    }
    s->placement = sp;
    sp->live = live;
    sp->mach = mach;
    pthread_mutex_init(&sp->mu, NULL);
    pthread_cond_init(&sp->cv, NULL);
    sp->replicas_hot_per_layer = config ? kt_placement_config_replicas_hot_per_layer(config) : 0;
    for (int d = 1; d < live->n_devices; d++)
        if (!sp->accel)
            sp->accel = d;
    for (uint32_t il = 0; il < live->n_layer; il++) /* without a config the engine chose the homes */
        for (uint32_t x = 0; live->layers[il].experts && x < live->n_expert; x++) {
            struct kt_expert_home *h = &live->layers[il].experts[x];
            const struct kt_expert_home now = engine_home(s, sp->accel, h, il, x);
            if (now.device != h->device || now.node != h->node)
                account(live, h, &now, kt_layer_expert_bytes(s->model, il));
            *h = now;
        }
    if (!s->o.rebalance_given)
        s->o.rebalance_interval_s = sp->accel || live->n_nodes > 1 ? 60 : 0;
    /* every expert can be on its way at once, at most */
    sp->max_queue = live->n_layer * live->n_expert + 1;
    if (!(sp->queue = calloc(sp->max_queue, sizeof *sp->queue)) ||
        !(sp->seen_node_pairs = calloc((size_t)live->n_layer * 16, sizeof *sp->seen_node_pairs)) ||
        !(sp->seen_node_busy = calloc((size_t)live->n_layer * BUSY_STRIDE, sizeof *sp->seen_node_busy)) ||
        !(sp->step_node_busy = calloc((size_t)live->n_layer * BUSY_STRIDE, sizeof *sp->step_node_busy)) ||
        !(sp->decode_node_busy = calloc((size_t)live->n_layer * BUSY_STRIDE, sizeof *sp->decode_node_busy)))
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    if (kt_engine_expert_cache_stats(s->engine, -1, &sp->cache) &&
        (!(sp->cache_layers = calloc(live->n_layer, sizeof *sp->cache_layers)) ||
         !(sp->cached = calloc((size_t)live->n_layer * live->n_expert, 1))))
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    return KT_OK;
}

static void *rebalancer_main(void *arg);

kt_status kt_serve_placement_start(struct kt_server *s, kt_err *err)
{
    struct kt_serve_placement *sp = s->placement;
    if (!sp || s->o.rebalance_interval_s <= 0)
        return KT_OK;
    if (!s->o.machine)
        fprintf(stderr, "kt-serve: rebalancing every %g s with the cost model's stated defaults (no --machine: run "
                        "`kt-bench machine` for this machine's rates)\n",
                s->o.rebalance_interval_s);
    if (pthread_create(&sp->thread, NULL, rebalancer_main, s) != 0)
        return kt_err_set(err, KT_ERR_NOMEM, "cannot start the rebalancer thread");
    sp->started = true;
    return KT_OK;
}

void kt_serve_placement_stop(struct kt_server *s)
{
    struct kt_serve_placement *sp = s->placement;
    if (!sp)
        return;
    pthread_mutex_lock(&sp->mu);
    sp->stop = true;
    pthread_cond_broadcast(&sp->cv);
    pthread_mutex_unlock(&sp->mu);
    if (sp->started)
        pthread_join(sp->thread, NULL);
    sp->started = false;
}

void kt_serve_placement_destroy(struct kt_server *s)
{
    struct kt_serve_placement *sp = s->placement;
    if (!sp)
        return;
    kt_serve_placement_stop(s);
    for (; sp->q_len; sp->q_len--, sp->q_head = (sp->q_head + 1) % sp->max_queue) /* the scheduler is gone */
        handoff_discard(&sp->queue[sp->q_head]);
    pthread_mutex_destroy(&sp->mu);
    pthread_cond_destroy(&sp->cv);
    kt_placement_destroy(sp->live);
    free(sp->queue);
    free(sp->seen_node_pairs);
    free(sp->seen_node_busy);
    free(sp->step_node_busy);
    free(sp->decode_node_busy);
    free(sp->mach);
    free(sp->cache_layers);
    free(sp->cached);
    free(sp);
    s->placement = NULL;
}

/* ---- a round ------------------------------------------------------------------------------------ */

static double unix_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Logs a move (mu held): ok when the expert now lives where the move said. */
static void log_move(struct kt_serve_placement *sp, const struct kt_move *mv, int from, int to, bool ok)
{
    struct migration *m = &sp->log[sp->n_log++ % LOG_SIZE];
    *m = (struct migration){.time = unix_now(), .kind = mv->kind, .layer = mv->layer, .expert = mv->expert,
                            .from = from, .to = to, .bytes = mv->bytes, .ok = ok};
    if (ok) {
        sp->moves_ok++;
        sp->bytes_moved += mv->bytes;
        sp->layers_sliced += mv->kind == KT_MOVE_LAYER_SLICE;
        sp->layers_whole += mv->kind == KT_MOVE_LAYER_WHOLE;
        if (mv->kind != KT_MOVE_LAYER_SLICE && mv->kind != KT_MOVE_LAYER_WHOLE && from >= 0 && from < MAX_PLACES && to >= 0 && to < MAX_PLACES)
            sp->pair_moves[from][to]++, sp->pair_bytes[from][to] += mv->bytes;
    } else {
        sp->moves_failed++;
    }
}

static void note_error(struct kt_serve_placement *sp, const char *what, const kt_err *err)
{
    pthread_mutex_lock(&sp->mu);
    snprintf(sp->last_error, sizeof sp->last_error, "%.40s: %.200s", what, err->msg);
    pthread_mutex_unlock(&sp->mu);
    fprintf(stderr, "kt-serve: rebalancer: %s: %s\n", what, err->msg);
}

/* Whether the engine can make move mv of placement cur: a CPU copy that moves
 * must be whole (no row-sliced layer) and go to a node without a replica of
 * it; a replica is added to a CPU-homed expert of a whole layer, on a node
 * with no copy of it. */
static bool movable(const struct kt_placement *cur, const struct kt_move *mv)
{
    const struct kt_placement_layer *L = &cur->layers[mv->layer];
    const struct kt_expert_home *h = &L->experts[mv->expert];
    if (mv->kind == KT_MOVE_LAYER_SLICE)
        return !L->cpu_sliced;
    if (mv->kind == KT_MOVE_LAYER_WHOLE)
        return L->cpu_sliced;
    if (mv->kind == KT_MOVE_REPLICA_ADD)
        return !L->cpu_sliced && h->device == 0 && mv->node >= 0 && mv->node < cur->n_nodes && mv->node != h->node &&
               !(h->replica_nodes >> mv->node & 1);
    if (mv->kind == KT_MOVE_REPLICA_DROP)
        return mv->node >= 0 && mv->node < cur->n_nodes && (h->replica_nodes >> mv->node & 1);
    const bool cpu_copy_moves = mv->to.device == 0 && (mv->from.device != 0 || mv->from.node != mv->to.node);
    return !(cpu_copy_moves && (L->cpu_sliced || (mv->to.node >= 0 && (h->replica_nodes >> mv->to.node & 1))));
}

/* True when the scheduler thread may be changing what mv's copy reads: a move
 * handed off and not yet made (the one being made included) switches or
 * frees the same expert's copies, or a slice or whole-again move is on either
 * side in the same layer (it reads, or unmaps, every expert of it). */
static bool touches(const struct kt_move *queued, const struct kt_move *mv)
{
    const bool layer_wide = queued->kind == KT_MOVE_LAYER_SLICE || queued->kind == KT_MOVE_LAYER_WHOLE ||
                            mv->kind == KT_MOVE_LAYER_SLICE || mv->kind == KT_MOVE_LAYER_WHOLE;
    return queued->layer == mv->layer && (layer_wide || queued->expert == mv->expert);
}

/* Waits until no move handed off touches what mv's copy reads (a switch of
 * the expert would unmap, or give back the pages of, the copy being read);
 * false when stopping. */
static bool wait_untouched(struct kt_serve_placement *sp, const struct kt_move *mv)
{
    pthread_mutex_lock(&sp->mu);
    for (;;) {
        bool busy = false;
        for (uint32_t i = 0; i < sp->q_len && !busy; i++)
            busy = touches(&sp->queue[(sp->q_head + i) % sp->max_queue].mv, mv);
        if (!busy || sp->stop)
            break;
        pthread_cond_wait(&sp->cv, &sp->mu);
    }
    const bool ok = !sp->stop;
    pthread_mutex_unlock(&sp->mu);
    return ok;
}

/* Hands mv (with its copy) to the scheduler thread, waiting while the queue
 * is full; false when stopping (the copy discarded).  The budget was waited
 * for before the copy was made (wait_room): only the scheduler thread takes
 * from the queue meanwhile, so its bytes can only have fallen since. */
static bool hand_off(struct kt_serve_placement *sp, struct handoff h)
{
    pthread_mutex_lock(&sp->mu);
    while (!sp->stop && sp->q_len == sp->max_queue)
        pthread_cond_wait(&sp->cv, &sp->mu);
    const bool ok = !sp->stop;
    if (ok) {
        sp->queue[(sp->q_head + sp->q_len++) % sp->max_queue] = h;
        sp->queued_bytes += h.bytes;
        sp->max_queued_bytes = sp->queued_bytes > sp->max_queued_bytes ? sp->queued_bytes : sp->max_queued_bytes;
    }
    pthread_mutex_unlock(&sp->mu);
    if (!ok)
        handoff_discard(&h);
    return ok;
}

/* Waits until a copy of `bytes` fits beside the copies on their way within
 * the budget, or none is on its way (one copy larger than the budget goes
 * alone): made only then, the copies in flight never hold more than the
 * budget; false when stopping. */
static bool wait_room(struct kt_serve_placement *sp, uint64_t bytes, uint64_t budget_bytes)
{
    pthread_mutex_lock(&sp->mu);
    while (!sp->stop && sp->q_len > 0 && sp->queued_bytes + bytes > budget_bytes)
        pthread_cond_wait(&sp->cv, &sp->mu);
    const bool ok = !sp->stop;
    pthread_mutex_unlock(&sp->mu);
    return ok;
}

static void recent_steps(const struct kt_serve_placement *sp, double *step_s, double *tokens);

/* Layer il's experts put back together for a move that makes it whole: each
 * on its node in the target (one the target keeps on the device: the lowest
 * node the placement homes experts on). */
static kt_status whole_copy(struct kt_server *s, const struct kt_placement *cur, const struct kt_placement *target,
                            uint32_t il, uint32_t x0, uint32_t x1, struct kt_layer_whole **out, kt_err *err)
{
    const uint32_t N = cur->n_expert;
    int *homes = malloc((N ? N : 1) * sizeof *homes);
    if (!homes)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    const uint64_t mask = cur->expert_nodes ? cur->expert_nodes : 1;
    const int first = __builtin_ctzll(mask);
    for (uint32_t x = 0; x < N; x++) {
        const struct kt_expert_home *t = kt_placement_expert(target, il, x);
        homes[x] = t->device == 0 && t->node >= 0 && t->node < cur->n_nodes ? t->node : first;
    }
    const kt_status st = kt_engine_layer_whole_copy(s->engine, il, homes, x0, x1, out, err);
    free(homes);
    return st;
}

/* True if expert x of layer il is already as a layer move wants it: row-sliced
 * (slice) or whole.  Read only while no move of the layer is on its way. */
static bool expert_done(const struct kt_server *s, uint32_t il, uint32_t x, bool slice)
{
    return (kt_engine_expert_node(s->engine, il, x) < 0) == slice;
}

/* A layer move (slicing it, or making it whole) in parts of as many experts
 * as one copy may take within the budget: each part's shares or whole copies
 * made here, while steps run, and switched between two steps before the next
 * part is copied, so the copies in flight stay within the budget however
 * large the layer (a part's switch gives its experts' old copies back).  The
 * experts already as the move wants them are skipped (a part that failed in
 * an earlier round left them so).  Returns the parts handed off; -1 when
 * stopping.  A part that cannot be copied ends the move: the layer stays
 * sliced in part, which computes the same, and the next round goes on. */
static int layer_move(struct kt_server *s, const struct kt_placement *cur, const struct kt_placement *target,
                      const struct kt_move *mv, uint64_t budget)
{
    struct kt_serve_placement *sp = s->placement;
    const bool slice = mv->kind == KT_MOVE_LAYER_SLICE;
    const uint32_t N = cur->n_expert, il = mv->layer;
    int handed = 0;
    for (uint32_t x0 = 0; x0 < N;) {
        /* the last part handed off is switched first: the layer's state is then this thread's to read */
        if (!wait_untouched(sp, mv) || !wait_room(sp, budget, budget))
            return -1;
        const uint32_t per = kt_engine_layer_move_experts(s->engine, il, slice, budget);
        while (x0 < N && expert_done(s, il, x0, slice))
            x0++;
        if (x0 == N)
            break;
        uint32_t x1 = x0 + 1;
        while (x1 < N && x1 - x0 < per && !expert_done(s, il, x1, slice))
            x1++;
        struct handoff h = {.mv = *mv};
        kt_err err = {0};
        if ((slice ? kt_engine_layer_slice_copy(s->engine, il, x0, x1, &h.slices, &err)
                   : whole_copy(s, cur, target, il, x0, x1, &h.whole, &err)) != KT_OK) {
            char what[80];
            snprintf(what, sizeof what, "%s layer %u%s (experts %u to %u)", slice ? "slicing" : "making", il,
                     slice ? "" : " whole", x0, x1 - 1);
            note_error(sp, what, &err);
            pthread_mutex_lock(&sp->mu);
            log_move(sp, mv, 0, 0, false);
            pthread_mutex_unlock(&sp->mu);
            return handed;
        }
        h.bytes = slice ? kt_layer_slices_bytes(h.slices) : kt_layer_whole_bytes(h.whole);
        if (!hand_off(sp, h))
            return -1;
        handed++;
        kt_sched_poke(s->sched); /* made between two steps, or at once on an idle server */
        x0 = x1;
    }
    return handed;
}

static void round_once(struct kt_server *s)
{
    struct kt_serve_placement *sp = s->placement;
    kt_err err = {0};
    struct kt_profile *prof = kt_serve_profile_snapshot(s);
    struct kt_placement *cur = NULL;
    struct kt_cost_model *cost = NULL;
    struct kt_plan *plan = NULL;
    struct kt_rebalance r = {0};
    if (!prof || prof->tokens[KT_PROFILE_DECODE] + prof->tokens[KT_PROFILE_PREFILL] < MIN_PROFILE_TOKENS)
        goto done;
    pthread_mutex_lock(&sp->mu);
    cur = kt_placement_clone(sp->live);
    const uint64_t cache_bytes = sp->cache.device_bytes; /* the device's expert cache is not the planner's */
    double step_s = 0, step_tokens = 0; /* the batch it decodes at: plans and gains for it */
    recent_steps(sp, &step_s, &step_tokens);
    pthread_mutex_unlock(&sp->mu);
    const uint32_t batch = step_tokens >= 1.5 ? (uint32_t)lround(step_tokens) : 1;
    if (!cur) {
        kt_err_set(&err, KT_ERR_NOMEM, "out of memory");
        note_error(sp, "copying the placement", &err);
        goto done;
    }
    const struct kt_placement_device *acc = sp->accel ? &cur->devices[sp->accel] : NULL;
    const struct kt_planner_options po = {
        .device = acc ? acc->backend : KT_PLACE_CPU,
        .gpu_memory_gib = acc && acc->budget_bytes > cache_bytes ? (double)(acc->budget_bytes - cache_bytes) / (1u << 30)
                                                                 : 0,
        .budget_source = "the served placement's device",
        .kv_tokens = cur->kv_tokens,
        .batch = batch,
        .objective = KT_PLAN_DECODE,
    };
    const uint64_t budget = (uint64_t)(s->o.migration_budget_mib * 1048576.0);
    const struct kt_rebalance_params rp = {
        .query = {.mode = KT_COST_DECODE, .batch = batch, .context = 512},
        .min_gain = s->o.rebalance_min_gain,
        /* no bytes limit a round: the budget bounds the copies in flight as they are made (wait_room,
         * layer_move), so a round takes every move its hysteresis lets through, layers included */
        .budget_bytes = 0,
    };
    if (kt_cost_create(s->model, prof, sp->mach, &cost, &err) != KT_OK ||
        kt_plan_create(s->model, s->served_name, prof, sp->mach, cost, &po, &plan, &err) != KT_OK ||
        kt_rebalance_plan(cost, s->model, cur, plan->placement, &rp, &r, &err) != KT_OK) {
        note_error(sp, "planning", &err);
        goto done;
    }
    pthread_mutex_lock(&sp->mu);
    sp->rounds++;
    sp->in_round = true;
    sp->before_s = r.before_s, sp->after_s = r.after_s;
    sp->pending = r.n_pending;
    pthread_mutex_unlock(&sp->mu);
    uint32_t handed = 0;
    for (uint32_t i = 0; i < r.n_moves; i++) {
        const struct kt_move *mv = &r.moves[i];
        if (!movable(cur, mv))
            continue;
        if (!wait_untouched(sp, mv))
            break;
        if (mv->kind == KT_MOVE_LAYER_SLICE || mv->kind == KT_MOVE_LAYER_WHOLE) {
            const int parts = layer_move(s, cur, plan->placement, mv, budget);
            if (parts < 0)
                break;
            handed += (uint32_t)parts;
            continue;
        }
        if (!wait_room(sp, mv->bytes, budget))
            break;
        struct kt_expert_copy *copy = NULL;
        /* the CPU copy goes to its new node here, while steps run (a new replica's to its node) */
        /* (a row-sliced layer holds every expert's rows on its nodes: one off the device needs no copy) */
        const bool copies = mv->kind == KT_MOVE_REPLICA_ADD ||
                            (mv->kind == KT_MOVE_HOME && mv->to.device == 0 &&
                             !kt_engine_layer_sliced(s->engine, mv->layer) &&
                             kt_engine_expert_node(s->engine, mv->layer, mv->expert) != mv->to.node);
        if (copies && kt_engine_expert_copy(s->engine, mv->layer, mv->expert,
                                            mv->kind == KT_MOVE_HOME ? mv->to.node : mv->node, &copy, &err) != KT_OK) {
            char what[64];
            snprintf(what, sizeof what, "layer %u expert %u", mv->layer, mv->expert);
            note_error(sp, what, &err);
            pthread_mutex_lock(&sp->mu);
            log_move(sp, mv, place_of(cur, &mv->from), mv->kind == KT_MOVE_HOME ? place_of(cur, &mv->to) : mv->node,
                     false);
            pthread_mutex_unlock(&sp->mu);
            continue;
        }
        /* onto the device: the expert's rows staged here, so the stepping thread only queues their copy
         * (read between steps, the file's pages would stall the next one) */
        struct kt_expert_upload *upload = NULL;
        if (mv->kind == KT_MOVE_HOME && mv->to.device != 0 &&
            kt_engine_expert_upload_read(s->engine, mv->layer, mv->expert, &upload, &err) != KT_OK) {
            char what[64];
            snprintf(what, sizeof what, "staging layer %u expert %u", mv->layer, mv->expert);
            note_error(sp, what, &err);
            kt_expert_copy_discard(copy);
            pthread_mutex_lock(&sp->mu);
            log_move(sp, mv, place_of(cur, &mv->from), place_of(cur, &mv->to), false);
            pthread_mutex_unlock(&sp->mu);
            continue;
        }
        if (!hand_off(sp, (struct handoff){.mv = *mv, .copy = copy, .upload = upload, .bytes = mv->bytes}))
            break;
        handed++;
        kt_sched_poke(s->sched);
    }
    /* the next round plans from what runs: wait for these to be made */
    pthread_mutex_lock(&sp->mu);
    while (!sp->stop && sp->q_len > 0)
        pthread_cond_wait(&sp->cv, &sp->mu);
    pthread_mutex_unlock(&sp->mu);
    if (handed && s->o.plan_out && kt_serve_placement_write(s, &err) != KT_OK)
        note_error(sp, "--plan-out", &err);
    pthread_mutex_lock(&sp->mu);
    sp->in_round = false;
    pthread_mutex_unlock(&sp->mu);
done:
    kt_rebalance_free(&r);
    kt_plan_destroy(plan);
    kt_cost_destroy(cost);
    kt_placement_destroy(cur);
    kt_profile_destroy(prof);
}

static void *rebalancer_main(void *arg)
{
    struct kt_server *s = arg;
    struct kt_serve_placement *sp = s->placement;
    /* planning and copying yield to the steps: nice 10 weighs this thread about a tenth of a step
     * thread on a shared core (SCHED_IDLE starved it on a busy host: a round's moves never finished) */
    if (setpriority(PRIO_PROCESS, (id_t)gettid(), 10) != 0)
        fprintf(stderr, "kt-serve: rebalancer: cannot lower its thread's priority (nice 10): it competes with the "
                        "steps for cores\n");
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double whole = floor(s->o.rebalance_interval_s);
        until.tv_sec += (time_t)whole;
        until.tv_nsec += (long)((s->o.rebalance_interval_s - whole) * 1e9);
        if (until.tv_nsec >= 1000000000L)
            until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_mutex_lock(&sp->mu);
        while (!sp->stop && pthread_cond_timedwait(&sp->cv, &sp->mu, &until) == 0)
            ;
        const bool stop = sp->stop;
        pthread_mutex_unlock(&sp->mu);
        if (stop)
            return NULL;
        round_once(s);
    }
}

/* ---- between two steps: the scheduler thread makes the moves ----------------------------------- */

/* Where the engine runs expert x of layer il now. */
static struct kt_expert_home engine_home(const struct kt_server *s, int accel, const struct kt_expert_home *was,
                                         uint32_t il, uint32_t x)
{
    struct kt_expert_home h = *was;
    if (accel && kt_engine_expert_on_device(s->engine, il, x)) {
        h.device = accel, h.node = -1;
    } else {
        h.device = 0;
        const int node = kt_engine_expert_node(s->engine, il, x);
        h.node = node >= 0 ? node : (was->node >= 0 ? was->node : 0);
    }
    return h;
}

/* The live placement's byte counts after expert (il, x) of `bytes` went from a to b (mu held). */
static void account(struct kt_placement *p, const struct kt_expert_home *a, const struct kt_expert_home *b,
                    uint64_t bytes)
{
    const struct kt_expert_home *h[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        const int64_t sign = k ? 1 : -1;
        struct kt_placement_device *d = &p->devices[h[k]->device];
        d->bytes += (uint64_t)(sign * (int64_t)bytes);
        d->part_bytes[KT_PART_ROUTED_EXPERTS] += (uint64_t)(sign * (int64_t)bytes);
        d->n_experts += (uint32_t)sign;
        if (h[k]->device == 0 && h[k]->node >= 0 && h[k]->node < p->n_nodes) {
            p->node_bytes[h[k]->node] += (uint64_t)(sign * (int64_t)bytes);
            p->node_experts[h[k]->node] += (uint32_t)sign;
        }
    }
}

/* Adds or drops a replica on the engine (scheduler thread, between steps)
 * and reads the expert's replica set back into the live placement. */
static void make_replica_move(struct kt_server *s, const struct handoff *h)
{
    struct kt_serve_placement *sp = s->placement;
    const struct kt_move *mv = &h->mv;
    kt_err err = {0};
    const kt_status st = mv->kind == KT_MOVE_REPLICA_ADD
                             ? kt_engine_expert_add_replica(s->engine, h->copy, &err)
                             : kt_engine_expert_drop_replica(s->engine, mv->layer, mv->expert, mv->node, &err);
    if (st != KT_OK && mv->kind == KT_MOVE_REPLICA_ADD)
        kt_expert_copy_discard(h->copy);
    const uint64_t now_bits = kt_engine_expert_replica_nodes(s->engine, mv->layer, mv->expert);
    const bool want = mv->kind == KT_MOVE_REPLICA_ADD;
    pthread_mutex_lock(&sp->mu);
    struct kt_expert_home *live = &sp->live->layers[mv->layer].experts[mv->expert];
    const bool had = live->replica_nodes >> mv->node & 1, has = now_bits >> mv->node & 1;
    if (had != has) { /* the replica's bytes on its node */
        const uint64_t bytes = kt_layer_expert_bytes(s->model, mv->layer);
        const int64_t sign = has ? 1 : -1;
        sp->live->devices[0].bytes += (uint64_t)(sign * (int64_t)bytes);
        sp->live->devices[0].part_bytes[KT_PART_REPLICAS] += (uint64_t)(sign * (int64_t)bytes);
        sp->live->node_bytes[mv->node] += (uint64_t)(sign * (int64_t)bytes);
    }
    live->replica_nodes = now_bits;
    const int home = place_of(sp->live, live);
    /* an add is logged home -> the replica's node, a drop the other way */
    log_move(sp, mv, want ? home : mv->node, want ? mv->node : home, st == KT_OK && has == want);
    if (st != KT_OK)
        snprintf(sp->last_error, sizeof sp->last_error, "layer %u expert %u: %.200s", mv->layer, mv->expert, err.msg);
    pthread_mutex_unlock(&sp->mu);
    if (st != KT_OK)
        fprintf(stderr, "kt-serve: rebalancer: layer %u expert %u: its replica on node %d %s: %s\n", mv->layer,
                mv->expert, mv->node, want ? "is not added" : "stays", err.msg);
}

/* A layer move's end (mu held, released here): logged, ok when the switch
 * left the layer as the move wanted; a failure noted and said. */
static void end_layer_move(struct kt_serve_placement *sp, const struct kt_move *mv, kt_status st, bool done,
                           const kt_err *err, const char *doing, const char *stays)
{
    log_move(sp, mv, 0, 0, st == KT_OK && done);
    if (st != KT_OK)
        snprintf(sp->last_error, sizeof sp->last_error, "%s layer %u: %.200s", doing, mv->layer, err->msg);
    pthread_mutex_unlock(&sp->mu);
    if (st != KT_OK)
        fprintf(stderr, "kt-serve: rebalancer: layer %u stays %s: %s\n", mv->layer, stays, err->msg);
}

/* Slices a part of a layer on the engine (scheduler thread, between steps);
 * once every expert is, the live placement's layer becomes sliced, its
 * replicas gone, each node holding its share of every CPU expert (until then
 * it shows the layer whole, and only a failed part is logged). */
static void make_slice_move(struct kt_server *s, const struct handoff *h)
{
    struct kt_serve_placement *sp = s->placement;
    const struct kt_move *mv = &h->mv;
    kt_err err = {0};
    const kt_status st = kt_engine_layer_slice_switch(s->engine, h->slices, &err); /* takes h->slices */
    const bool sliced = kt_engine_layer_sliced(s->engine, mv->layer);
    pthread_mutex_lock(&sp->mu);
    sp->layer_parts += st == KT_OK;
    if (st == KT_OK && !sliced) { /* a part: the next one follows */
        pthread_mutex_unlock(&sp->mu);
        return;
    }
    struct kt_placement *p = sp->live;
    struct kt_placement_layer *L = &p->layers[mv->layer];
    if (sliced && !L->cpu_sliced) {
        const uint64_t eb = kt_layer_expert_bytes(s->model, mv->layer);
        const int parts = __builtin_popcountll(p->expert_nodes) > 1 ? __builtin_popcountll(p->expert_nodes) : 1;
        for (uint32_t x = 0; x < p->n_expert; x++) {
            struct kt_expert_home *e = &L->experts[x];
            if (e->device != 0)
                continue;
            if (e->node >= 0 && e->node < p->n_nodes)
                p->node_bytes[e->node] -= eb;
            for (int n = 0; n < p->n_nodes && n < 64; n++) {
                if (e->replica_nodes >> n & 1) {
                    p->node_bytes[n] -= eb;
                    p->devices[0].bytes -= eb;
                    p->devices[0].part_bytes[KT_PART_REPLICAS] -= eb;
                }
                if (p->expert_nodes >> n & 1)
                    p->node_bytes[n] += eb / (uint64_t)parts;
            }
            e->replica_nodes = 0;
        }
        L->cpu_sliced = true;
    }
    end_layer_move(sp, mv, st, sliced, &err, "slicing", "whole");
}

/* Makes a part of a sliced layer whole on the engine (scheduler thread,
 * between steps); once every expert is, the live placement's CPU experts go
 * back to their nodes. */
static void make_whole_move(struct kt_server *s, const struct handoff *h)
{
    struct kt_serve_placement *sp = s->placement;
    const struct kt_move *mv = &h->mv;
    kt_err err = {0};
    const kt_status st = kt_engine_layer_whole_switch(s->engine, h->whole, &err); /* takes h->whole */
    const bool whole = kt_engine_layer_sliced_experts(s->engine, mv->layer) == 0;
    pthread_mutex_lock(&sp->mu);
    sp->layer_parts += st == KT_OK;
    if (st == KT_OK && !whole) { /* a part: the next one follows */
        pthread_mutex_unlock(&sp->mu);
        return;
    }
    struct kt_placement *p = sp->live;
    struct kt_placement_layer *L = &p->layers[mv->layer];
    if (whole && L->cpu_sliced) {
        const uint64_t eb = kt_layer_expert_bytes(s->model, mv->layer);
        const int parts = __builtin_popcountll(p->expert_nodes) > 1 ? __builtin_popcountll(p->expert_nodes) : 1;
        for (uint32_t x = 0; x < p->n_expert; x++) {
            struct kt_expert_home *e = &L->experts[x];
            if (e->device != 0)
                continue;
            for (int n = 0; n < p->n_nodes && n < 64; n++)
                if (p->expert_nodes >> n & 1)
                    p->node_bytes[n] -= eb / (uint64_t)parts;
            const int node = kt_engine_expert_node(s->engine, mv->layer, x);
            e->node = node >= 0 ? node : e->node;
            if (e->node >= 0 && e->node < p->n_nodes)
                p->node_bytes[e->node] += eb;
        }
        L->cpu_sliced = false;
    }
    end_layer_move(sp, mv, st, whole, &err, "making whole", "sliced");
}

/* Makes one move on the engine; false when the step's one upload is spent
 * and mv needs another (it waits for the next step). */
static bool make_move(struct kt_server *s, const struct handoff *h, bool *uploaded)
{
    struct kt_serve_placement *sp = s->placement;
    const struct kt_move *mv = &h->mv;
    if (mv->kind == KT_MOVE_LAYER_SLICE) {
        make_slice_move(s, h);
        return true;
    }
    if (mv->kind == KT_MOVE_LAYER_WHOLE) {
        make_whole_move(s, h);
        return true;
    }
    if (mv->kind != KT_MOVE_HOME) {
        make_replica_move(s, h);
        return true;
    }
    if (mv->to.device != 0 && *uploaded)
        return false;
    kt_err err = {0};
    kt_status st = KT_OK;
    if (mv->from.device != 0 && kt_engine_expert_on_device(s->engine, mv->layer, mv->expert))
        st = kt_engine_expert_off_device(s->engine, mv->layer, mv->expert, &err);
    if (h->copy) {
        if (st == KT_OK)
            st = kt_engine_expert_switch(s->engine, h->copy, &err);
        else
            kt_expert_copy_discard(h->copy);
    }
    if (st == KT_OK && mv->to.device != 0) {
        st = kt_engine_expert_to_device(s->engine, mv->layer, mv->expert, h->upload, &err); /* takes it on success */
        *uploaded = true;
    }
    if (h->upload && (st != KT_OK || mv->to.device == 0))
        kt_expert_upload_discard(h->upload);
    pthread_mutex_lock(&sp->mu);
    struct kt_expert_home *live = &sp->live->layers[mv->layer].experts[mv->expert];
    const struct kt_expert_home was = *live, now = engine_home(s, sp->accel, live, mv->layer, mv->expert);
    if (was.device != now.device || was.node != now.node)
        account(sp->live, &was, &now, kt_layer_expert_bytes(s->model, mv->layer));
    *live = now;
    const int to = place_of(sp->live, &now);
    /* a row-sliced layer's expert off the device is on all its nodes: the target's node is any of them */
    const bool reached = to == place_of(sp->live, &mv->to) ||
                         (now.device == 0 && mv->to.device == 0 && kt_engine_layer_sliced(s->engine, mv->layer));
    log_move(sp, mv, place_of(sp->live, &was), to, st == KT_OK && reached);
    if (st != KT_OK)
        snprintf(sp->last_error, sizeof sp->last_error, "layer %u expert %u: %.200s", mv->layer, mv->expert, err.msg);
    pthread_mutex_unlock(&sp->mu);
    if (st != KT_OK)
        fprintf(stderr, "kt-serve: rebalancer: layer %u expert %u stays: %s\n", mv->layer, mv->expert, err.msg);
    return true;
}

/* What step e just made measured (scheduler thread): the routed pairs each
 * place ran since the start - CPU nodes' as their pools counted them (in a
 * row-sliced layer each slice node runs a share of every pair), the
 * device's as its (token, FFN) pairs less the shared experts and dense FFNs
 * it runs (one a token each), and without node pools the CPU's as the rest,
 * on its first node - and, when the step only decoded, its MoE layers' time. */
static void measure_step(struct kt_server *s, const struct kt_engine *e)
{
    struct kt_serve_placement *sp = s->placement;
    const struct kt_placement *p = sp->live; /* only its experts' homes change, on this thread */
    struct kt_engine_stats es;
    kt_engine_stats(e, &es);
    uint64_t pairs[MAX_PLACES] = {0}, on_nodes = 0, moe_ns = 0;
    uint64_t *step_busy = sp->step_node_busy;
    for (uint32_t il = 0; il < p->n_layer; il++) {
        const struct kt_placement_layer *L = &p->layers[il];
        struct kt_engine_layer_stats ls;
        memset(step_busy + BUSY_STRIDE * (size_t)il, 0, BUSY_STRIDE * sizeof *step_busy);
        if (!L->experts || !kt_engine_layer_stats(e, il, &ls))
            continue;
        moe_ns += ls.attention_ns + ls.router_ns + ls.experts_ns + ls.combine_ns;
        uint64_t *seen = sp->seen_node_pairs + (size_t)il * 16, slices = 0, step_all = 0, given = 0;
        int first = -1;
        for (int n = 0; n < p->n_nodes && n < 16; n++) {
            const bool part = L->cpu_sliced && ls.node_pairs[n] > seen[n];
            slices += part;
            first = part && first < 0 ? n : first;
            step_all += ls.node_pairs[n] - seen[n];
        }
        for (int n = 0; n < p->n_nodes && n < 16; n++) {
            const uint64_t step = ls.node_pairs[n] - seen[n], mine = slices ? step / slices : step;
            sp->sum_pairs[n] += mine, given += mine;
            seen[n] = ls.node_pairs[n];
            on_nodes += ls.node_pairs[n];
        }
        if (slices && first >= 0) /* every slice node counted each pair: the rest of the division to one */
            sp->sum_pairs[first] += step_all / slices - given;
        uint64_t *busy = sp->seen_node_busy + BUSY_STRIDE * (size_t)il, *now = step_busy + BUSY_STRIDE * (size_t)il;
        uint64_t total[BUSY_STRIDE] = {ls.node_busy_max_ns, ls.node_busy_mean_ns};
        memcpy(total + 2, ls.node_busy_ns, sizeof ls.node_busy_ns);
        for (int i = 0; i < BUSY_STRIDE; i++)
            now[i] = total[i] - busy[i], busy[i] = total[i];
    }
    for (int n = 0; n < p->n_nodes && n < 16; n++)
        pairs[n] = sp->sum_pairs[n];
    const uint64_t all = es.tokens * s->metrics.routed_pairs_per_token;
    const uint64_t on_device = es.device_routed_pairs; /* the expert cache's hits included */
    if (sp->accel)
        pairs[p->n_nodes + sp->accel - 1] = on_device;
    if (!on_nodes) /* one pool: the CPU's pairs are not counted by node */
        pairs[p->expert_nodes ? __builtin_ctzll(p->expert_nodes) : 0] = all > on_device ? all - on_device : 0;

    uint64_t tokens[2] = {0, 0};
    kt_engine_route_counts(e, KT_ROUTE_DECODE, &tokens[0]);
    kt_engine_route_counts(e, KT_ROUTE_PREFILL, &tokens[1]);
    const uint64_t decoded = tokens[0] - sp->seen_tokens[0], prefilled = tokens[1] - sp->seen_tokens[1];
    const uint64_t step_ns = moe_ns - sp->seen_moe_ns;
    sp->seen_tokens[0] = tokens[0], sp->seen_tokens[1] = tokens[1], sp->seen_moe_ns = moe_ns;
    pthread_mutex_lock(&sp->mu);
    memcpy(sp->place_pairs, pairs, sizeof pairs);
    if (sp->cached) {
        kt_engine_expert_cache_stats(e, -1, &sp->cache);
        for (uint32_t il = 0; il < p->n_layer; il++) {
            kt_engine_expert_cache_stats(e, (int)il, &sp->cache_layers[il]);
            for (uint32_t x = 0; p->layers[il].experts && x < p->n_expert; x++)
                sp->cached[(size_t)il * p->n_expert + x] = kt_engine_expert_cached(e, il, x);
        }
    }
    if (decoded && !prefilled) {
        for (size_t i = 0; i < BUSY_STRIDE * (size_t)p->n_layer; i++)
            sp->decode_node_busy[i] += step_busy[i];
        sp->recent_s[sp->n_recent % RECENT_STEPS] = 1e-9 * (double)step_ns;
        sp->recent_tokens[sp->n_recent++ % RECENT_STEPS] = (uint32_t)decoded;
    }
    pthread_mutex_unlock(&sp->mu);
}

void kt_serve_after_step(void *ctx, const struct kt_engine *e)
{
    struct kt_server *s = ctx;
    struct kt_serve_placement *sp = s->placement;
    kt_serve_profile_after_step(s->profile, e);
    if (!sp)
        return;
    measure_step(s, e); /* moves: kt_serve_make_moves, when the rebalancer pokes */
}

void kt_serve_make_moves(void *ctx)
{
    struct kt_server *s = ctx;
    struct kt_serve_placement *sp = s->placement;
    if (!sp)
        return;
    bool uploaded = false;
    for (;;) {
        pthread_mutex_lock(&sp->mu);
        struct handoff h = {0};
        const bool any = sp->q_len > 0;
        if (any)
            h = sp->queue[sp->q_head];
        pthread_mutex_unlock(&sp->mu);
        if (!any)
            break;
        if (!make_move(s, &h, &uploaded)) { /* the next upload after the next step, or at once when idle */
            kt_sched_poke(s->sched);
            break;
        }
        pthread_mutex_lock(&sp->mu);
        sp->q_head = (sp->q_head + 1) % sp->max_queue;
        sp->q_len--;
        sp->queued_bytes -= h.bytes;
        pthread_cond_broadcast(&sp->cv);
        pthread_mutex_unlock(&sp->mu);
    }
}

/* ---- what it shows ------------------------------------------------------------------------------ */

/* The live placement as placement config v1 text (malloc'd; NULL out of memory), mu held. */
static char *live_yaml(struct kt_server *s)
{
    struct kt_serve_placement *sp = s->placement;
    const struct kt_placement *p = sp->live;
    struct kt_plan plan = {.placement = (struct kt_placement *)p, .accel = sp->accel,
                           .replicas_hot_per_layer = sp->replicas_hot_per_layer};
    plan.options = (struct kt_planner_options){.device = sp->accel ? p->devices[sp->accel].backend : KT_PLACE_CPU,
                                               .kv_tokens = p->kv_tokens, .batch = 1, .context = 512,
                                               .prefill_tokens = 512};
    if (sp->accel) {
        plan.accel_memory_gib = (double)p->devices[sp->accel].budget_bytes / (1u << 30);
        plan.accel_transfer_gbps = p->devices[sp->accel].transfer_gbps;
        plan.accel_latency_us = p->devices[sp->accel].latency_us;
    }
    if (!(plan.layers = calloc(p->n_layer ? p->n_layer : 1, sizeof *plan.layers)))
        return NULL;
    for (uint32_t il = 0; il < p->n_layer; il++)
        for (uint32_t x = 0; p->layers[il].experts && x < p->n_expert; x++)
            plan.layers[il].gpu_experts += p->layers[il].experts[x].device != 0;
    char when[32], description[160];
    const time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    snprintf(description, sizeof description, "the live placement, written by kt-serve's rebalancer at %s after %llu "
             "migration(s)", when, (unsigned long long)sp->moves_ok);
    plan.description = description;
    /* the profile as the config named it, relative to where kt-serve runs: absolute for the file */
    char profile[PATH_MAX];
    const char *profile_path = p->profile[0] ? (realpath(p->profile, profile) ? profile : p->profile) : NULL;
    char *text = kt_plan_yaml(&plan, s->served_name, profile_path);
    free(plan.layers);
    return text;
}

kt_status kt_serve_placement_write(struct kt_server *s, kt_err *err)
{
    struct kt_serve_placement *sp = s->placement;
    if (!sp || !s->o.plan_out)
        return KT_OK;
    pthread_mutex_lock(&sp->mu);
    char *text = live_yaml(s);
    pthread_mutex_unlock(&sp->mu);
    kt_status st = text ? kt_write_file_atomic(s->o.plan_out, text, strlen(text), err)
                        : kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", s->o.plan_out);
    free(text);
    return st;
}

/* The mean MoE-layer time and tokens of the recent decode steps (mu held); 0s before any. */
static void recent_steps(const struct kt_serve_placement *sp, double *step_s, double *tokens)
{
    const uint64_t n = sp->n_recent < RECENT_STEPS ? sp->n_recent : RECENT_STEPS;
    double sum_s = 0, sum_tokens = 0;
    for (uint64_t i = 0; i < n; i++)
        sum_s += sp->recent_s[i], sum_tokens += sp->recent_tokens[i];
    *step_s = n ? sum_s / (double)n : 0;
    *tokens = n ? sum_tokens / (double)n : 0;
}

/* A counter by (source, target) place: the pairs that moved anything, mu held. */
static void by_route(struct kt_buf *o, const struct kt_serve_placement *sp, const char *name, const char *help,
                     const uint64_t counts[MAX_PLACES][MAX_PLACES])
{
    const int n = n_places(sp->live);
    char a[40], b[40];
    kt_buf_printf(o, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (int f = 0; f < n; f++)
        for (int t = 0; t < n; t++)
            if (sp->pair_moves[f][t]) {
                place_name(sp->live, f, a, sizeof a), place_name(sp->live, t, b, sizeof b);
                kt_buf_printf(o, "%s{from=\"%s\",to=\"%s\"} %llu\n", name, a, b, (unsigned long long)counts[f][t]);
            }
}

void kt_serve_placement_metrics(struct kt_server *s, struct kt_buf *o)
{
    struct kt_serve_placement *sp = s->placement;
    if (!sp)
        return;
    uint64_t node_busy_ns[16], busy_sum = 0;
    pthread_mutex_lock(&s->metrics.mu);
    memcpy(node_busy_ns, s->metrics.engine.node_busy_ns, sizeof node_busy_ns);
    pthread_mutex_unlock(&s->metrics.mu);
    pthread_mutex_lock(&sp->mu);
    const struct kt_placement *p = sp->live;
    const int n = n_places(p);
    char a[40];
    by_route(o, sp, "kt:expert_migrations_total", "Routed experts moved while serving, by source and target.",
             sp->pair_moves);
    by_route(o, sp, "kt:expert_migrated_bytes_total", "Bytes copied for those moves, by source and target.",
             sp->pair_bytes);
    kt_buf_printf(o, "# HELP kt:layer_slices_total Layers row-sliced over the nodes while serving (each one move of "
                     "kt:expert_migrations' total, not counted by source and target).\n"
                     "# TYPE kt:layer_slices_total counter\nkt:layer_slices_total %llu\n",
                  (unsigned long long)sp->layers_sliced);
    kt_buf_printf(o, "# HELP kt:layers_made_whole_total Row-sliced layers made whole again while serving (each one move "
                     "of kt:expert_migrations' total).\n"
                     "# TYPE kt:layers_made_whole_total counter\nkt:layers_made_whole_total %llu\n",
                  (unsigned long long)sp->layers_whole);
    kt_buf_printf(o, "# HELP kt:layer_move_parts_total Parts of those layer moves switched: a layer larger than "
                     "--migration-budget-mib is sliced or made whole a few experts at a time.\n"
                     "# TYPE kt:layer_move_parts_total counter\nkt:layer_move_parts_total %llu\n",
                  (unsigned long long)sp->layer_parts);
    kt_buf_printf(o, "# HELP kt:expert_migrations_failed_total Moves that failed (the old home kept serving).\n"
                     "# TYPE kt:expert_migrations_failed_total counter\nkt:expert_migrations_failed_total %llu\n",
                  (unsigned long long)sp->moves_failed);
    kt_buf_printf(o, "# HELP kt:rebalance_rounds_total Rebalancing rounds planned.\n"
                     "# TYPE kt:rebalance_rounds_total counter\nkt:rebalance_rounds_total %llu\n",
                  (unsigned long long)sp->rounds);
    kt_buf_printf(o, "# HELP kt:rebalance_predicted_step_seconds The last round's predicted decode step of the MoE "
                     "layers, as served and as planned.\n# TYPE kt:rebalance_predicted_step_seconds gauge\n"
                     "kt:rebalance_predicted_step_seconds{placement=\"served\"} %.9f\n"
                     "kt:rebalance_predicted_step_seconds{placement=\"planned\"} %.9f\n",
                  sp->before_s, sp->after_s);
    if (sp->cached) {
        const struct kt_expert_cache_stats *c = &sp->cache;
        kt_buf_printf(o, "# HELP kt:expert_cache_pairs_total Routed (token, expert) pairs by where the device's expert "
                         "cache found them: homed on the device, in a slot, or computed on the CPU.\n"
                         "# TYPE kt:expert_cache_pairs_total counter\n"
                         "kt:expert_cache_pairs_total{result=\"pinned\"} %llu\n"
                         "kt:expert_cache_pairs_total{result=\"hit\"} %llu\n"
                         "kt:expert_cache_pairs_total{result=\"miss\"} %llu\n",
                      (unsigned long long)c->pinned_pairs, (unsigned long long)c->hit_pairs,
                      (unsigned long long)c->miss_pairs);
        kt_buf_printf(o, "# HELP kt:expert_cache_uploads_total Experts copied into the cache whole.\n"
                         "# TYPE kt:expert_cache_uploads_total counter\nkt:expert_cache_uploads_total %llu\n"
                         "# HELP kt:expert_cache_upload_bytes_total Bytes queued for the cache's copies.\n"
                         "# TYPE kt:expert_cache_upload_bytes_total counter\nkt:expert_cache_upload_bytes_total %llu\n"
                         "# HELP kt:expert_cache_evictions_total Live cached experts another took the slot of.\n"
                         "# TYPE kt:expert_cache_evictions_total counter\nkt:expert_cache_evictions_total %llu\n"
                         "# HELP kt:expert_cache_slots The cache's slots, and of them those holding a live expert.\n"
                         "# TYPE kt:expert_cache_slots gauge\nkt:expert_cache_slots{state=\"all\"} %u\n"
                         "kt:expert_cache_slots{state=\"live\"} %u\n",
                      (unsigned long long)c->uploads, (unsigned long long)c->upload_bytes,
                      (unsigned long long)c->evictions, c->slots, c->resident);
    }
    kt_buf_printf(o, "# HELP kt:experts_homed Routed experts living on each place now.\n# TYPE kt:experts_homed gauge\n");
    uint32_t count[MAX_PLACES] = {0};
    for (uint32_t il = 0; il < p->n_layer; il++)
        for (uint32_t x = 0; p->layers[il].experts && x < p->n_expert; x++) {
            const int at = place_of(p, &p->layers[il].experts[x]);
            if (at >= 0 && at < n)
                count[at]++;
        }
    for (int f = 0; f < n; f++) {
        place_name(p, f, a, sizeof a);
        kt_buf_printf(o, "kt:experts_homed{place=\"%s\"} %u\n", a, count[f]);
    }

    /* what the steps measured */
    uint64_t pairs = 0;
    for (int f = 0; f < n; f++)
        pairs += sp->place_pairs[f];
    kt_buf_printf(o, "# HELP kt:place_routed_pairs_total Routed (token, expert) pairs each place ran (shared experts "
                     "and dense FFNs not counted).\n# TYPE kt:place_routed_pairs_total counter\n");
    for (int f = 0; f < n; f++) {
        place_name(p, f, a, sizeof a);
        kt_buf_printf(o, "kt:place_routed_pairs_total{place=\"%s\"} %llu\n", a,
                      (unsigned long long)sp->place_pairs[f]);
    }
    kt_buf_printf(o, "# HELP kt:place_routed_share Each place's share of the routed (token, expert) pairs run so "
                     "far.\n# TYPE kt:place_routed_share gauge\n");
    for (int f = 0; f < n; f++) {
        place_name(p, f, a, sizeof a);
        kt_buf_printf(o, "kt:place_routed_share{place=\"%s\"} %.6f\n", a,
                      pairs ? (double)sp->place_pairs[f] / (double)pairs : 0.0);
    }
    for (int node = 0; node < p->n_nodes && node < 16; node++)
        busy_sum += node_busy_ns[node];
    if (busy_sum) { /* the engine counts it by node only with node pools */
        kt_buf_printf(o, "# HELP kt:node_busy_seconds_total Time the threads of each NUMA node's pool spent in "
                         "expert and dense FFN tasks, summed over threads.\n"
                         "# TYPE kt:node_busy_seconds_total counter\n");
        for (int node = 0; node < p->n_nodes && node < 16; node++) {
            place_name(p, node, a, sizeof a);
            kt_buf_printf(o, "kt:node_busy_seconds_total{place=\"%s\"} %.9f\n", a, 1e-9 * (double)node_busy_ns[node]);
        }
        kt_buf_printf(o, "# HELP kt:node_busy_share Each NUMA node's share of that time: 1/nodes each when "
                         "balanced.\n# TYPE kt:node_busy_share gauge\n");
        for (int node = 0; node < p->n_nodes && node < 16; node++) {
            place_name(p, node, a, sizeof a);
            kt_buf_printf(o, "kt:node_busy_share{place=\"%s\"} %.6f\n", a,
                          (double)node_busy_ns[node] / (double)busy_sum);
        }
    }
    double step_s, step_tokens;
    recent_steps(sp, &step_s, &step_tokens);
    kt_buf_printf(o, "# HELP kt:measured_step_seconds The MoE layers' time in the last %d decode steps, mean (what "
                     "kt:rebalance_predicted_step_seconds predicts at one token a step).\n"
                     "# TYPE kt:measured_step_seconds gauge\nkt:measured_step_seconds %.9f\n"
                     "# HELP kt:measured_step_tokens Tokens in those steps, mean.\n"
                     "# TYPE kt:measured_step_tokens gauge\nkt:measured_step_tokens %.3f\n",
                  RECENT_STEPS, step_s, step_tokens);
    pthread_mutex_unlock(&sp->mu);
}

/* Each expert's share of its layer's routed pairs in prof. */
/* A layer's node balance over the decode steps (busy: its BUSY_STRIDE
 * counters): per step, the busiest pool's busy time against the pools' mean
 * (ratio), and over the steps, the busiest node's total against the nodes'
 * mean total (spread; the nodes that may hold experts, idle ones too). */
static json_t *node_balance(const struct kt_placement *p, const uint64_t *busy)
{
    json_t *nodes = json_array();
    uint64_t max = 0, sum = 0;
    int n = 0;
    for (int node = 0; node < p->n_nodes && node < 16; node++)
        if (p->expert_nodes >> node & 1) {
            const uint64_t ns = busy[2 + node];
            json_array_append_new(nodes, json_real(1e-9 * (double)ns));
            max = ns > max ? ns : max, sum += ns, n++;
        }
    return json_pack("{s:f, s:f, s:f, s:o, s:f}", "busiest_s", 1e-9 * (double)busy[0], "mean_s", 1e-9 * (double)busy[1],
                     "ratio", (double)busy[0] / (double)busy[1], "node_busy_s", nodes, "spread",
                     sum ? (double)max * n / (double)sum : 0.0);
}

static json_t *layer_heat(const struct kt_profile *prof, uint32_t il, uint32_t n_expert)
{
    json_t *heat = json_array();
    double sum = 0;
    for (uint32_t x = 0; prof && x < n_expert; x++)
        sum += kt_profile_count(prof, il, x);
    for (uint32_t x = 0; x < n_expert; x++)
        json_array_append_new(heat, json_real(sum > 0 ? kt_profile_count(prof, il, x) / sum : 0.0));
    return heat;
}

/* The device's expert cache as /kt/placement shows it (null without one), mu held. */
static json_t *cache_json(const struct kt_server *s)
{
    const struct kt_serve_placement *sp = s->placement;
    if (!sp->cached)
        return json_null();
    const struct kt_expert_cache_stats *c = &sp->cache;
    const uint64_t looked = c->hit_pairs + c->miss_pairs;
    return json_pack("{s:s, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:f, s:I, s:I, s:I}", "policy",
                     s->o.expert_cache_lfu ? "lfu" : "lru", "slots_per_layer", (json_int_t)s->o.expert_cache_slots,
                     "slots", (json_int_t)c->slots, "live", (json_int_t)c->resident, "device_mib",
                     (double)c->device_bytes / 1048576.0, "hit_pairs", (json_int_t)c->hit_pairs, "miss_pairs",
                     (json_int_t)c->miss_pairs, "pinned_pairs", (json_int_t)c->pinned_pairs, "hit_rate",
                     looked ? (double)c->hit_pairs / (double)looked : 0.0, "uploads", (json_int_t)c->uploads,
                     "upload_bytes", (json_int_t)c->upload_bytes, "evictions", (json_int_t)c->evictions);
}

enum MHD_Result kt_serve_placement_endpoint(struct kt_http_request *rq)
{
    struct kt_server *s = rq->server;
    struct kt_serve_placement *sp = s->placement;
    struct kt_profile *prof = kt_serve_profile_snapshot(s);
    json_t *j = json_object(), *places = json_array(), *layers = json_array(), *log = json_array();
    pthread_mutex_lock(&sp->mu);
    const struct kt_placement *p = sp->live;
    const int n = n_places(p);
    char name[40];
    uint64_t pairs = 0;
    for (int f = 0; f < n; f++)
        pairs += sp->place_pairs[f];
    for (int f = 0; f < n; f++) {
        place_name(p, f, name, sizeof name);
        const char *kind = f < p->n_nodes ? "cpu" : kt_place_backend_name(p->devices[f - p->n_nodes + 1].backend);
        json_array_append_new(places, json_pack("{s:s, s:s, s:f}", "name", name, "kind", kind, "routed_share",
                                                pairs ? (double)sp->place_pairs[f] / (double)pairs : 0.0));
    }
    for (uint32_t il = 0; il < p->n_layer; il++) {
        const struct kt_placement_layer *L = &p->layers[il];
        json_t *l = json_pack("{s:I, s:b}", "layer", (json_int_t)il, "moe", L->experts != NULL);
        if (L->experts) {
            json_t *place = json_array(), *replicas = json_array();
            for (uint32_t x = 0; x < p->n_expert; x++) {
                json_array_append_new(place, json_integer(place_of(p, &L->experts[x])));
                json_t *r = json_array();
                for (int node = 0; node < p->n_nodes; node++)
                    if (L->experts[x].replica_nodes >> node & 1)
                        json_array_append_new(r, json_integer(node));
                json_array_append_new(replicas, r);
            }
            json_object_set_new(l, "sliced", json_boolean(L->cpu_sliced));
            json_object_set_new(l, "place", place);
            json_object_set_new(l, "replicas", replicas);
            json_object_set_new(l, "heat", layer_heat(prof, il, p->n_expert));
            const uint64_t *busy = sp->decode_node_busy + BUSY_STRIDE * (size_t)il;
            if (busy[1]) /* more than one node pool: the decode steps' busiest / mean node, measured */
                json_object_set_new(l, "node_balance", node_balance(p, busy));
            if (sp->cached) { /* the device's expert cache: what it holds, how often it served */
                json_t *cached = json_array();
                for (uint32_t x = 0; x < p->n_expert; x++)
                    if (sp->cached[(size_t)il * p->n_expert + x])
                        json_array_append_new(cached, json_integer(x));
                const struct kt_expert_cache_stats *cs = &sp->cache_layers[il];
                const uint64_t looked = cs->hit_pairs + cs->miss_pairs;
                json_object_set_new(l, "cached", cached);
                json_object_set_new(l, "cache_hit_rate", json_real(looked ? (double)cs->hit_pairs / (double)looked : 0));
            }
        }
        json_array_append_new(layers, l);
    }
    const uint64_t first = sp->n_log > LOG_SIZE ? sp->n_log - LOG_SIZE : 0;
    for (uint64_t i = first; i < sp->n_log; i++) {
        const struct migration *m = &sp->log[i % LOG_SIZE];
        char from[40], to[40];
        place_name(p, m->from, from, sizeof from), place_name(p, m->to, to, sizeof to);
        static const char *const kinds[] = {"home", "replica_add", "replica_drop", "slice", "whole"};
        json_array_append_new(log, json_pack("{s:f, s:s, s:I, s:I, s:s, s:s, s:I, s:b}", "time", m->time, "kind",
                                             kinds[m->kind], "layer", (json_int_t)m->layer, "expert",
                                             (json_int_t)m->expert, "from", from, "to", to, "bytes",
                                             (json_int_t)m->bytes, "ok", m->ok));
    }
    json_object_set_new(j, "model", json_string(s->served_name));
    json_object_set_new(j, "n_layer", json_integer(p->n_layer));
    json_object_set_new(j, "n_expert", json_integer(p->n_expert));
    json_object_set_new(j, "places", places);
    json_object_set_new(j, "layers", layers);
    double step_s, step_tokens;
    recent_steps(sp, &step_s, &step_tokens);
    json_object_set_new(
        j, "rebalancer",
        json_pack("{s:b, s:f, s:I, s:b, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:s}", "enabled", sp->started,
                  "interval_s", s->o.rebalance_interval_s, "rounds", (json_int_t)sp->rounds, "in_round", sp->in_round,
                  "in_flight", (json_int_t)sp->q_len, "in_flight_bytes_max", (json_int_t)sp->max_queued_bytes,
                  "budget_bytes", (json_int_t)(s->o.migration_budget_mib * 1048576.0), "layer_parts",
                  (json_int_t)sp->layer_parts,
                  "pending", (json_int_t)sp->pending, "predicted_before_ms", 1e3 * sp->before_s,
                  "predicted_after_ms", 1e3 * sp->after_s, "measured_ms", 1e3 * step_s, "measured_tokens",
                  step_tokens, "last_error", sp->last_error));
    json_object_set_new(j, "migrations", log);
    json_object_set_new(j, "migrations_total", json_integer((json_int_t)sp->moves_ok));
    json_object_set_new(j, "migrations_failed", json_integer((json_int_t)sp->moves_failed));
    json_object_set_new(j, "migrated_bytes_total", json_integer((json_int_t)sp->bytes_moved));
    json_object_set_new(j, "expert_cache", cache_json(s));
    pthread_mutex_unlock(&sp->mu);
    kt_profile_destroy(prof);
    return kt_http_send_json(rq, 200, j);
}

enum MHD_Result kt_serve_stats_endpoint(struct kt_http_request *rq)
{
    struct kt_server *s = rq->server;
    struct kt_serve_metrics *m = &s->metrics;
    pthread_mutex_lock(&m->mu);
    json_t *j = json_pack("{s:s, s:f, s:I, s:I, s:I, s:I, s:f, s:I}", "state", "ready", "uptime_s",
                          (double)time(NULL) - (double)s->created, "requests_running",
                          (json_int_t)m->requests_running, "requests_waiting", (json_int_t)m->requests_waiting,
                          "prompt_tokens_total", (json_int_t)m->prompt_tokens, "generation_tokens_total",
                          (json_int_t)m->generation_tokens, "kv_cache_usage", m->kv_cache_usage, "steps",
                          (json_int_t)m->engine.steps);
    json_object_set_new(j, "requests_preempted", json_integer((json_int_t)m->requests_preempted));
    json_object_set_new(j, "preemptions_total", json_integer((json_int_t)m->preemptions));
    json_object_set_new(j, "kv_cache", json_pack("{s:I, s:I, s:I, s:I}", "blocks", (json_int_t)m->kv_blocks_total,
                                                 "blocks_used", (json_int_t)m->kv_blocks_used, "blocks_free",
                                                 (json_int_t)(m->kv_blocks_total - m->kv_blocks_used),
                                                 "block_tokens", (json_int_t)m->kv_block_tokens));
    pthread_mutex_unlock(&m->mu);
    struct kt_serve_placement *sp = s->placement;
    pthread_mutex_lock(&sp->mu);
    json_object_set_new(j, "migrations_total", json_integer((json_int_t)sp->moves_ok));
    json_object_set_new(j, "migrated_bytes_total", json_integer((json_int_t)sp->bytes_moved));
    pthread_mutex_unlock(&sp->mu);
    return kt_http_send_json(rq, 200, j);
}
