/*
 * test_route_counts.c - the engine's routing counts (kt_engine_route_counts):
 * every step adds each token's experts of each MoE layer to its phase's
 * counts, a token being prefill when its sequence has more than one token in
 * the step.  Checked against a recount from the reference forward's routing
 * (tests/reference_forward.c) over batches that mix prefill chunks and decode
 * tokens of several sequences, on the CPU and with the router on the sim
 * device, and reset with the stats.
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "engine.h"
#include "model.h"
#include "reference_forward.h"
#include "testlib.h"

enum { N_SEQ = 3, MAX_LEN = 8, N_STEPS = 3 };

/* Each step's tokens per sequence: a prompt chunk (> 1: prefill), one token (decode) or none. */
static const uint32_t STEP_TOKENS[N_STEPS][N_SEQ] = {
    {5, 1, 0}, /* seq 0 prefills, seq 1 decodes its first token */
    {1, 4, 3}, /* seq 0 decodes, seqs 1 and 2 prefill */
    {1, 1, 1}, /* all decode */
};

struct counts {
    uint64_t *c[2]; /* (n_layer, n_expert) per phase */
    uint64_t tokens[2];
};

/* Runs the steps over seqs' tokens; copies the engine's counts into got. */
static bool run_steps(struct kt_model *m, const struct kt_engine_params *params, int32_t seqs[N_SEQ][MAX_LEN],
                      struct counts *got)
{
    struct kt_engine *e = NULL;
    kt_err err = {0};
    KT_CHECK(kt_engine_create(m, params, &e, &err) == KT_OK, "%s", err.msg);
    if (!e)
        return false;
    bool ok = true;
    for (uint32_t s = 0; s < N_SEQ; s++)
        ok = ok && kt_engine_seq_add(e, s, &err) == KT_OK;
    uint32_t len[N_SEQ] = {0};
    for (int step = 0; ok && step < N_STEPS; step++) {
        struct kt_batch_token batch[N_SEQ * MAX_LEN];
        uint32_t n = 0, left[N_SEQ];
        memcpy(left, STEP_TOKENS[step], sizeof left);
        for (bool more = true; more;) { /* interleave the sequences' tokens */
            more = false;
            for (uint32_t s = 0; s < N_SEQ; s++)
                if (left[s]) {
                    batch[n++] = (struct kt_batch_token){seqs[s][len[s]], s, len[s], false};
                    len[s]++, left[s]--, more = true;
                }
        }
        ok = kt_engine_step(e, &(struct kt_batch){n, batch}, NULL, &err) == KT_OK;
        KT_CHECK(ok, "step %d: %s", step, err.msg);
    }
    const size_t cells = (size_t)m->hp.n_layer * m->hp.n_expert;
    for (int ph = 0; ok && ph < 2; ph++) {
        const uint64_t *c = kt_engine_route_counts(e, ph, &got->tokens[ph]);
        KT_CHECK(c != NULL, "phase %d", ph);
        if (c)
            memcpy(got->c[ph], c, cells * sizeof *c);
    }
    KT_CHECK(kt_engine_route_counts(e, 2, NULL) == NULL, "no third phase");
    kt_engine_stats_reset(e);
    uint64_t n_after = 1;
    const uint64_t *after = kt_engine_route_counts(e, KT_ROUTE_PREFILL, &n_after);
    bool zero = after && n_after == 0;
    for (size_t i = 0; zero && i < cells; i++)
        zero = after[i] == 0;
    KT_CHECK(zero, "kt_engine_stats_reset clears the routing counts");
    kt_engine_destroy(e);
    return ok;
}

static void counts_match_the_reference_routing_of_mixed_batches(void)
{
    char path[1024] = "";
    struct kt_model *m = kt_test_synth_model("tiny", NULL, path, sizeof path);
    if (!m)
        return;
    const uint32_t L = m->hp.n_layer, Ne = m->hp.n_expert, k = m->hp.n_expert_used;
    const size_t cells = (size_t)L * Ne;
    int32_t seqs[N_SEQ][MAX_LEN];
    unsigned long long rng = 12345;
    for (int s = 0; s < N_SEQ; s++)
        for (int i = 0; i < MAX_LEN; i++)
            seqs[s][i] = (int32_t)(kt_test_rand_u64(&rng) % m->hp.n_vocab);

    /* expected: each sequence's positions routed by the reference, added to
     * the phase of the step that ran them */
    struct counts want = {{calloc(cells, 8), calloc(cells, 8)}, {0, 0}};
    uint32_t *routes = calloc((size_t)L * MAX_LEN * k, sizeof *routes);
    double margin = 1e300;
    for (uint32_t s = 0; s < N_SEQ; s++) {
        uint32_t n = 0;
        for (int step = 0; step < N_STEPS; step++)
            n += STEP_TOKENS[step][s];
        free(ref_forward_routed(m, seqs[s], n, routes, &margin));
        uint32_t pos = 0;
        for (int step = 0; step < N_STEPS; step++) {
            const uint32_t t = STEP_TOKENS[step][s];
            const int ph = t > 1 ? KT_ROUTE_PREFILL : KT_ROUTE_DECODE;
            want.tokens[ph] += t;
            for (uint32_t p = pos; p < pos + t; p++)
                for (uint32_t il = 0; il < L; il++)
                    for (uint32_t j = 0; m->layers[il].is_moe && j < k; j++)
                        want.c[ph][(size_t)il * Ne + routes[((size_t)il * n + p) * k + j]]++;
            pos += t;
        }
    }
    /* float and double routing agree when no decision was close */
    KT_CHECK(margin > 1e-4, "the prompt's routing has a near tie (margin %g): pick another seed", margin);
    KT_CHECK(want.tokens[KT_ROUTE_PREFILL] == 12 && want.tokens[KT_ROUTE_DECODE] == 5, "the steps' phases");

    const struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim0", .transfer_gbps = 25};
    const struct {
        const char *name;
        struct kt_engine_params p;
    } cases[] = {
        {"cpu", {.n_ctx = 64, .max_seqs = N_SEQ, .n_threads = 2}},
        {"router on the sim device",
         {.n_ctx = 64, .max_seqs = N_SEQ, .n_threads = 2, .device = &sim, .attention_on_device = true}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct counts got = {{calloc(cells, 8), calloc(cells, 8)}, {0, 0}};
        if (run_steps(m, &cases[c].p, seqs, &got)) {
            for (int ph = 0; ph < 2; ph++) {
                KT_CHECK(got.tokens[ph] == want.tokens[ph], "%s: phase %d: %llu tokens, want %llu", cases[c].name, ph,
                         (unsigned long long)got.tokens[ph], (unsigned long long)want.tokens[ph]);
                size_t differ = 0;
                uint64_t sum = 0;
                for (size_t i = 0; i < cells; i++)
                    differ += got.c[ph][i] != want.c[ph][i], sum += got.c[ph][i];
                KT_CHECK(differ == 0, "%s: phase %d: %zu (layer, expert) counts differ from the reference's",
                         cases[c].name, ph, differ);
                const uint32_t n_moe = L - m->hp.n_dense_lead;
                KT_CHECK(sum == want.tokens[ph] * k * n_moe, "%s: phase %d: %llu pairs", cases[c].name, ph,
                         (unsigned long long)sum);
            }
        }
        free(got.c[0]), free(got.c[1]);
    }
    free(want.c[0]), free(want.c[1]), free(routes);
    kt_test_synth_remove(m, path);
}

int main(void)
{
    KT_RUN(counts_match_the_reference_routing_of_mixed_batches);
    return kt_test_finish();
}
