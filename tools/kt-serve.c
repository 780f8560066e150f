/*
 * kt-serve.c - the OpenAI-compatible server: parse options, check all it
 * can before reading a weight (preflight: the model's header, the context,
 * the placement, the machine file, output folders), listen (GET /health
 * answers 503 with the load progress; with --self-check only once the
 * loaded engine has passed the correctness check), load the model and
 * start the scheduler, then wait for SIGTERM/SIGINT: stop accepting, let
 * in-flight requests finish for --shutdown-timeout seconds, cancel the
 * rest, exit 0; a second signal meanwhile quits at once.  Exit status 1:
 * a refusal, or could not listen or load (one line saying why); 2: usage;
 * 3: --self-check failed; 128 + the signal: a second SIGTERM/SIGINT cut the
 * drain short.  See tools/serve/server.h for the threads.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "kv_type.h"
#include "model_chat.h"
#include "pipeline.h"
#include "placement_opt.h"
#include "preflight.h"
#include "ranks.h"
#include "serve_responses.h"
#include "server.h"
#include "threads.h"
#include "transport.h"

/* ---- options --------------------------------------------------------------------------------------- */

#define OPTS(o) ((struct kt_serve_options *)(o))

KT_CLI_STRING_OPTION(opt_placement, placement)

static bool opt_kv_type(void *opts, const char *arg, char *why, size_t why_size)
{
    OPTS(opts)->kv_type_given = true;
    return kt_tool_parse_kv_type(arg, &OPTS(opts)->kv_type, why, why_size);
}
KT_CLI_STRING_OPTION(opt_self_check_reference, test_self_check_reference)
KT_CLI_STRING_OPTION(opt_host, host)
KT_CLI_STRING_OPTION(opt_api_key, api_key)
KT_CLI_STRING_OPTION(opt_cors_origins, cors_origins)
KT_CLI_STRING_OPTION(opt_name, served_name)
KT_CLI_STRING_OPTION(opt_chat_template, chat_template)
KT_CLI_STRING_OPTION(opt_profile_out, profile_out)
KT_CLI_STRING_OPTION(opt_machine, machine)
KT_CLI_STRING_OPTION(opt_plan_out, plan_out)
KT_CLI_U32_OPTION(opt_port, port, 0, 65535, "--port", "0: any free port")
KT_CLI_U32_OPTION(opt_max_seqs, max_seqs, 1, 4096, "--max-seqs", NULL)
KT_CLI_U32_OPTION(opt_ctx, ctx, 16, KT_TOOL_MAX_CTX, "--ctx", "positions per sequence; at most the model's "
                  "context_length")
KT_CLI_U32_OPTION(opt_threads, threads, 1, 4096, "--threads", NULL)
KT_CLI_DOUBLE_OPTION(opt_kv_memory, kv_memory_mib, 0, 1e12, KT_CLI_LO_OPEN, "--kv-memory", "MiB")
KT_CLI_U32_OPTION(opt_expert_cache, expert_cache_slots, 0, 65536, "--expert-cache", "slots per MoE layer; 0: off")
KT_CLI_U32_OPTION(opt_max_waiting, max_waiting, 1, 1u << 20, "--max-waiting", NULL)
KT_CLI_U32_OPTION(opt_max_batch, max_batch_tokens, 1, 1u << 16, "--max-batch-tokens", "the engine's most per step")
KT_CLI_U32_OPTION(opt_micro_batches, micro_batches, 1, 16, "--micro-batches", NULL)
KT_CLI_U32_OPTION(opt_rank_timeout, rank_timeout_s, 1, 86400, "--rank-timeout", "seconds")
KT_CLI_U32_OPTION(opt_body, max_body_bytes, 1024, 1u << 31, "--max-body-bytes", NULL)
KT_CLI_U32_OPTION(opt_connections, max_connections, 1, 1u << 16, "--max-connections", NULL)
KT_CLI_U32_OPTION(opt_per_client, max_connections_per_client, 0, 1u << 16, "--max-connections-per-client",
                  "0: no limit")
KT_CLI_U32_OPTION(opt_client_timeout, client_timeout_s, 1, 86400, "--client-timeout", "whole seconds")
KT_CLI_U32_OPTION(opt_idle_timeout, idle_timeout_s, 1, 86400, "--idle-timeout", "whole seconds")
KT_CLI_DOUBLE_OPTION(opt_timeout, request_timeout_s, 0, 1e9, KT_CLI_CLOSED, "--request-timeout", "seconds; 0: no limit")
KT_CLI_DOUBLE_OPTION(opt_shutdown, shutdown_timeout_s, 0, 1e9, KT_CLI_CLOSED, "--shutdown-timeout", "seconds")
KT_CLI_DOUBLE_OPTION(opt_ping, ping_interval_s, 0, 1e9, KT_CLI_CLOSED, "--sse-ping-interval", "seconds")
KT_CLI_DOUBLE_OPTION(opt_profile_half_life, profile_half_life, 0, 1e18, KT_CLI_CLOSED, "--profile-half-life",
                     "tokens; 0: no decay")
KT_CLI_DOUBLE_OPTION(opt_profile_interval, profile_interval_s, 0.01, 1e6, KT_CLI_CLOSED, "--profile-interval",
                     "seconds")
KT_CLI_DOUBLE_OPTION(opt_min_gain, rebalance_min_gain, 0, 1, KT_CLI_HI_OPEN, "--rebalance-min-gain",
                     "a share of the step")
KT_CLI_DOUBLE_OPTION(opt_migration_budget, migration_budget_mib, 0, 1e9, KT_CLI_LO_OPEN, "--migration-budget-mib",
                     "MiB")

static bool opt_responses_store(void *o, const char *arg, char *why, size_t ws)
{
    return kt_cli_u32_arg("--responses-store", arg, 0, 1000000, "responses; 0: none", &OPTS(o)->responses_store, why,
                          ws);
}

