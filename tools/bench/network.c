/*
 * network.c - the link between the ranks of an MPI job as the pipeline sees
 * it (runtime/dist/transport.h: its sends and its bounded, polling waits),
 * hop by hop round the ring a step's residual stream takes (rank r to r + 1,
 * the last back to 0).  Per hop: round trips of a 64-byte and a 4 MiB
 * message, each one way half the median round trip, fitted to
 *     one way = latency + bytes / bandwidth
 * (placement/machine.h's "network", kt-place's link model), and the
 * pipeline's own messages - a decode step's STEP of one token, a prefill
 * chunk's - timed beside what that line says of them.
 *
 * `kt-bench network` prints the hops and, with --machine FILE (a "%r" in
 * FILE: the rank), writes each rank's hop into its machine file; `mpirun
 * kt-bench model` measures the hops before its run (kt_bench_ring_links) and
 * sets the link model's figure for a step beside the communication it
 * measured.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "machine.h"
#include "model.h"
#include "ranks_plan.h"
#include "transport.h"

#define SMALL_BYTES 64u
#define LARGE_BYTES (4u << 20)
#define TIMEOUT_MS 30000
#define WARM_UP 3
#define PAUSE_NS 2000000L /* before each round trip to a waiting rank: 2 ms, past its tight polls */
#define DEFAULT_WIDTH 7168u /* DeepSeek-V3's and Kimi-K2's hidden size */

/* Round trips of the large messages (4 MiB, the prefill chunk): a tenth of the small ones', at least 3. */
static int large_reps(int reps)
{
    return reps / 10 > 3 ? reps / 10 : 3;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One message each way with peer, `reps` times after a warm-up: the
 * initiator sends first (each time after pause_ns) and times the round
 * trips (*one_way_us: half their median), the other answers each with a
 * message of the same size. */
static kt_status round_trips(struct kt_transport *t, int peer, bool initiator, uint8_t *out, uint8_t *in,
                             size_t bytes, int reps, long pause_ns, double *times, double *one_way_us, kt_err *err)
{
    for (int i = 0; i < WARM_UP + reps; i++) {
        struct kt_transport_req s = {0}, r = {0};
        size_t got = 0;
        if (initiator && pause_ns > 0) { /* the other rank's wait goes past its tight polls, as between steps */
            struct timespec ts = {0, pause_ns};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
            }
        }
        const double t0 = kt_bench_now_seconds();
        kt_status st = KT_OK;
        if (initiator) {
            st = kt_transport_isend(t, peer, out, bytes, &s, err);
            if (st == KT_OK)
                st = kt_transport_irecv(t, peer, in, bytes, &r, err);
            if (st == KT_OK)
                st = kt_transport_wait(t, &s, TIMEOUT_MS, NULL, NULL, err);
            if (st == KT_OK)
                st = kt_transport_wait(t, &r, TIMEOUT_MS, &got, NULL, err);
        } else {
            st = kt_transport_irecv(t, peer, in, bytes, &r, err);
            if (st == KT_OK)
                st = kt_transport_wait(t, &r, TIMEOUT_MS, &got, NULL, err);
            if (st == KT_OK)
                st = kt_transport_isend(t, peer, in, got, &s, err);
            if (st == KT_OK)
                st = kt_transport_wait(t, &s, TIMEOUT_MS, NULL, NULL, err);
        }
        if (st != KT_OK) {
            kt_transport_cancel(t, &r);
            kt_err_prefix(err, "round trips of %zu bytes with rank %d", bytes, peer);
            return st;
        }
        if (got != bytes)
            return kt_err_set(err, KT_ERR_IO, "rank %d answered a %zu-byte message with %zu bytes", peer, bytes, got);
        if (i >= WARM_UP)
            times[i - WARM_UP] = kt_bench_now_seconds() - t0;
    }
    if (initiator) {
        qsort(times, (size_t)reps, sizeof *times, cmp_double);
        *one_way_us = 0.5e6 * times[reps / 2];
    }
    return KT_OK;
}

