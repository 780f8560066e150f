/*
 * sched_harness.h - what the scheduler tests share: a job from a request body
 * (chat when it has "messages", else completions), prepared against a served
 * model, and waiting for a job to finish.
 */
#ifndef KT_TEST_SCHED_HARNESS_H
#define KT_TEST_SCHED_HARNESS_H

#include <pthread.h>
#include <string.h>

#include "scheduler.h"
#include "serve_prompt.h"
#include "serve_request.h"
#include "testlib.h"

static inline struct kt_job *sched_job_from(const struct kt_serve_model *sm, const char *body)
{
    struct kt_api_request r;
    struct kt_api_error e;
    enum kt_api_kind kind = strstr(body, "\"messages\"") ? KT_API_CHAT : KT_API_COMPLETION;
    if (!kt_api_request_parse(kind, body, strlen(body), &r, &e)) {
        KT_CHECK(false, "parse %s: %s", body, e.message);
        return NULL;
    }
    struct kt_prompt p;
    struct kt_job *job = NULL;
    if (kt_prompt_prepare(sm, &r, "t", &p, &e))
        job = kt_job_create(&p, &r, 0);
    else
        KT_CHECK(false, "prepare %s: %s", body, e.message);
    kt_prompt_free(&p);
    kt_api_request_free(&r);
    return job;
}

/* Waits up to wait_ms for job to be done (a check fails past it). */
static inline void sched_wait_done(struct kt_job *job, int wait_ms)
{
    uint64_t seen = 0;
    for (int i = 0; i < wait_ms / 10; i++) {
        pthread_mutex_lock(&job->mu);
        bool done = job->done;
        pthread_mutex_unlock(&job->mu);
        if (done)
            return;
        kt_job_wait(job, &seen, 10);
    }
    KT_CHECK(false, "job did not finish");
}

#endif