static bool opt_prefix_cache(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->prefix_cache_given = true;
    return kt_cli_u32_arg("--prefix-cache", arg, 0, 4096, "prefixes; 0: off", &OPTS(o)->prefix_cache, why, ws);
}

static bool opt_rebalance_interval(void *o, const char *arg, char *why, size_t ws)
{
    double v;
    if (!kt_cli_double_arg("--rebalance-interval", arg, 0, 1e6, KT_CLI_CLOSED, "seconds; 0: off", &v, why, ws))
        return false;
    if (v != 0 && v < 0.01) {
        snprintf(why, ws, "--rebalance-interval '%s' is out of range: give 0 (off) or a number in [0.01, 1e+06] "
                          "(seconds)", arg);
        return false;
    }
    OPTS(o)->rebalance_interval_s = v;
    OPTS(o)->rebalance_given = true;
    return true;
}

static bool opt_expert_cache_policy(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->expert_cache_policy_given = true;
    return kt_cli_cache_policy_arg(arg, &OPTS(o)->expert_cache_lfu, why, ws);
}

static bool opt_model(void *o, const char *arg, char *why, size_t ws)
{
    if (OPTS(o)->model) {
        snprintf(why, ws, "more than one model given ('%s' and '%s'): give one", OPTS(o)->model, arg);
        return false;
    }
    OPTS(o)->model = arg;
    return true;
}

static bool opt_self_check(void *o, const char *arg, char *why, size_t ws)
{
    (void)arg, (void)why, (void)ws;
    OPTS(o)->self_check = true;
    return true;
}

static bool opt_forced(void *o, const char *arg, char *why, size_t ws)
{
    (void)arg, (void)why, (void)ws;
    OPTS(o)->test_forced_output = true;
    return true;
}

static bool opt_quiet(void *o, const char *arg, char *why, size_t ws)
{
    (void)arg, (void)why, (void)ws;
    OPTS(o)->quiet = true;
    return true;
}

static const struct kt_cli_option options_table[] = {
    {"--model", "-m", "MODEL", 0, "GGUF model file or Hugging Face checkpoint directory", opt_model},
    {"--placement", NULL, "FILE", 0, "placement config v1 (configs/*.yaml): experts on NUMA nodes and a device",
     opt_placement},
    {"--host", NULL, "ADDR", 0, "address to listen on (default 127.0.0.1: this machine only)", opt_host},
    {"--port", NULL, "PORT", 0, "port (default 8080; 0: any free port, printed)", opt_port},
    {"--max-seqs", NULL, "N", 0, "sequences decoding at once, a concurrency limit (each n>1 choice counts; "
     "default 8)", opt_max_seqs},
    {"--ctx", NULL, "N", 0, "positions per sequence (default: the model's context_length when one sequence of it "
     "fits the KV pool, else the largest that does)", opt_ctx},
    {"--kv-memory", NULL, "MIB", 0, "the KV cache's block pool, shared by all sequences as they grow; when full the "
     "youngest request is preempted and recomputed later (default: half the host memory free beyond the model, or "
     "9/10 of what the attention device's budget leaves; at most --max-seqs x --ctx)", opt_kv_memory},
    {"--kv-type", NULL, "T", 0, "KV cache rows: f32, bf16 or f16 (default bf16: half of f32)", opt_kv_type},
    {"--threads", "-t", "N", 0, "engine threads (default: the CPUs this process may use)", opt_threads},
    {"--api-key", NULL, "KEY", 0, "require 'Authorization: Bearer KEY' on /v1, /tokenize and /kt/", opt_api_key},
    {"--cors-origins", NULL, "LIST", 0,
     "let browser pages from these origins call the API (CORS): '*' or a comma list such as "
     "'http://localhost:3000,https://app.example.com'; default none",
     opt_cors_origins},
    {"--chat-template", NULL, "FILE", 0, "render chats with this Jinja chat template instead of the model's",
     opt_chat_template},
    {"--served-model-name", NULL, "NAME", 0, "the model's name in the API (default: file name without .gguf)",
     opt_name},
    {"--max-waiting", NULL, "N", 0, "requests queued beyond the running batch before 429 (default 64)",
     opt_max_waiting},
    {"--max-batch-tokens", NULL, "N", 0, "tokens per step: decode tokens plus prefill chunks (default 256)",
     opt_max_batch},
    {"--micro-batches", NULL, "N", 0, "under mpirun: slices of a decode batch sent down the pipeline one after "
     "the other (default: the number of ranks; 1: none)", opt_micro_batches},
    {"--rank-timeout", NULL, "S", 0, "under mpirun: a step another rank has not answered in S seconds fails, and "
     "kt-serve answers 503 and exits non-zero (default 120)", opt_rank_timeout},
    {"--prefix-cache", NULL, "N", 0, "prompt prefixes kept for reuse, LRU (default: --max-seqs; 0: off)",
     opt_prefix_cache},
    {"--responses-store", NULL, "N", 0, "/v1/responses kept in memory for previous_response_id and GET, LRU "
     "(default 256; 0: none)", opt_responses_store},
    {"--request-timeout", NULL, "S", 0, "seconds a request may run (default 600; 0: no limit)", opt_timeout},
    {"--shutdown-timeout", NULL, "S", 0, "on SIGTERM, seconds to let requests finish (default 30); a second signal "
     "quits at once", opt_shutdown},
    {"--sse-ping-interval", NULL, "S", 0,
     "': ping' on a stream quiet for S seconds (default 10; 0: only every half --client-timeout, which keeps "
     "a quiet stream open)",
     opt_ping},
    {"--max-body-bytes", NULL, "N", 0, "larger request bodies get 413 (default 8 MiB)", opt_body},
    {"--max-connections", NULL, "N", 0, "open connections at most (default 512); the last eighth is kept free for new "
     "clients: one arriving closes the connection that has waited longest without sending its request",
     opt_connections},
    {"--max-connections-per-client", NULL, "N", 0, "open connections from one address at most (default 0: no "
     "limit; behind a proxy every client has the proxy's address)", opt_per_client},
    {"--client-timeout", NULL, "S", 0, "seconds a client has to send a whole request (headers and body), and that a "
     "response may wait for the client to read (default 30)", opt_client_timeout},
    {"--idle-timeout", NULL, "S", 0, "seconds a connection may wait between requests (keep-alive) or before its "
     "first (default 15)", opt_idle_timeout},
    {"--profile-out", NULL, "FILE", 0, "keep writing the routing profile of what is served here (atomically)",
     opt_profile_out},
    {"--profile-half-life", NULL, "T", 0, "the profile's counts halve every T tokens (default 1000000; 0: never)",
     opt_profile_half_life},
    {"--profile-interval", NULL, "S", 0, "seconds between profile writes (default 60; also at exit)",
     opt_profile_interval},
    {"--rebalance-interval", NULL, "S", 0,
     "seconds between rebalancing rounds: experts move to where the live profile wants them (default 60 with a "
     "device or more than one NUMA node; 0: off)",
     opt_rebalance_interval},
    {"--rebalance-min-gain", NULL, "G", 0, "move only when the plan saves this share of the step (default 0.02)",
     opt_min_gain},
    {"--migration-budget-mib", NULL, "M", 0,
     "memory the expert copies on their way to a new home hold at most; a larger layer is sliced or made "
     "whole in parts (default 1024)",
     opt_migration_budget},
    {"--machine", NULL, "FILE", 0, "kt-bench machine file for the rebalancer's cost model (default: stated defaults)",
     opt_machine},
    {"--plan-out", NULL, "FILE", 0, "write the live placement as a placement config after each round that moved "
     "experts, and at exit (atomically)", opt_plan_out},
    {"--expert-cache", NULL, "SLOTS", 0,
     "a decode-time expert cache on the placement's device: SLOTS copies per MoE layer of the experts the last "
     "steps routed to, uploaded in the link's spare time (default 0: off)",
     opt_expert_cache},
    {"--expert-cache-policy", NULL, "P", 0, "which experts the cache keeps: lru (recently routed, default) or lfu "
     "(most routed, decayed)", opt_expert_cache_policy},
    {"--self-check", NULL, NULL, 0,
     "before listening, check the loaded engine against a CPU reference reading the GGUF rows (kt-bench check's "
     "core, 3 built-in prompts); refuse to serve on FAIL (exit status 3)", opt_self_check},
    {"--quiet", "-q", NULL, 0, "no log line per request", opt_quiet},
    {"--test-forced-output", NULL, NULL, 0, "tests only: honour the request field kt_test_forced_output",
     opt_forced},
    {"--test-self-check-reference", NULL, "FILE", 0, "tests only: --self-check's reference reads this model file",
     opt_self_check_reference},
};
#define N_OPTIONS (sizeof options_table / sizeof options_table[0])