/* Hop from -> to (its initiator's view): five round trips, then the fit. */
static kt_status measure_hop(struct kt_transport *t, bool initiator, int peer, uint8_t *out, uint8_t *in,
                             int reps, double *times, struct kt_bench_link *l, kt_err *err)
{
    const size_t sizes[5] = {SMALL_BYTES, LARGE_BYTES, l->decode_bytes, l->prefill_bytes, SMALL_BYTES};
    const int few = large_reps(reps);
    const int n_reps[5] = {reps, few, reps, few, reps};
    const long pause_ns[5] = {0, 0, 0, 0, PAUSE_NS}; /* the last to a rank that had waited */
    double us[5] = {0};
    for (int k = 0; k < 5; k++) {
        kt_status st = round_trips(t, peer, initiator, out, in, sizes[k], n_reps[k], pause_ns[k], times, &us[k], err);
        if (st != KT_OK)
            return st;
    }
    if (!initiator)
        return KT_OK;
    /* the line through the small and the large message */
    const double dt = us[1] - us[0];
    l->gbps = dt > 0 ? (double)(LARGE_BYTES - SMALL_BYTES) / (dt * 1e3) : (double)LARGE_BYTES / (us[1] * 1e3);
    l->latency_us = us[0] - (double)SMALL_BYTES / (l->gbps * 1e3);
    if (l->latency_us < 0.01)
        l->latency_us = 0.01;
    /* a receiver that had waited saw the small message late by its round trip's excess */
    l->wake_us = us[4] > us[0] ? 2 * (us[4] - us[0]) : 0;
    l->decode_us = us[2];
    l->prefill_us = us[3];
    l->decode_fit_us = l->latency_us + (double)l->decode_bytes / (l->gbps * 1e3);
    l->prefill_fit_us = l->latency_us + (double)l->prefill_bytes / (l->gbps * 1e3);
    return KT_OK;
}

kt_status kt_bench_ring_links(struct kt_transport *t, uint32_t n_embd, uint32_t prefill_tokens, int reps,
                              struct kt_bench_link *links, kt_err *err)
{
    const int rank = kt_transport_rank(t), size = kt_transport_size(t);
    if (size < 2)
        return kt_err_set(err, KT_ERR_INVALID, "the link between ranks needs an MPI job of 2 or more ranks");
    const uint64_t decode_bytes = kt_rank_message_bytes(1, n_embd, true);
    const uint64_t prefill_bytes = kt_rank_message_bytes(prefill_tokens, n_embd, true);
    const size_t cap = prefill_bytes > LARGE_BYTES ? prefill_bytes : LARGE_BYTES;
    uint8_t *out = calloc(1, cap), *in = calloc(1, cap);
    double *times = malloc((size_t)reps * sizeof *times);
    kt_status st = KT_OK;
    if (!out || !in || !times) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory for %zu-byte messages", cap);
        goto done;
    }
    struct kt_bench_link mine = {.from = rank, .to = (rank + 1) % size, .decode_bytes = decode_bytes,
                                 .prefill_bytes = prefill_bytes};
    snprintf(mine.host, sizeof mine.host, "%s", kt_transport_host(t));
    /* hops in ring order: each rank takes part in two, and the messages of a
     * pair of ranks arrive in order, so no hop waits on a later one */
    for (int k = 0; k < size && st == KT_OK; k++) {
        const int a = k, b = (k + 1) % size;
        if (rank == a)
            st = measure_hop(t, true, b, out, in, reps, times, &mine, err);
        else if (rank == b) {
            struct kt_bench_link other = {.decode_bytes = decode_bytes, .prefill_bytes = prefill_bytes};
            st = measure_hop(t, false, a, out, in, reps, times, &other, err);
        }
    }
    /* every hop's figures to rank 0 */
    for (int r = 1; r < size && st == KT_OK; r++) {
        struct kt_transport_req req = {0};
        size_t got = 0;
        if (rank == r) {
            st = kt_transport_isend(t, 0, &mine, sizeof mine, &req, err);
            if (st == KT_OK)
                st = kt_transport_wait(t, &req, TIMEOUT_MS, NULL, NULL, err);
        } else if (rank == 0) {
            st = kt_transport_irecv(t, r, &links[r], sizeof links[r], &req, err);
            if (st == KT_OK)
                st = kt_transport_wait(t, &req, TIMEOUT_MS, &got, NULL, err);
            if (st != KT_OK)
                kt_transport_cancel(t, &req);
            else if (got != sizeof links[r])
                st = kt_err_set(err, KT_ERR_IO, "rank %d sent %zu bytes, not its link", r, got);
        }
    }
    if (st == KT_OK)
        links[0] = mine; /* rank 0: hop 0 (the others from 1 on); the others: their own */
done:
    free(out), free(in), free(times);
    return st;
}

