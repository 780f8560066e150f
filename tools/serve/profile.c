/*
 * profile.c - kt-serve's live routing profile: after every step the
 * scheduler thread adds what the engine counted since the step before
 * (kt_engine_route_counts, decode and prefill apart) to a decaying profile
 * (half-life --profile-half-life tokens); GET /kt/profile returns it as JSON
 * and, with --profile-out, the main thread writes it atomically every
 * --profile-interval seconds and at exit.  The profile's mutex guards it; only
 * the scheduler thread reads the engine.
 */
#include <stdlib.h>
#include <string.h>

#include "profile.h"
#include "small_file.h"
#include "server.h"

struct kt_serve_profile {
    pthread_mutex_t mu;
    struct kt_profile *p;       /* guarded by mu */
    /* the scheduler thread's: the engine's counts when last added */
    uint64_t *last[2];          /* (n_layer, n_expert) per engine phase */
    uint64_t last_tokens[2];
    uint64_t *delta;            /* (n_layer, n_expert) scratch */
    size_t cells;
};

kt_status kt_serve_profile_create(struct kt_server *s, kt_err *err)
{
    struct kt_serve_profile *sp = calloc(1, sizeof *sp);
    if (!sp)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    struct kt_model_identity id;
    kt_model_identity(s->model, &id);
    kt_status st = kt_profile_create(id.n_layer, id.n_expert, &id, &sp->p, err);
    if (st != KT_OK) {
        free(sp);
        return st;
    }
    sp->p->half_life_tokens = s->o.profile_half_life;
    sp->cells = (size_t)id.n_layer * id.n_expert;
    sp->last[0] = calloc(sp->cells + 1, sizeof(uint64_t));
    sp->last[1] = calloc(sp->cells + 1, sizeof(uint64_t));
    sp->delta = calloc(sp->cells + 1, sizeof(uint64_t));
    pthread_mutex_init(&sp->mu, NULL);
    s->profile = sp;
    if (!sp->last[0] || !sp->last[1] || !sp->delta)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory for the routing profile");
    return KT_OK;
}

void kt_serve_profile_destroy(struct kt_server *s)
{
    struct kt_serve_profile *sp = s->profile;
    if (!sp)
        return;
    pthread_mutex_destroy(&sp->mu);
    kt_profile_destroy(sp->p);
    free(sp->last[0]), free(sp->last[1]), free(sp->delta);
    free(sp);
    s->profile = NULL;
}

void kt_serve_profile_after_step(void *ctx, const struct kt_engine *e)
{
    struct kt_serve_profile *sp = ctx;
    for (int ph = 0; ph < 2; ph++) {
        uint64_t n = 0;
        const uint64_t *c = kt_engine_route_counts(e, ph, &n);
        if (!c || n == sp->last_tokens[ph])
            continue;
        for (size_t i = 0; i < sp->cells; i++)
            sp->delta[i] = c[i] - sp->last[ph][i], sp->last[ph][i] = c[i];
        pthread_mutex_lock(&sp->mu);
        kt_profile_add(sp->p, ph == KT_ROUTE_DECODE ? KT_PROFILE_DECODE : KT_PROFILE_PREFILL, sp->delta,
                       n - sp->last_tokens[ph]);
        pthread_mutex_unlock(&sp->mu);
        sp->last_tokens[ph] = n;
    }
}

/* The profile as JSON (malloc'd), or NULL when memory runs out. */
static char *dump(struct kt_serve_profile *sp)
{
    pthread_mutex_lock(&sp->mu);
    char *text = kt_profile_dump(sp->p);
    pthread_mutex_unlock(&sp->mu);
    return text;
}

kt_status kt_serve_profile_write(struct kt_server *s, kt_err *err)
{
    if (!s->profile || !s->o.profile_out)
        return KT_OK;
    char *text = dump(s->profile);
    if (!text)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory building the profile", s->o.profile_out);
    kt_status st = kt_write_file_atomic(s->o.profile_out, text, strlen(text), err);
    free(text);
    return st;
}

enum MHD_Result kt_serve_profile_endpoint(struct kt_http_request *rq)
{
    char *text = rq->server->profile ? dump(rq->server->profile) : NULL;
    if (!text) {
        struct kt_api_error e = {0};
        kt_api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory building the routing profile");
        return kt_http_send_error(rq, &e);
    }
    enum MHD_Result ok = kt_http_send(rq, 200, "application/json", text, strlen(text));
    free(text);
    return ok;
}

struct kt_profile *kt_serve_profile_snapshot(struct kt_server *s)
{
    struct kt_serve_profile *sp = s->profile;
    struct kt_profile *c = NULL;
    kt_err err = {0};
    if (!sp)
        return NULL;
    pthread_mutex_lock(&sp->mu);
    const struct kt_profile *p = sp->p;
    if (kt_profile_create(p->n_layer, p->n_expert, &p->model, &c, &err) == KT_OK) {
        for (int ph = 0; ph < KT_PROFILE_PHASES; ph++) {
            memcpy(c->counts[ph], p->counts[ph], (size_t)p->n_layer * p->n_expert * sizeof *p->counts[ph]);
            c->tokens[ph] = p->tokens[ph];
        }
        c->half_life_tokens = p->half_life_tokens;
    }
    pthread_mutex_unlock(&sp->mu);
    return c;
}