static void usage(FILE *f);
#define SYNOPSIS                                                                                                       \
    "usage: kt-serve -m MODEL [--placement FILE] [--host ADDR] [--port PORT] [--max-seqs N] [--ctx N]\n"             \
    "                [--api-key KEY] [--served-model-name NAME] [--self-check] [options]\n"
static const struct kt_cli cli = {.prog = "kt-serve", .synopsis = SYNOPSIS, .options = options_table,
                                  .n_options = N_OPTIONS, .usage = usage, .operand = opt_model};

static void usage(FILE *f)
{
    fprintf(f, SYNOPSIS "\n"
               "OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models, /health,\n"
               "/metrics, /tokenize, /detokenize, /version, /kt/profile (routing counts), /kt/placement (where\n"
               "experts live, the rebalancer, migrations), /kt/stats, /dashboard (a live page in a browser).\n\n"
               "options:\n");
    kt_cli_print_options(f, &cli, NULL);
    fprintf(f, "\nenvironment:\n"
               "  KT_TOPOLOGY_SYNTHETIC=DESC  see NUMA nodes and cores as hwloc's synthetic description DESC says,\n"
               "                              e.g. \"numa:2 core:4 pu:1\": try a 2-socket --placement on one socket\n"
               "                              (nothing is pinned; README.md, \"Trying a 2-socket plan\")\n");
}

/* ---- loading ----------------------------------------------------------------------------------------- */

/* The engine's load progress goes to stderr through this stream, which also
 * reads the percentages off it for GET /health. */
struct progress_sink {
    struct kt_server *s;
    char line[256];
    size_t len;
};

static void progress_line(struct progress_sink *p)
{
    p->line[p->len] = 0;
    for (char *pct = strchr(p->line, '%'); pct; pct = strchr(pct + 1, '%')) {
        char *d = pct;
        while (d > p->line && d[-1] >= '0' && d[-1] <= '9')
            d--;
        if (d < pct) {
            unsigned v = (unsigned)atoi(d);
            atomic_store(&p->s->load_permille, v >= 100 ? 999 : v * 10);
        }
    }
    p->len = 0;
}

static ssize_t progress_write(void *cookie, const char *buf, size_t size)
{
    struct progress_sink *p = cookie;
    fwrite(buf, 1, size, stderr);
    for (size_t i = 0; i < size; i++) {
        if (buf[i] == '\n' || buf[i] == '\r' || p->len + 1 >= sizeof p->line)
            progress_line(p);
        else
            p->line[p->len++] = buf[i];
    }
    return (ssize_t)size;
}

static const char *file_stem(const char *path, char *out, size_t size)
{
    const char *base = strrchr(path, '/');
    snprintf(out, size, "%s", base ? base + 1 : path);
    size_t n = strlen(out);
    if (n > 5 && strcmp(out + n - 5, ".gguf") == 0)
        out[n - 5] = 0;
    return out;
}

/* The engine's parameters from the options, the same on every rank (each
 * with its own layers when mpirun started several). */
#define KV_BLOCK_TOKENS 16 /* positions per KV block */

