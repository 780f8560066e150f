/*
 * server.h - what kt-serve's parts share: its options and its state.
 *
 * Threads: libmicrohttpd runs one thread per connection (plus its listening
 * thread); a handler thread parses and prepares its request, submits a job
 * to the scheduler (runtime/serve/scheduler.h, one thread that owns the engine)
 * and then waits on that job's condition variable, streaming what the
 * scheduler publishes.  Handlers never touch the engine.  While it waits a
 * handler polls its socket: a client that went away cancels its job, whose
 * sequence the scheduler frees at the next step.  A watchdog thread closes
 * connections whose request is late (connections.c).  The main thread checks
 * the inputs (preflight) and listens; a loader thread loads the model while
 * /health answers with the progress (with --self-check it checks the engine
 * and only then listens); the main thread waits for SIGTERM/SIGINT to drain
 * (on a thread of its own, so that a second signal quits at once).
 */
#ifndef KT_SERVE_SERVER_H
#define KT_SERVE_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <microhttpd.h>

#include "engine.h"
#include "engine_plan.h"
#include "model.h"
#include "scheduler.h"
#include "serve_metrics.h"
#include "serve_prompt.h"
#include "tokenizer.h"

struct kt_serve_options {
    const char *model;
    const char *placement;
    const char *host;             /* default 127.0.0.1 */
    uint32_t port;                /* default 8080; 0: any free port (printed) */
    uint32_t max_seqs;            /* sequences in the running batch */
    uint32_t ctx;                 /* positions per sequence; 0: from the KV pool (kt_tool_kv_pool_size) */
    double kv_memory_mib;         /* the KV pool; 0: from free memory (kt_tool_kv_pool_size) */
    enum kt_row_type kv_type;     /* --kv-type: the KV cache's row type (kv_type.h; default bf16) */
    bool kv_type_given;           /* ... given: it wins over a placement config's kv_cache.type */
    uint32_t threads;             /* engine threads; 0: the CPUs this process may use (threads.h) */
    uint32_t max_waiting;         /* queued requests before 429 */
    uint32_t max_batch_tokens;    /* per-step token budget; 0: max(256, max_seqs) */
    uint32_t micro_batches;       /* under mpirun: slices of a decode batch (pipeline.h); 0: the number of ranks */
    uint32_t rank_timeout_s;      /* under mpirun: longest wait for another rank's answer; 0: 120 */
    uint32_t prefix_cache;        /* cached prefixes; default max_seqs */
    bool prefix_cache_given;
    uint32_t max_body_bytes;      /* larger request bodies get 413 */
    uint32_t max_connections;     /* libmicrohttpd's table; its last eighth is kept for new clients (connections.c) */
    uint32_t max_connections_per_client; /* from one address; 0: no limit */
    uint32_t client_timeout_s;    /* a request must arrive within this, and a transfer not stall longer */
    uint32_t idle_timeout_s;      /* keep-alive connections idle longer are closed */
    const char *api_key;          /* NULL: no authentication */
    const char *cors_origins;     /* --cors-origins: "*" or a comma list of origins browsers may call from; NULL: none */
    const char *served_name;      /* NULL: the file name without .gguf */
    const char *chat_template;    /* --chat-template: a Jinja template file in place of the model's; NULL: none */
    double request_timeout_s;     /* 0: none */
    double shutdown_timeout_s;    /* grace for in-flight requests on SIGTERM */
    double ping_interval_s;       /* ": ping" comments on quiet streams */
    bool test_forced_output;      /* honour kt_test_forced_output (tests only) */
    bool quiet;                   /* no per-request log lines */
    const char *profile_out;      /* write the live routing profile here; NULL: only GET /kt/profile */
    double profile_half_life;     /* tokens (default 1e6); 0: no decay */
    double profile_interval_s;    /* seconds between writes (default 60) */
    const char *machine;          /* kt-bench machine file for the rebalancer's cost model; NULL: defaults */
    double rebalance_interval_s;  /* seconds between rebalancing rounds; 0: off */
    bool rebalance_given;         /* else: 60 with a device or more than one NUMA node, 0 otherwise */
    double rebalance_min_gain;    /* a round moves only when the plan saves this share of the step (0.02) */
    double migration_budget_mib;  /* expert copies in flight at most (default 1024) */
    const char *plan_out;         /* write the live placement here (atomically); NULL: only GET /kt/placement */
    uint32_t expert_cache_slots;  /* the device's expert cache, slots per MoE layer; 0: none */
    bool expert_cache_lfu;        /* its policy: LFU, else LRU */
    bool expert_cache_policy_given;
    bool self_check;              /* run the correctness check before listening; refuse to serve on FAIL */
    const char *test_self_check_reference; /* tests only: the check's reference reads this file, not model */
    uint32_t responses_store;     /* responses kept for previous_response_id and GET /v1/responses/{id}, LRU; 0: none */
};

