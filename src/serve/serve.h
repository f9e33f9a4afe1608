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
    /* the image embedding cache (serve_vcache.h): image_cache bytes (0: 256 MiB), none with
     * no_image_cache */
    long long image_cache;
    int no_image_cache;
    /* prefill/decode disaggregation (docs/pd.md, src/serve/serve_pd.c): role DS41_ROLE_*;
     * a prefill node listens for decode nodes on host:port (UCX), and serves /health and
     * /metrics over HTTP on host:pd_http_port when that is >= 0 (0: a free port); a decode
     * node sends prompts with at least remote_min new tokens to prefill_nodes ("HOST:PORT,...") */
    int role;
    const char *prefill_nodes;
    long long remote_min;
    int on_failure_fail;         /* --on-prefill-failure fail */
    int prefill_timeout_ms;      /* a prefill node's next frame within this (default 30000) */
    int lease_ms;                /* prefill node: a silent decode node's state goes after this (10000) */
    int pd_decoder_decode;       /* prefill node, --pd-decoder decode: the decoder runs on the decode node */
    int pd_http_port;            /* prefill node, --http-port: -1 (default) none */
} ds41_serve_opts;

enum { DS41_SERVE_ROLE_BOTH = 0, DS41_SERVE_ROLE_PREFILL = 1, DS41_SERVE_ROLE_DECODE = 2 };

/* serve_pd.c: the roles' parts of ds41_serve. prefill: serves until SIGINT / SIGTERM (ss, the
 * blocked signals; model_name labels its metrics; mirror: rank 0's record under mpiexec, else
 * NULL) and returns the exit status. decode: sets sp->remote up (*client to close
 * with ds41_serve_pd_close after the scheduler stopped); 0 or -1 with a message on stderr. */
struct ds41_sched_params;
struct ds41_smirror;
int ds41_serve_pd_prefill(ds41_engine *e, ds41_prefix_cache *pc, const ds41_serve_opts *o, const char *model_name,
                          const void *ss, struct ds41_smirror *mirror);
int ds41_serve_pd_decode(ds41_engine *e, ds41_prefix_cache *pc, const ds41_serve_opts *o, struct ds41_sched_params *sp,
                         void **client);
void ds41_serve_pd_close(void *client);

void ds41_serve_opts_default(ds41_serve_opts *o);
/* Loads the model, serves until SIGINT / SIGTERM; returns the exit status (0, or 1 with a
 * message on stderr). */
int ds41_serve(const ds41_serve_opts *o);

#endif