/* The engine's parameters before the placement and the KV pool: the context
 * until the pool is sized (preflight), and under mpirun this rank's layers. */
static bool engine_params(struct kt_server *s, uint32_t threads, kt_err *err)
{
    const struct kt_serve_options *o = &s->o;
    s->ep = (struct kt_engine_params){
        .n_ctx = kt_tool_context(s->model, o->ctx),
        .max_seqs = kt_sched_engine_seqs(o->max_seqs, o->prefix_cache),
        .n_threads = threads,
        .kv_block_tokens = KV_BLOCK_TOKENS,
        .kv_type = o->kv_type,
        .max_batch_tokens = o->max_batch_tokens,
    };
    const int n_ranks = kt_transport_size(s->transport);
    if (n_ranks == 1)
        return true;
    return kt_tool_rank_layers(o->placement, s->model, n_ranks, kt_transport_rank(s->transport),
                               &s->ep.layer_begin, &s->ep.layer_end, err) == KT_OK;
}

/* Rank 0, on the scheduler thread, as the pipeline breaks (a rank died or
 * hangs): from now on every request gets 503; main ends the job. */
static void pipeline_broken(void *ctx, const char *why)
{
    struct kt_server *s = ctx;
    snprintf(s->load_error, sizeof s->load_error, "a rank of the pipeline failed: %.1000s", why);
    atomic_store(&s->state, KT_SERVER_FAILED);
}

static struct kt_pipeline_params pipeline_params(struct kt_server *s)
{
    const bool rank0 = kt_transport_rank(s->transport) == 0;
    return (struct kt_pipeline_params){.micro_batches = s->o.micro_batches,
                                       .timeout_ms = (int64_t)s->o.rank_timeout_s * 1000,
                                       .on_broken = rank0 ? pipeline_broken : NULL,
                                       .on_broken_ctx = s};
}

/* Everything that can be refused before a weight is read, done by main
 * before it listens: the model file (it exists, can be read, its GGUF
 * header and tensor table parse), its tokenizer, --ctx against the model,
 * the placement (resolved and turned into the engine's parameters),
 * --expert-cache's device, the machine file and --plan-out's folder, that
 * the plan fits the host's memory (and a GPU's), and --self-check's prompts.  The loader then builds on what it leaves in s. */
static bool preflight(struct kt_server *s, kt_err *err)
{
    const struct kt_serve_options *o = &s->o;
    if (kt_model_open(o->model, &s->model, err) != KT_OK)
        return false;
    if (kt_tool_check_context("--ctx", o->ctx, s->model, o->model, err) != KT_OK)
        return false;
    if (kt_tokenizer_create(s->model->gguf, &s->tok, err) != KT_OK) {
        kt_err_prefix(err, "%s", o->model);
        return false;
    }
    char why[512], *override = NULL;
    if (o->chat_template && kt_tool_read_chat_template(o->chat_template, &override, err) != KT_OK)
        return false;
    s->format = kt_serve_chat_template(s->model->gguf, override, &s->chat_template, why, sizeof why);
    free(override);
    if (s->format == KT_CHAT_FORMAT_UNKNOWN && o->chat_template) {
        kt_err_set(err, KT_ERR_UNSUPPORTED, "--chat-template %s: %s", o->chat_template, why);
        return false;
    }
    if (s->format == KT_CHAT_FORMAT_UNKNOWN)
        fprintf(stderr, "kt-serve: %s: %s; /v1/chat/completions will refuse requests\n", o->model, why);
    else if (s->format == KT_CHAT_JINJA)
        fprintf(stderr, "kt-serve: %s: chat template: jinja (unrecognised template: rendered by the interpreter)\n",
                o->chat_template ? o->chat_template : o->model);

    uint32_t threads = o->threads;
    if (!threads && kt_tool_default_threads("kt-serve", stderr, &threads, err) != KT_OK)
        return false;
    if (!engine_params(s, threads, err))
        return false;
    if (kt_transport_size(s->transport) > 1 && o->self_check) {
        kt_err_set(err, KT_ERR_UNSUPPORTED, "--self-check under mpirun is not supported yet: its reference engine "
                   "would hold every layer on rank 0");
        return false;
    }
    /* under mpirun rank 0's own part of the placement (its ranks[0].placement, where the file has one) */
    const int rank = kt_transport_size(s->transport) > 1 ? 0 : -1;
    if (kt_tool_placement_load_rank(o->placement, s->model, s->ep.topology, rank, &s->config, &s->live, err) !=
        KT_OK)
        return false;
    if (o->placement) {
        kt_placement_describe(s->live, stderr);
        if (kt_engine_plan_apply(s->live, &s->plan, &s->ep, stderr, err) != KT_OK)
            return false;
        if (o->kv_type_given) /* --kv-type wins over the config's kv_cache.type */
            s->ep.kv_type = o->kv_type;
    }
    /* the KV pool from memory, and the context from the pool (placement_opt.h) */
    struct kt_tool_kv_pool pool;
    const struct kt_tool_kv_request kv_rq = {.ctx = o->ctx, .max_seqs = o->max_seqs,
                                             .kv_memory_mib = o->kv_memory_mib, .block_tokens = KV_BLOCK_TOKENS};
    if (kt_tool_kv_pool_size(s->model, s->live, &s->ep, &kv_rq, &pool, err) != KT_OK)
        return false;
    fprintf(stderr, "kt-serve: %s\n", pool.line);
    s->ep.n_ctx = pool.n_ctx;
    s->ep.kv_blocks = pool.n_blocks;
    if (o->expert_cache_slots && !s->ep.device) {
        kt_err_set(err, KT_ERR_INVALID, "--expert-cache %u needs a device: give a --placement with one (e.g. "
                                        "configs/tiny-sim.yaml), or drop --expert-cache", o->expert_cache_slots);
        return false;
    }
    if (kt_serve_placement_preflight(s, s->live, &s->machine, err) != KT_OK)
        return false;
    if (o->profile_out && kt_tool_check_writable("--profile-out", o->profile_out, err) != KT_OK)
        return false;
    if (o->self_check && kt_serve_self_check_prepare(s, err) != KT_OK)
        return false;
    /* last, as the loader's is: its memory check, made now, so a model that does not fit is refused
     * before kt-serve listens */
    FILE *quiet = fopen("/dev/null", "w");
    /* (under mpirun each rank's engine checks its own layers' share as it loads) */
    const bool fits = kt_transport_size(s->transport) > 1 || !quiet ||
                      kt_tool_placement_fits(quiet, s->model, s->live, &s->ep, err);
    if (quiet)
        fclose(quiet);
    return fits;
}

