/*
 * rebalance.h - the rebalancer's choice (issue 13, part 1): from the placement
 * kt-serve runs now and a target plan the planner made from the live profile,
 * the expert moves worth their bytes, best predicted gain per byte first.
 *
 * A move gives one routed expert a new home (an accelerator, or another
 * NUMA node), as the target has it.  A move onto an accelerator may come
 * paired with a move off it (another expert the target sends back to a CPU
 * node), made first: where the device's free bytes cannot take the expert
 * (the pair that loses the least), or where the swap gains more per byte
 * (a layer's hot set changing), so the device's budget holds after every
 * move.  Gains are the cost model's
 * (cost.h): the query's step time of the layers a move touches, before
 * minus after, each move judged on the placement the earlier ones made.
 *
 * Hysteresis, so the placement does not oscillate: nothing moves unless the
 * target's predicted step (its MoE layers) is below the present one by more
 * than min_gain (a share); then only moves that gain are taken.  At most
 * budget_bytes are copied in a round; the rest waits for the next one.
 *
 * Replicas change the same way, for an expert the target keeps on the same
 * CPU node: a replica the target drops is dropped first in the round (it
 * frees node memory the adds may need; bytes 0), and a replica it adds is a
 * move of the expert's bytes to that node, weighed by gain per byte with
 * the others.  A layer the target row-slices and the placement serves whole
 * is sliced by one move (its bytes: every expert of the layer, copied into
 * the nodes' shares), weighed like the others; the layer's CPU home and
 * replica moves are then left out (a sliced layer has neither), its device
 * moves stay.  The other way, a layer served sliced that the target keeps
 * whole is made whole by one move of the same bytes (KT_MOVE_LAYER_WHOLE:
 * every CPU expert back on the target's node, no replicas: those come in a
 * later round), weighed the same.  Pure
 * arithmetic: no thread, no device, no file.
 */
#ifndef KT_PLACEMENT_REBALANCE_H
#define KT_PLACEMENT_REBALANCE_H

#include <stdint.h>

#include "cost.h"
#include "plan.h"
#include "status.h"

enum kt_move_kind {
    KT_MOVE_HOME,                /* the expert's home changes: from -> to */
    KT_MOVE_REPLICA_ADD,         /* a replica on node `node` (to = from with its bit set) */
    KT_MOVE_REPLICA_DROP,        /* the replica on node `node` goes (to = from without its bit) */
    KT_MOVE_LAYER_SLICE,         /* the whole layer's CPU experts row-sliced over the nodes (expert 0; from = to) */
    KT_MOVE_LAYER_WHOLE,         /* a row-sliced layer made whole again, each CPU expert on the target's node (expert 0) */
};

struct kt_move {
    enum kt_move_kind kind;
    int node;                    /* the replica's node (replica moves) */
    uint32_t layer, expert;
    struct kt_expert_home from, to;
    uint64_t bytes;              /* copied to the new home: the expert's GGUF bytes */
    double gain_s;               /* predicted time saved by this move and its pair, when it has one */
    int32_t paired_with;         /* index of the move off the device it swaps with; -1: none */
};

struct kt_rebalance_params {
    struct kt_cost_query query;  /* the step the gains are predicted for (decode at the serving batch) */
    double min_gain;             /* moves only when the target saves more than this share of the step */
    uint64_t budget_bytes;       /* bytes of copies in this round; 0: no limit */
};

struct kt_rebalance {
    struct kt_move *moves;       /* [n_moves], in the order to make them */
    uint32_t n_moves;
    uint32_t n_pending;          /* target homes not moved this round (hysteresis, no gain yet, or over the budget) */
    uint64_t bytes;              /* sum of the moves' bytes */
    double gain_s;               /* predicted step time saved by all of them */
    double before_s, after_s;    /* predicted step time of the MoE layers before and after */
};

/* The moves from cur toward target, both placements of m (layers and experts alike; the
 * same devices by index).  Moves into device d may use its free bytes,
 * budget_bytes - bytes of cur.  out is the caller's; free with
 * kt_rebalance_free.  KT_ERR_INVALID when the two placements differ in shape,
 * KT_ERR_NOMEM out of memory. */
kt_status kt_rebalance_plan(const struct kt_cost_model *c, const struct kt_model *m, const struct kt_placement *cur,
                            const struct kt_placement *target, const struct kt_rebalance_params *rp,
                            struct kt_rebalance *out, kt_err *err);
void kt_rebalance_free(struct kt_rebalance *r);

#endif