struct kt_transport;
struct kt_pipeline;

enum kt_server_state { KT_SERVER_LOADING, KT_SERVER_READY, KT_SERVER_FAILED, KT_SERVER_STOPPING };

struct kt_server {
    struct kt_serve_options o;
    struct MHD_Daemon *daemon;
    struct kt_conn_table *conns;  /* every open connection's state (connections.c) */
    uint16_t port;                /* bound */
    char served_name[128];
    int64_t created;              /* unix seconds, for /v1/models */
    atomic_int state;             /* enum kt_server_state */
    atomic_uint load_permille;    /* 0..1000 while loading */
    char load_error[1100];        /* KT_SERVER_FAILED: why (written before the state flips) */
    int exit_status;              /* with KT_SERVER_FAILED: 1, or 3 when --self-check failed */

    /* checked and prepared by main before it listens (preflight); the loader builds on them */
    kt_chat_format format;        /* the model's chat template; KT_CHAT_FORMAT_UNKNOWN: chat is refused */
    char *chat_template;          /* its text (the model's or --chat-template's), which KT_CHAT_JINJA renders */
    struct kt_engine_params ep;   /* the engine's; its placement fields point into plan */
    struct kt_engine_plan plan;
    struct kt_placement_config *config;
    struct kt_placement *live;    /* the placement, handed to kt_serve_placement_create */
    struct kt_machine *machine;   /* --machine or stated defaults, handed to kt_serve_placement_create */
    struct kt_tool_prompts *check_prompts; /* --self-check's, tokenized */

    /* read-only once READY */
    struct kt_transport *transport; /* the job: one process, or mpirun's ranks (runtime/dist) */
    struct kt_pipeline *pipeline;   /* rank 0 of several: the engine's layers over the ranks; else NULL */
    struct kt_model *model;
    struct kt_tokenizer *tok;
    struct kt_engine *engine;
    struct kt_sched *sched;
    struct kt_serve_model sm;
    struct kt_serve_profile *profile; /* the live routing profile (profile.c) */
    struct kt_serve_placement *placement; /* where experts live, and the rebalancer (rebalance.c) */
    struct kt_responses_store *responses; /* stored responses (responses.c); thread-safe */

    struct kt_serve_metrics metrics;
    atomic_int in_flight;         /* generation responses not yet fully sent */
    atomic_uint_fast64_t next_id;
    uint64_t id_seed;
};

/* http.c: the daemon and the plumbing every endpoint uses */
bool kt_http_start(struct kt_server *s, char *why, size_t why_size);
void kt_http_quiesce(struct kt_server *s);  /* stop accepting connections */
void kt_http_stop(struct kt_server *s);     /* close every connection, join the threads */

struct kt_http_request {
    struct kt_server *server;
    struct MHD_Connection *conn;
    struct kt_buf body;
    bool too_large;
    bool responded;
    bool in_flight;               /* counted in server->in_flight until completed */
    bool anthropic;               /* /v1/messages...: errors in Anthropic's shape (serve_anthropic.h) */
    char cors_origin[256];        /* the Origin to allow in the response (CORS); "": none */
    char request_id[40];          /* the client's X-Request-Id, echoed */
};