double kt_bench_link_step_seconds(const struct kt_bench_link *links, int n_ranks, uint32_t n_embd,
                                  uint32_t n_tokens)
{
    struct kt_machine *from = calloc(1, sizeof *from), *to = calloc(1, sizeof *to);
    double s = 0;
    for (int r = 0; from && to && r < n_ranks; r++) { /* kt-place's figure of each hop, from what was measured */
        from->net_gbps = to->net_gbps = links[r].gbps;
        from->net_latency_us = to->net_latency_us = links[r].latency_us + links[r].wake_us;
        s += kt_rank_link_seconds(from, to, n_embd, n_tokens, 1, r + 1 < n_ranks); /* the last hop: a RESULT */
    }
    free(from), free(to);
    return s;
}

/* ---- kt-bench network ---------------------------------------------------------------------- */

static void print_bytes(char *buf, size_t size, uint64_t b)
{
    if (b >= (1u << 20))
        snprintf(buf, size, "%.2f MiB", (double)b / (1u << 20));
    else
        snprintf(buf, size, "%.1f KiB", (double)b / 1024);
}

static void print_us(char *buf, size_t size, double us)
{
    if (us >= 1000)
        snprintf(buf, size, "%.3f ms", us * 1e-3);
    else
        snprintf(buf, size, "%.1f us", us);
}

/* "measured (fit)" of one message. */
static void measured_and_fit(char *buf, size_t size, double us, double fit_us)
{
    char m[32], f[32];
    print_us(m, sizeof m, us);
    print_us(f, sizeof f, fit_us);
    snprintf(buf, size, "%s (%s)", m, f);
}

static void print_links(const struct kt_bench_link *links, int n, uint32_t n_embd, uint32_t prefill_tokens,
                        int reps)
{
    char db[32], pb[32];
    print_bytes(db, sizeof db, links[0].decode_bytes);
    print_bytes(pb, sizeof pb, links[0].prefill_bytes);
    printf("kt-bench network: %d MPI ranks, hop by hop round the ring; one way = half the median of %d round trips "
           "(%d for 4 MiB and the prefill chunk) through kt's transport, as the pipeline sends and waits; \"+ if "
           "waiting\": how late a rank that had waited 2 ms sees a message (a step's receiver: the machine file's "
           "latency is the sum)\n",
           n, reps, large_reps(reps));
    printf("messages of width %u: a decode step's of one token %s, a prefill chunk's of %u tokens %s\n", n_embd, db,
           prefill_tokens, pb);
    printf("  %-8s %-20s %10s %14s %12s %24s %24s\n", "hop", "hosts", "latency", "+ if waiting", "bandwidth",
           "decode step (fit)", "prefill chunk (fit)");
    for (int r = 0; r < n; r++) {
        const struct kt_bench_link *l = &links[r];
        char hop[32], hosts[160], lat[32], wake[32], dcol[80], pcol[80];
        snprintf(hop, sizeof hop, "%d -> %d", l->from, l->to);
        snprintf(hosts, sizeof hosts, "%s -> %s", l->host, links[(r + 1) % n].host);
        print_us(lat, sizeof lat, l->latency_us);
        print_us(wake, sizeof wake, l->wake_us);
        measured_and_fit(dcol, sizeof dcol, l->decode_us, l->decode_fit_us);
        measured_and_fit(pcol, sizeof pcol, l->prefill_us, l->prefill_fit_us);
        printf("  %-8s %-20s %10s %14s %7.3f GB/s %24s %24s\n", hop, hosts, lat, wake, l->gbps, dcol, pcol);
    }
}

void *kt_bench_links_json(const struct kt_bench_link *links, int n)
{
    json_t *a = json_array();
    for (int r = 0; a && r < n; r++) {
        const struct kt_bench_link *l = &links[r];
        json_t *o = json_object();
        json_object_set_new(o, "from", json_integer(l->from));
        json_object_set_new(o, "to", json_integer(l->to));
        json_object_set_new(o, "host", json_string(l->host));
        json_object_set_new(o, "latency_us", json_real(l->latency_us));
        json_object_set_new(o, "wake_us", json_real(l->wake_us));
        json_object_set_new(o, "bandwidth_gbps", json_real(l->gbps));
        json_object_set_new(o, "decode_message_bytes", json_integer((json_int_t)l->decode_bytes));
        json_object_set_new(o, "decode_message_us", json_real(l->decode_us));
        json_object_set_new(o, "decode_message_fit_us", json_real(l->decode_fit_us));
        json_object_set_new(o, "prefill_message_bytes", json_integer((json_int_t)l->prefill_bytes));
        json_object_set_new(o, "prefill_message_us", json_real(l->prefill_us));
        json_object_set_new(o, "prefill_message_fit_us", json_real(l->prefill_fit_us));
        json_array_append_new(a, o);
    }
    return a;
}

