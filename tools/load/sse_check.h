/*
 * sse_check.h - reads an OpenAI chat-completion event stream event by event
 * and checks it is well formed: every data line is JSON, one id throughout,
 * the role first, one finish_reason per choice, the usage chunk (when asked
 * for) before "data: [DONE]", nothing after it.
 */
#ifndef KT_LOAD_SSE_CHECK_H
#define KT_LOAD_SSE_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "serve_text.h"

struct kt_sse_check {
    struct kt_buf pending;     /* bytes of an event not yet complete */
    char id[96];
    bool role_seen, finish_seen, usage_seen, done;
    size_t events, pings, content_events;
    long long completion_tokens, prompt_tokens, cached_tokens; /* from the usage chunk; -1 before */
    char error[768];           /* the first problem found; "" while none */
};

void kt_sse_check_init(struct kt_sse_check *c);
/* Feeds body bytes; returns how many complete events carrying a token (any
 * delta after the role) they finished. */
size_t kt_sse_check_feed(struct kt_sse_check *c, const char *bytes, size_t len);
/* At the end of the body: the stream must have ended with [DONE]. */
bool kt_sse_check_finish(struct kt_sse_check *c, bool want_usage);
void kt_sse_check_free(struct kt_sse_check *c);

#endif