enum MHD_Result kt_http_send(struct kt_http_request *rq, unsigned status, const char *content_type, const char *body,
                             size_t len);
enum MHD_Result kt_http_send_json(struct kt_http_request *rq, unsigned status, json_t *j); /* steals j */
enum MHD_Result kt_http_send_error(struct kt_http_request *rq, const struct kt_api_error *e);
enum MHD_Result kt_http_queue(struct kt_http_request *rq, unsigned status, struct MHD_Response *r);
void kt_http_count(struct kt_server *s, unsigned status);
/* true when the client closed its end of the connection */
bool kt_http_client_gone(struct MHD_Connection *conn);
/* logs that memory ran out doing `what` and returns MHD_NO, which closes the connection */
enum MHD_Result kt_http_out_of_memory(const char *what);

/* connections.c: a deadline on each request's arrival and room for new clients
 * (its comment says why libmicrohttpd's own timeout is not enough).  start
 * before the daemon, stop after it; the rest are libmicrohttpd's callbacks
 * (notify: MHD_OPTION_NOTIFY_CONNECTION, request_begins:
 * MHD_OPTION_URI_LOG_CALLBACK) and on_request's and on_completed's calls. */
struct kt_conn_table;
bool kt_conns_start(struct kt_server *s, char *why, size_t why_size);
void kt_conns_stop(struct kt_server *s);
void kt_conns_notify(void *cls, struct MHD_Connection *mhd, void **socket_context,
                     enum MHD_ConnectionNotificationCode code);
void *kt_conns_request_begins(void *cls, const char *uri, struct MHD_Connection *mhd);
void kt_conns_request_received(struct kt_server *s, struct MHD_Connection *mhd); /* being answered */
void kt_conns_request_done(struct kt_server *s, struct MHD_Connection *mhd, enum MHD_RequestTerminationCode toe);
void kt_conns_log_refusal(struct kt_server *s); /* libmicrohttpd refused one: a line at most every 10 s */
void kt_conns_metrics(struct kt_server *s, struct kt_buf *out); /* Prometheus lines */
uint32_t kt_conns_reserved(uint32_t max_connections); /* slots kept free for new clients */

/* endpoints.c */
enum MHD_Result kt_serve_health(struct kt_http_request *rq);
enum MHD_Result kt_serve_version(struct kt_http_request *rq);
enum MHD_Result kt_serve_models(struct kt_http_request *rq, const char *id);
enum MHD_Result kt_serve_metrics_endpoint(struct kt_http_request *rq);
enum MHD_Result kt_serve_tokenize(struct kt_http_request *rq);
enum MHD_Result kt_serve_detokenize(struct kt_http_request *rq);
enum MHD_Result kt_serve_count_tokens(struct kt_http_request *rq); /* /v1/messages/count_tokens */

/* profile.c: the live routing profile, GET /kt/profile; write: atomically to --profile-out (KT_OK without one) */
struct kt_serve_profile;
kt_status kt_serve_profile_create(struct kt_server *s, kt_err *err); /* s->model loaded; sets s->profile */
void kt_serve_profile_destroy(struct kt_server *s);
void kt_serve_profile_after_step(void *ctx, const struct kt_engine *e); /* a kt_sched_params.after_step */
kt_status kt_serve_profile_write(struct kt_server *s, kt_err *err);
enum MHD_Result kt_serve_profile_endpoint(struct kt_http_request *rq);
struct kt_profile *kt_serve_profile_snapshot(struct kt_server *s); /* a copy of the live profile; NULL: none */

/* rebalance.c: the live placement (GET /kt/placement, --plan-out) and the
 * rebalancer thread.  preflight: before the engine (and before listening),
 * --plan-out's folder, the placement's nodes and the machine file the
 * rebalancer plans with (--machine, or stated defaults: *mach, handed to
 * create); create: after the engine, taking `live` (the placement it was
 * created with), the config it came from and the machine; start: once READY (no
 * thread when --rebalance-interval is 0); stop: ends the thread; destroy: after the
 * scheduler (discards copies not yet switched); after_step: the scheduler's hook (also updates
 * the profile); make_moves: its poked hook (an idle server makes moves at once). */