/* FILE with each "%r" replaced by rank. */
static kt_status rank_path(const char *pattern, int rank, char *buf, size_t size, kt_err *err)
{
    size_t n = 0;
    for (const char *p = pattern; *p; p++) {
        int w;
        if (p[0] == '%' && p[1] == 'r') {
            w = snprintf(buf + n, size - n, "%d", rank);
            p++;
        } else {
            w = snprintf(buf + n, size - n, "%c", *p);
        }
        if (w < 0 || (size_t)w >= size - n)
            return kt_err_set(err, KT_ERR_INVALID, "--machine '%s': the path is too long", pattern);
        n += (size_t)w;
    }
    return KT_OK;
}

int kt_bench_network(const struct kt_bench_options *o)
{
    kt_err err = {0};
    struct kt_transport *t = NULL;
    struct kt_machine *mach = NULL;
    struct kt_bench_link links[KT_RANK_PLAN_MAX] = {{0}};
    char path[1024] = "";
    const int reps = 200;
    uint32_t n_embd = DEFAULT_WIDTH;
    int rc = 1;
    if (kt_transport_init(NULL, NULL, &t, &err) != KT_OK)
        goto fail;
    const int rank = kt_transport_rank(t), size = kt_transport_size(t);
    if (size < 2) {
        kt_err_set(&err, KT_ERR_INVALID, "network measures the link between the ranks of an MPI job: run it under "
                   "mpirun -np 2 (or more, one rank per host), e.g. mpirun -np 2 --host a,b kt-bench network");
        goto fail;
    }
    if (size > KT_RANK_PLAN_MAX) {
        kt_err_set(&err, KT_ERR_UNSUPPORTED, "%d ranks; kt plans at most %d", size, KT_RANK_PLAN_MAX);
        goto fail;
    }
    if (o->model) { /* its width: the header only */
        struct kt_model *m = NULL;
        if (kt_model_open(o->model, &m, &err) != KT_OK)
            goto fail;
        n_embd = m->hp.n_embd;
        kt_model_close(m);
    }
    if (o->machine) { /* every rank's file read before any measures: a bad one fails the job at once */
        if (rank_path(o->machine, rank, path, sizeof path, &err) != KT_OK ||
            kt_machine_load(path, &mach, &err) != KT_OK)
            goto fail;
    }
    if (kt_bench_ring_links(t, n_embd, o->prefill_tokens, reps, links, &err) != KT_OK)
        goto fail;
    if (mach) { /* this rank's hop: its link to the next rank, the way its stage's output goes */
        mach->net_gbps = links[0].gbps;
        mach->net_latency_us = links[0].latency_us + links[0].wake_us; /* a step's receiver has waited */
        mach->network_given = true;
        if (kt_machine_save(mach, path, &err) != KT_OK)
            goto fail;
        fprintf(stderr, "kt-bench network: rank %d (%s): wrote its link to rank %d into %s: %.1f us + bytes / %.3f "
                "GB/s\n", rank, kt_transport_host(t), links[0].to, path, mach->net_latency_us, mach->net_gbps);
    }
    if (rank == 0) {
        print_links(links, size, n_embd, o->prefill_tokens, reps);
        if (o->json) {
            json_t *root = json_object();
            json_object_set_new(root, "ranks", json_integer(size));
            json_object_set_new(root, "width", json_integer(n_embd));
            json_object_set_new(root, "prefill_tokens", json_integer(o->prefill_tokens));
            json_object_set_new(root, "hops", kt_bench_links_json(links, size));
            rc = kt_bench_write_json(root, o->json);
            json_decref(root);
            if (rc)
                goto done;
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kt-bench: %s%s\n", t && kt_transport_size(t) > 1 ? "network: " : "", err.msg);
    if (t && kt_transport_size(t) > 1) { /* the other ranks wait on this one */
        fflush(stderr);
        kt_transport_abort(t, 1);
    }
    rc = 1;
done:
    free(mach);
    kt_transport_finalize(t);
    return rc;
}