/* The slow part, on the loader thread: the engine (the experts load here),
 * --self-check, the live placement, the profile, the scheduler. */
static bool load(struct kt_server *s, kt_err *err)
{
    const struct kt_serve_options *o = &s->o;
    struct progress_sink sink = {.s = s};
    FILE *progress = fopencookie(&sink, "w", (cookie_io_functions_t){.write = progress_write});
    if (progress)
        setvbuf(progress, NULL, _IONBF, 0);
    s->ep.progress = progress;
    const struct kt_expert_cache_params cache = {
        o->expert_cache_slots, o->expert_cache_lfu ? KT_EXPERT_CACHE_LFU : KT_EXPERT_CACHE_LRU};
    s->ep.expert_cache = o->expert_cache_slots ? &cache : NULL;
    bool ok = kt_engine_create(s->model, &s->ep, &s->engine, err) == KT_OK;
    if (ok && kt_transport_size(s->transport) > 1) {
        const struct kt_pipeline_params pp = pipeline_params(s);
        ok = kt_pipeline_create(s->transport, s->engine, &pp, &s->pipeline, err) == KT_OK;
    }
    s->ep.progress = NULL;
    s->ep.expert_cache = NULL;
    kt_engine_plan_free(&s->plan); /* only read at creation */
    if (progress)
        fclose(progress);
    if (ok && o->self_check) {
        bool pass = false;
        ok = kt_serve_self_check_run(s, &pass, err) == KT_OK;
        if (ok && !pass) {
            s->exit_status = 3;
            kt_err_set(err, KT_ERR_INVALID, "--self-check failed: not serving; `kt-bench check -m %s%s%s` shows every "
                                            "row", o->model, o->placement ? " --placement " : "",
                       o->placement ? o->placement : "");
            ok = false;
        }
    }
    if (!ok)
        return false;
    kt_serve_self_check_free(s);
    struct kt_placement *live = s->live;
    struct kt_machine *mach = s->machine;
    s->live = NULL, s->machine = NULL;
    if (kt_serve_placement_create(s, live, s->config, mach, err) != KT_OK) /* takes live and mach */
        return false;
    kt_placement_config_destroy(s->config);
    s->config = NULL;
    s->sm = (struct kt_serve_model){.tok = s->tok, .format = s->format, .chat_template = s->chat_template,
                                    .n_ctx = s->ep.n_ctx,
                                    .kv_positions = (uint64_t)s->ep.kv_blocks * s->ep.kv_block_tokens < UINT32_MAX
                                                        ? s->ep.kv_blocks * s->ep.kv_block_tokens : UINT32_MAX,
                                    .n_vocab = kt_engine_n_vocab(s->engine),
                                    .allow_forced_output = o->test_forced_output};
    const struct kt_hparams *hp = &s->model->hp;
    s->metrics.routed_pairs_per_token =
        hp->n_layer > hp->n_dense_lead ? (uint64_t)(hp->n_layer - hp->n_dense_lead) * hp->n_expert_used : 0;
    if (kt_serve_profile_create(s, err) != KT_OK)
        return false;
    struct kt_sched_params sp = {.engine = s->engine, .tok = s->tok, .max_running_seqs = o->max_seqs,
                                 .max_waiting = o->max_waiting, .max_batch_tokens = o->max_batch_tokens,
                                 .prefix_cache_entries = o->prefix_cache, .metrics = &s->metrics,
                                 .after_step = kt_serve_after_step, .poked = kt_serve_make_moves,
                                 .after_step_ctx = s};
    return kt_sched_create(&sp, &s->sched, err) == KT_OK && kt_serve_placement_start(s, err) == KT_OK;
}

static pthread_t g_main_thread; /* the loader signals it when loading fails */

static void listening(const struct kt_server *s, const char *what)
{
    const bool v6 = strchr(s->o.host, ':') != NULL; /* http://[::1]:8080 */
    fprintf(stderr, "kt-serve: listening on http://%s%s%s:%u (%s %s)\n", v6 ? "[" : "", s->o.host, v6 ? "]" : "",
            s->port, what, s->o.model);
}

static void *loader_main(void *arg)
{
    struct kt_server *s = arg;
    kt_err err = {0};
    char why[512];
    double t0 = kt_monotonic_s();
    bool ok = load(s, &err);
    if (ok && s->o.self_check) { /* checked: only now listen */
        ok = kt_http_start(s, why, sizeof why);
        if (ok)
            listening(s, "serving");
        else
            kt_err_set(&err, KT_ERR_IO, "%s", why);
    }
    if (ok) {
        atomic_store(&s->load_permille, 1000);
        atomic_store(&s->state, KT_SERVER_READY);
        const struct kt_kv_cache *kv = kt_engine_kv_cache(s->engine);
        struct kt_kv_cache_stats ks;
        kt_kv_cache_stats(kv, &ks);
        fprintf(stderr,
                "kt-serve: ready in %.1f s: model '%s', %u threads, context %u, %u sequences, prefix cache %u, "
                "KV cache %s (%llu bytes per token)\n",
                kt_monotonic_s() - t0, s->served_name, kt_engine_params(s->engine)->n_threads, s->sm.n_ctx,
                s->o.max_seqs, s->o.prefix_cache, kt_row_type_name(kt_kv_cache_row_type(kv)),
                (unsigned long long)ks.bytes_per_token);
        if (s->pipeline)
            fprintf(stderr, "kt-serve: pipeline of %d ranks (rank 0 on %s, pid %d: layers [%u, %u), embedding and "
                    "head); SIGTERM to rank 0 stops the job\n", kt_transport_size(s->transport),
                    kt_transport_host(s->transport), (int)getpid(), s->ep.layer_begin, s->ep.layer_end);
    } else {
        snprintf(s->load_error, sizeof s->load_error, "%s", err.msg[0] ? err.msg : "loading failed");
        atomic_store(&s->state, KT_SERVER_FAILED);
        pthread_kill(g_main_thread, SIGUSR1);
    }
    return NULL;
}

