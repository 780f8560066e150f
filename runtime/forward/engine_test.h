/*
 * engine_test.h - engine knobs that only tests set (kt_engine_params.test):
 * they force one code path where the engine would choose, or stand in for the
 * machine.  Programs never include this header; with test NULL every knob is
 * off.  The engine copies the struct at creation.
 */
#ifndef KT_ENGINE_TEST_H
#define KT_ENGINE_TEST_H

#include <stdbool.h>

/* MLA attention has two exact forms (docs/deepseek2.md, "Attention (MLA)"):
 * "absorbed" attends over the cached latent rows (cheap per context token:
 * decode), "expanded" rebuilds per-head keys and values for the context
 * (cheap per query: long prefill chunks).  AUTO picks per sequence and step
 * by operation count. */
enum kt_attention_form {
    KT_ATTENTION_AUTO = 0,
    KT_ATTENTION_ABSORBED = 1,
    KT_ATTENTION_EXPANDED = 2,
};

struct kt_engine_test_params {
    enum kt_attention_form attention_form; /* force one form (AUTO: the engine picks) */
    bool experts_in_place;      /* read routed experts from the mapping instead of the expert store */
    bool experts_round_robin;   /* home expert x of each layer on topology node x % n_nodes (default:
                                   node 0); ignored when experts_in_place */
    /* Keep every weight in the file's GGUF rows instead of repacking the
     * routed experts (expert store) and the host's attention, dense and
     * shared-expert matrices (anonymous huge-page memory) into the kernel
     * level's packed format. */
    bool keep_gguf_layout;
    /* With attention on the device, decode batches replay each layer's
     * attention from a graph; this runs every batch directly instead. */
    bool no_device_graphs;
    /* The memory check before the load reads proc/meminfo and the cgroup files
     * (runtime/host/cgroup.h) under this directory instead of "/". */
    const char *host_root;
    /* Before every step, move one routed expert of each MoE layer (the step's
     * number modulo n_expert) onto the device or off it (with a device), then
     * to the next node with cores (kt_engine_move_expert), and give the next
     * expert a replica on another node or take away the one it has: outputs
     * must not change.  Experts that cannot move (sliced, onto a node holding
     * a copy, over the device's budget) are left where they are. */
    bool migrate_every_step;
    /* The expert cache copies a whole expert per layer and step, whatever
     * the link's measured spare time (which a host emulation of the GPU
     * cannot measure). */
    bool expert_cache_unthrottled;
    /* Nonzero: the device's idle time per MoE layer and step, standing in for
     * the measured one (the CPU part's time minus the device's busy time), so
     * the cache's chunk sizes follow the link alone and not how fast this host
     * is against the device: on a fast host the sim is never idle and nothing
     * would upload. */
    uint64_t expert_cache_idle_ns;
};

#endif
