/*
 * test_kt_serve_rebalance.c - kt-serve's online rebalancer end to end, over
 * HTTP with curl, on two synthetic NUMA nodes and a sim device: a greedy
 * answer is the same with the rebalancer off, before experts move and after;
 * GET /kt/placement's shape, its migration log against the homes it reports,
 * /metrics' migration counters and measured shares, /kt/stats; --plan-out
 * written at exit and served again gives every expert the same place; with
 * --rebalance-interval 0 nothing moves; a --migration-budget-mib below one
 * expert still moves them; layers are sliced while serving, and sliced ones
 * are made whole again on nodes of unequal speed, the answer unchanged; bad
 * rebalancing options are refused up front; --api-key guards /kt/ but not
 * /dashboard.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "machine.h"
#include "model.h"
#include "serve_harness.h"

#define TOPOLOGY "numa:2 core:1 pu:1"

static char tiny[1024], sim_config[1200];
static uint32_t n_expert_used; /* the tiny model's, for the pair counts */

/* The request whose answer must not depend on where experts live: greedy,
 * with the top log-probabilities, which would show a difference in the
 * logits before a token changed.  Every server that answers it runs with
 * --prefix-cache 0: a prompt found in the cache is finished by the absorbed
 * (decode) attention instead of the expanded one, a few ulps apart. */
static const char *const greedy =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"Where do rivers go?\"}], \"max_tokens\": 24, "
    "\"temperature\": 0, \"seed\": 7, \"logprobs\": true, \"top_logprobs\": 3, \"ignore_eos\": true}";

static json_t *get_json(const struct test_server *s, const char *path)
{
    struct kt_buf out = {0};
    int code = http(s, NULL, path, NULL, &out, NULL);
    json_error_t je;
    json_t *j = code == 200 ? json_loads(kt_buf_str(&out), 0, &je) : NULL;
    KT_CHECK(j != NULL, "GET %s: HTTP %d: %.300s", path, code, kt_buf_str(&out));
    kt_buf_free(&out);
    return j;
}

/* The greedy answer's message and log-probabilities as JSON text (malloc'd; NULL on failure). */
static char *greedy_answer(const struct test_server *s)
{
    struct kt_buf out = {0};
    int code = http(s, NULL, "/v1/chat/completions", greedy, &out, NULL);
    json_error_t je;
    json_t *j = code == 200 ? json_loads(kt_buf_str(&out), 0, &je) : NULL;
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    const char *text = json_string_value(json_object_get(json_object_get(choice, "message"), "content"));
    json_t *lp = json_object_get(json_object_get(choice, "logprobs"), "content");
    KT_CHECK(text && json_array_size(lp) == 24, "greedy request: HTTP %d: %.300s", code, kt_buf_str(&out));
    json_t *both = json_pack("{s:O?, s:O?}", "message", json_object_get(choice, "message"), "logprobs", lp);
    char *dump = both ? json_dumps(both, JSON_SORT_KEYS) : NULL;
    json_decref(both), json_decref(j);
    kt_buf_free(&out);
    return dump;
}

/* Chat requests with different prompts, so the live profile has routing to plan from. */
static void send_traffic(const struct test_server *s, int n, int first)
{
    struct kt_buf out = {0};
    for (int i = first; i < first + n; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"Story %d about the sea, "
                 "part %d.\"}], \"max_tokens\": 12, \"seed\": %d}", i * 7919 % 1000, i, i);
        int code = http(s, NULL, "/v1/chat/completions", body, &out, NULL);
        KT_CHECK(code == 200, "traffic %d: HTTP %d %.200s", i, code, kt_buf_str(&out));
    }
    kt_buf_free(&out);
}

/* The value of the series `name{labels}` (exactly as printed) in Prometheus text; NAN when absent. */
static double metric(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *at = strstr(text, series); at; at = strstr(at + 1, series))
        if ((at == text || at[-1] == '\n') && at[n] == ' ')
            return strtod(at + n + 1, NULL);
    return NAN;
}