/* ---- ranks (mpirun) ---------------------------------------------------------------------------------- */

/* A following rank's KV pool, sized as rank 0 sizes its own (preflight) from
 * the same options: with --kv-memory or --ctx given, the same pool; from free
 * memory alone, each rank's own (a smaller one makes that rank fail the step
 * that outgrows it, which ends the job: rank 0 answers 503 and exits). */
static bool follower_kv_pool(struct kt_server *s, kt_err *err)
{
    struct kt_tool_kv_pool pool;
    const struct kt_tool_kv_request rq = {.ctx = s->o.ctx, .max_seqs = s->o.max_seqs,
                                          .kv_memory_mib = s->o.kv_memory_mib, .block_tokens = KV_BLOCK_TOKENS};
    /* this rank's part of --placement (ranks[rank].placement, else the file's top level), applied to its
     * engine; without one CPU-only, as rank 0's default placement */
    struct kt_placement *own = NULL;
    if (kt_tool_placement_resolve_rank(s->o.placement, s->model, s->ep.topology, kt_transport_rank(s->transport),
                                       &own, err) != KT_OK)
        return false;
    kt_status st = KT_OK;
    if (s->o.placement) {
        fprintf(stderr, "kt-serve: rank %d: ", kt_transport_rank(s->transport));
        kt_placement_describe(own, stderr);
        st = kt_engine_plan_apply(own, &s->plan, &s->ep, stderr, err);
        if (st == KT_OK && s->o.kv_type_given) /* --kv-type wins over the config's kv_cache.type */
            s->ep.kv_type = s->o.kv_type;
    }
    if (st == KT_OK)
        st = kt_tool_kv_pool_size(s->model, own, &s->ep, &rq, &pool, err);
    kt_placement_destroy(own);
    if (st != KT_OK)
        return false;
    s->ep.n_ctx = pool.n_ctx;
    s->ep.kv_blocks = pool.n_blocks;
    return true;
}

/* Under mpirun, every rank but 0: no HTTP, tokenizer or scheduler - the
 * engine with this rank's layers, running what rank 0 sends until it stops.
 * A failure ends the whole job (rank 0 waits on this rank). */
static int follow_main(struct kt_server *s)
{
    /* mpirun passes a SIGTERM to every rank: rank 0 drains, then stops this one */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    kt_err err = {0};
    const int rank = kt_transport_rank(s->transport);
    uint32_t threads = s->o.threads;
    bool ok = kt_model_open(s->o.model, &s->model, &err) == KT_OK &&
              kt_tool_check_context("--ctx", s->o.ctx, s->model, s->o.model, &err) == KT_OK &&
              (threads || kt_tool_default_threads("kt-serve", stderr, &threads, &err) == KT_OK) &&
              engine_params(s, threads, &err) && follower_kv_pool(s, &err) &&
              kt_engine_create(s->model, &s->ep, &s->engine, &err) == KT_OK;
    kt_engine_plan_free(&s->plan); /* only read at creation */
    const struct kt_pipeline_params pp = pipeline_params(s);
    ok = ok && kt_pipeline_create(s->transport, s->engine, &pp, &s->pipeline, &err) == KT_OK;
    if (ok)
        fprintf(stderr, "kt-serve: rank %d (%s, pid %d): layers [%u, %u) of %s, following rank 0\n", rank,
                kt_transport_host(s->transport), (int)getpid(), s->ep.layer_begin, s->ep.layer_end, s->o.model);
    double t0 = kt_monotonic_s();
    ok = ok && kt_pipeline_follow(s->pipeline, &err) == KT_OK;
    if (!ok) {
        fprintf(stderr, "kt-serve: rank %d: %s\n", rank, err.msg[0] ? err.msg : "failed");
        fflush(stderr);
        kt_transport_abort(s->transport, 1);
    }
    struct kt_pipeline_stats ps;
    kt_pipeline_stats(s->pipeline, &ps);
    struct kt_backend_stats dev;
    char device[96] = "";
    if (s->engine && kt_engine_device_stats(s->engine, &dev) == KT_OK) /* a hybrid stage: its device's share */
        snprintf(device, sizeof device, ", its device busy %.3f s (%llu ops)", (double)dev.busy_ns * 1e-9,
                 (unsigned long long)dev.ops);
    fprintf(stderr, "kt-serve: rank %d: stopped; %llu slices, busy %.3f s of %.3f s%s\n", rank,
            (unsigned long long)ps.steps, (double)ps.busy_ns[rank] * 1e-9, kt_monotonic_s() - t0, device);
    kt_pipeline_destroy(s->pipeline);
    kt_engine_destroy(s->engine);
    kt_model_close(s->model);
    kt_serve_metrics_destroy(&s->metrics);
    kt_responses_store_destroy(s->responses);
    kt_transport_finalize(s->transport);
    return 0;
}

/* Rank 0, once the pipeline broke (pipeline_broken: new requests get 503
 * since, the running ones failed with the step): their responses get a
 * moment to reach the clients, then the whole job ends with status 1 (a
 * hung rank too). */
