/* ds41 serve: an OpenAI-compatible HTTP server (libmicrohttpd + jansson) over the scheduler.
 *
 *   serve_req.c     request bodies -> validated requests (fuzzed by fuzz/fuzz_request.c)
 *   serve_text.c    generated text -> reasoning / content / DSML tool calls
 *   serve_sched.c   continuous batching: queue, admission against the KV budget, one
 *                   ds41_feed_batch per step, sampling, stop conditions, cancellation
 *   serve_metrics.c Prometheus text with vLLM's metric names
 *   serve_http.c    routes, OpenAI response objects, SSE streaming, errors, limits */
#ifndef DS41_SERVE_H
#define DS41_SERVE_H

#include <stddef.h>

#include "ds41.h"

typedef struct ds41_serve_opts {
    const char *model_dir;
    const char *model_name;      /* NULL: the directory's base name */
    const char *host;            /* default 127.0.0.1 */
    int port;                    /* default 8000; 0 = any free port (printed) */
    const char *api_key;         /* NULL: no authentication */
    ds41_load_params lp;
    ds41_session_params sp;
    int parallel;                /* sequences running at most (default 16) */
    int batch_tokens;            /* tokens per engine step (default 512) */
    int max_queue;               /* waiting sequences at most (default 256) */
    long long kv_budget;         /* bytes; 0 = half of the available RAM */
    size_t max_body;             /* request body bytes at most (default 8 MiB) */
    int timeout_s;               /* idle connection timeout (default 60) */
    int body_timeout_s;          /* whole request body within this (default 30) */
    int max_connections;         /* default 256 */
    int max_connections_per_ip;  /* from one client address at most (default 32; 0 = no limit) */
    int verbose;
    /* --spec: DS41_SPEC_* and fixed K; spec_default: no --spec given (auto when the model has
     * DSpark stages, else off; an explicit non-off --spec on a model without them is an error) */
    int spec_mode, spec_k, spec_default;
    /* prefix cache (README "Prefix cache"): on unless no_prefix_cache; cache_mem bytes in
     * memory (0: 1 GiB), cache_dir / cache_bytes the persistent store, replay DS41_REPLAY_* */
    int no_prefix_cache, replay;
    long long cache_mem, cache_bytes;
    const char *cache_dir;
} ds41_serve_opts;

void ds41_serve_opts_default(ds41_serve_opts *o);
/* Loads the model, serves until SIGINT / SIGTERM; returns the exit status (0, or 1 with a
 * message on stderr). */
int ds41_serve(const ds41_serve_opts *o);

#endif
