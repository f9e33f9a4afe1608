/* ds41 serve: Prometheus metrics with vLLM's names (counters, gauges, histograms). */
#ifndef DS41_SERVE_METRICS_H
#define DS41_SERVE_METRICS_H

#include <pthread.h>
#include <stddef.h>

#include "serve_gcache.h"
#include "serve_vcache.h"

#define DS41_HIST_MAX 24

typedef struct ds41_hist {
    const char *name, *help;
    int nb;
    double bounds[DS41_HIST_MAX];
    unsigned long long counts[DS41_HIST_MAX + 1];   /* counts[nb] = +Inf */
    double sum;
    unsigned long long count;
} ds41_hist;

enum { DS41_FIN_STOP, DS41_FIN_LENGTH, DS41_FIN_ABORT, DS41_FIN_ERROR, DS41_FIN_N };

typedef struct ds41_metrics {
    pthread_mutex_t mu;
    unsigned long long prompt_tokens, generation_tokens;
    int prefix_cache;                                   /* 1: the prefix cache is on */
    unsigned long long prefix_queries, prefix_hits;     /* tokens looked up / restored */
    unsigned long long finished[DS41_FIN_N];
    unsigned long long status[600];   /* per HTTP status */
    unsigned long long steps, preempted;
    ds41_hist ttft, itl, e2e, queue, prefill, decode, prompt_len, gen_len, iter_tokens;
    /* speculative decoding; spec_positions = block size (0: not exposed) */
    int spec_positions;
    unsigned long long spec_drafts, spec_draft_tokens, spec_accepted_tokens, spec_verify_steps;
    unsigned long long spec_drafted_at[64], spec_accepted_at[64];
    /* prefill/decode disaggregation (docs/pd.md; pd = 1: a decode node, the metrics exposed) */
    int pd;
    unsigned long long remote_prefills, remote_fallbacks, kv_transfer_bytes;
    ds41_hist kv_transfer;
} ds41_metrics;

/* Gauges sampled when /metrics is read. */
typedef struct ds41_gauges {
    long long running, waiting, sessions_open;
    long long kv_budget, kv_reserved, kv_used;
    long long prefix_bytes;       /* prefix-cache blocks held in memory */
    long long connections;
    /* Engram placement (P4; ds41_engram_get_stats): counters since load, exposed when the
     * model has Engram tables (eg_table_bytes > 0) */
    int eg_mode, eg_prefetch;
    long long eg_table_bytes, eg_cache_bytes, eg_steps, eg_lookups, eg_hits, eg_rows_read, eg_bytes_read;
    long long eg_retries, eg_errors;
    double eg_stall_s;
    /* the grammar table cache (exposed when grammar is 1: the model has a tokenizer) */
    int grammar;
    ds41_gcache_stats gt;
    long long gt_prefetched;      /* masks computed beside the forward (serve_gprefetch.h) */
    /* the image embedding cache (exposed when vision is 1: the model has a tower) */
    int vision;
    ds41_vcache_stats vc;
} ds41_gauges;

void ds41_metrics_init(ds41_metrics *m);
void ds41_metrics_free(ds41_metrics *m);
void ds41_metrics_observe(ds41_metrics *m, ds41_hist *h, double v);
void ds41_metrics_status(ds41_metrics *m, int status);
/* lbl = model_name="NAME", the name escaped as a Prometheus label value */
void ds41_metrics_label(const char *model_name, char *lbl, size_t cap);
/* Prometheus text exposition (malloc'd). */
char *ds41_metrics_text(ds41_metrics *m, const ds41_gauges *g, const char *model_name, size_t *len);

#endif