static void pipeline_down(struct kt_server *s)
{
    fprintf(stderr, "kt-serve: %s; answering 503, exiting\n", s->load_error);
    for (double t0 = kt_monotonic_s(); atomic_load(&s->in_flight) > 0 && kt_monotonic_s() - t0 < 5;)
        usleep(10000);
    usleep(1000000); /* the last responses' bytes; meanwhile new requests get 503 */
    fflush(stderr);
    kt_transport_abort(s->transport, 1);
}

/* Rank 0's exit: with a failure under mpirun the whole job ends (the other ranks would wait). */
static int end_job(struct kt_server *s, int status)
{
    if (status != 0 && s->transport && kt_transport_size(s->transport) > 1) {
        fflush(stderr);
        kt_transport_abort(s->transport, status);
    }
    kt_transport_finalize(s->transport);
    return status;
}

/* ---- main -------------------------------------------------------------------------------------------- */

/* Drains on a thread of its own, so the main thread can take a second
 * signal meanwhile; tells it when done. */
static void *drain_main(void *arg)
{
    struct kt_server *s = arg;
    if (s->sched)
        kt_sched_drain(s->sched, s->o.shutdown_timeout_s);
    /* the jobs are done; let their responses reach the clients before closing connections */
    for (double t0 = kt_monotonic_s(); atomic_load(&s->in_flight) > 0 && kt_monotonic_s() - t0 < 10;)
        usleep(10000);
    pthread_kill(g_main_thread, SIGUSR1);
    return NULL;
}

static void write_profile(struct kt_server *s)
{
    kt_err err = {0};
    if (kt_serve_profile_write(s, &err) != KT_OK)
        fprintf(stderr, "kt-serve: the routing profile: %s\n", err.msg);
}

/* Rank 0's account of the pipeline at the end: steps, slices, each rank's busy time, the bubble. */
static void pipeline_report(const struct kt_server *s)
{
    if (!s->pipeline)
        return;
    struct kt_pipeline_stats ps;
    kt_pipeline_stats(s->pipeline, &ps);
    fprintf(stderr, "kt-serve: pipeline of %d ranks: %llu steps in %llu slices, %.3f s; ranks busy", ps.n_ranks,
            (unsigned long long)ps.steps, (unsigned long long)ps.micro_batches, (double)ps.step_ns * 1e-9);
    for (int r = 0; r < ps.n_ranks; r++)
        fprintf(stderr, " %.3f", (double)ps.busy_ns[r] * 1e-9);
    fprintf(stderr, " s; bubble %.0f%%\n", 100.0 * kt_pipeline_bubble(&ps));
}

static void teardown(struct kt_server *s)
{
    kt_sched_destroy(s->sched);
    kt_serve_placement_destroy(s);
    kt_serve_profile_destroy(s);
    pipeline_report(s);
    kt_pipeline_destroy(s->pipeline); /* the other ranks stop */
    s->pipeline = NULL;
    kt_engine_destroy(s->engine);
    kt_serve_self_check_free(s);
    kt_engine_plan_free(&s->plan);
    kt_placement_destroy(s->live);
    kt_placement_config_destroy(s->config);
    free(s->machine);
    kt_tokenizer_destroy(s->tok);
    free(s->chat_template);
    kt_model_close(s->model);
    kt_serve_metrics_destroy(&s->metrics);
    kt_responses_store_destroy(s->responses);
}