static double json_num(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* The index of the place named name in /kt/placement's places; -1 if none. */
static int place_index(const json_t *placement, const char *name)
{
    const json_t *places = json_object_get(placement, "places");
    for (size_t i = 0; name && i < json_array_size(places); i++)
        if (strcmp(json_string_value(json_object_get(json_array_get(places, i), "name")), name) == 0)
            return (int)i;
    return -1;
}

static const char *place_name(const json_t *placement, json_int_t i)
{
    const json_t *p = json_array_get(json_object_get(placement, "places"), (size_t)i);
    return json_string_value(json_object_get(p, "name"));
}

/* ---- GET /kt/placement's shape ------------------------------------------------------------------- */

/* Checks what every /kt/placement must hold: places, a layer entry per layer
 * (MoE ones with n_expert places, replica lists and heats in [0, 1] summing to
 * 1 once traffic ran), the rebalancer object, the log's entries and totals
 * that agree with it. */
static void check_placement_shape(const json_t *j, bool traffic, bool enabled)
{
    const json_int_t n_layer = json_integer_value(json_object_get(j, "n_layer"));
    const json_int_t n_expert = json_integer_value(json_object_get(j, "n_expert"));
    const json_t *places = json_object_get(j, "places"), *layers = json_object_get(j, "layers");
    KT_CHECK(json_is_string(json_object_get(j, "model")) && n_layer == 4 && n_expert == 32, "model, n_layer %lld, "
             "n_expert %lld", (long long)n_layer, (long long)n_expert);
    /* two synthetic nodes and the config's sim device, CPU nodes first */
    KT_CHECK(json_array_size(places) == 3 && place_index(j, "node 0") == 0 && place_index(j, "node 1") == 1 &&
                 place_index(j, "sim") == 2,
             "places: %s", json_dumps(places, 0));
    double share_sum = 0;
    for (size_t i = 0; i < json_array_size(places); i++) {
        const json_t *p = json_array_get(places, i);
        const char *kind = json_string_value(json_object_get(p, "kind"));
        double share = json_num(p, "routed_share");
        KT_CHECK(kind && strcmp(kind, i < 2 ? "cpu" : "sim") == 0 && share >= 0 && share <= 1, "place %zu", i);
        share_sum += share;
    }
    KT_CHECK(traffic ? fabs(share_sum - 1) < 1e-6 : share_sum == 0, "the places' routed shares sum to %g", share_sum);
    KT_CHECK((json_int_t)json_array_size(layers) == n_layer, "%zu layers", json_array_size(layers));
    uint32_t moe = 0, balanced = 0;
    for (size_t il = 0; il < json_array_size(layers); il++) {
        const json_t *l = json_array_get(layers, il);
        KT_CHECK(json_integer_value(json_object_get(l, "layer")) == (json_int_t)il, "layer %zu numbered", il);
        if (!json_is_true(json_object_get(l, "moe"))) {
            KT_CHECK(il == 0 && !json_object_get(l, "place"), "layer %zu: only the leading dense layer", il);
            continue;
        }
        moe++;
        const json_t *place = json_object_get(l, "place"), *heat = json_object_get(l, "heat");
        const json_t *replicas = json_object_get(l, "replicas");
        KT_CHECK((json_int_t)json_array_size(place) == n_expert && (json_int_t)json_array_size(heat) == n_expert &&
                     (json_int_t)json_array_size(replicas) == n_expert && json_is_boolean(json_object_get(l, "sliced")),
                 "layer %zu arrays", il);
        double heat_sum = 0;
        for (json_int_t x = 0; x < n_expert; x++) {
            const json_int_t at = json_integer_value(json_array_get(place, (size_t)x));
            const double h = json_number_value(json_array_get(heat, (size_t)x));
            KT_CHECK(json_is_integer(json_array_get(place, (size_t)x)) && at >= 0 &&
                         at < (json_int_t)json_array_size(places) && h >= 0 && h <= 1,
                     "layer %zu expert %lld: place %lld heat %g", il, (long long)x, (long long)at, h);
            heat_sum += h;
        }
        KT_CHECK(traffic ? fabs(heat_sum - 1) < 1e-6 : heat_sum == 0, "layer %zu heat sums to %g", il, heat_sum);
        /* the decode steps' busiest / mean node pool, as measured: on two nodes within [1, 2] */
        const json_t *nb = json_object_get(l, "node_balance");
        if (nb) {
            const double busiest = json_num(nb, "busiest_s"), mean = json_num(nb, "mean_s"), ratio = json_num(nb, "ratio");
            KT_CHECK(traffic && mean > 0 && busiest >= mean * (1 - 1e-9) && busiest <= 2 * mean * (1 + 1e-9) &&
                         fabs(ratio - busiest / mean) < 1e-6,
                     "layer %zu node balance: %s", il, json_dumps(nb, 0));
            /* the nodes' totals: their mean is the steps' mean summed (each step's mean truncated to a ns),
             * the busiest total at most the steps' busiest summed, spread their ratio */
            const json_t *nodes = json_object_get(nb, "node_busy_s");
            double top = 0, sum = 0;
            for (size_t n = 0; n < json_array_size(nodes); n++) {
                const double b = json_number_value(json_array_get(nodes, n));
                top = b > top ? b : top, sum += b;
            }
            const double spread = json_num(nb, "spread");
            KT_CHECK(json_array_size(nodes) == 2 && fabs(sum / 2 - mean) <= 1e-6 * mean + 1e-6 &&
                         top <= busiest * (1 + 1e-9) && spread >= 1 && spread <= ratio * (1 + 1e-6) &&
                         fabs(spread - top / (sum / 2)) < 1e-6,
                     "layer %zu nodes' totals: %s", il, json_dumps(nb, 0));
            balanced++;
        }
    }
    KT_CHECK(moe == 3, "%u MoE layers", moe);
    KT_CHECK(!traffic || balanced > 0, "no layer's node balance measured after decode steps");

    const json_t *r = json_object_get(j, "rebalancer");
    KT_CHECK(json_is_boolean(json_object_get(r, "enabled")) && json_is_true(json_object_get(r, "enabled")) == enabled &&
                 json_num(r, "interval_s") == (enabled ? 0.2 : 0) && json_is_integer(json_object_get(r, "rounds")) &&
                 json_is_boolean(json_object_get(r, "in_round")) && json_is_integer(json_object_get(r, "in_flight")) &&
                 json_is_integer(json_object_get(r, "pending")) &&
                 json_num(r, "predicted_before_ms") >= 0 && json_num(r, "predicted_after_ms") >= 0 &&
                 json_num(r, "predicted_after_ms") <= json_num(r, "predicted_before_ms") &&
                 json_num(r, "measured_ms") >= 0 && json_num(r, "measured_tokens") >= 0 &&
                 json_is_string(json_object_get(r, "last_error")),
             "rebalancer: %s", json_dumps(r, 0));
    KT_CHECK(json_string_length(json_object_get(r, "last_error")) == 0, "rebalancer error: %s",
             json_string_value(json_object_get(r, "last_error")));
    if (traffic)
        KT_CHECK(json_num(r, "measured_ms") > 0 && json_num(r, "measured_tokens") >= 1,
                 "decode steps measured: %s", json_dumps(r, 0));

    const json_t *log = json_object_get(j, "migrations");
    const json_int_t total = json_integer_value(json_object_get(j, "migrations_total"));
    const json_int_t failed = json_integer_value(json_object_get(j, "migrations_failed"));
    const json_int_t bytes = json_integer_value(json_object_get(j, "migrated_bytes_total"));
    KT_CHECK(json_is_array(log) && json_array_size(log) <= 64 && total >= 0 && failed >= 0 && bytes >= 0,
             "migration totals");
    json_int_t ok = 0, ok_bytes = 0;
    for (size_t i = 0; i < json_array_size(log); i++) {
        const json_t *m = json_array_get(log, i);
        const int from = place_index(j, json_string_value(json_object_get(m, "from")));
        const int to = place_index(j, json_string_value(json_object_get(m, "to")));
        const json_int_t layer = json_integer_value(json_object_get(m, "layer"));
        const json_int_t expert = json_integer_value(json_object_get(m, "expert"));
        const bool m_ok = json_is_true(json_object_get(m, "ok"));
        const char *kind = json_string_value(json_object_get(m, "kind"));
        const bool slice = kind && !strcmp(kind, "slice"); /* the whole layer: no expert changes place */
        KT_CHECK(json_num(m, "time") > 1.6e9 && layer >= 1 && layer < n_layer && expert >= 0 && expert < n_expert &&
                     from >= 0 && to >= 0 && (!m_ok || slice || from != to) &&
                     json_integer_value(json_object_get(m, "bytes")) > 0 && json_is_boolean(json_object_get(m, "ok")),
                 "migration %zu: %s", i, json_dumps(m, 0));
        ok += m_ok;
        ok_bytes += m_ok ? json_integer_value(json_object_get(m, "bytes")) : 0;
    }
    if (total + failed < 64) /* every move is still in the log */
        KT_CHECK(ok == total && (json_int_t)json_array_size(log) == total + failed && ok_bytes == bytes,
                 "the log's %lld ok moves (%lld bytes) against migrations_total %lld (%lld bytes), %lld failed",
                 (long long)ok, (long long)ok_bytes, (long long)total, (long long)bytes, (long long)failed);
}

/* Each MoE layer's place names per expert, for comparing two servers' placements. */
static void places_by_name(const json_t *j, const char *names[4][32])
{
    const json_t *layers = json_object_get(j, "layers");
    for (size_t il = 0; il < 4; il++)
        for (size_t x = 0; x < 32; x++) {
            const json_t *place = json_object_get(json_array_get(layers, il), "place");
            names[il][x] = place ? place_name(j, json_integer_value(json_array_get(place, x))) : "";
            if (!names[il][x])
                names[il][x] = "?";
        }
}

/* The moves logged account for the experts' places: an expert's last ok
 * move ends where it is now; while the log holds every move, one never
 * moved is where it started. */
static void check_log_against_places(const json_t *before, const json_t *after)
{
    const bool whole = json_integer_value(json_object_get(after, "migrations_total")) +
                           json_integer_value(json_object_get(after, "migrations_failed")) <
                       64;
    const char *was[4][32], *now[4][32], *last_to[4][32] = {{0}};
    places_by_name(before, was);
    places_by_name(after, now);
    const json_t *log = json_object_get(after, "migrations");
    for (size_t i = 0; i < json_array_size(log); i++) {
        const json_t *m = json_array_get(log, i);
        const json_int_t il = json_integer_value(json_object_get(m, "layer"));
        const json_int_t x = json_integer_value(json_object_get(m, "expert"));
        const char *kind = json_string_value(json_object_get(m, "kind"));
        KT_CHECK(kind && (!strcmp(kind, "home") || !strcmp(kind, "replica_add") || !strcmp(kind, "replica_drop") ||
                          !strcmp(kind, "slice")),
                 "migration %zu: kind %s", i, kind ? kind : "(none)");
        if (json_is_true(json_object_get(m, "ok")) && il < 4 && x < 32 && kind && !strcmp(kind, "home"))
            last_to[il][x] = json_string_value(json_object_get(m, "to"));
    }
    uint32_t changed = 0;
    for (int il = 1; il < 4; il++)
        for (int x = 0; x < 32; x++) {
            changed += strcmp(was[il][x], now[il][x]) != 0;
            const char *expect = last_to[il][x] ? last_to[il][x] : whole ? was[il][x] : now[il][x];
            KT_CHECK(strcmp(now[il][x], expect) == 0, "layer %d expert %d is on %s; its moves say %s", il, x,
                     now[il][x], expect);
        }
    KT_CHECK(changed > 0, "no expert changed its place");
}

/* ---- /metrics ------------------------------------------------------------------------------------ */

/* The migration counters agree with /kt/placement; the measured routed and
 * busy shares and the decode step time parse and add up. */
static void check_metrics(const struct test_server *s, const json_t *placement)
{
    struct kt_buf out = {0};
    KT_CHECK(http(s, NULL, "/metrics", NULL, &out, NULL) == 200, "GET /metrics");
    const char *text = kt_buf_str(&out);
    const json_int_t total = json_integer_value(json_object_get(placement, "migrations_total"));
    double sum = 0;
    int lines = 0;
    for (const char *at = strstr(text, "\nkt:expert_migrations_total{"); at;
         at = strstr(at + 1, "\nkt:expert_migrations_total{")) {
        char from[40] = "", to[40] = "";
        double v = NAN;
        int got = sscanf(at + 1, "kt:expert_migrations_total{from=\"%39[^\"]\",to=\"%39[^\"]\"} %lf", from, to, &v);
        KT_CHECK(got == 3 && v > 0 && place_index(placement, from) >= 0 && place_index(placement, to) >= 0 &&
                     strcmp(from, to) != 0,
                 "migration counter: %.120s", at + 1);
        sum += v, lines++;
    }
    const double slices = metric(text, "kt:layer_slices_total"); /* moves without a source and target */
    KT_CHECK(lines > 0 && slices >= 0 && sum + slices == (double)total,
             "%d migration counters sum to %g and %g layers were sliced, /kt/placement says %lld", lines, sum, slices,
             (long long)total);
    const json_t *r = json_object_get(placement, "rebalancer");
    KT_CHECK(metric(text, "kt:rebalance_rounds_total") >= (double)json_integer_value(json_object_get(r, "rounds")) &&
                 metric(text, "kt:rebalance_rounds_total") >= 1,
             "kt:rebalance_rounds_total %g", metric(text, "kt:rebalance_rounds_total"));
    KT_CHECK(metric(text, "kt:expert_migrations_failed_total") ==
                 (double)json_integer_value(json_object_get(placement, "migrations_failed")),
             "failed moves");

    /* experts homed per place: the places /kt/placement lists */
    const json_t *layers = json_object_get(placement, "layers");
    uint32_t homed[3] = {0, 0, 0};
    for (size_t il = 0; il < json_array_size(layers); il++) {
        const json_t *place = json_object_get(json_array_get(layers, il), "place");
        for (size_t x = 0; x < json_array_size(place); x++)
            homed[json_integer_value(json_array_get(place, x)) % 3]++;
    }
    const char *const names[3] = {"node 0", "node 1", "sim"};
    double routed = 0, share = 0, busy = 0;
    for (int p = 0; p < 3; p++) {
        char series[80];
        snprintf(series, sizeof series, "kt:experts_homed{place=\"%s\"}", names[p]);
        KT_CHECK(metric(text, series) == homed[p], "%s %g, /kt/placement %u", series, metric(text, series), homed[p]);
        snprintf(series, sizeof series, "kt:place_routed_pairs_total{place=\"%s\"}", names[p]);
        const double pairs = metric(text, series);
        snprintf(series, sizeof series, "kt:place_routed_share{place=\"%s\"}", names[p]);
        const double sh = metric(text, series);
        KT_CHECK(pairs > 0 && sh > 0 && sh < 1, "place %s: %g pairs, share %g", names[p], pairs, sh);
        routed += pairs, share += sh;
        if (p < 2) {
            snprintf(series, sizeof series, "kt:node_busy_share{place=\"%s\"}", names[p]);
            const double b = metric(text, series);
            snprintf(series, sizeof series, "kt:node_busy_seconds_total{place=\"%s\"}", names[p]);
            KT_CHECK(b > 0 && b < 1 && metric(text, series) > 0, "node %d busy share %g, %g s", p, b,
                     metric(text, series));
            busy += b;
        }
    }
    KT_CHECK(fabs(share - 1) < 1e-5 && fabs(busy - 1) < 1e-5, "routed shares sum to %g, busy shares to %g", share,
             busy);
    /* every token routes n_expert_used pairs in each of the 3 MoE layers, wherever they ran */
    const double tokens = metric(text, "kt:step_tokens_total{model_name=\"tiny\"}");
    KT_CHECK(tokens > 0 && routed == tokens * 3 * n_expert_used, "%g routed pairs for %g tokens x 3 layers x %u",
             routed, tokens, n_expert_used);
    const double measured = metric(text, "kt:measured_step_seconds");
    const double predicted = metric(text, "kt:rebalance_predicted_step_seconds{placement=\"served\"}");
    KT_CHECK(measured > 0 && measured < 10 && metric(text, "kt:measured_step_tokens") >= 1 && predicted > 0,
             "decode step: measured %g s (%g tokens), predicted %g s", measured,
             metric(text, "kt:measured_step_tokens"), predicted);
    KT_CHECK(fabs(measured - json_num(r, "measured_ms") / 1e3) < 1e-6, "measured step: /metrics %g, /kt/placement %g",
             measured, json_num(r, "measured_ms") / 1e3);
    KT_CHECK(strstr(text, "# HELP kt:place_routed_share ") && strstr(text, "# HELP kt:node_busy_share ") &&
                 strstr(text, "# HELP kt:measured_step_seconds "),
             "HELP lines");
    kt_buf_free(&out);
}

/* ---- the cases ----------------------------------------------------------------------------------- */

static char reference[16384]; /* the greedy answer with nothing moving */

static void nothing_moves_with_the_rebalancer_off(void)
{
    struct test_server s;
    char args[1400];
    snprintf(args, sizeof args, "-t 2 -q --served-model-name tiny --prefix-cache 0 --placement '%s' "
             "--rebalance-interval 0", sim_config);
    if (!server_start(&s, tiny, args, true))
        return;
    json_t *before = get_json(&s, "/kt/placement");
    check_placement_shape(before, false, false);
    char *answer = greedy_answer(&s);
    snprintf(reference, sizeof reference, "%s", answer ? answer : "");
    free(answer);
    send_traffic(&s, 8, 0);
    usleep(500000); /* more than the 0.2 s the other case rebalances at */
    json_t *after = get_json(&s, "/kt/placement");
    check_placement_shape(after, true, false);
    const json_t *r = json_object_get(after, "rebalancer");
    KT_CHECK(json_integer_value(json_object_get(r, "rounds")) == 0 &&
                 json_integer_value(json_object_get(after, "migrations_total")) == 0 &&
                 json_array_size(json_object_get(after, "migrations")) == 0,
             "moves without a rebalancer: %s", json_dumps(r, 0));
    const char *was[4][32], *now[4][32];
    places_by_name(before, was), places_by_name(after, now);
    for (int il = 1; il < 4; il++)
        for (int x = 0; x < 32; x++)
            KT_CHECK(strcmp(was[il][x], now[il][x]) == 0, "layer %d expert %d moved", il, x);
    struct kt_buf out = {0};
    KT_CHECK(http(&s, NULL, "/metrics", NULL, &out, NULL) == 200 &&
                 !strstr(kt_buf_str(&out), "kt:expert_migrations_total{") &&
                 metric(kt_buf_str(&out), "kt:rebalance_rounds_total") == 0,
             "migration metrics without a rebalancer");
    kt_buf_free(&out);
    json_decref(before), json_decref(after);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

static void moves_keep_the_greedy_answer_and_the_plan_serves_the_same_places(void)
{
    char plan[1024], args[2600];
    snprintf(plan, sizeof plan, "%s", kt_test_path("rebalanced.yaml"));
    unlink(plan);
    struct test_server s;
    snprintf(args, sizeof args, "-t 2 -q --served-model-name tiny --prefix-cache 0 --placement '%s' "
             "--rebalance-interval 0.2 --plan-out '%s'", sim_config, plan);
    if (!server_start(&s, tiny, args, true))
        return;
    json_t *first = get_json(&s, "/kt/placement");
    check_placement_shape(first, false, true);
    KT_CHECK(json_integer_value(json_object_get(first, "migrations_total")) == 0, "moves before any traffic");

    char *before = greedy_answer(&s);
    KT_CHECK(before && strcmp(before, reference) == 0, "the greedy answer with the rebalancer on differs from off:\n"
             "%s\n%s", before, reference);
    /* traffic until a round has moved experts and its moves are all made */
    json_t *j = NULL;
    bool moved = false;
    const double t0 = harness_now();
    for (int round = 0; harness_now() - t0 < 120 && !moved; round++) {
        send_traffic(&s, 2, 100 + 2 * round);
        json_decref(j);
        j = get_json(&s, "/kt/placement");
        const json_t *rb = json_object_get(j, "rebalancer");
        moved = json_integer_value(json_object_get(j, "migrations_total")) > 0 &&
                json_is_false(json_object_get(rb, "in_round")) &&
                json_integer_value(json_object_get(rb, "in_flight")) == 0;
    }
    KT_CHECK(moved, "no expert moved: %s", json_dumps(json_object_get(j, "rebalancer"), 0));
    char *after = greedy_answer(&s);
    KT_CHECK(after && before && strcmp(after, before) == 0, "the greedy answer changed after moves:\n%s\n%s", before,
             after);
    free(before), free(after);

    /* settled: no traffic, and the rounds planned from the last profile have reached their target (an idle
     * server makes a round's moves at once), so nothing moves for 2 s (10 rounds) */
    json_decref(j);
    j = NULL;
    json_int_t last = -1;
    double quiet_since = harness_now();
    for (double t1 = harness_now(); harness_now() - t1 < 60; usleep(100000)) {
        json_decref(j);
        j = get_json(&s, "/kt/placement");
        const json_t *rb = json_object_get(j, "rebalancer");
        const json_int_t total = json_integer_value(json_object_get(j, "migrations_total"));
        if (total != last || json_integer_value(json_object_get(rb, "in_flight")) != 0 ||
            !json_is_false(json_object_get(rb, "in_round")))
            last = total, quiet_since = harness_now();
        else if (harness_now() - quiet_since > 2.0)
            break;
    }
    check_placement_shape(j, true, true);
    printf("  %lld experts moved (%lld failed) in %lld rounds\n",
           (long long)json_integer_value(json_object_get(j, "migrations_total")),
           (long long)json_integer_value(json_object_get(j, "migrations_failed")),
           (long long)json_integer_value(json_object_get(json_object_get(j, "rebalancer"), "rounds")));
    check_log_against_places(first, j);
    check_metrics(&s, j);
    json_t *stats = get_json(&s, "/kt/stats");
    KT_CHECK(stats && strcmp(json_string_value(json_object_get(stats, "state")), "ready") == 0 &&
                 json_integer_value(json_object_get(stats, "steps")) > 0 &&
                 json_integer_value(json_object_get(stats, "generation_tokens_total")) > 0 &&
                 json_integer_value(json_object_get(stats, "migrations_total")) ==
                     json_integer_value(json_object_get(j, "migrations_total")) &&
                 json_integer_value(json_object_get(stats, "migrated_bytes_total")) ==
                     json_integer_value(json_object_get(j, "migrated_bytes_total")),
             "/kt/stats: %s", json_dumps(stats, 0));
    json_decref(stats);
    bool written = false; /* by the round that moved, once its moves were made */
    for (double t1 = harness_now(); harness_now() - t1 < 60 && !written; usleep(20000))
        written = access(plan, R_OK) == 0;
    KT_CHECK(written, "--plan-out %s not written after a round that moved", plan);
    unlink(plan);
    KT_CHECK(server_stop(&s) == 0, "exit status");

    /* the plan written at exit: kt-serve's, without predictions, and it serves the same places */
    size_t len = 0;
    char *text = kt_test_read_file(plan, &len);
    KT_CHECK(text && strstr(text, "written by kt-serve's rebalancer") && !strstr(text, "predicted per layer") &&
                 !strstr(text, "kt-place plan") && strstr(text, "kv_cache:\n  tokens: ") && strstr(text, "  sim:\n"),
             "--plan-out %s:\n%s", plan, text ? text : "(missing)");
    free(text);
    snprintf(args, sizeof args, "-t 2 -q --served-model-name tiny --prefix-cache 0 --placement '%s' "
             "--rebalance-interval 0", plan);
    struct test_server again;
    if (text && server_start(&again, tiny, args, true)) {
        json_t *served = get_json(&again, "/kt/placement");
        const char *want[4][32], *got[4][32];
        places_by_name(j, want), places_by_name(served, got);
        int differ = 0;
        for (int il = 1; il < 4; il++)
            for (int x = 0; x < 32; x++)
                differ += strcmp(want[il][x], got[il][x]) != 0;
        KT_CHECK(differ == 0, "%d experts not where the plan put them", differ);
        char *answer = greedy_answer(&again);
        KT_CHECK(answer && strcmp(answer, reference) == 0, "the greedy answer from the written plan differs");
        free(answer);
        json_decref(served);
        KT_CHECK(server_stop(&again) == 0, "exit status");
    }
    json_decref(first), json_decref(j);
    unlink(plan);
}

/* Replicas in the live placement's JSON: copies beyond the homes. */
static long count_replicas(const json_t *placement)
{
    long n = 0;
    const json_t *layers = json_object_get(placement, "layers");
    for (size_t il = 0; il < json_array_size(layers); il++) {
        const json_t *r = json_object_get(json_array_get(layers, il), "replicas");
        for (size_t x = 0; x < json_array_size(r); x++)
            n += (long)json_array_size(json_array_get(r, x));
    }
    return n;
}

/* kt-serve on tiny from the placement config `yaml` (written to name in the
 * scratch folder, its path left in config), rebalancing every 0.2 s; false
 * (after a failed check, the file gone) when it does not start. */
static bool start_cpu_only(struct test_server *s, char *config, size_t config_size, const char *name, const char *yaml,
                           const char *extra)
{
    snprintf(config, config_size, "%s", kt_test_path(name));
    FILE *f = fopen(config, "w");
    if (!f) {
        KT_CHECK(false, "cannot write %s", config);
        return false;
    }
    fputs(yaml, f);
    fclose(f);
    char args[2600];
    snprintf(args, sizeof args, "-t 2 -q --served-model-name tiny --prefix-cache 0 --placement '%s' "
             "--rebalance-interval 0.2 %s", config, extra);
    if (!server_start(s, tiny, args, true)) {
        unlink(config);
        return false;
    }
    return true;
}

/* Replicas move too: CPU only on both nodes, the two hottest experts of each
 * layer replicated; with no --machine the planner's target has none (no
 * node memory is stated), so the rebalancer drops them (those of rounds
 * whose target gains past the hysteresis), between steps, and logs each
 * drop; a replica computes the same bytes, so the greedy answer stays the
 * same. */
static void replicas_are_dropped_between_steps(void)
{
    char config[1024];
    struct test_server s;
    if (!start_cpu_only(&s, config, sizeof config, "replicas.yaml",
                        "version: 1\ndescription: both nodes, two replicas a layer\nattention: cpu\ncpu:\n"
                        "  nodes: auto\n  replicas:\n    hot_per_layer: 2\n", ""))
        return;
    json_t *first = get_json(&s, "/kt/placement");
    const long at_start = count_replicas(first);
    KT_CHECK(at_start == 3 * 2, "the config's replicas at the start: %ld", at_start);
    char *before = greedy_answer(&s);
    json_t *j = NULL;
    bool dropped = false;
    const double t0 = harness_now();
    for (int round = 0; harness_now() - t0 < 120 && !dropped; round++) {
        send_traffic(&s, 2, 300 + 2 * round);
        json_decref(j);
        j = get_json(&s, "/kt/placement");
        dropped = count_replicas(j) < at_start &&
                  json_integer_value(json_object_get(json_object_get(j, "rebalancer"), "in_flight")) == 0;
    }
    const long left = count_replicas(j);
    KT_CHECK(dropped, "replicas left: %ld of %ld", left, at_start);
    printf("  %ld of %ld replicas dropped (the rest while the target's gain stays under the hysteresis)\n",
           at_start - left, at_start);
    long drops = 0, slices = 0; /* a replica goes by a drop, or with its layer sliced */
    const json_t *log = json_object_get(j, "migrations");
    for (size_t i = 0; i < json_array_size(log); i++) {
        const json_t *m = json_array_get(log, i);
        const char *kind = json_string_value(json_object_get(m, "kind"));
        drops += kind && !strcmp(kind, "replica_drop") && json_is_true(json_object_get(m, "ok"));
        slices += kind && !strcmp(kind, "slice") && json_is_true(json_object_get(m, "ok"));
    }
    printf("  by %ld replica drops and %ld layer slices\n", drops, slices);
    KT_CHECK(drops + 2 * slices >= at_start - left && json_integer_value(json_object_get(j, "migrations_failed")) == 0,
             "each drop logged: %ld drops, %ld slices, %lld failed", drops, slices,
             (long long)json_integer_value(json_object_get(j, "migrations_failed")));
    char *after = greedy_answer(&s);
    KT_CHECK(before && after && strcmp(before, after) == 0, "the greedy answer changed as replicas went:\n%s\n%s",
             before, after);
    free(before), free(after);
    json_decref(first), json_decref(j);
    KT_CHECK(server_stop(&s) == 0, "exit status");
    unlink(config);
}

/* The rebalancer's layer moves in j (GET /kt/placement) came in parts of the
 * budget's size: one part a layer under the default budget (budget_mib 0),
 * more under a budget below a layer's bytes; the copies in flight never held
 * more than the budget. */
static void check_layer_parts(const json_t *j, long layers, double budget_mib)
{
    const json_t *rb = json_object_get(j, "rebalancer");
    const json_int_t parts = json_integer_value(json_object_get(rb, "layer_parts"));
    const json_int_t max = json_integer_value(json_object_get(rb, "in_flight_bytes_max"));
    const json_int_t budget = json_integer_value(json_object_get(rb, "budget_bytes"));
    printf("  %lld parts for %ld layers, at most %.2f MiB in flight (budget %.2f MiB)\n", (long long)parts, layers,
           (double)max / 1048576.0, (double)budget / 1048576.0);
    KT_CHECK(budget_mib > 0 ? parts >= 2 * layers : parts == layers, "budget %g MiB: %lld parts for %ld layers",
             budget_mib, (long long)parts, layers);
    KT_CHECK(max > 0 && max <= budget, "%lld bytes in flight, budget %lld", (long long)max, (long long)budget);
}

/* Layers sliced while serving: CPU only on both nodes, every layer whole at
 * the start; at batch 1 the planner row-slices them (a whole expert's tokens
 * fall unevenly on two nodes), so the rebalancer slices a layer between two
 * steps - logged as a "slice" - and the greedy answer stays the same (the
 * shares hold the whole experts' bytes). */
static void layers_are_sliced_between_steps_budget(double budget_mib)
{
    char config[1024], extra[64] = "";
    if (budget_mib > 0)
        snprintf(extra, sizeof extra, "--migration-budget-mib %g", budget_mib);
    struct test_server s;
    if (!start_cpu_only(&s, config, sizeof config, "whole.yaml",
                        "version: 1\ndescription: both nodes, whole experts\nattention: cpu\ncpu:\n  nodes: auto\n",
                        extra))
        return;
    char *before = greedy_answer(&s);
    json_t *j = NULL;
    long sliced = 0;
    const double t0 = harness_now();
    for (int round = 0; harness_now() - t0 < 120 && !sliced; round++) {
        send_traffic(&s, 2, 700 + 2 * round);
        json_decref(j);
        j = get_json(&s, "/kt/placement");
        const json_t *layers = json_object_get(j, "layers");
        for (size_t il = 0; il < json_array_size(layers); il++)
            sliced += json_is_true(json_object_get(json_array_get(layers, il), "sliced"));
        if (json_integer_value(json_object_get(json_object_get(j, "rebalancer"), "in_flight")) != 0)
            sliced = 0;
    }
    KT_CHECK(sliced > 0, "no layer sliced: %s", json_dumps(json_object_get(j, "rebalancer"), 0));
    long logged = 0;
    const json_t *log = json_object_get(j, "migrations");
    for (size_t i = 0; i < json_array_size(log); i++) {
        const json_t *m = json_array_get(log, i);
        logged += !strcmp(json_string_value(json_object_get(m, "kind")), "slice") &&
                  json_is_true(json_object_get(m, "ok"));
    }
    printf("  %ld layers sliced while serving (%ld logged)\n", sliced, logged);
    KT_CHECK(logged == sliced, "%ld sliced layers, %ld slices logged", sliced, logged);
    check_layer_parts(j, sliced, budget_mib);
    char *after = greedy_answer(&s);
    KT_CHECK(before && after && strcmp(before, after) == 0, "the greedy answer changed as layers were sliced:\n%s\n%s",
             before, after);
    free(before), free(after);
    json_decref(j);
    KT_CHECK(server_stop(&s) == 0, "exit status");
    unlink(config);
}

static void layers_are_sliced_between_steps(void)
{
    layers_are_sliced_between_steps_budget(0);
}

/* A layer of tiny holds 24 MiB of experts: under a 4 MiB budget it is sliced
 * 5 experts at a time, and serves the same answer while sliced in part. */
static void layers_larger_than_the_budget_are_sliced_in_parts(void)
{
    layers_are_sliced_between_steps_budget(4);
}

/* And back: both nodes, every layer sliced by the config, and a machine whose
 * node 1 runs at 40% of node 0: a whole layer can give the faster node more
 * experts, which an even slice cannot, so the rebalancer makes the layers
 * whole again between steps, logs each, and the greedy answer stays. */
static void sliced_layers_are_made_whole_between_steps_budget(double budget_mib)
{
    char machine[1024];
    snprintf(machine, sizeof machine, "%s", kt_test_path("uneven.machine.json"));
    struct kt_machine mach;
    kt_machine_defaults(&mach, 2);
    for (int t = 0; t < KT_TYPE_COUNT; t++)
        mach.nodes[1].decode[t].gbps *= 0.4;
    mach.nodes[1].triad_gbps *= 0.4;
    kt_err err = {0};
    KT_CHECK(kt_machine_save(&mach, machine, &err) == KT_OK, "%s", err.msg);
    char config[1024];
    snprintf(config, sizeof config, "%s", kt_test_path("sliced.yaml"));
    FILE *f = fopen(config, "w");
    KT_CHECK(f && fputs("version: 1\ndescription: both nodes, sliced\nattention: cpu\ncpu:\n  nodes: auto\n"
                        "  sliced: all\n", f) >= 0 && fclose(f) == 0, "writing %s", config);
    char args[3000];
    snprintf(args, sizeof args, "-t 2 -q --served-model-name tiny --prefix-cache 0 --placement '%s' "
             "--rebalance-interval 0.2 --machine '%s' --migration-budget-mib %g", config, machine,
             budget_mib > 0 ? budget_mib : 1024);
    struct test_server s;
    if (!server_start(&s, tiny, args, true)) {
        unlink(config), unlink(machine);
        return;
    }
    json_t *j = get_json(&s, "/kt/placement");
    long sliced_at_start = 0;
    for (size_t il = 0; il < json_array_size(json_object_get(j, "layers")); il++)
        sliced_at_start += json_is_true(json_object_get(json_array_get(json_object_get(j, "layers"), il), "sliced"));
    KT_CHECK(sliced_at_start == 3, "the config slices the 3 MoE layers: %ld", sliced_at_start);
    char *before = greedy_answer(&s);
    long whole = 0;
    const double t0 = harness_now();
    for (int round = 0; harness_now() - t0 < 120 && !whole; round++) {
        send_traffic(&s, 2, 1300 + 2 * round);
        json_decref(j);
        j = get_json(&s, "/kt/placement");
        const json_t *layers = json_object_get(j, "layers"), *rb = json_object_get(j, "rebalancer");
        for (size_t il = 0; il < json_array_size(layers); il++)
            whole += json_is_false(json_object_get(json_array_get(layers, il), "sliced")) &&
                     json_array_size(json_object_get(json_array_get(layers, il), "place")) > 0;
        if (json_integer_value(json_object_get(rb, "in_flight")) != 0 || !json_is_false(json_object_get(rb, "in_round")))
            whole = 0;
    }
    KT_CHECK(whole > 0, "no layer made whole: %s", json_dumps(json_object_get(j, "rebalancer"), 0));
    long logged = 0;
    const json_t *log = json_object_get(j, "migrations");
    for (size_t i = 0; i < json_array_size(log); i++) {
        const json_t *m = json_array_get(log, i);
        logged += !strcmp(json_string_value(json_object_get(m, "kind")), "whole") &&
                  json_is_true(json_object_get(m, "ok"));
    }
    printf("  %ld layers made whole while serving (%ld logged)\n", whole, logged);
    KT_CHECK(logged == whole, "%ld whole layers, %ld logged", whole, logged);
    check_layer_parts(j, whole, budget_mib);
    struct kt_buf out = {0};
    KT_CHECK(http(&s, NULL, "/metrics", NULL, &out, NULL) == 200 &&
                 metric(kt_buf_str(&out), "kt:layers_made_whole_total") == (double)logged,
             "kt:layers_made_whole_total");
    kt_buf_free(&out);
    char *after = greedy_answer(&s);
    KT_CHECK(before && after && strcmp(before, after) == 0, "the greedy answer changed as layers were made whole:\n"
             "%s\n%s", before, after);
    free(before), free(after);
    json_decref(j);
    KT_CHECK(server_stop(&s) == 0, "exit status");
    unlink(config), unlink(machine);
}

static void sliced_layers_are_made_whole_between_steps(void)
{
    sliced_layers_are_made_whole_between_steps_budget(0);
}

/* Under a 6 MiB budget a sliced layer of tiny is made whole a few experts at a time. */
static void layers_larger_than_the_budget_are_made_whole_in_parts(void)
{
    sliced_layers_are_made_whole_between_steps_budget(6);
}

/* A tiny expert is 0.75 MiB: a budget below it still lets one move at a time through. */
static void a_budget_below_one_expert_still_moves_experts(void)
{
    struct test_server s;
    char args[1400];
    snprintf(args, sizeof args, "-t 2 -q --served-model-name tiny --prefix-cache 0 --placement '%s' "
             "--rebalance-interval 0.2 --migration-budget-mib 0.5", sim_config);
    if (!server_start(&s, tiny, args, true))
        return;
    json_int_t moved = 0;
    const double t0 = harness_now();
    for (int round = 0; harness_now() - t0 < 120 && moved == 0; round++) {
        send_traffic(&s, 2, 1000 + 2 * round);
        json_t *j = get_json(&s, "/kt/placement");
        moved = json_integer_value(json_object_get(j, "migrations_total"));
        json_decref(j);
    }
    KT_CHECK(moved > 0, "nothing moved under a budget below one expert");
    char *answer = greedy_answer(&s);
    KT_CHECK(answer && strcmp(answer, reference) == 0, "the greedy answer changed:\n%s\n%s", answer, reference);
    free(answer);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

/* Runs kt-serve ARGS to its exit; its status, its stderr in err_text (malloc'd). */
static int serve_exit(const char *args, char **err_text)
{
    char log[1024];
    snprintf(log, sizeof log, "%s", kt_test_path("bad-option.log"));
    int rc = kt_test_system("timeout 60 %s -m %s --port 0 -t 2 %s >/dev/null 2>%s", kt_test_tool("kt-serve"), tiny,
                            args, log);
    size_t len;
    *err_text = kt_test_read_file(log, &len);
    unlink(log);
    return rc;
}

static void bad_rebalancing_options_are_refused(void)
{
    static const struct {
        const char *args, *names;
    } bad[] = {
        {"--rebalance-interval -1", "--rebalance-interval"},
        {"--rebalance-interval abc", "--rebalance-interval"},
        {"--rebalance-interval 0.001", "--rebalance-interval"},
        {"--rebalance-interval nan", "--rebalance-interval"},
        {"--rebalance-min-gain -0.5", "--rebalance-min-gain"},
        {"--rebalance-min-gain 1", "--rebalance-min-gain"},
        {"--migration-budget-mib 0", "--migration-budget-mib"},
        {"--migration-budget-mib -3", "--migration-budget-mib"},
        {"--migration-budget-mib inf", "--migration-budget-mib"},
        {"--machine /nonexistent/machine.json", "/nonexistent/machine.json"},
        {"--plan-out /nonexistent-kt-dir/plan.yaml", "--plan-out"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *err = NULL;
        int rc = serve_exit(bad[i].args, &err);
        KT_CHECK(rc != 0 && rc != 124 && err && strstr(err, bad[i].names), "%s: exit %d: %s", bad[i].args, rc,
                 err ? err : "");
        free(err);
    }
}

static void api_key_guards_kt_endpoints_but_not_the_dashboard(void)
{
    struct test_server s;
    if (!server_start(&s, tiny, "-t 2 -q --api-key K", true))
        return;
    struct kt_buf out = {0};
    static const char *const guarded[] = {"/kt/placement", "/kt/stats", "/kt/profile"};
    for (size_t i = 0; i < 3; i++) {
        KT_CHECK(http(&s, NULL, guarded[i], NULL, &out, NULL) == 401 && strstr(kt_buf_str(&out), "invalid_api_key"),
                 "%s without the key: %s", guarded[i], kt_buf_str(&out));
        KT_CHECK(http(&s, "-H 'Authorization: Bearer k'", guarded[i], NULL, &out, NULL) == 401, "%s, wrong key",
                 guarded[i]);
        KT_CHECK(http(&s, "-H 'Authorization: Bearer K'", guarded[i], NULL, &out, NULL) == 200, "%s with the key: %s",
                 guarded[i], kt_buf_str(&out));
    }
    KT_CHECK(http(&s, NULL, "/dashboard", NULL, &out, NULL) == 200 && strstr(kt_buf_str(&out), "<!DOCTYPE html>"),
             "/dashboard without the key");
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

/* --expert-cache 4 on the sim device: the greedy answer is the reference's;
 * /kt/placement's expert_cache counts hits, misses and pinned pairs that add
 * up to the routed pairs the places ran, and the device's share is its
 * pinned pairs plus its hits; each layer's cached experts are at most its
 * slots and none of them is homed on the device; /metrics has the counters. */
static void the_expert_cache_hits_and_keeps_the_greedy_answer(void)
{
    struct test_server s;
    char args[1400];
    snprintf(args, sizeof args, "-t 2 -q --served-model-name tiny --prefix-cache 0 --placement '%s' "
             "--rebalance-interval 0 --expert-cache 4", sim_config);
    if (!server_start(&s, tiny, args, true))
        return;
    send_traffic(&s, 6, 2000);
    char *answer = greedy_answer(&s);
    KT_CHECK(answer && strcmp(answer, reference) == 0, "the greedy answer changed:\n%s\n%s", answer, reference);
    free(answer);
    json_t *j = get_json(&s, "/kt/placement");
    const json_t *c = json_object_get(j, "expert_cache");
    const double hit = json_num(c, "hit_pairs"), miss = json_num(c, "miss_pairs"), pinned = json_num(c, "pinned_pairs");
    KT_CHECK(json_is_object(c) && json_num(c, "slots") == 12 && json_num(c, "slots_per_layer") == 4 &&
                 json_num(c, "live") > 0 && json_num(c, "uploads") >= json_num(c, "live") && hit > 0 && miss > 0 &&
                 pinned > 0 && strcmp(json_string_value(json_object_get(c, "policy")), "lru") == 0,
             "expert_cache: %s", json_dumps(c, 0));
    struct kt_buf out = {0};
    KT_CHECK(http(&s, NULL, "/metrics", NULL, &out, NULL) == 200, "metrics");
    const char *text = kt_buf_str(&out);
    const double on_sim = metric(text, "kt:place_routed_pairs_total{place=\"sim\"}");
    const double all = on_sim + metric(text, "kt:place_routed_pairs_total{place=\"node 0\"}") +
                       metric(text, "kt:place_routed_pairs_total{place=\"node 1\"}");
    const double m_hit = metric(text, "kt:expert_cache_pairs_total{result=\"hit\"}");
    const double m_all = m_hit + metric(text, "kt:expert_cache_pairs_total{result=\"miss\"}") +
                         metric(text, "kt:expert_cache_pairs_total{result=\"pinned\"}");
    KT_CHECK(m_hit > 0 && m_all == all && on_sim == m_all - metric(text, "kt:expert_cache_pairs_total{result=\"miss\"}"),
             "cache pairs %.0f (hits %.0f) against the places' routed pairs %.0f (sim %.0f)", m_all, m_hit, all, on_sim);
    KT_CHECK(metric(text, "kt:expert_cache_slots{state=\"all\"}") == 12 &&
                 metric(text, "kt:expert_cache_uploads_total") > 0,
             "cache metrics:\n%s", text);
    const int sim = place_index(j, "sim");
    const json_t *layers = json_object_get(j, "layers");
    for (size_t il = 0; il < json_array_size(layers); il++) {
        const json_t *l = json_array_get(layers, il), *cached = json_object_get(l, "cached");
        if (!json_is_true(json_object_get(l, "moe")))
            continue;
        KT_CHECK(json_array_size(cached) <= 4, "layer %zu caches %zu experts", il, json_array_size(cached));
        for (size_t i = 0; i < json_array_size(cached); i++) {
            const json_int_t x = json_integer_value(json_array_get(cached, i));
            KT_CHECK(json_integer_value(json_array_get(json_object_get(l, "place"), (size_t)x)) != sim,
                     "layer %zu expert %lld is cached and homed on the device", il, (long long)x);
        }
    }
    kt_buf_free(&out);
    json_decref(j);
    KT_CHECK(server_stop(&s) == 0, "exit status");
    char *err = NULL;
    KT_CHECK(serve_exit("--expert-cache 4", &err) != 0 && err &&
                 strstr(err, "--expert-cache 4 needs a device: give a --placement with one"),
             "a cache without a device: %s", err ? err : "");
    free(err);
    KT_CHECK(serve_exit("--expert-cache-policy mru", &err) != 0 && err && strstr(err, "--expert-cache-policy"),
             "a bad policy: %s", err ? err : "");
    free(err);
    snprintf(args, sizeof args, "--placement '%s' --expert-cache 33", sim_config);
    KT_CHECK(serve_exit(args, &err) != 0 && err && strstr(err, "slots per layer"), "more slots than experts: %s",
             err ? err : "");
    free(err);
}

int main(void)
{
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    setenv("KT_TOPOLOGY_SYNTHETIC", TOPOLOGY, 1);
    snprintf(tiny, sizeof tiny, "%s", kt_test_path("rebalance-tiny.gguf"));
    snprintf(sim_config, sizeof sim_config, "%s/configs/tiny-sim.yaml",
             getenv("KT_SOURCE_DIR") ? getenv("KT_SOURCE_DIR") : ".");
    struct kt_model *m = NULL;
    kt_err err = {0};
    if (!make_model(tiny, "tiny", NULL) || kt_model_open(tiny, &m, &err) != KT_OK) {
        KT_CHECK(false, "kt-synth failed: %s", err.msg);
        return kt_test_finish();
    }
    n_expert_used = m->hp.n_expert_used;
    kt_model_close(m);
    KT_RUN(nothing_moves_with_the_rebalancer_off);
    KT_RUN(moves_keep_the_greedy_answer_and_the_plan_serves_the_same_places);
    KT_RUN(a_budget_below_one_expert_still_moves_experts);
    KT_RUN(replicas_are_dropped_between_steps);
    KT_RUN(layers_are_sliced_between_steps);
    KT_RUN(layers_larger_than_the_budget_are_sliced_in_parts);
    KT_RUN(sliced_layers_are_made_whole_between_steps);
    KT_RUN(layers_larger_than_the_budget_are_made_whole_in_parts);
    KT_RUN(bad_rebalancing_options_are_refused);
    KT_RUN(api_key_guards_kt_endpoints_but_not_the_dashboard);
    KT_RUN(the_expert_cache_hits_and_keeps_the_greedy_answer);
    unlink(tiny);
    return kt_test_finish();
}