struct kt_placement;
struct kt_placement_config;
struct kt_machine;
kt_status kt_serve_placement_preflight(const struct kt_server *s, const struct kt_placement *live,
                                       struct kt_machine **mach, kt_err *err);
kt_status kt_serve_placement_create(struct kt_server *s, struct kt_placement *live,
                                    const struct kt_placement_config *config, struct kt_machine *mach, kt_err *err);
kt_status kt_serve_placement_start(struct kt_server *s, kt_err *err);
void kt_serve_placement_stop(struct kt_server *s);
void kt_serve_placement_destroy(struct kt_server *s);
void kt_serve_after_step(void *ctx, const struct kt_engine *e);
void kt_serve_make_moves(void *ctx); /* the scheduler's poked hook: the moves handed off, made now */
kt_status kt_serve_placement_write(struct kt_server *s, kt_err *err); /* to --plan-out; KT_OK without one */
void kt_serve_placement_metrics(struct kt_server *s, struct kt_buf *out); /* Prometheus lines */
enum MHD_Result kt_serve_placement_endpoint(struct kt_http_request *rq);
enum MHD_Result kt_serve_stats_endpoint(struct kt_http_request *rq);

/* self_check.c: --self-check.  prepare: before listening, the built-in prompts
 * tokenized (s->check_prompts), refused when --ctx cannot hold them; run:
 * after the engine is created, before the scheduler, the check against a CPU
 * reference, its verdict logged (a PASS line, or each failing prompt with its
 * numbers and the layer where the divergence starts); the engine is left
 * with no sequence and its counters reset.  KT_OK when the check ran. */
kt_status kt_serve_self_check_prepare(struct kt_server *s, kt_err *err);
kt_status kt_serve_self_check_run(struct kt_server *s, bool *pass, kt_err *err);
void kt_serve_self_check_free(struct kt_server *s);

/* dashboard.c: GET /dashboard, one static page polling /kt/stats and /kt/placement */
enum MHD_Result kt_serve_dashboard(struct kt_http_request *rq);

/* generate.c: the content reader of every SSE answer (chat and text
 * completions, /v1/messages, /v1/responses).  Each time it wakes it calls
 * write(ctx, first, out, finished): take what the jobs published, append
 * events to out, true when anything was taken (always on the first call),
 * *finished once the last event is in out.  Between wakes it pings a quiet
 * stream, waits on the first of jobs still running, and cancels them all
 * when the client goes away. */
struct kt_sse_pump {
    struct kt_server *server;
    struct MHD_Connection *conn;
    struct kt_job *const *jobs;   /* [n_jobs] */
    size_t n_jobs;
    bool (*write)(void *ctx, bool first, struct kt_buf *out, bool *finished);
    void *ctx;
    const char *ping;             /* the keep-alive: ": ping\n\n", or Anthropic's event */
    double last_send;             /* monotonic seconds: set at the start */
    /* the reader's own */
    struct kt_buf out;            /* SSE bytes not yet handed to MHD */
    size_t out_off, waiting;
    uint64_t seen;
    bool started, finished;
};
ssize_t kt_sse_pump_read(struct kt_sse_pump *p, char *buf, size_t max);
void kt_sse_pump_free(struct kt_sse_pump *p);

/* generate.c: /v1/chat/completions and /v1/completions; /v1/messages */
enum MHD_Result kt_serve_generate(struct kt_http_request *rq, enum kt_api_kind kind);
/* Seconds between pings on a quiet stream: --sse-ping-interval, at most half of --client-timeout
 * (libmicrohttpd closes a connection that sent nothing that long). */
double kt_serve_ping_interval(const struct kt_server *s);
enum MHD_Result kt_serve_messages(struct kt_http_request *rq);

/* responses.c: OpenAI's Responses API: POST /v1/responses, GET / DELETE /v1/responses/{id},
 * GET /v1/responses/{id}/input_items (id: the path after /responses/) */
enum MHD_Result kt_serve_responses(struct kt_http_request *rq, const char *method, const char *id);

#endif