int main(int argc, char **argv)
{
    static struct kt_server server;
    struct kt_server *s = &server;
    s->o = (struct kt_serve_options){.host = "127.0.0.1", .port = 8080, .max_seqs = 8, .max_waiting = 64,
                                     .kv_type = KT_TOOL_DEFAULT_KV_TYPE,
                                     .request_timeout_s = 600, .shutdown_timeout_s = 30, .ping_interval_s = 10,
                                     .max_body_bytes = 8u << 20, .max_connections = 512,
                                     .client_timeout_s = 30, .idle_timeout_s = 15,
                                     .profile_half_life = 1e6, .profile_interval_s = 60,
                                     .rebalance_min_gain = 0.02, .migration_budget_mib = 1024,
                                     .responses_store = 256};
    int rc = kt_cli_parse(&cli, argc, argv, 1, 0, &s->o);
    if (rc >= 0)
        return rc;
    if (!s->o.model)
        return kt_cli_usage_error(&cli, "%s", "no model given: give -m MODEL.gguf");
    if (!s->o.prefix_cache_given)
        s->o.prefix_cache = s->o.max_seqs;
    if (!s->o.max_batch_tokens)
        s->o.max_batch_tokens = s->o.max_seqs > 256 ? s->o.max_seqs : 256;
    char line[512];
    if (s->o.max_batch_tokens < s->o.max_seqs) {
        snprintf(line, sizeof line, "--max-batch-tokens %u is below --max-seqs %u (each running sequence decodes a "
                                    "token every step): give --max-batch-tokens %u or more", s->o.max_batch_tokens,
                 s->o.max_seqs, s->o.max_seqs);
        return kt_cli_usage_error(&cli, "%s", line);
    }
    if (s->o.expert_cache_policy_given && !s->o.expert_cache_slots)
        return kt_cli_usage_error(&cli, "%s", "--expert-cache-policy picks what --expert-cache SLOTS keeps: give "
                                              "--expert-cache too");
    if (s->o.test_self_check_reference && !s->o.self_check)
        return kt_cli_usage_error(&cli, "%s", "--test-self-check-reference goes with --self-check");
    uint32_t answered = s->o.max_seqs + s->o.max_waiting, enough = answered;
    while (enough - kt_conns_reserved(enough) < answered)
        enough++;
    if (s->o.max_connections < enough)
        fprintf(stderr, "kt-serve: note: --max-connections %u keeps %u slots free for new clients and leaves %u for "
                        "requests being answered, fewer than --max-seqs + --max-waiting (%u): when that many run "
                        "and wait, new clients (/health too) wait for a slot; --max-connections %u would not\n",
                s->o.max_connections, kt_conns_reserved(s->o.max_connections),
                s->o.max_connections - kt_conns_reserved(s->o.max_connections), answered, enough);
    kt_serve_metrics_init(&s->metrics);
    if (!(s->responses = kt_responses_store_create(s->o.responses_store))) {
        fprintf(stderr, "kt-serve: out of memory for --responses-store %u\n", s->o.responses_store);
        return 1;
    }
    kt_err err = {0};
    /* under mpirun: the other ranks only run their layers */
    if (kt_transport_init(&argc, &argv, &s->transport, &err) != KT_OK) {
        fprintf(stderr, "kt-serve: %s\n", err.msg);
        return 1;
    }
    if (kt_transport_rank(s->transport) > 0)
        return follow_main(s);
    if (kt_transport_size(s->transport) > 1 && s->o.rebalance_given && s->o.rebalance_interval_s > 0) {
        fprintf(stderr, "kt-serve: --rebalance-interval under mpirun is not supported yet (rank 0 would move only "
                        "its own layers' experts): give --rebalance-interval 0\n");
        return end_job(s, 1);
    }
    if (kt_transport_size(s->transport) > 1) { /* no rebalancer under mpirun (above) */
        s->o.rebalance_given = true;
        s->o.rebalance_interval_s = 0;
    }
    s->exit_status = 1;
    if (!preflight(s, &err)) { /* before listening: nothing is loaded yet */
        fprintf(stderr, "kt-serve: %s\n", err.msg);
        teardown(s);
        return end_job(s, 1);
    }
    file_stem(s->o.model, s->served_name, sizeof s->served_name);
    if (s->o.served_name)
        snprintf(s->served_name, sizeof s->served_name, "%s", s->o.served_name);
    s->created = (int64_t)time(NULL);
    s->id_seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();

    /* Signals go to the main thread's sigwait only; every later thread inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    g_main_thread = pthread_self();

    /* Listen at once (GET /health shows the load), or with --self-check once the engine passed it. */
    char why[512];
    if (!s->o.self_check) {
        if (!kt_http_start(s, why, sizeof why)) {
            fprintf(stderr, "kt-serve: %s\n", why);
            teardown(s);
            return 1;
        }
        listening(s, "loading");
    }
    pthread_t loader;
    if (pthread_create(&loader, NULL, loader_main, s) != 0) {
        fprintf(stderr, "kt-serve: cannot start the loader thread\n");
        return 1;
    }
    /* with --profile-out, wake every interval to write the profile; under
     * mpirun every 0.2 s, to see a broken pipeline */
    const bool ranks = kt_transport_size(s->transport) > 1;
    double profile_t0 = kt_monotonic_s();
    int sig = -1;
    while (sig < 0) {
        if (!s->o.profile_out && !ranks) {
            if (sigwait(&set, &sig) != 0)
                sig = -1;
            continue;
        }
        double wait_s = s->o.profile_out ? s->o.profile_interval_s : 0.2;
        if (ranks && wait_s > 0.2)
            wait_s = 0.2;
        double whole = floor(wait_s);
        struct timespec interval = {(time_t)whole, (long)((wait_s - whole) * 1e9)};
        sig = sigtimedwait(&set, NULL, &interval);
        const int state = atomic_load(&s->state);
        if (sig < 0 && ranks && state == KT_SERVER_FAILED && s->pipeline && kt_pipeline_broken(s->pipeline))
            pipeline_down(s); /* (a load that failed signals SIGUSR1 instead) */
        if (sig >= 0 || state != KT_SERVER_READY)
            continue;
        if (s->o.profile_out && kt_monotonic_s() - profile_t0 >= s->o.profile_interval_s) {
            write_profile(s);
            profile_t0 = kt_monotonic_s();
        }
    }
    if (sig == SIGUSR1) {
        pthread_join(loader, NULL);
        fprintf(stderr, "kt-serve: %s\n", s->load_error);
        kt_http_stop(s);
        teardown(s);
        return end_job(s, s->exit_status);
    }
    int state = atomic_exchange(&s->state, KT_SERVER_STOPPING);
    fprintf(stderr, "kt-serve: %s: stopping\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    if (state == KT_SERVER_LOADING) {
        /* the load cannot be interrupted and nothing is in flight; with --self-check the
         * loader may be starting the daemon this moment: exiting closes its socket */
        if (!s->o.self_check) {
            kt_http_quiesce(s);
            kt_http_stop(s);
        }
        fflush(stderr);
        _exit(0);
    }
    kt_http_quiesce(s);
    pthread_join(loader, NULL);
    /* SIGUSR1 from here on: the drain is done.  A second SIGTERM/SIGINT quits at once. */
    double drain_t0 = kt_monotonic_s();
    pthread_t drainer;
    if (pthread_create(&drainer, NULL, drain_main, s) != 0) {
        fprintf(stderr, "kt-serve: cannot start a thread to drain on; draining here (a second signal waits for it)\n");
        drain_main(s);
    } else {
        int again = SIGUSR1;
        if (sigwait(&set, &again) != 0)
            again = SIGUSR1; /* cannot take signals: wait for the drain */
        if (again != SIGUSR1) {
            fprintf(stderr, "kt-serve: %s again: quitting now, %.1f s into the drain (--shutdown-timeout %g); %d "
                            "responses in flight are cut off, the profile and the plan are not written; exit "
                            "status %d\n",
                    again == SIGTERM ? "SIGTERM" : "SIGINT", kt_monotonic_s() - drain_t0, s->o.shutdown_timeout_s,
                    atomic_load(&s->in_flight), 128 + again);
            fflush(stderr);
            _exit(128 + again);
        }
        pthread_join(drainer, NULL);
    }
    write_profile(s); /* what was served, all of it */
    kt_serve_placement_stop(s);
    err = (kt_err){0};
    if (kt_serve_placement_write(s, &err) != KT_OK)
        fprintf(stderr, "kt-serve: --plan-out: %s\n", err.msg);
    kt_http_stop(s);
    teardown(s);
    fprintf(stderr, "kt-serve: stopped\n");
    return end_job(s, 0);
}
