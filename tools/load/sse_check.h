/*
 * sse_check.h - reads an OpenAI chat-completion event stream event by event
 * and checks it is well formed: every data line is JSON, one id throughout,
 * each choice (n > 1 streams interleave them by index) opens with the
 * assistant role and ends with exactly one finish_reason, nothing of a choice
 * after its finish, the usage chunk (when asked for) after every finish and
 * before "data: [DONE]", nothing after that.  What each choice said - its
 * content, its tool calls, its finish_reason - is kept for the caller.
 */
#ifndef KT_LOAD_SSE_CHECK_H
#define KT_LOAD_SSE_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "serve_text.h"

#define KT_SSE_MAX_CHOICES 16 /* kt-serve's KT_API_MAX_N */

struct kt_sse_choice {
    bool role_seen, finished;
    char finish_reason[16];    /* "" until its finish */
    struct kt_buf content;     /* the content deltas, joined (may hold NUL bytes) */
    size_t tool_calls;         /* tool calls opened (deltas carrying an id) */
};

struct kt_sse_check {
    struct kt_buf pending;     /* bytes of an event not yet complete */
    char id[96];
    bool usage_seen, done;
    size_t events, pings, content_events;
    size_t n_choices;          /* 1 + the highest choice index seen */
    struct kt_sse_choice choices[KT_SSE_MAX_CHOICES];
    long long completion_tokens, prompt_tokens, cached_tokens; /* from the usage chunk; -1 before */
    char error[768];           /* the first problem found; "" while none */
};

void kt_sse_check_init(struct kt_sse_check *c);
/* Feeds body bytes; returns how many complete events carrying a token (any
 * delta after the role) they finished. */
size_t kt_sse_check_feed(struct kt_sse_check *c, const char *bytes, size_t len);
/* At the end of the body: the stream must have ended with [DONE], every
 * choice from 0 to n_choices - 1 opened and finished. */
bool kt_sse_check_finish(struct kt_sse_check *c, bool want_usage);
void kt_sse_check_free(struct kt_sse_check *c);

#endif
